"""``diagnose slurm``: diagnose a Slurm job by id, follow a running one, or list recent failed jobs.

Exit codes: 0 no failure found, 1 a failure diagnosed (or failed jobs listed), 2 usage/input error.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, TextIO

from diagnose.model import DiagnoseError, Report, SlurmFacts
from diagnose.present import json_text
from diagnose.present.output import output_stream
from diagnose.present.text import make_console
from diagnose.units import format_bytes

MAX_LISTED = 50  # --failed diagnoses at most this many jobs (newest first)
# --failed's text table: a job name is cut to this many characters (its escaped form, ending in "…") so that a long
# name does not push the other columns right; --parsable, --fields, JSON and markdown keep the whole name
NAME_WIDTH = 32


def run(args: Any) -> int:
    from diagnose.ingest.slurm import parse_job_id
    from diagnose.pipeline import AnalyzeOptions

    options = AnalyzeOptions(rules_dirs=list(getattr(args, "rules", []) or []))
    if args.failed:
        if args.jobid:
            raise DiagnoseError("give either a JOBID or --failed, not both")
        return _list_failed(args, options)
    for option in ("fields", "parsable", "noheader"):
        if getattr(args, option, None):
            raise DiagnoseError(f"--{option} goes with --failed (the list of failed jobs)")
    if not args.jobid:
        raise DiagnoseError("give a JOBID (e.g. diagnose slurm 123456), or --failed to list recent failed jobs")
    ref = parse_job_id(args.jobid, args.step)
    if args.follow:
        return _follow(ref, args, options)
    from diagnose.slurm_diagnosis import diagnose_job

    diagnosis = diagnose_job(ref, options)
    with output_stream(getattr(args, "output", None)) as out:
        _emit(diagnosis.report, args, out)
    return 1 if diagnosis.report.root_cause is not None else 0


# --------------------------------------------------------------------------------------------- output


def _emit(report: Report, args: Any, out: TextIO) -> None:
    """JSON: the shared report (with its "slurm" section). Text and markdown: a compact Slurm header, then the
    shared renderer on the same report minus the raw "slurm" mapping (the header already says it)."""
    fmt = getattr(args, "format", "text")
    body = dataclasses.replace(report, slurm=None)
    if fmt == "json":
        from diagnose.present.json_report import render_json

        out.write(render_json(report))
    elif fmt == "markdown":
        from diagnose.inert import no_ci_commands
        from diagnose.present.markdown import render_markdown

        out.write(no_ci_commands(slurm_markdown(report.slurm) + "\n" + render_markdown(body)))
    else:
        from diagnose.present.output import NoCICommands
        from diagnose.present.text import render

        safe = NoCICommands(out)
        console = make_console(safe, getattr(args, "color", "auto"))
        for line in slurm_header(report.slurm, failed=report.root_cause is not None):
            console.print(line, soft_wrap=True)  # paths stay on one line, copyable
        console.print()
        render(body, console)
        safe.flush()


def slurm_header(s: SlurmFacts | None, failed: bool) -> list[Any]:
    """What Slurm says about the job, as rich Text lines; every value is made inert."""
    from rich.text import Text

    from diagnose.ingest.slurm.parse import not_ended
    from diagnose.present.safe import log_text

    if s is None:
        return []
    head = Text()
    head.append("SLURM JOB ", style="bold underline")
    head.append_text(log_text(f"{s.job_id} ({s.name or '?'}, user {s.user or '?'}): "))
    head.append_text(log_text(_state_words(s), style="bold red" if failed else "bold green"))
    lines = [head, log_text("  " + _facts_line(s))]
    usage = usage_line(s)
    if usage:
        lines.append(log_text("  " + usage))
    if s.failed_step:
        lines.append(log_text(f"  failed step: {s.failed_step}"))
    for o in s.outputs:
        line = f"  output ({o.stream}): {o.path}"
        line += f"  [found via {s.output_route}]" if s.output_route else ""
        if o.problem:
            line += f" - {o.problem}"
        lines.append(log_text(line, style="yellow" if o.problem else ""))
    tasks = task_outputs_line(s)
    if tasks:
        lines.append(log_text("  " + tasks))
    if not failed and not_ended(s.state):
        # "No failure found." on a running job reads as a verdict: it is the log so far
        lines.append(log_text(f"  not ended yet ({s.state}): what follows is its log so far; 'diagnose slurm "
                              f"{s.job_id} --follow' reports the first failure the moment it appears",
                              style="yellow"))
    return lines


def task_outputs_line(s: SlurmFacts) -> str:
    """One line for srun's per-task/per-node files: "per-task outputs: 128 of 1024 read (logs/%j-%t.out, via ...)"."""
    files = s.task_outputs
    if not files:
        return ""
    found = s.task_outputs_found or len(files)
    ranks = sorted({t.rank for t in files if t.rank is not None})
    text = f"per-task outputs: {len(files)} read" + (f" of {found} found" if found > len(files) else "")
    if ranks:
        from diagnose.model import rank_runs

        text += f", ranks {','.join(rank_runs(ranks))}"
    patterns = ", ".join(str(p) for p in s.task_patterns[:3])
    via = s.task_route
    if patterns or via:
        text += " (" + ", ".join(x for x in (patterns, f"found via {via}" if via else "") if x) + ")"
    return text


