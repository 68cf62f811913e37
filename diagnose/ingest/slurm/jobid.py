"""Job ids as a user types them, validated before anything reaches a Slurm command.

Accepted forms: ``123456`` (a job), ``123456_7`` (array task 7 of array job 123456), ``123456+1`` (component 1 of
a heterogeneous job), each optionally followed by ``.STEP`` (``.0``, ``.batch``, ``.extern``, ``.interactive``).
Anything else (spaces, ``;``, ``$(...)``, ranges like ``123_[1-3]``) is refused with a one-line DiagnoseError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diagnose.model import DiagnoseError

_STEP = r"(?:\d{1,10}|batch|extern|interactive)"
_JOB_ID = re.compile(rf"(\d{{1,10}})(?:_(\d{{1,10}})|\+(\d{{1,4}}))?(?:\.({_STEP}))?")
_STEP_ONLY = re.compile(_STEP)
_JOB_ID_END = 0xFFFFFFFE  # 32-bit ids; 0xfffffffe and 0xffffffff are Slurm's NO_VAL and INFINITE


@dataclass(frozen=True, slots=True)
class JobRef:
    """A validated reference to one job (or array task, or het component), and optionally one step."""

    job: int
    array_task: int | None = None
    het_offset: int | None = None
    step: str | None = None

    @property
    def slurm_id(self) -> str:
        """The id as scontrol/sacct take it, without the step (``123``, ``123_7``, ``123+1``)."""
        if self.array_task is not None:
            return f"{self.job}_{self.array_task}"
        if self.het_offset is not None:
            return f"{self.job}+{self.het_offset}"
        return str(self.job)

    def __str__(self) -> str:
        return self.slurm_id if self.step is None else f"{self.slurm_id}.{self.step}"


_TASK_RANGE = re.compile(r"(\d{1,10})_\[(\d[\d,\-:%]*)\]")


def parse_job_id(text: str, step: str | None = None) -> JobRef:
    """Validate ``text`` (and an explicit ``--step``) strictly; raise DiagnoseError on anything else."""
    shown = text if len(text) <= 40 else text[:40] + "..."
    match = _JOB_ID.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None and isinstance(text, str) and (squeue := _TASK_RANGE.fullmatch(text.strip())):
        first = re.match(r"\d+", squeue.group(2)).group(0)  # type: ignore[union-attr]
        raise DiagnoseError(  # squeue's form for an array's tasks, e.g. 123_[1-3%2] (pending ones), pasted as is
            f"not a Slurm job id: {shown!r} is a range of array tasks (as squeue shows them): name one task, e.g. "
            f"{squeue.group(1)}_{first}, or the array, {squeue.group(1)} (its first task that ended badly)")
    if match is None:
        raise DiagnoseError(
            f"not a Slurm job id: {shown!r} (expected e.g. 123456, 123456_7 for an array task, 123456+1 for a het "
            "component, optionally .STEP)"
        )
    job, task, het, id_step = match.groups()
    if not 0 < int(job) < _JOB_ID_END:  # scontrol reads 0 (and 2**32, which wraps to 0) as "every job": it listed
        raise DiagnoseError(  # all of them and the first one was shown as job 0
            f"not a Slurm job id: {shown!r} (Slurm's job ids run from 1 to {_JOB_ID_END - 1})")
    if step is not None:
        if not _STEP_ONLY.fullmatch(step.strip()):
            raise DiagnoseError(f"not a Slurm step: {step[:40]!r} (expected a number, batch, extern or interactive)")
        if id_step is not None and id_step != step.strip():
            raise DiagnoseError(f"two different steps given: .{id_step} in the job id and --step {step.strip()}")
        id_step = step.strip()
    return JobRef(int(job), None if task is None else int(task), None if het is None else int(het), id_step)
