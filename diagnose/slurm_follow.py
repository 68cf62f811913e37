"""``diagnose slurm JOBID --follow``: tail a running job's output and stop at the first root-cause failure.

Polls (never inotify: output usually lives on a network file system): the job's state through scontrol only, the
output file by size. The log is re-matched when it grew (a huge log at most every 5x the time one match takes);
following stops when a root-cause error appears, when the
job ends, or after ``max_s`` seconds, whichever comes first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from diagnose.ingest.slurm.commands import run_slurm
from diagnose.ingest.slurm.job import ENDED_STATES, Runner, SlurmJob, lookup_job, scontrol_state
from diagnose.ingest.slurm.jobid import JobRef
from diagnose.model import DiagnoseError
from diagnose.slurm_diagnosis import SlurmDiagnosis, diagnose_job

DEFAULT_MAX_S = 7 * 86400.0
MAX_CHUNK = 1 << 20  # bytes read per poll, so a huge burst cannot stall the loop


@dataclass
class FollowResult:
    diagnosis: SlurmDiagnosis
    stopped_because: str  # "failure", "job ended", "time bound", "job forgotten"
    seconds: float


def follow_job(
    ref: JobRef,
    options: Any = None,
    on_text: Callable[[str], None] | None = None,
    poll_s: float = 1.0,
    max_s: float | None = None,
    runner: Runner = run_slurm,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_start: Callable[[SlurmJob], None] | None = None,
) -> FollowResult:
    """Follow ``ref`` until a root-cause failure appears in its output or it ends; ``on_text`` gets new output,
    ``on_start`` the job as first looked up (what is followed, and an output that cannot be, before any wait)."""
    from diagnose.pipeline import AnalyzeOptions, analyze

    if max_s is None:
        max_s = float(os.environ.get("DIAGNOSE_FOLLOW_MAX_S", DEFAULT_MAX_S))
    started = clock()
    quick = AnalyzeOptions(rules_dirs=list(getattr(options, "rules_dirs", []) or []), replay=False)
    paths: list[str] = []  # stdout, and stderr when it goes to its own file
    offsets: dict[str, int] = {}
    state: str | None = ""
    pending = False  # a file grew since the last match
    next_match = 0.0
    while True:
        if not paths:
            job = lookup_job(ref, runner=runner, settle_s=0)
            if on_start is not None:
                on_start(job)
                on_start = None
            state = job.state
            paths = list(dict.fromkeys(o.path for o in job.outputs))
            if not paths and (job.ended or not job.batch):
                break
        else:
            state = scontrol_state(ref, runner)
        pending = _read_all_new(paths, offsets, on_text) or pending
        # re-match the whole files (tracebacks span polls), but on a huge log no more often than 5x its cost
        if pending and clock() >= next_match:
            pending = False
            match_started = clock()
            quick_report = analyze([p for p in paths if os.path.exists(p)], quick)
            next_match = clock() + 5 * (clock() - match_started)
            root = quick_report.root
            if root is not None and root.severity == "error" and root.role == "root":
                # the match read the files as they are now: what the job wrote since this poll's read (the failure
                # itself, often) is shown too before following stops
                _read_all_new(paths, offsets, on_text)
                return FollowResult(diagnose_job(ref, options, runner=runner), "failure", clock() - started)
        if state is None:
            return FollowResult(diagnose_job(ref, options, runner=runner), "job forgotten", clock() - started)
        if state in ENDED_STATES:
            _read_all_new(paths, offsets, on_text)
            break
        if clock() - started >= max_s:
            result = diagnose_job(ref, options, runner=runner)
            result.report.warnings.append(f"stopped following job {ref} after {max_s:.0f} s; it is still {state}")
            return FollowResult(result, "time bound", clock() - started)
        sleep(poll_s)
    return FollowResult(diagnose_job(ref, options, runner=runner), "job ended", clock() - started)


def _read_all_new(paths: list[str], offsets: dict[str, int], on_text: Callable[[str], None] | None) -> bool:
    """Read what each file gained since its offset (offsets move on); did any grow?"""
    grew = False
    for path in paths:
        offsets[path], more = _read_new(path, offsets.get(path, 0), on_text)
        grew = grew or more
    return grew


def _read_new(path: str, offset: int, on_text: Callable[[str], None] | None) -> tuple[int, bool]:
    """Read what was appended since ``offset``; a file that shrank (truncated, rotated) is read from the start; a
    file not created yet reads as nothing."""
    try:
        if not os.path.exists(path):
            return offset, False
        size = os.path.getsize(path)
        if size < offset:
            offset = 0
        if size == offset:
            return offset, False
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read(min(size - offset, MAX_CHUNK))
    except OSError as e:
        raise DiagnoseError(f"cannot read the job's output {path}: {e.strerror}") from None
    if on_text is not None and chunk:
        on_text(chunk.decode("utf-8", "replace"))
    return offset + len(chunk), bool(chunk)
