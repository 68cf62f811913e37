"""``diagnose slurm``: diagnose a Slurm job by id, follow a running one, or list recent failed jobs.

Exit codes: 0 no failure found, 1 a failure diagnosed (or failed jobs listed), 2 usage/input error.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, TextIO

from diagnose.model import DiagnoseError, Report

MAX_LISTED = 50  # --failed diagnoses at most this many jobs (newest first)


def run(args: Any) -> int:
    from diagnose.ingest.slurm import parse_job_id
    from diagnose.pipeline import AnalyzeOptions

    options = AnalyzeOptions(rules_dirs=list(getattr(args, "rules", []) or []))
    if args.failed:
        if args.jobid:
            raise DiagnoseError("give either a JOBID or --failed, not both")
        return _list_failed(args, options)
    if not args.jobid:
        raise DiagnoseError("give a JOBID (e.g. diagnose slurm 123456), or --failed to list recent failed jobs")
    ref = parse_job_id(args.jobid, args.step)
    if args.follow:
        return _follow(ref, args, options)
    from diagnose.ingest.slurm.diagnosis import diagnose_job

    diagnosis = diagnose_job(ref, options)
    with _output(args) as out:
        _emit(diagnosis.report, args, out)
    return 1 if diagnosis.report.root_cause is not None else 0


# --------------------------------------------------------------------------------------------- output


@contextmanager
def _output(args: Any) -> Iterator[TextIO]:
    path = getattr(args, "output", None)
    if not path:
        yield sys.stdout
        return
    try:
        fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as e:
        raise DiagnoseError(f"--output {path}: {e.strerror}") from None
    with fh:
        yield fh


def _console(args: Any, out: TextIO):
    from rich.console import Console

    color = getattr(args, "color", "auto")
    no_color = color == "never" or (color == "auto" and "NO_COLOR" in os.environ)
    return Console(
        file=out,
        force_terminal=True if color == "always" else None,
        no_color=no_color,
        highlight=False,
        soft_wrap=True,
        emoji=False,
        markup=False,
    )


def _emit(report: Report, args: Any, out: TextIO) -> None:
    fmt = getattr(args, "format", "text")
    if fmt == "json":
        json.dump(report.to_dict(), out, indent=2)
        out.write("\n")
    elif fmt == "markdown":
        out.write(render_markdown(report))
    else:
        render_text(report, _console(args, out))


def render_text(report: Report, console: Any) -> None:
    """The Slurm header, then the findings, root cause first. Everything from Slurm or a log is made inert."""
    from rich.text import Text

    from diagnose.present.safe import log_text

    s = report.slurm or {}
    if s:
        header = Text()
        header.append("Slurm job ", style="bold")
        header.append_text(log_text(f"{s.get('job_id')} ({s.get('name') or '?'}, user {s.get('user') or '?'})"))
        header.append(": ")
        header.append_text(log_text(_state_words(s), style="bold red" if report.root_cause is not None else "green"))
        console.print(header)
        console.print(log_text(_facts_line(s)))
        if s.get("failed_step"):
            console.print(log_text(f"failed step: {s['failed_step']}"))
        for o in s.get("outputs") or []:
            line = f"output ({o['stream']}): {o['path']}"
            line += f"  [found via {s.get('output_route')}]" if s.get("output_route") else ""
            if o.get("problem"):
                line += f"  - {o['problem']}"
            console.print(log_text(line, style="yellow" if o.get("problem") else ""))
        console.print()
    root = report.root
    if root is None:
        console.print(Text("No failure found in the output.", style="green"))
    else:
        title = Text("Root cause ", style="bold")
        title.append_text(log_text(f"[{root.rule}] {root.title}", style="bold red"))
        console.print(title)
        for ev in root.evidence[:6]:
            console.print(log_text(f"  {ev.path}:{ev.line}: {ev.text}", style="dim", limit=300))
        if root.explanation:
            console.print(log_text("  " + " ".join(root.explanation.split()), limit=600))
        if not root.fix.empty:
            if root.fix.summary:
                console.print(log_text(f"  fix: {root.fix.summary}", style="cyan"))
            for o in root.fix.overrides:
                console.print(log_text(f"    {o.key}={json.dumps(o.value)}", style="cyan"))
            for step in root.fix.steps:
                console.print(log_text(f"    - {step}", style="cyan"))
    others = [f for i, f in enumerate(report.findings) if i != report.root_cause]
    if others:
        console.print()
        console.print(Text("Other findings", style="bold"))
        for f in others:
            where = f" ({f.evidence[0].path}:{f.evidence[0].line})" if f.evidence else ""
            console.print(log_text(f"  {f.role:<8} [{f.rule}] {f.title}{where}", limit=300))
    for w in report.warnings:
        console.print(log_text(f"warning: {w}", style="yellow"))


def _state_words(s: dict[str, Any]) -> str:
    state = s.get("state") or "?"
    if state == "CANCELLED" and s.get("cancelled_by"):
        state += f" by {s['cancelled_by']}"
    if s.get("signal"):
        state += f", killed by {s['signal']}"
    elif s.get("exit_code"):
        state += f", exit code {s['exit_code']}"
    if s.get("derived_exit_code"):
        state += f" (DerivedExitCode {s['derived_exit_code']})"
    return state


def _facts_line(s: dict[str, Any]) -> str:
    parts = [f"nodes {s.get('nodes') or '?'}"]
    if s.get("elapsed"):
        parts.append(f"elapsed {s['elapsed']} of {s.get('time_limit') or '?'}")
    if s.get("restarts"):
        parts.append(f"requeued {s['restarts']}x")
    parts.append(f"from {s.get('source')}")
    return ", ".join(parts)


def render_markdown(report: Report) -> str:
    from diagnose.present.safe import inert

    s = report.slurm or {}
    lines = [f"# Slurm job {inert(str(s.get('job_id')))}: {inert(_state_words(s))}", ""]
    lines.append(f"- {inert(_facts_line(s))}")
    for o in s.get("outputs") or []:
        lines.append(f"- output ({o['stream']}): `{inert(o['path'])}` via {inert(str(s.get('output_route')))}"
                     + (f" ({inert(o['problem'])})" if o.get("problem") else ""))
    lines.append("")
    root = report.root
    lines.append(f"## Root cause: [{root.rule}] {inert(root.title)}" if root else "## No failure found")
    if root:
        lines += ["", "```"] + [inert(f"{e.path}:{e.line}: {e.text}") for e in root.evidence[:6]] + ["```"]
    for i, f in enumerate(report.findings):
        if i != report.root_cause:
            lines.append(f"- {f.role} [{f.rule}] {inert(f.title)}")
    for w in report.warnings:
        lines.append(f"- warning: {inert(w)}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- --failed


def _list_failed(args: Any, options: Any) -> int:
    from rich.table import Table

    from diagnose.ingest.slurm import list_failed_jobs, parse_job_id
    from diagnose.ingest.slurm.diagnosis import diagnose_job
    from diagnose.pipeline import AnalyzeOptions
    from diagnose.present.safe import log_text

    jobs = list_failed_jobs(since=args.since, user=args.user)
    quick = AnalyzeOptions(rules_dirs=options.rules_dirs, replay=False)
    rows: list[dict[str, Any]] = []
    for summary in jobs[:MAX_LISTED]:
        try:
            report = diagnose_job(parse_job_id(summary.job_id), quick).report
            root = report.root
            line = one_line_diagnosis(report)
            outputs = [o["path"] for o in (report.slurm or {}).get("outputs", [])]
        except DiagnoseError as e:
            line, outputs = f"could not diagnose: {e}", []
        rows.append({"job_id": summary.job_id, "name": summary.name, "user": summary.user,
                     "state": summary.state_text(), "end": summary.end, "diagnosis": line, "outputs": outputs})
    with _output(args) as out:
        if args.format == "json":
            json.dump({"since": args.since, "jobs": rows, "truncated": len(jobs) > MAX_LISTED}, out, indent=2)
            out.write("\n")
        elif args.format == "markdown":
            from diagnose.present.safe import inert

            out.write("| job | name | state | end | diagnosis |\n| --- | --- | --- | --- | --- |\n")
            for r in rows:
                cells = [inert(str(r[k])).replace("|", "\\|") for k in ("job_id", "name", "state", "end", "diagnosis")]
                out.write("| " + " | ".join(cells) + " |\n")
        else:
            console = _console(args, out)
            if not rows:
                console.print(log_text(f"No failed jobs since {args.since}."))
            else:
                table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
                for col in ("JOBID", "NAME", "STATE", "END", "DIAGNOSIS"):
                    table.add_column(col, overflow="fold")
                for r in rows:
                    table.add_row(*(log_text(str(r[k]), limit=200) for k in ("job_id", "name", "state", "end", "diagnosis")))
                console.print(table)
            if len(jobs) > MAX_LISTED:
                console.print(log_text(f"... and {len(jobs) - MAX_LISTED} older ones (narrow --since)"))
    return 1 if rows else 0


def one_line_diagnosis(report: Report) -> str:
    """``[RULE] title``; for a catch-all rule (category other) the evidence line says more than the title."""
    root = report.root
    if root is None:
        return "no failure found in the output"
    line = f"[{root.rule}] {root.title}"
    if root.category == "other" and root.evidence:
        text = " ".join(root.evidence[0].text.split())
        line += ": " + (text if len(text) <= 120 else text[:119] + "…")
    return line


# ------------------------------------------------------------------------------------------- --follow


def _follow(ref: Any, args: Any, options: Any) -> int:
    from diagnose.ingest.slurm.follow import follow_job
    from diagnose.present.safe import inert_block

    text_mode = args.format == "text" and not args.output

    def show(chunk: str) -> None:
        if text_mode:
            sys.stdout.write(inert_block(chunk))
            sys.stdout.flush()

    result = follow_job(ref, options, on_text=show)
    if text_mode:
        print(f"\n--- stopped following: {result.stopped_because} after {result.seconds:.0f} s ---", flush=True)
    with _output(args) as out:
        _emit(result.diagnosis.report, args, out)
    return 1 if result.diagnosis.report.root_cause is not None else 0
