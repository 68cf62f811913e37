"""The terminal report (rich): root cause first, then secondary findings, then cascades collapsed to one line each.

Everything that came from a log (evidence, facts, config values) is made inert and put in ``Text`` objects, never
in markup strings. Helpers here (rank compaction, sections) are shared with the markdown report; a fix's overrides
are rendered by ``diagnose.explain.render``, the one renderer of every presenter.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable
from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from diagnose.coerce import as_int
from diagnose.explain.render import (
    cli_line,
    env_line,
    fix_style,
    fix_words,
    overrides_yaml,
    python_lines,
    replay_speaks_to,
)
from diagnose.explained import CONFIG_CATEGORIES
from diagnose.model import Finding, Fix, HangReport, Override, Report, rank_runs
from diagnose.present.memory_text import memory_lines
from diagnose.present.replay_text import replay_lines, replay_summary
from diagnose.present.safe import inert, inert_block, log_text, shorten
from diagnose.present.section_lines import config_lines, slurm_lines
from diagnose.units import format_bytes

SAFETY_NOTE = {
    "safe": "safe: no change to numerics or speed",
    "unsafe": "unsafe: changes numerics or speed, review before applying",
    "manual": "manual: needs a human step",
}
ROOT_NOUN = {
    "cuda_oom": "the OOM",
    "host_oom": "the host OOM",
    "fsdp_config": "the FSDP config error",
    "checkpoint_format": "the checkpoint format error",
    "checkpoint_io": "the checkpoint I/O error",
    "nccl_timeout": "the NCCL timeout",
    "nccl_error": "the NCCL error",
    "config_validation": "the config error",
    "slurm": "the Slurm event",
    "launcher": "the launcher error",
    "import_version": "the import error",
    "hardware": "the hardware fault",
    "numerics": "the numerics failure",
    "data": "the data error",
    "other": "the error",
}
MAX_RANK_RUNS = 12


# ------------------------------------------------------------------------------------------ shared helpers


def compact_ranks(ranks: Iterable[int]) -> str:
    """``[0,1,2,3,9,11,12]`` -> ``"0-3, 9, 11-12"``; very long lists are cut with a count."""
    values = set(ranks)
    runs = rank_runs(values)
    if len(runs) > MAX_RANK_RUNS:
        return ", ".join(runs[:MAX_RANK_RUNS]) + f", … ({len(values)} ranks)"
    return ", ".join(runs)


def category_words(f: Finding) -> str:
    """The category as the report says it: with how it was reached unless a specific rule's message said it."""
    if f.basis == "inferred":
        return f"{f.category} (inferred from the evidence)"
    if f.basis == "catchall":
        return f"{f.category} (catch-all: nothing more specific matched)"
    return f.category


def where(f: Finding) -> str:
    """"ranks 0-7, 9 on node1, node2" (or "rank 3", or "" when the log names no rank)."""
    parts = []
    if f.ranks:
        parts.append(("rank " if len(f.ranks) == 1 else "ranks ") + compact_ranks(f.ranks))
    if f.hosts:
        hosts = f.hosts if len(f.hosts) <= 4 else f.hosts[:4] + [f"… ({len(f.hosts)} hosts)"]
        parts.append(("on " if parts else "hosts ") + ", ".join(hosts))
    return " ".join(parts)


def yaml_text(overrides: list[Override]) -> str:
    """The overrides as nested YAML, without the final newline (one builder: ``diagnose.explain.render``)."""
    return overrides_yaml(overrides).rstrip()


def collapsed_line(f: Finding, root: Finding | None) -> str:
    """"NCCL watchdog timeout on 511 ranks, caused by the OOM above"."""
    n = len(f.ranks)
    if n > 1:
        spread = f" on {n} ranks"
    elif n == 1:
        spread = f" on rank {f.ranks[0]}"
    else:
        spread = f" ({f.count} lines)" if f.count > 1 else ""
    cause = f", caused by {ROOT_NOUN.get(root.category, 'the error')} above" if root is not None else ""
    return f"{f.title}{spread}{cause}"