def _state_words(s: SlurmFacts) -> str:
    state = s.state or "?"
    if state == "CANCELLED" and s.cancelled_by:
        state += f" by {s.cancelled_by}"
    if s.launch_failed:  # nothing ran: the signal Slurm records (0:53) killed no program
        state += ", the batch step failed to launch (JobLaunchFailure)"
    elif s.signal:
        state += f", killed by {s.signal}"
    elif s.exit_code:
        state += f", exit code {s.exit_code}"
    if s.derived_exit_code:
        state += f" (DerivedExitCode {s.derived_exit_code})"
    return state


def usage_line(s: SlurmFacts) -> str:
    """seff's figures in one line: "usage: 2 nodes, 16 GPUs, MaxRSS 12.50 GiB, CPU efficiency 8.3 %, 4.27
    GPU-hours lost"; what sacct did not record is left out ("" when nothing is)."""
    parts = []
    if s.nnodes is not None:
        parts.append(f"{s.nnodes} node{'s' if s.nnodes != 1 else ''}")
    if s.gpus is not None:
        parts.append(f"{s.gpus} GPU{'s' if s.gpus != 1 else ''}")
    if s.max_rss_bytes is not None:
        parts.append(f"MaxRSS {format_bytes(s.max_rss_bytes)}")
    if s.cpu_efficiency is not None:
        parts.append(f"CPU efficiency {100 * s.cpu_efficiency:.1f} %")
    if s.gpu_hours is not None and s.gpus:
        parts.append(f"{s.gpu_hours:.2f} GPU-hours {'lost' if s.state not in ('COMPLETED', '') else 'used'}")
    return "usage: " + ", ".join(parts) if parts else ""


def _facts_line(s: SlurmFacts) -> str:
    parts = [f"nodes {s.nodes or '?'}"]
    if s.elapsed:
        parts.append(f"elapsed {s.elapsed} of {s.time_limit or '?'}")
    if s.restarts:
        parts.append(f"requeued {s.restarts}x")
    parts.append(f"from {s.source}")
    return ", ".join(parts)


