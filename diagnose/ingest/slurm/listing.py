"""Recent jobs that ended badly, from ``sacct``: the morning-after triage list (``diagnose slurm --failed`` and the
TUI's job list, ``diagnose tui --slurm``)."""

from __future__ import annotations

import getpass
import re
from dataclasses import dataclass, field

from diagnose.ingest.slurm.commands import run_slurm
from diagnose.ingest.slurm.job import Runner, user_name
from diagnose.ingest.slurm.parse import (
    NOT_ENDED,
    parse_duration,
    parse_exit_code,
    parse_sacct,
    signal_name,
    split_state,
)
from diagnose.ingest.slurm.usage import USAGE_FIELDS, Usage, usage_from_rows
from diagnose.model import DiagnoseError

# Asked from sacct (--state selects jobs that were in one of these during the window); COMPLETED is asked too
# because a job whose batch script exits 0 can still have a failed srun step (non-zero DerivedExitCode).
_STATES = "CA,F,TO,OOM,NF,PR,BF,DL,CD"
_FIELDS = ("JobID,JobIDRaw,JobName,User,State,ExitCode,DerivedExitCode,Start,End,Elapsed,Timelimit,NodeList,WorkDir,"
           + ",".join(USAGE_FIELDS))
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass(slots=True)
class JobSummary:
    """One recent job that ended badly, as sacct lists it.

    ``job_id`` is what ``diagnose slurm`` takes (``123``, ``123_7`` for an array task, ``123+1`` for a het
    component). ``state`` is Slurm's (FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, CANCELLED, BOOT_FAIL,
    DEADLINE, or COMPLETED when only a step failed); ``cancelled_by`` is set for CANCELLED. ``exit_code`` and
    ``signal`` come from ExitCode (``code:signal``), ``derived_exit_code`` is the worst step's exit code.
    ``elapsed_s``/``time_limit_s`` are seconds (None: unknown / unlimited). ``end`` is ISO 8601 local time.
    """

    job_id: str
    name: str
    user: str
    state: str
    cancelled_by: str | None
    exit_code: int | None
    signal: str | None
    derived_exit_code: int | None
    start: str
    end: str
    elapsed_s: int | None
    time_limit_s: int | None
    nodes: str
    work_dir: str
    usage: Usage = field(default_factory=Usage)  # nodes, GPUs, CPUs, TotalCPU, MaxRSS (seff's figures)

    @property
    def gpu_hours_lost(self) -> float | None:
        return self.usage.gpu_hours(self.elapsed_s)

    @property
    def cpu_efficiency(self) -> float | None:
        return self.usage.cpu_efficiency(self.elapsed_s)

    @property
    def failed(self) -> bool:
        return self.state != "COMPLETED" or bool(self.derived_exit_code) or bool(self.exit_code)

    def state_text(self) -> str:
        """``FAILED exit 1``, ``CANCELLED by alice``, ``TIMEOUT``, ``COMPLETED (a step exited 1)``..."""
        if self.state == "CANCELLED" and self.cancelled_by:
            return f"CANCELLED by {self.cancelled_by}"
        if self.state == "COMPLETED" and self.derived_exit_code:
            return f"COMPLETED (a step exited {self.derived_exit_code})"
        if self.signal:
            return f"{self.state} ({self.signal})"
        if self.exit_code:
            return f"{self.state} exit {self.exit_code}"
        return self.state


def sacct_since(since: str) -> str:
    """``6h``, ``2d``, ``30m``, ``1w``, ``90`` (seconds) or an ISO date/time -> sacct's ``-S`` value."""
    s = since.strip()
    m = re.fullmatch(r"(\d{1,6})([smhdw]?)", s)
    if m:
        return f"now-{m.group(1)}{_UNITS[m.group(2) or 's']}"
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2})?)?", s):
        return s
    raise DiagnoseError(f"--since {since[:30]!r}: expected an age like 6h, 2d, 1w or a date like 2026-11-29")


def list_failed_jobs(since: str = "1d", user: str | None = None, runner: Runner = run_slurm) -> list[JobSummary]:
    """Jobs of ``user`` (default: the current user) that ended badly since ``since``, newest first."""
    if user is not None and not re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}", user):
        raise DiagnoseError(f"--user {user[:30]!r}: not a user name")
    argv = [
        "sacct", "--parsable2", "-S", sacct_since(since), "-E", "now", f"--state={_STATES}",
        f"--format={_FIELDS}", "-u", user or getpass.getuser(),
    ]  # fmt: skip
    result = runner(argv)
    if not result.ok:
        raise result.failure("sacct")
    rows = parse_sacct(result.stdout)
    steps_of: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        job_id, dot, _ = row.fields.get("JobID", "").partition(".")
        if dot:
            steps_of.setdefault(job_id, []).append(row.fields)
    jobs: list[JobSummary] = []
    for row in rows:
        f = row.fields
        if "." in f.get("JobID", ""):
            continue
        state, by = split_state(f.get("State"))
        exit_status = parse_exit_code(f.get("ExitCode"))
        steps = steps_of.get(f.get("JobID", ""), [])
        summary = JobSummary(
            job_id=f.get("JobID", ""),
            name=f.get("JobName", ""),
            user=f.get("User", ""),
            state=state,
            cancelled_by=user_name(by) if by else by,  # the same name the job view shows ("by root", not "by 0")
            exit_code=exit_status.code,
            signal=signal_name(exit_status.signal),
            derived_exit_code=parse_exit_code(f.get("DerivedExitCode")).code,
            start=f.get("Start", ""),
            end=f.get("End", ""),
            elapsed_s=parse_duration(f.get("Elapsed")),
            time_limit_s=parse_duration(f.get("Timelimit")),
            nodes=f.get("NodeList", ""),
            work_dir=f.get("WorkDir", ""),
            usage=usage_from_rows(f, steps),
        )
        # the steps ("123.0") correct a DerivedExitCode that accounting left at 0:0 (seen with 22.05)
        worst = max((parse_exit_code(s.get("ExitCode")).code or 0 for s in steps
                     if s.get("JobID", "").partition(".")[2].isdigit()), default=0)
        if not summary.derived_exit_code and worst:
            summary.derived_exit_code = worst
        if summary.failed and state not in NOT_ENDED:
            jobs.append(summary)
    jobs.sort(key=lambda j: j.end, reverse=True)
    return jobs