def _keeps_its_lines(line: str) -> bool:
    """A list item ("- ", "* ", "• "), a code fence or an indented code line: its paragraph keeps its lines. A line
    that merely starts with an inline `code` span or "--flag" is prose the TOML wrapped there (qa15: 40 rules' Why
    was printed ragged, each TOML line wrapped again at the terminal's width)."""
    stripped = line.lstrip()
    return stripped[:2] in ("- ", "* ", "• ") or stripped.startswith("```") or line.startswith("    ")


def wrap_paragraphs(text: str, width: int, indent: str) -> list[str]:
    """Reflow hard-wrapped paragraphs (rule explanations are wrapped in TOML) to the terminal width."""
    out: list[str] = []
    for para in text.split("\n\n"):
        lines = para.splitlines()
        if any(_keeps_its_lines(ln) for ln in lines):  # a list or code: keep its lines
            out.extend(indent + ln for ln in lines)
        else:
            out.extend(textwrap.wrap(" ".join(ln.strip() for ln in lines), max(40, width - 1),
                                     initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False) or [""])
        out.append("")
    while out and not out[-1]:
        out.pop()
    return out


def fact_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return str(v)


# ------------------------------------------------------------------------------------------ rendering


def _header(report: Report) -> Text:
    t = Text("diagnose", style="bold")
    inputs = report.inputs
    if len(inputs) == 1:
        i = inputs[0]
        t.append(" · ")
        t.append(inert(i.path))
        t.append(f" ({_size(i.bytes)}, {i.lines:,} line{'' if i.lines == 1 else 's'})", style="dim")
    elif inputs:
        t.append(f" · {len(inputs)} inputs ({_size(sum(i.bytes for i in inputs))}, "
                 f"{sum(i.lines for i in inputs):,} lines)", style="dim")
    else:  # `diagnose slurm` on a job whose output is gone: say so rather than print a bare "diagnose"
        t.append(" · no log read (the findings come from Slurm's records)", style="dim")
    return t


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def seen_where(f: Finding) -> list[str]:
    """The end of a finding's meta line (text and markdown): where it was seen, and in how many lines from where."""
    lines = ("from the flight-recorder dumps" if f.facts.get("source") == "flight_recorder"
             else f"{f.count} line{'s' if f.count != 1 else ''}, first at line {f.first_line}")
    return [w for w in (where(f), lines) if w]


def _finding_meta(f: Finding) -> Text:
    bits = [f"phase {f.phase}", category_words(f), f"confidence {f.confidence:.2f}", *seen_where(f)]
    return Text(" · ".join(inert(b) for b in bits), style="dim")


class _RStripped:
    """Render a renderable with each line's trailing blanks removed (a table pads its cells to the column width,
    which leaves spaces at line ends that a copy from the terminal picks up)."""

    def __init__(self, renderable: Any) -> None:
        self.renderable = renderable

    def __rich_console__(self, console, options):
        from rich.segment import Segment

        for line in console.render_lines(self.renderable, options, pad=False, new_lines=False):
            segments = list(line)
            while segments and not segments[-1].control and not segments[-1].text.rstrip():
                segments.pop()
            if segments and not segments[-1].control:
                last = segments[-1]
                segments[-1] = Segment(last.text.rstrip(), last.style, last.control)
            yield from segments
            yield Segment.line()


def _grid() -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    return grid


def _evidence(f: Finding) -> list[Any]:
    """Evidence lines as a two-column grid: where, then the log text wrapped under itself.

    When every line comes from one file its path goes in the heading and the grid shows line numbers only.
    """
    paths = {e.path for e in f.evidence}
    one_path = len(paths) == 1
    heading = Text("  Evidence", style="bold")
    if one_path:
        heading.append("  " + inert(f.evidence[0].path), style="dim")
    grid = _grid()
    for e in f.evidence:
        if e.line > 0:
            where_text = f"line {e.line}" if one_path else f"{inert(e.path)}:{e.line}"
        else:  # not a line of a file (a flight-recorder dump, a Slurm record): the file alone
            where_text = "" if one_path else inert(e.path)
        grid.add_row(Text(where_text, style="cyan"), log_text(e.text, limit=400))
    return [heading, _RStripped(Padding(grid, (0, 0, 0, 4), expand=False))]


FACTS_SHOWN = 12