def slurm_markdown(s: SlurmFacts | None) -> str:
    from diagnose.present.markdown import md_code
    from diagnose.present.safe import inert

    if s is None:
        return ""
    lines = [f"## Slurm job {inert(str(s.job_id))}: {inert(_state_words(s))}", "", f"- {inert(_facts_line(s))}"]
    if usage_line(s):
        lines.append(f"- {inert(usage_line(s))}")
    if s.failed_step:
        lines.append(f"- failed step: {md_code(s.failed_step)}")
    lines.extend(f"- output ({o.stream}): {md_code(o.path)} via {inert(str(s.output_route))}"
                 + (f" ({inert(o.problem)})" if o.problem else "") for o in s.outputs)
    tasks = task_outputs_line(s)
    if tasks:
        lines.append(f"- {inert(tasks)}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- --failed


LISTED_TASK_FILES = 16  # per job in `slurm --failed`; `slurm JOBID` reads up to 128


# --fields (sacct's -o/--format): the field name as sacct spells it -> the key of a --failed row
FAILED_FIELDS = {
    "JobID": "job_id", "JobName": "name", "User": "user", "State": "state", "ExitCode": "exit_code",
    "Start": "start", "End": "end", "Elapsed": "elapsed", "Timelimit": "time_limit", "NNodes": "nnodes",
    "NodeList": "nodes", "GPUs": "gpus", "MaxRSS": "max_rss", "CPUEff": "cpu_efficiency",
    "GPUHoursLost": "gpu_hours_lost", "WorkDir": "work_dir", "RootCause": "root_cause", "Category": "category",
    "Diagnosis": "diagnosis", "Log": "log",
}  # fmt: skip
FAILED_COLUMNS = tuple((name, FAILED_FIELDS[name]) for name in ("JobID", "JobName", "User", "State", "End",
                                                                 "Diagnosis"))


def parse_fields(text: str) -> list[tuple[str, str, int | None]]:
    """``--fields JobID,jobname%30,MaxRSS`` -> [(name, row key, width)]: names as sacct takes them (any case, an
    optional ``%WIDTH``); an unknown one is an error with a did-you-mean."""
    import difflib
    import re

    from diagnose.present.safe import inert

    by_lower = {n.lower(): n for n in FAILED_FIELDS}
    out = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        m = re.fullmatch(r"([A-Za-z]+)(?:%(\d{1,3}))?", item)
        name = by_lower.get(m.group(1).lower()) if m else None
        if name is None or m is None:
            close = difflib.get_close_matches(item.split("%")[0].lower(), list(by_lower), n=1, cutoff=0.6)
            hint = f"did you mean {by_lower[close[0]]}?" if close else "fields: " + ",".join(FAILED_FIELDS)
            raise DiagnoseError(f"--fields: unknown field {inert(item[:40])!r} ({hint})")
        out.append((name, FAILED_FIELDS[name], int(m.group(2)) if m.group(2) else None))
    if not out:
        raise DiagnoseError("--fields: name at least one field, e.g. --fields JobID,State,RootCause")
    return out


def _refuse_fields_as_output(output: str | None) -> None:
    """sacct's habit, ``-o JobID,State``, would write the list to a file named ``JobID,State``: here ``-o`` is
    ``--output``. A value made only of field names (and no such file) is refused with the option to use."""
    import os
    import re

    if not output or os.path.exists(output):
        return
    names = {n.lower() for n in FAILED_FIELDS}
    tokens = [re.sub(r"%\d+$", "", t.strip()).lower() for t in output.split(",")]
    if tokens and all(t in names for t in tokens):
        raise DiagnoseError(f"-o/--output writes the list to a file; for sacct's -o (the columns) use --fields "
                            f"{output[:80]}")


def failed_parsable(rows: list[dict[str, Any]], parsable: bool, header: bool,
                    fields: list[tuple[str, str, int | None]] | None = None) -> str:
    """sacct's ``--parsable2`` / ``--noheader`` / ``-o`` for ``--failed``: ``|``-separated fields (a ``|`` inside a
    value becomes ``/``), else space-padded columns (``%WIDTH`` fixes a column's width, cutting longer values, as
    sacct does), with the header line unless ``header`` is False. Values are inert."""
    from diagnose.present.safe import inert

    columns = fields or [(name, key, None) for name, key in FAILED_COLUMNS]
    table = [[inert(_cell(r.get(key), key)) for _, key, _ in columns] for r in rows]
    names = [name for name, _, _ in columns]
    if parsable:
        lines = (["|".join(names)] if header else []) + ["|".join(v.replace("|", "/") for v in t) for t in table]
        return "\n".join(lines) + ("\n" if lines else "")
    widths = [w if w is not None else max([len(names[i])] + [len(t[i]) for t in table])
              for i, (_, _, w) in enumerate(columns)]
    body = ([names] if header else []) + table
    lines = ["  ".join(v[:w].ljust(w) for v, w in zip(t, widths)).rstrip() for t in body]
    return "\n".join(lines) + ("\n" if lines else "")


def _cell(value: Any, key: str = "") -> str:
    """A --failed value as a table cell: "" for unknown, CPU efficiency in percent as seff prints it."""
    if value is None:
        return ""
    if key == "cpu_efficiency":
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def failed_json(since: str, rows: list[dict[str, Any]], truncated: bool) -> dict[str, Any]:
    """``--failed --format json``, schema ``diagnose/failed@1`` (``diagnose schema failed``)."""
    return {"schema": "diagnose/failed@1", "since": since, "jobs": rows, "truncated": truncated}


def failed_markdown(rows: list[dict[str, Any]], fields: list[tuple[str, str, int | None]] | None = None) -> str:
    """The ``--failed`` table in markdown (``--fields`` chooses the columns). Every cell is escaped like any
    markdown inline text: not only ``|`` but ``<img>``, ``@mentions``, ``**bold**`` and links, which job names and
    diagnoses can hold."""
    from diagnose.present.markdown import md_inline

    columns = [(name, key) for name, key, _ in fields] if fields else [
        ("job", "job_id"), ("name", "name"), ("state", "state"), ("end", "end"), ("diagnosis", "diagnosis")]
    out = ["| " + " | ".join(name for name, _ in columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for r in rows:
        cells = [md_inline(_cell(r.get(k), k)) for _, k in columns]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _failed_extras(summary: Any, root: Any, outputs: list[str]) -> dict[str, Any]:
    """The sacct and seff figures of a --failed row, and the root cause's code and category (``--fields``)."""
    from diagnose.ingest.slurm.parse import format_duration

    usage = summary.usage
    efficiency, lost = summary.cpu_efficiency, summary.gpu_hours_lost
    exit_code = "" if summary.exit_code is None else f"{summary.exit_code}:{_signal_number(summary.signal)}"
    return {
        "exit_code": exit_code, "start": summary.start,
        "elapsed": format_duration(summary.elapsed_s) if summary.elapsed_s is not None else None,
        "time_limit": format_duration(summary.time_limit_s), "nodes": summary.nodes, "work_dir": summary.work_dir,
        "nnodes": usage.nnodes, "gpus": usage.gpus, "max_rss_bytes": usage.max_rss_bytes,
        "max_rss": None if usage.max_rss_bytes is None else format_bytes(usage.max_rss_bytes),
        "cpu_efficiency": None if efficiency is None else round(efficiency, 4),
        "gpu_hours_lost": None if lost is None else round(lost, 3),
        "root_cause": root.rule if root is not None else None, "category": root.category if root is not None else None,
        "log": outputs[0] if outputs else None,
    }


def _signal_number(name: str | None) -> int:
    import signal

    if not name:
        return 0
    try:
        return int(signal.Signals[name])
    except KeyError:  # "signal 77": a number Python has no name for
        return int(name.split()[-1]) if name.split()[-1].isdigit() else 0


def _list_failed(args: Any, options: Any) -> int:
    from rich.text import Text

    from diagnose.ingest.slurm import list_failed_jobs
    from diagnose.pipeline import AnalyzeOptions
    from diagnose.present.safe import inert, log_text, shorten

    fields = parse_fields(args.fields) if getattr(args, "fields", None) else None  # before asking sacct
    _refuse_fields_as_output(getattr(args, "output", None))
    jobs = list_failed_jobs(since=args.since, user=args.user)
    quick = AnalyzeOptions(rules_dirs=options.rules_dirs, replay=False)
    rows: list[dict[str, Any]] = []
    for summary in jobs[:MAX_LISTED]:
        line, outputs, root = diagnose_listed(summary.job_id, quick)
        rows.append({"job_id": summary.job_id, "name": summary.name, "user": summary.user,
                     "state": summary.state_text(), "end": summary.end, "diagnosis": line, "outputs": outputs,
                     **_failed_extras(summary, root, outputs)})
    with output_stream(getattr(args, "output", None)) as out:
        if args.format == "json":
            out.write(json_text.dumps(failed_json(args.since, rows, len(jobs) > MAX_LISTED), indent=2))
            out.write("\n")
        elif args.format == "markdown":
            out.write(failed_markdown(rows, fields))
        else:
            console = make_console(out, getattr(args, "color", "auto"))
            if not rows:
                console.print(log_text(f"No failed jobs since {args.since}."))
            elif getattr(args, "parsable", False) or getattr(args, "noheader", False) or fields:
                out.write(failed_parsable(rows, bool(getattr(args, "parsable", False)),
                                          not getattr(args, "noheader", False), fields))
            else:  # one line per job, never wrapped: columns padded to the widest value
                cols = ("job_id", "name", "state", "end", "diagnosis")
                table = [[inert(str(r[k])) for k in cols] for r in rows]
                for c in table:
                    c[1] = shorten(c[1], NAME_WIDTH)  # cut after escaping: the cut never makes a control byte
                widths = [max(len(c[i]) for c in table + [["JOBID", "NAME", "STATE", "END", ""]]) for i in range(4)]
                header = "  ".join(h.ljust(w) for h, w in zip(("JOBID", "NAME", "STATE", "END"), widths))
                console.print(Text(header + "  DIAGNOSIS", style="bold"), soft_wrap=True)
                for c in table:
                    row = Text("  ".join(v.ljust(w) for v, w in zip(c[:4], widths)) + "  ")
                    row.append(c[4], style="red" if not c[4].startswith("no failure") else "green")
                    console.print(row, soft_wrap=True)
            if len(jobs) > MAX_LISTED:
                console.print(log_text(f"... and {len(jobs) - MAX_LISTED} older ones (narrow --since)"))
    return 1 if rows else 0


def diagnose_listed(job_id: str, quick: Any) -> tuple[str, list[str], Any]:
    """One job of the failed list (``--failed``, the TUI's job list): (one-line diagnosis, output files read, root
    cause finding or None); a job that cannot be diagnosed says why in the line."""
    from diagnose.ingest.slurm import lookup_job, parse_job_id
    from diagnose.slurm_diagnosis import diagnose_job

    try:
        if "[" in job_id:  # "123_[0-9]": array tasks cancelled before any of them started
            raise DiagnoseError("array tasks that never started")
        ref = parse_job_id(job_id)
        # many jobs: do not wait long for an incomplete sacct record, and read fewer per-task files per job
        # (rank 0 and the largest ones, where a failure's traceback makes the file grow)
        job = lookup_job(ref, settle_s=1.0, max_task_files=LISTED_TASK_FILES)
        report = diagnose_job(ref, quick, job=job).report
    except DiagnoseError as e:
        return f"could not diagnose: {e}", [], None
    outputs = [o.path for o in report.slurm.outputs] if report.slurm is not None else []
    return one_line_diagnosis(report), outputs, report.root


def one_line_diagnosis(report: Report) -> str:
    """``[RULE] title``; for a catch-all rule (category other) the evidence line says more than the title."""
    root = report.root
    outputs = report.slurm.outputs if report.slurm is not None else []
    gone = bool(outputs) and all(o.exists is False or o.readable is False for o in outputs)
    if root is None:
        return "no failure found in the output" if not gone else "log not found: nothing to read"
    line = f"[{root.rule}] {root.title}"
    head = root.headline_evidence
    if root.category == "other" and head is not None:
        text = " ".join(head.text.split())
        line += ": " + (text if len(text) <= 120 else text[:119] + "…")
    return line + (" (log not found: from Slurm's record only)" if gone else "")


# ------------------------------------------------------------------------------------------- --follow


def _follow(ref: Any, args: Any, options: Any) -> int:
    from diagnose.present.safe import inert_block
    from diagnose.slurm_follow import follow_job

    # The job's own output is shown live on stderr, like a progress display: stdout carries the report alone, so
    # `slurm JOB --follow > report.txt` (or `| jq` with --format json) gets the report and nothing else.
    live = sys.stderr

    def show(chunk: str) -> None:
        if live is not None:
            live.write(inert_block(chunk))
            live.flush()

    def started(job: Any) -> None:
        # before the first wait: what is followed, and why nothing may show (a FIFO, a refused or unreadable file)
        if live is None:
            return
        what = ", ".join(o.path for o in job.outputs) or "no output file"
        print(inert_block(f"--- following job {job.job_id} ({job.state or '?'}): {what} ---"), file=live, flush=True)
        for o in job.outputs:
            if o.problem and o.exists:
                print(inert_block(f"--- {o.path} {o.problem}: not shown; the report comes when the job ends ---"),
                      file=live, flush=True)

    result = follow_job(ref, options, on_text=show, on_start=started)
    if live is not None:
        print(f"\n--- stopped following: {result.stopped_because} after {result.seconds:.0f} s ---", file=live,
              flush=True)
    with output_stream(getattr(args, "output", None)) as out:
        _emit(result.diagnosis.report, args, out)
    return 1 if result.diagnosis.report.root_cause is not None else 0
