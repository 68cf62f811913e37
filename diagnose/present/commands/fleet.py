"""``diagnose fleet``: scan | submit | merge | report | epilog. Parsing is in cli.py; the work in diagnose/fleet.

Exit codes: 0 done, 2 usage or input error (one line on stderr). ``fleet epilog`` always exits 0 (a failing
per-node epilog would drain the node): its problems go to stderr, which the epilog script sends to its log file.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from diagnose.model import DiagnoseError


def run(args: Any) -> int:
    return {"scan": _scan, "submit": _submit, "merge": _merge, "report": _report, "epilog": _epilog}[
        args.fleet_command
    ](args)


# ------------------------------------------------------------------------------------------------ progress


class ProgressLine:
    """``fleet scan: 120/300 jobs (40%), 35.2 jobs/s, ETA 0:05`` on stderr: rewritten in place on a terminal,
    else one line every ``interval`` seconds (logs of array tasks stay short)."""

    def __init__(self, stream: TextIO = sys.stderr, interval: float | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.interval = interval if interval is not None else (0.2 if self.tty else 10.0)
        self.started = time.monotonic()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done not in (0, total) and now - self.last < self.interval:
            return
        self.last = now
        elapsed = max(now - self.started, 1e-6)
        rate = done / elapsed
        eta = (total - done) / rate if rate > 0 else None
        line = f"fleet scan: {done}/{total} jobs ({100 * done / total if total else 100:.0f}%), {rate:.1f} jobs/s"
        line += f", ETA {_clock(eta)}" if eta is not None and done < total else f", {_clock(elapsed)} elapsed"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line + ("\n" if done == total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


# ---------------------------------------------------------------------------------------------- commands


def _items(args: Any) -> list:
    from diagnose.fleet import scan, slurm_source

    shard = scan.parse_shard(getattr(args, "shard", None))
    if getattr(args, "sacct", False):
        if args.paths or getattr(args, "manifest", None):
            raise DiagnoseError("give log paths or --sacct, not both")
        start, end = _window(args)
        rows = scan.shard_rows(slurm_source.list_ended_jobs(start, end, user=args.user, name=args.name), shard)
        return [scan.SlurmItem(row, args.gpus_per_node) for row in rows]
    if getattr(args, "manifest", None):
        return scan.shard_files(scan.read_manifest(args.manifest), shard)
    if not args.paths:
        raise DiagnoseError("give log files or folders to scan, --manifest FILE, or --sacct")
    return scan.shard_files(scan.list_files(args.paths), shard)


def _window(args: Any) -> tuple[str, str]:
    """The sacct window as absolute times: --start/--end as given, else --since back from now (fixed once, so that
    every array task of `fleet submit` sees the same jobs)."""
    from diagnose.fleet.slurm_source import window
    from diagnose.ingest.slurm.listing import sacct_since

    if not args.start:
        return window(args.since, args.end)
    for value in (args.start, args.end):
        if value is not None and sacct_since(value).startswith("now-"):
            raise DiagnoseError(f"--start/--end {value[:30]!r}: expected a date like 2026-11-29T12:00")
    return args.start, args.end or time.strftime("%Y-%m-%dT%H:%M:%S")


def _scan(args: Any) -> int:
    from diagnose.fleet.scan import ScanOptions, scan
    from diagnose.fleet.store import FleetStore

    jobs = args.jobs or (os.cpu_count() or 1)
    if not 1 <= jobs <= 256:
        raise DiagnoseError(f"--jobs {jobs}: expected 1 to 256")
    items = _items(args)
    progress = None if args.no_progress else ProgressLine()
    options = ScanOptions(jobs=jobs, rules_dirs=list(args.rules or []), replay=args.replay, progress=progress,
                          batch_size=args.batch)
    with FleetStore(args.store) as store:
        summary = scan(store, items, options)
        total = store.count()
    print(scan_line(summary, total), file=sys.stderr)
    return 0


def scan_line(summary: Any, total: int) -> str:
    """The scan's one line. Every job listed is accounted for, or "56 listed, 0 already stored, 55 added" does not
    add up: a file whose job another file of this scan is (a copy, a log named twice) adds no row, and neither does a
    job another scan running beside this one stored first (qa-report-10 L6)."""
    notes = [f"{summary.unreadable} unreadable"]
    if summary.duplicates > 0:
        notes.append(f"{summary.duplicates} the same job as another file")
    if summary.stored_elsewhere > 0:
        notes.append(f"{summary.stored_elsewhere} stored meanwhile by another scan")
    jobs_stored = f"{total} job" + ("" if total == 1 else "s")
    return (f"fleet scan: {summary.listed} jobs listed, {summary.skipped} already stored, {summary.added} added "
            f"({', '.join(notes)}) in {summary.seconds:.1f} s; the store has {jobs_stored}")


def _submit(args: Any) -> int:
    from diagnose.fleet import scan, submit

    if args.sacct and args.paths:
        raise DiagnoseError("give log paths or --sacct, not both")
    if not args.sacct and not args.paths:
        raise DiagnoseError("give log files or folders, or --sacct")
    source = ({"window": _window(args), "user": args.user, "name": args.name} if args.sacct
              else {"files": scan.list_files(args.paths)})
    try:
        plan = submit.write_array(args.run_dir, args.store, args.tasks, sbatch_args=args.sbatch_arg,
                                  gpus_per_node=args.gpus_per_node, **source)
    except OSError as e:  # a read-only or full file system, a file where the folder should be
        where = e.filename or args.run_dir
        raise DiagnoseError(f"cannot write the run folder: {where}: {e.strerror or e}") from None
    print(f"wrote {plan.array_script} ({plan.tasks} tasks) and {plan.merge_script}")
    if args.dry_run:
        return 0
    array_id, merge_id = submit.submit(plan, then_merge=not args.no_merge)
    print(f"submitted array job {array_id}" + (f"; merge job {merge_id} runs after it" if merge_id else ""))
    return 0


def _merge(args: Any) -> int:
    from diagnose.fleet.submit import merge

    result = merge(args.store, args.shards, missing_ok=args.missing_ok)
    for shard, added in result.merged:
        print(f"merged {shard}: {added} new jobs")
    for shard in result.missing:
        print(f"missing shard {shard} (its task failed or has not run)", file=sys.stderr)
    return 0


def _report(args: Any) -> int:
    from diagnose.fleet.report import build_report
    from diagnose.fleet.store import FleetStore
    from diagnose.present import fleet_render
    from diagnose.present.output import output_stream

    if args.output and os.path.exists(args.output) and os.path.exists(args.store) \
            and os.path.samefile(args.output, args.store):
        raise DiagnoseError(f"--output {args.output} is the fleet store; write the report elsewhere")
    if not 0 < args.alpha < 1:
        raise DiagnoseError(f"--alpha {args.alpha}: expected a probability between 0 and 1")
    with FleetStore(args.store, readonly=True) as store:
        report = build_report(store, since=args.since, alpha=args.alpha, min_failures=args.min_failures)
    render = {"json": fleet_render.render_json, "markdown": fleet_render.render_markdown}.get(
        args.format, fleet_render.render_text
    )
    with output_stream(args.output) as out:
        out.write(render(report))
    return 0


def _epilog(args: Any) -> int:
    from diagnose.fleet.epilog import run_epilog

    try:
        result = run_epilog(args.store, os.environ, comment=args.comment, gpus_per_node=args.gpus_per_node)
    except Exception as e:  # noqa: BLE001 - an epilog must never fail the job's node; say why and exit 0
        # the job's id on every line (an epilog log is read per job); the class name only for an unexpected error
        env = os.environ
        job = (f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
               if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID") else env.get("SLURM_JOB_ID", "?"))
        kind = "" if isinstance(e, DiagnoseError) else f"{type(e).__name__}: "
        print(f"diagnose fleet epilog: job {job}: {kind}{' '.join(str(e).split())[:300]}", file=sys.stderr)
        return 0
    for note in result.skipped:  # the epilog's own log only: the job's comment never names a refused file
        print(f"diagnose fleet epilog: job {result.job_id}: skipped {note}", file=sys.stderr)
    print(f"diagnose fleet epilog: job {result.job_id}: {result.verdict}"
          + ("" if result.added else " (already stored)") + (" [comment set]" if result.comment_set else "")
          + (f" [comment not set: {result.comment_problem}]" if result.comment_problem else ""),
          file=sys.stderr)
    return 0