# Facts that are parser internals (which template matched, a typo flag) or that another line of the report already
# shows: kept in JSON, never in the text/markdown Facts block.
HIDDEN_FACTS = frozenset({
    "capacity_typo", "old_reserved_word", "template", "prefix_style", "tasks_text", "docs_url", "hint",
    "alloc_conf_env", "pg", "pg_guid", "device", "other_processes", "no_other_failures", "silent_ranks",
    "collective_groups", "desync", "stragglers",
    "nccl_result", "cpp_type",
})
# Shown in the meta line when the finding has ranks.
RANK_FACTS = frozenset({"rank", "tasks", "local_rank"})
FACT_LABELS = {
    "requested_bytes": "requested", "total_bytes": "GPU capacity", "free_bytes": "free",
    "process_in_use_bytes": "in use (this process)", "allocated_bytes": "allocated by PyTorch",
    "reserved_bytes": "reserved by PyTorch", "reserved_unallocated_bytes": "reserved, unallocated",
    "allowed_bytes": "allowed", "private_pool_bytes": "private pools",
    "seq_num": "SeqNum", "op_type": "OpType", "numel_in": "NumelIn", "numel_out": "NumelOut",
    "timeout_ms": "Timeout", "ran_for_ms": "ran for", "last_completed": "last completed SeqNum",
    "last_enqueued": "last enqueued SeqNum", "pg_desc": "process group", "nccl_version": "NCCL version",
    "exit_code": "exit code", "exitcode": "exit code", "signal_name": "signal name", "gpu": "GPU",
    "exc_type": "exception", "job_id": "job id", "root_cause": "first failure", "failures": "other failures",
    "gpus": "GPUs out of memory",  # several unprefixed OOMs, one per GPU, no ranks in the log
}


def _int(v: Any) -> int | None:
    return as_int(v, floats=True)


def _millis(ms: int) -> str:
    if ms >= 60_000:
        minutes = ms / 60_000
        return f"{ms} ms ({minutes:.0f} min)" if ms % 60_000 == 0 else f"{ms} ms ({minutes:.1f} min)"
    if ms >= 1000:
        return f"{ms} ms ({ms / 1000:g} s)"
    return f"{ms} ms"


def _failure(d: dict) -> str | None:
    """torchrun's failure record -> "rank 0 on node01, exit code 1" (signal when there is one)."""
    rank = _int(d.get("rank"))
    if rank is None:
        return None
    text = f"rank {rank}"
    if isinstance(d.get("host"), str) and d["host"]:
        text += f" on {d['host']}"
    if _int(d.get("exitcode")) is not None:
        text += f", exit code {_int(d['exitcode'])}"
    if d.get("signal") not in (None, "", False):
        text += f", signal {d['signal']}"
    return text


def _fact_text(key: str, v: Any) -> str | None:
    """One fact as a user reads it, or None when it says nothing to a user (empty, internal, a raw blob)."""
    if v is None or v is False or v == "" or v == [] or v == {}:
        return None
    if v is True:
        return "yes"
    n = _int(v)
    if key.endswith("_bytes") and n is not None:
        return format_bytes(n)
    if key.endswith("_ms") and n is not None:
        return _millis(n)
    if isinstance(v, dict):
        return _failure(v) if key == "root_cause" else None
    if isinstance(v, list):
        if all(isinstance(x, dict) for x in v):
            ranks = [r for x in v if (r := _int(x.get("rank"))) is not None]
            return (("rank " if len(ranks) == 1 else "ranks ") + compact_ranks(ranks)) if ranks else None
        if all(_int(x) is not None for x in v):
            return compact_ranks(r for x in v if (r := _int(x)) is not None)
        if all(isinstance(x, (str, int, float)) for x in v):
            return ", ".join(str(x) for x in v)
        return None
    text = fact_value(v)
    return text if len(text) <= 200 else text[:199] + "…"


