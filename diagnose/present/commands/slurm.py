"""``diagnose slurm``: diagnose a Slurm job by id, follow a running one, or list recent failed jobs.

Exit codes: 0 no failure found, 1 a failure diagnosed (or failed jobs listed), 2 usage/input error.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from diagnose.model import DiagnoseError, Report, SlurmFacts

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
    from diagnose.present.output import output_stream

    with output_stream(getattr(args, "output", None)) as fh:
        yield fh


def _console(args: Any, out: TextIO):
    from diagnose.present.text import make_console

    return make_console(out, getattr(args, "color", "auto"))


def _emit(report: Report, args: Any, out: TextIO) -> None:
    """JSON: the shared report (with its "slurm" section). Text and markdown: a compact Slurm header, then the
    shared renderer on the same report minus the raw "slurm" mapping (the header already says it)."""
    fmt = getattr(args, "format", "text")
    body = dataclasses.replace(report, slurm=None)
    if fmt == "json":
        from diagnose.present.json_report import render_json

        out.write(render_json(report))
    elif fmt == "markdown":
        from diagnose.present.markdown import render_markdown

        out.write(slurm_markdown(report.slurm) + "\n" + render_markdown(body))
    else:
        from diagnose.present.text import render

        console = _console(args, out)
        for line in slurm_header(report.slurm, failed=report.root_cause is not None):
            console.print(line, soft_wrap=True)  # paths stay on one line, copyable
        console.print()
        render(body, console)


def slurm_header(s: SlurmFacts | None, failed: bool) -> list[Any]:
    """What Slurm says about the job, as rich Text lines; every value is made inert."""
    from rich.text import Text

    from diagnose.present.safe import log_text

    if s is None:
        return []
    head = Text()
    head.append("SLURM JOB ", style="bold underline")
    head.append_text(log_text(f"{s.job_id} ({s.name or '?'}, user {s.user or '?'}): "))
    head.append_text(log_text(_state_words(s), style="bold red" if failed else "bold green"))
    lines = [head, log_text("  " + _facts_line(s))]
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
    if s.signal:
        state += f", killed by {s.signal}"
    elif s.exit_code:
        state += f", exit code {s.exit_code}"
    if s.derived_exit_code:
        state += f" (DerivedExitCode {s.derived_exit_code})"
    return state


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
    if s.failed_step:
        lines.append(f"- failed step: {md_code(s.failed_step)}")
    for o in s.outputs:
        lines.append(f"- output ({o.stream}): {md_code(o.path)} via {inert(str(s.output_route))}"
                     + (f" ({inert(o.problem)})" if o.problem else ""))
    tasks = task_outputs_line(s)
    if tasks:
        lines.append(f"- {inert(tasks)}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- --failed


LISTED_TASK_FILES = 16  # per job in `slurm --failed`; `slurm JOBID` reads up to 128


FAILED_COLUMNS = (("JobID", "job_id"), ("JobName", "name"), ("User", "user"), ("State", "state"), ("End", "end"),
                  ("Diagnosis", "diagnosis"))


def failed_parsable(rows: list[dict[str, Any]], parsable: bool, header: bool) -> str:
    """sacct's ``--parsable2`` / ``--noheader`` for ``--failed``: ``|``-separated fields (a ``|`` inside a value
    becomes ``/``), or with only ``--noheader`` space-padded columns without the header line. Values are inert."""
    from diagnose.present.safe import inert

    table = [[inert(str(r.get(key) or "")) for _, key in FAILED_COLUMNS] for r in rows]
    names = [name for name, _ in FAILED_COLUMNS]
    if parsable:
        lines = (["|".join(names)] if header else []) + ["|".join(v.replace("|", "/") for v in t) for t in table]
    else:
        widths = [max([len(n) for n in names[i:i + 1]] + [len(t[i]) for t in table]) for i in range(len(names) - 1)]
        lines = ["  ".join(v.ljust(w) for v, w in zip(t[:-1], widths)) + "  " + t[-1] for t in table]
    return "\n".join(lines) + ("\n" if lines else "")


def failed_json(since: str, rows: list[dict[str, Any]], truncated: bool) -> dict[str, Any]:
    """``--failed --format json``, schema ``diagnose/failed@1`` (``diagnose schema failed``)."""
    return {"schema": "diagnose/failed@1", "since": since, "jobs": rows, "truncated": truncated}


def failed_markdown(rows: list[dict[str, Any]]) -> str:
    """The ``--failed`` table in markdown. Every cell is escaped like any markdown inline text: not only ``|``
    but ``<img>``, ``@mentions``, ``**bold**`` and links, which job names and diagnoses can hold."""
    from diagnose.present.markdown import md_inline

    out = ["| job | name | state | end | diagnosis |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        cells = [md_inline(str(r[k])) for k in ("job_id", "name", "state", "end", "diagnosis")]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _list_failed(args: Any, options: Any) -> int:
    from rich.text import Text

    from diagnose.ingest.slurm import list_failed_jobs, lookup_job, parse_job_id
    from diagnose.ingest.slurm.diagnosis import diagnose_job
    from diagnose.pipeline import AnalyzeOptions
    from diagnose.present.safe import inert, log_text

    jobs = list_failed_jobs(since=args.since, user=args.user)
    quick = AnalyzeOptions(rules_dirs=options.rules_dirs, replay=False)
    rows: list[dict[str, Any]] = []
    for summary in jobs[:MAX_LISTED]:
        try:
            if "[" in summary.job_id:  # "123_[0-9]": array tasks cancelled before any of them started
                raise DiagnoseError("array tasks that never started")
            ref = parse_job_id(summary.job_id)
            # many jobs: do not wait long for an incomplete sacct record, and read fewer per-task files per job
            # (rank 0 and the largest ones, where a failure's traceback makes the file grow)
            job = lookup_job(ref, settle_s=1.0, max_task_files=LISTED_TASK_FILES)
            report = diagnose_job(ref, quick, job=job).report
            line = one_line_diagnosis(report)
            outputs = [o.path for o in report.slurm.outputs] if report.slurm is not None else []
        except DiagnoseError as e:
            line, outputs = f"could not diagnose: {e}", []
        rows.append({"job_id": summary.job_id, "name": summary.name, "user": summary.user,
                     "state": summary.state_text(), "end": summary.end, "diagnosis": line, "outputs": outputs})
    with _output(args) as out:
        if args.format == "json":
            json.dump(failed_json(args.since, rows, len(jobs) > MAX_LISTED), out, indent=2)
            out.write("\n")
        elif args.format == "markdown":
            out.write(failed_markdown(rows))
        else:
            console = _console(args, out)
            if not rows:
                console.print(log_text(f"No failed jobs since {args.since}."))
            elif getattr(args, "parsable", False) or getattr(args, "noheader", False):
                out.write(failed_parsable(rows, bool(getattr(args, "parsable", False)),
                                          not getattr(args, "noheader", False)))
            else:  # one line per job, never wrapped: columns padded to the widest value
                cols = ("job_id", "name", "state", "end", "diagnosis")
                table = [[inert(str(r[k])) for k in cols] for r in rows]
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


def one_line_diagnosis(report: Report) -> str:
    """``[RULE] title``; for a catch-all rule (category other) the evidence line says more than the title."""
    root = report.root
    outputs = report.slurm.outputs if report.slurm is not None else []
    gone = bool(outputs) and all(o.exists is False or o.readable is False for o in outputs)
    if root is None:
        return "no failure found in the output" if not gone else "log not found: nothing to read"
    line = f"[{root.rule}] {root.title}"
    if root.category == "other" and root.evidence:
        text = " ".join(root.evidence[0].text.split())
        line += ": " + (text if len(text) <= 120 else text[:119] + "…")
    return line + (" (log not found: from Slurm's record only)" if gone else "")


# ------------------------------------------------------------------------------------------- --follow


def _follow(ref: Any, args: Any, options: Any) -> int:
    from diagnose.ingest.slurm.follow import follow_job
    from diagnose.present.safe import inert_block

    # The job's own output is shown live on stderr, like a progress display: stdout carries the report alone, so
    # `slurm JOB --follow > report.txt` (or `| jq` with --format json) gets the report and nothing else.
    live = sys.stderr

    def show(chunk: str) -> None:
        if live is not None:
            live.write(inert_block(chunk))
            live.flush()

    result = follow_job(ref, options, on_text=show)
    if live is not None:
        print(f"\n--- stopped following: {result.stopped_because} after {result.seconds:.0f} s ---", file=live,
              flush=True)
    with _output(args) as out:
        _emit(result.diagnosis.report, args, out)
    return 1 if result.diagnosis.report.root_cause is not None else 0
