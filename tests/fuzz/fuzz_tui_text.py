"""Fuzz target: every function that turns text from a log, a finding, a file name or a store into something the TUI
draws, without starting the TUI.

The input is a log (and a file name, host names, rank numbers, a store row) from which the match engine builds a
report; then each finding goes through the findings list label, the detail pane's header, evidence, fix and
verdict texts, the memory panel; the fleet tables' rows and the rank formatting helpers get the fuzzed values
directly; and the raw text goes through ``safe.log_text`` / ``block_text``.

Invariants: nothing raises (a ``MarkupError`` included); every ``Text`` holds no escape, control (newline aside in
multi-line blocks), bidi or zero-width character; no ``@click`` action in a span's meta comes from the input (only
the evidence links' own ``screen.open_evidence(n)``);
a fleet row, passed through DataTable's own cell formatter, shows the value as typed (markup not obeyed).

    python3 tests/fuzz/fuzz_tui_text.py --seconds 1800 --crash-dir /tmp/fuzz-tui-text
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script from a checkout: import the checkout's package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # the harness beside it, also from the test suite
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Choices, encode  # noqa: E402
from rich.text import Text  # noqa: E402
from textual.widgets._data_table import default_cell_formatter  # noqa: E402

from diagnose.fleet.report import FailureClass, JobRow, NodeRow  # noqa: E402
from diagnose.match import load_catalogue, match_text  # noqa: E402
from diagnose.normalize import decode  # noqa: E402
from diagnose.present.safe import block_text, inert, log_text  # noqa: E402
from diagnose.present.tui.detail import (  # noqa: E402
    evidence_text,
    fix_header,
    header_text,
    inert_multiline,
    reflow,
    verdict_text,  # noqa: E402
)
from diagnose.present.tui.findings import finding_label, finding_order  # noqa: E402
from diagnose.present.tui.fixrender import render_fix  # noqa: E402
from diagnose.present.tui.fleet import class_row, job_row, node_row  # noqa: E402
from diagnose.present.tui.fmt import compact_ranks, format_ranks, rank_phrase  # noqa: E402
from diagnose.present.tui.memoryview import memory_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = load_catalogue()
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069"
                          "\u2028\u2029\ufeff\u00ad\u180e]")
_UNSAFE_BLOCK = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069"
                           "\u2028\u2029\ufeff\u00ad\u180e]")
_OWN_ACTIONS = re.compile(r"screen\.open_evidence\(\d+\)")


def _safe(text: Text | None, what: str, multiline: bool = True) -> None:
    if text is None:
        return
    assert isinstance(text, Text), f"{what}: {type(text).__name__}, not a rich Text"
    bad = (_UNSAFE_BLOCK if multiline else _UNSAFE_LINE).search(text.plain)
    assert bad is None, f"{what}: raw {bad.group()!r} in {text.plain[max(0, bad.start() - 60):bad.end() + 20]!r}"
    for span in text.spans:
        style = span.style
        meta = getattr(style, "meta", None) or {}
        click = meta.get("@click")
        assert click is None or _OWN_ACTIONS.fullmatch(str(click)), f"{what}: action {click!r} in a span"


def check(data: bytes) -> None:
    c = Choices(data)
    name = c.text(40) or "job.log"
    hosts = [c.text(16) for _ in range(c.byte() % 3)]
    ranks = [c.byte() * 7 + c.byte() for _ in range(c.byte() % 40)]
    store_value = c.text(48)
    text = decode(c.rest())

    # the raw text through the safe helpers
    _safe(log_text(text), "log_text", multiline=False)
    _safe(block_text(text), "block_text")
    _safe(block_text(reflow(text)), "block_text(reflow)")  # how the detail pane shows an explanation
    _safe(Text(inert_multiline(text)), "inert_multiline")

    # rank and host formatting (widgets append these as plain strings)
    for what, s in (("format_ranks", format_ranks(ranks)), ("compact_ranks", compact_ranks(ranks or [0])),
                    ("rank_phrase", rank_phrase(ranks, [inert(h) for h in hosts], len(ranks)))):
        _safe(Text(s), what, multiline=False)

    # a report from the log, every finding through the detail pane's builders
    report = match_text(text, CATALOGUE, path=name)
    order = [i for section in finding_order(report) for i in section.indices]
    assert sorted(order) == list(range(len(report.findings))), "finding_order lost or repeated a finding"
    display = {name: name}
    for i, finding in enumerate(report.findings):
        finding.hosts = finding.hosts + hosts
        _safe(finding_label(finding, i == report.root_cause), "finding_label")
        _safe(header_text(report, finding), "header_text")
        _safe(evidence_text(finding, display), "evidence_text")
        rendered = render_fix(report, finding)
        _safe(fix_header(finding, rendered), "fix_header")
        _safe(verdict_text(rendered), "verdict_text")
        _safe(memory_text(report.memory, finding) if report.memory else None, "memory_text")

    # the fleet tables: every cell as DataTable draws it
    job = JobRow(store_value, store_value, store_value, store_value, store_value, store_value or None, store_value,
                 0.0, "diagnosed", [])
    klass = FailureClass(store_value, "X", "other", store_value, 1, 0.5, 0.0, 0.0, 0, 1, True, "new", store_value)
    node = NodeRow(store_value, 2, 1, 0.5, 0.01, True, store_value, None)
    for row in (job_row(job), class_row(klass), node_row(node)):
        for cell in row:
            shown = default_cell_formatter(cell)
            _safe(shown, "fleet cell", multiline=False)
    assert default_cell_formatter(job_row(job)[1]).plain == inert(store_value), "fleet cell: markup obeyed"


def _sample(name: str, limit: int = 5000) -> bytes:
    return (ROOT / "sample_logs" / name).read_bytes()[:limit]


def seeds() -> list[bytes]:
    return [
        encode("ddp_wrap_oom.log", 1, "node[b]01", 3, 0, 1, 0, 2, 9, 9, "train[/]", _sample("ddp_wrap_oom.log")),
        encode("x\x1b]52;c;aGk=\x07.log", 2, "h1", "[@click=app.quit]", 0, "[red]job", _sample("nccl_desync_seqnum.log")),
        encode("\u202erank0.log", 0, 39, *range(78), "\u200b", _sample("cascade_512_ranks_oom.log", 8000)),
        encode("f.log", 0, 0, "", _sample("exception_group_oom.log")),
        encode("g.log", 0, 0, "x", _sample("slurm_time_limit.log")),
        encode("h.log", 0, 0, "y", _sample("oom_fragmentation.log")),
    ]


if __name__ == "__main__":
    from harness import main

    sys.exit(main("tui_text", check, seeds()))