def shown_facts(facts: dict[str, Any], ranks_known: bool = False) -> list[tuple[str, str]]:
    """The facts worth a line in a text/markdown report, as (label, value): user-meaningful ones only.

    Internals and empty values are left out, sizes read ``135.33 GiB``, timeouts ``600000 ms (10 min)``, the
    watchdog's fields keep their log names (SeqNum, OpType, NumelIn), nested records are summarised, never dumped.
    JSON keeps every fact unchanged.
    """
    out: list[tuple[str, str]] = []
    seen_labels: set[str] = set()
    for k, v in facts.items():
        key = str(k)
        if key in HIDDEN_FACTS or (ranks_known and key in RANK_FACTS):
            continue
        if facts.get(f"{key}_bytes") not in (None, False, ""):  # "requested" next to "requested_bytes"
            continue
        text = _fact_text(key, v)
        label = FACT_LABELS.get(key, key.replace("_", " "))
        if text is None or label in seen_labels:
            continue
        seen_labels.add(label)
        out.append((label, text))
    return out[:FACTS_SHOWN]


def _facts(f: Finding) -> list[Any]:
    items = shown_facts(f.facts, ranks_known=bool(f.ranks))
    if not items:
        return []
    grid = _grid()
    for k, v in items:
        grid.add_row(Text(inert(k), style="dim"), Text(inert(v)))
    return [Text("  Facts", style="bold"), _RStripped(Padding(grid, (0, 0, 0, 4), expand=False))]


def silent_line(f: Finding, root: Finding | None) -> str:
    """The ranks that did not report an NCCL timeout (``facts.silent_ranks``), as one sentence, or ``""``."""
    from diagnose.match.silent_ranks import silent_sentence

    silent = f.facts.get("silent_ranks")
    if not isinstance(silent, list) or not silent or not all(_int(r) is not None for r in silent):
        return ""
    silent = [_int(r) for r in silent]
    if root is not None and root is not f and set(silent) <= set(root.ranks):
        who = ("rank " if len(silent) == 1 else "ranks ") + compact_ranks(silent)
        return f"{who}, where {ROOT_NOUN.get(root.category, 'the error')} above happened, did not report the timeout"
    return silent_sentence(silent)


def skew_line(f: Finding) -> str:
    """The desynced and straggling NCCL ranks (``facts.desync``, ``facts.stragglers``) as one sentence, or ``""``."""
    from diagnose.match.collective_skew import skew_sentences

    return "; ".join(skew_sentences(f.facts))


def command_text(prefix: str, command: str, style: str = "") -> Text:
    """A line holding something to copy (a command, code, YAML): never wrapped, never cut, at any width."""
    t = Text(prefix, style="dim", no_wrap=True, overflow="ignore")
    t.append(command, style=style)
    return t


def fix_texts(fix: Fix, indent: str = "    ", width: int = 100, verbose: bool = True,
              style: str = "bridge") -> list[Text]:
    """The fix as overrides (Bridge CLI, Python, and with ``verbose`` YAML), env vars and steps, in the job's words
    (``style``: render.fix_style): a Megatron-LM job's overrides are its command-line flags, and the Bridge words
    only for what has no flag; a job of another stack gets the rule's stack-neutral steps instead."""
    if fix.empty:
        return []
    head = Text("  Fix", style="bold green")
    head.append(f"  ({SAFETY_NOTE.get(fix.safety, fix.safety)})", style="yellow" if fix.safety == "unsafe" else "dim")
    out = [head]
    if fix.summary:
        out.extend(Text(line, style="bold") for line in wrap_paragraphs(inert_block(fix.summary), width, indent))
    words = fix_words(fix, style)
    if words.flags:
        out.append(command_text(f"{indent}Megatron-LM ", inert(words.flags), style="bold"))
    if words.overrides:
        out.append(command_text(f"{indent}Bridge CLI  ", inert(cli_line(words.overrides)), style="bold"))
        for i, line in enumerate(python_lines(words.overrides)):
            label = "Python      " if i == 0 else "            "
            out.append(command_text(f"{indent}{label}", inert(line)))
        if verbose:
            out.append(Text(f"{indent}YAML", style="dim"))
            out.extend(command_text(f"{indent}  ", inert(line)) for line in yaml_text(words.overrides).splitlines())
    out.extend(command_text(f"{indent}Env         ", inert(env_line(e.name, e.value)), style="bold") for e in fix.env)
    for step in words.steps:
        out.extend(Text(line) for line in textwrap.wrap(inert(step), max(40, width - 1), initial_indent=f"{indent}- ",
                                                        subsequent_indent=f"{indent}  ", break_on_hyphens=False))
    return out


