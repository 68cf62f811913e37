"""README.md stays true: its counts, its set-up commands and its `diagnose analyze` transcripts are checked against
what the code does now (a transcript may leave lines out, marked or not; the lines it shows must be real, in order)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.match.rules import load_catalogue

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_rule_count() -> None:
    m = re.search(r"\(`rules/`, data, (\d+) rules\)", README)
    assert m, "README no longer states the rule count"
    assert int(m.group(1)) == len(load_catalogue().rules)


def test_sample_log_count() -> None:
    m = re.search(r"`sample_logs/` holds (\d+) logs", README)
    assert m, "README no longer states the sample log count"
    logs = [p for p in ROOT.glob("sample_logs/**/*.log") if p.with_suffix(".expected.json").exists()]
    assert int(m.group(1)) == len(logs)


def test_the_two_setup_commands_are_what_ci_runs() -> None:
    section = README.split("## Set up", 1)[1]
    block = section.split("```", 2)[1].strip().splitlines()
    assert len(block) == 2, block
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").replace(" -q ", " ")  # CI installs quietly
    for command in block:
        assert command.strip() in ci, command


def _analyze_transcripts() -> list[tuple[str, list[str]]]:
    out = []
    for cmd, body in re.findall(r"```\n\$ (diagnose analyze [^\n]+)\n(.*?)```", README, re.S):
        body = body.split("\n$ ", 1)[0]  # the transcript of this command, not of the next one ("$ echo $?")
        shown = [ln.rstrip() for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("…")]
        out.append((cmd, shown))
    return out


@pytest.mark.parametrize("cmd,shown", _analyze_transcripts(), ids=lambda v: v if isinstance(v, str) else "")
def test_analyze_transcript_lines_are_real_and_in_order(cmd: str, shown: list[str]) -> None:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-m", *cmd.split()], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    real = [ln.rstrip() for ln in done.stdout.splitlines()]
    at = 0
    for line in shown:
        try:
            at = real.index(line, at) + 1
        except ValueError:
            pytest.fail(f"README line not in the output (or out of order): {line!r}")


def test_there_is_a_transcript_to_check() -> None:
    assert _analyze_transcripts()


def test_accuracy_table_is_the_recorded_one() -> None:
    """README's accuracy figures are corpus/accuracy.json's (which tests/test_corpus.py recomputes)."""
    import json

    figures = json.loads((ROOT / "corpus" / "accuracy.json").read_text(encoding="utf-8"))["figures"]
    for part, label in (("dev", "dev (tuned on)"), ("test", "test (frozen, never tuned on)")):
        f = figures[part]
        row = (
            f"| {label} | {f['failures']} | {f['top1']:.1f} % | {f['silent']} | {f['clean_right']}/{f['clean']} | "
            f"{f['phase_accuracy']:.1f} % | {f['evidence_rate']:.1f} % |"
        )
        assert row in README, row


def test_the_test_parts_interval_is_the_recorded_ones() -> None:
    """README's sentence on how far the frozen part's top-1 could be is computed from corpus/accuracy.json."""
    import json
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from accuracy import wilson_interval

    f = json.loads((ROOT / "corpus" / "accuracy.json").read_text(encoding="utf-8"))["figures"]["test"]
    low, high = wilson_interval(f["category_right"], f["failures"])
    assert f"**{f['category_right']}/{f['failures']} is {low}-{high} %**" in README


def test_reliability_table_is_the_recorded_one() -> None:
    """README's reliability rows (confidence band: logs and right, dev then test) are corpus/accuracy.json's."""
    import json

    figures = json.loads((ROOT / "corpus" / "accuracy.json").read_text(encoding="utf-8"))["figures"]
    bands = {"0.0": "0.0-0.4", "0.4": "0.4-0.6", "0.6": "0.6-0.8", "0.8": "0.8-1.0"}
    for low, label in bands.items():
        cells = []
        for part in ("dev", "test"):
            n, right, said = figures[part]["reliability"].get(low, [0, 0, 0.0])
            cells += [f"{int(n)}", f"{said / n:.2f}" if n else "-", f"{100.0 * right / n:.1f} %" if n else "-"]
        row = f"| {label} | " + " | ".join(cells) + " |"
        assert row in README, row