def render_finding(f: Finding, headline: str, style: str, width: int = 100, full: bool = True,
                   root: Finding | None = None, verbose: bool = True, fix_as: str = "bridge") -> list[Any]:
    """A finding: title, where, the silent NCCL ranks, evidence, facts; with ``full`` also why and the fix.

    Not ``verbose`` (the default report): title, where, evidence, then the fix, so that the fix is on the first
    screen; the why after it; the facts only with -v (the OOM message in the evidence already says them)."""
    title = Text()
    title.append(f"{headline}  ", style=style)
    title.append(inert(f.rule), style="bold")
    title.append("  ")
    title.append(inert(f.title), style="bold")
    parts: list[Any] = [title, Padding(_finding_meta(f), (0, 0, 0, 2))]  # wrapped lines stay indented
    if f.basis == "inferred" and f.basis_detail:
        parts.extend(Text(line, style="dim") for line in textwrap.wrap(
            inert("category from " + f.basis_detail), max(40, width - 1),
            initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False))
    # the odd ranks of an NCCL hang (silent, desynchronised, behind) are the headline: shown here even when the
    # explanation repeats them further down
    silent, skew = silent_line(f, root), skew_line(f)
    for odd in (x for x in (silent, skew) if x):
        parts.extend(Text(line, style="bold yellow") for line in textwrap.wrap(
            inert(odd[0].upper() + odd[1:]), max(40, width - 1), initial_indent="  ", subsequent_indent="  ",
            break_on_hyphens=False))
    if f.evidence:
        parts.extend(_evidence(f))
    if verbose:
        parts.extend(_facts(f))
    if not full:
        return parts
    why: list[Any] = []
    explanation = _without_headline(f.explanation, [x for x in (silent, skew) if x])
    if explanation:
        why.append(Text("  Why", style="bold"))
        why.extend(Text(line) for line in wrap_paragraphs(inert_block(explanation), width, "    "))
    fix = fix_texts(f.shown_fix, width=width, verbose=verbose, style=fix_as)
    return parts + (why + fix if verbose else fix + why)


NOTHING_RECOVERED = "nothing recovered from the input"


def _without_headline(explanation: str, headlines: list[str]) -> str:
    """The explanation minus the paragraphs that say what the headline lines above it already say (once is
    enough: the odd ranks of a hang are shown at the top)."""
    if not explanation or not headlines:
        return explanation
    keys = [h.split(";")[0].split(":")[0].strip().lower() for h in headlines]
    paragraphs = explanation.split("\n\n")
    kept = [p for p in paragraphs if not any(k and k in p.lower() for k in keys)]
    return "\n\n".join(kept).strip()


def _sections(report: Report, width: int) -> list[Any]:
    """-v: CONFIG and SLURM read from their typed objects as YAML-like lines; REPLAY (whether it reproduced, the
    violations before and after, what replay added, the memory fit) and MEMORY (verdict, prediction, options,
    notes) in words under their one sentence. The fix itself is the finding's fix block, not repeated."""
    parts: list[Any] = []
    if report.config is not None:
        parts += _titled("config", "", [(inert_block(ln), False) for ln in config_lines(report.config, report.stack)],
                         width)
    style = fix_style(report.framework, report.stack)
    if report.replay is not None and replay_speaks_to(style):
        lines = [(inert(ln), False) for ln in replay_lines(report.replay, style)]
        parts += _titled("replay", replay_summary(report.replay, style), lines, width)
    if report.memory is not None:
        oom = next((f for f in [report.root, *report.findings] if f is not None and f.category == "cuda_oom"), None)
        lines = [(inert(ln), cmd) for ln, cmd in memory_lines(report.memory, oom)]
        parts += _titled("memory", report.memory.explanation, lines, width)
    if report.slurm is not None:
        parts += _titled("slurm", "", [(inert_block(ln), False) for ln in slurm_lines(report.slurm)], width)
    return parts


def _titled(title: str, lead: str, lines: list[tuple[str, bool]], width: int) -> list[Any]:
    """A section: the one sentence a user reads first in bold, then its (inert) lines: commands unwrapped, prose
    wrapped under its key or list item (hanging)."""
    out: list[Any] = [Text(""), Text(title.upper(), style="bold underline")]
    if lead:
        out.extend(Text(w, style="bold") for w in wrap_paragraphs(inert(lead), width, "  "))
    if not lines:
        out.append(Text("  " + NOTHING_RECOVERED, style="dim"))
    for line, command in lines:
        line = "  " + line
        if command:
            out.append(command_text("", line))
            continue
        body = line.lstrip(" ")
        hang = " " * (len(line) - len(body) + (2 if body.startswith("- ") else 0) + 4)
        wrapped = textwrap.wrap(line, max(40, width - 1), subsequent_indent=hang, drop_whitespace=True,
                                break_on_hyphens=False) if len(line) >= width else [line]
        out.extend(Text(w) for w in wrapped or [line])
    return out


def renderables(report: Report, width: int = 100, detail: str = "verbose") -> list[Any]:
    """The report as rich renderables. ``detail``: "quiet" (-q: root cause, evidence line, fix), "default" (fix on
    the first screen, one line per other finding, one sentence per section), "verbose" (-v: everything)."""
    if report.jobs:
        return _per_job(report, width, detail)
    if detail == "quiet":
        return _quiet(report)
    verbose = detail == "verbose"
    parts: list[Any] = [_header(report), Text("")]
    root = report.root
    if root is None:
        parts.append(Text("No failure found.", style="bold green"))
        if not report.findings:
            parts.append(Text("No rule matched this log.", style="dim"))
    else:
        root_parts = render_finding(root, "ROOT CAUSE", "bold white on red", width, verbose=verbose,
                                    fix_as=fix_style(report.framework, report.stack))
        launch = _launch_texts(report, verbose)
        at = next((i + 1 for i, p in enumerate(root_parts) if isinstance(p, Text)
                   and p.plain.lstrip().startswith(("Bridge CLI", "Megatron-LM "))), None)
        if launch and at is not None:  # the fix needs more GPUs: how to launch them, under the fix's command lines
            root_parts[at:at] = launch
        parts.extend(root_parts)
    secondary = [f for i, f in enumerate(report.findings) if i != report.root_cause and f.role != "cascade"]
    cascades = [f for f in report.findings if f.role == "cascade"]
    if secondary and not verbose:
        parts += [Text(""), Text("OTHER FINDINGS", style="bold underline")]
        for f in secondary:
            line = Text("")
            line.append(f"{finding_label(f)}  ", style=_severity_style(f.severity) if f.role != "context" else "dim")
            line.append(f"{inert(f.rule)}  {inert(f.title)}")
            w = where(f)
            line.append(f"  [{inert(w) + ', ' if w else ''}line {f.first_line}]", style="dim")
            parts.append(Padding(line, (0, 0, 0, 2)))  # a wrapped line stays indented, as in the cascade
    elif secondary:
        parts += [Text(""), Text("OTHER FINDINGS", style="bold underline")]
        for f in secondary:
            parts.append(Text(""))
            parts.extend(render_finding(f, finding_label(f), _severity_style(f.severity), width,
                                        full=f.severity == "error", root=root,
                                        fix_as=fix_style(report.framework, report.stack)))
    if cascades:
        parts += [Text(""), Text("CASCADE (consequences, collapsed)", style="bold underline")]
        for f in cascades:
            line = Text("")
            line.append(inert(collapsed_line(f, root if f.cause_of is not None else None)))
            for odd in (x for x in (silent_line(f, root), skew_line(f)) if x):
                line.append("; " + inert(odd), style="yellow")
            line.append(f"  [{inert(f.rule)}, first at line {f.first_line}]", style="dim")
            parts.append(Padding(line, (0, 0, 0, 2)))  # a wrapped line stays indented under its first line
    if report.hang is not None:
        parts.extend(_hang_section(report.hang))
    if verbose:
        parts.extend(_sections(report, width))
    else:
        parts.extend(_summaries(report, width))
    if report.verify is not None:
        from diagnose.present.verify_text import verify_renderables

        parts.extend(verify_renderables(report.verify))
    if report.warnings:
        parts += [Text(""), Text("WARNINGS", style="bold yellow")]
        parts.extend(Text("  ").append(inert(w)) for w in report.warnings)
    if not verbose and any(getattr(report, n) for n in ("config", "replay", "memory")):
        parts += [Text(""), Text("(-v: facts, YAML fix, config/replay/memory details; --format json: everything)",
                                 style="dim")]
    return parts


def _hang_section(hang: HangReport) -> list[Any]:
    """HANG (flight recorder): the sentences, then the grid unwrapped (it is a table)."""
    from diagnose.present.hang_view import grid_rows, hang_lines

    parts: list[Any] = [Text(""), Text("HANG (flight recorder)", style="bold underline")]
    parts.extend(Padding(Text(inert(line)), (0, 0, 0, 2)) for line in hang_lines(hang))
    rows = grid_rows(hang)
    if rows:
        parts.append(Text(""))
        parts.extend(Text("  " + inert(row), no_wrap=True, overflow="ignore") for row in rows)
    return parts


def _launch_texts(report: Report, verbose: bool) -> list[Text]:
    """Replay's launch note for a fix that needs more GPUs ("launch with world size 8 (torchrun: ...)"), then the
    torchrun and srun lines (``rendered["torchrun"]`` / ``["srun"]``); in the default report one line, so that it
    stays within a screen."""
    render = report.replay.rendered if report.replay is not None else {}
    launch = render.get("launch")
    if not launch or not launch.strip():
        return []
    commands = {name: render[name] for name in ("torchrun", "srun")
                if isinstance(render.get(name), str) and render[name].strip()}
    if verbose or "torchrun" not in commands:  # the note, then each launcher's line
        lines = [("    Launch      ", launch.lstrip("# "))]
        lines += [(f"    {name:<12}", cmd) for name, cmd in commands.items()]
    else:
        srun = commands.get("srun", "").replace("srun ", "", 1).replace(" TRAIN_SCRIPT [ARGS...]", "")
        lines = [("    Launch      ", commands["torchrun"] + (f"  (srun: {srun})" if srun else ""))]
    return [command_text(label, inert(text), style="bold") for label, text in lines]


def _replay_says_nothing(replay: Any) -> bool:
    """Replay of a failure that is no config check (a launcher, an import, NCCL), with no config key in its fix and no
    memory question: "the job's config passes validation; fix passes validation: export NCCL_DEBUG=INFO" proves
    nothing a user can act on (an unsloth or DeepSpeed job's env var checked against Megatron-Bridge defaults).
    Left out of the default report; -v and JSON keep it."""
    return (replay.category not in CONFIG_CATEGORIES and replay.fits is None and replay.reproduced is not True
            and not any(not o.key.startswith(("env.", "launch.")) for o in replay.fix))


def _summaries(report: Report, width: int) -> list[Any]:
    """One short paragraph per section: what replay proved, what the memory model says, what config was read."""
    out: list[Any] = []
    memory, config = report.memory, report.config
    lines: list[tuple[str, str]] = []
    if (report.replay is not None and report.replay.summary and not _replay_says_nothing(report.replay)
            and replay_speaks_to(fix_style(report.framework, report.stack))):
        lines.append(("Replay", replay_summary(report.replay, fix_style(report.framework, report.stack))))
    if memory is not None and memory.explanation:
        lines.append(("Memory", memory.explanation))
    if config is not None:
        values = config.values if config.known() else {}
        known = [k for k, v in values.items() if v.origin != "default"]
        bits = [f"release {config.version}" if config.version else "",
                f"{len(known)} value{'s' if len(known) != 1 else ''} from the job, {len(values) - len(known)} at "
                "release defaults" if values else NOTHING_RECOVERED,
                ", ".join(config.sources[:3])]
        lines.append(("Config", "; ".join(b for b in bits if b)))
    s = report.slurm
    if s is not None:
        words = [f"job {s.job_id}", s.state, f"exit code {s.exit_code}" if s.exit_code is not None else "",
                 f"signal {s.signal}" if s.signal else "", f"on {s.nodes}" if s.nodes else "",
                 f"after {s.elapsed}" if s.elapsed else ""]
        lines.append(("Slurm", " ".join(w for w in words if w) + " (-v for the steps and outputs)"))
    for title, body in lines:
        out.append(Text(""))
        out.append(Text(title.upper(), style="bold underline"))
        out.extend(Text(w) for w in wrap_paragraphs(inert(body), width, "  "))
    return out


def _quiet(report: Report) -> list[Any]:
    """-q: the root cause, its first evidence line and the fix command; "No failure found." otherwise. A warning
    (logs of different jobs read as one, an archive cut short, a rule stopped by its timeout) follows either: it says
    how far the answer can be trusted."""
    warned = [Text("  warning: ", style="bold yellow").append(inert(w), style="") for w in report.warnings]
    root = report.root
    if root is None:
        return [Text("No failure found.", style="bold green"), *warned]
    head = Text()
    head.append(f"{inert(root.rule)}  ", style="bold")
    head.append(inert(root.title))
    w = where(root)
    if w:
        head.append(f"  ({inert(w)})", style="dim")
    out: list[Any] = [head]
    if (e := root.headline_evidence) is not None:
        out.append(log_text(f"  {e.path}:{e.line}: {shorten(inert(e.text), 200)}"))
    fix = root.shown_fix
    words = fix_words(fix, fix_style(report.framework, report.stack))
    out.extend(command_text("  fix: ", inert(c), style="bold") for c in words.commands)
    out.extend(command_text("  fix: ", inert(env_line(var.name, var.value)), style="bold") for var in fix.env)
    if not words.commands and not fix.env and (said := fix.summary or (words.steps[0] if words.steps else "")):
        out.append(Text("  fix: " + inert(said)))
    return out + warned


def _per_job(report: Report, width: int, detail: str) -> list[Any]:
    """Inputs of several jobs: a line saying so, then each job's own report under a ``JOB i of n`` rule."""
    n = len(report.jobs)
    parts: list[Any] = [Text(f"{n} jobs in these inputs: one report per job (exit code: the worst)",
                             style="bold")]
    for job in report.jobs:
        title = Text()
        title.append(f"{'=' * 3} {inert(job.label).upper().split(':', 1)[0]}:", style="bold reverse")
        title.append(" " + inert(job.label.split(": ", 1)[-1]), style="bold")
        parts += [Text(""), title]
        parts += renderables(job.report, width, detail)
    return parts


def finding_label(f: Finding) -> str:
    """ERROR / WARNING / INFO, except CONTEXT for a finding whose rule says it only explains the root cause (an
    ``error``-severity Slurm line in the context role used to print as a second ERROR)."""
    return "CONTEXT" if f.role == "context" else f.severity.upper()


def _severity_style(severity: str) -> str:
    return {"error": "bold red", "warning": "bold yellow"}.get(severity, "bold blue")


def render(report: Report, console: Console, detail: str = "verbose") -> None:
    # crop=False: lines marked no_wrap (commands, code, YAML) run past the width instead of being cut; everything
    # else is laid out within the width and printed without trailing blanks.
    parts = [p if isinstance(p, Text) and p.no_wrap else _RStripped(p)
             for p in renderables(report, console.width, detail)]
    console.print(Group(*parts), soft_wrap=False, highlight=False, markup=False, crop=False)


class _Console(Console):
    """rich's Console, except that a closed pipe raises BrokenPipeError for the command to handle: rich's own
    answer, ``SystemExit(1)``, made ``analyze clean.log | true`` say "failure diagnosed" (exit 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(32, "Broken pipe")


def make_console(file, color: str = "auto", width: int | None = None) -> Console:
    """A console honouring ``--color`` (auto/always/never) and NO_COLOR (which ``auto`` respects)."""
    import os

    # Piped or redirected output is laid out at $COLUMNS when set (rich reads it), else 100 columns; a terminal at
    # its own width. A fixed 100 used to cut regexes, paths and timestamps mid-token whatever COLUMNS said.
    columns = os.environ.get("COLUMNS", "")
    piped_width = width or (None if columns.isdigit() and int(columns) > 0 else 100)
    if color == "always":
        return _Console(file=file, force_terminal=True, color_system="standard", width=piped_width,
                       highlight=False, emoji=False)
    if color == "never" or os.environ.get("NO_COLOR"):
        return _Console(file=file, no_color=True, color_system=None, width=piped_width, highlight=False,
                       emoji=False, force_terminal=False)
    is_tty = hasattr(file, "isatty") and file.isatty()
    return _Console(file=file, width=width if width or is_tty else piped_width, highlight=False, emoji=False)
