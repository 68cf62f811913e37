"""Fix words the log itself makes needless or can fill in, settled before the report is shown (every format alike).

- A rule's fix for a generic NCCL error tells the user to rerun with ``NCCL_DEBUG=INFO`` (or ``WARN``) to see NCCL's
  own warning. When the log already holds an ``NCCL WARN`` line, that rerun costs a job and shows nothing new: the
  variable is dropped from the fix (and so from what replay checks), and the fix's first step names the warning's
  line.
- A step that says ``sacct -j JOBID``: when Slurm's own lines in the evidence name one job (``in step
  59137890.batch``, ``*** JOB 123 ON node CANCELLED``), its id replaces ``JOBID`` (``diagnose slurm`` does the same
  with the job it was given).
No category, rule or ranking changes here: only what the fix asks the user to do.
"""

from __future__ import annotations

import dataclasses
import re

from diagnose.model import Evidence, Finding, Report
from diagnose.normalize.facts.nccl import is_nccl_warn

# NCCL's own probe for InfiniBand: ibvwrap.cc dlopen()s libibverbs and, on a host without it, warns and goes on
# over sockets ("NET/Socket : Using ..."). Printed at every start on such a host, it names no failure.
_PROBE_WARNS = ("Failed to open libibverbs",)


def is_probe_warn(text: str) -> bool:
    return any(p in text for p in _PROBE_WARNS)


def _first_warn(report: Report, near: Finding) -> Evidence | None:
    """The earliest ``NCCL WARN`` evidence line of any finding, in the file of ``near``'s first evidence if it has
    one there (the same rank's output), else anywhere; NCCL's InfiniBand probe only when no other warning is there."""
    warns = [e for f in report.findings for e in (f.evidence or []) if is_nccl_warn(e.text)]
    if not warns:
        return None
    warns = [e for e in warns if not is_probe_warn(e.text)] or warns
    own = near.evidence[0].path if near.evidence else None
    same = [e for e in warns if e.path == own]
    return min(same or warns, key=lambda e: (e.path != own, e.line))


# Slurm's own words for the job a line belongs to (slurmstepd, srun, the cgroup OOM handler)
_SLURM_JOB = re.compile(r"(?:\bin step |\bStepId=|\bJobId=|\*\*\* (?:JOB|STEP) |\bjob |\bstep )"
                        r"(\d{1,10})(?:\.(?:batch|extern|\d+)|\b)")


def slurm_job_id(report: Report) -> str | None:
    """The one Slurm job id the findings' evidence names, else None (none, or several)."""
    ids = {m.group(1) for f in report.findings for e in (f.evidence or []) if "slurm" in e.text.lower()
           or "srun" in e.text or "StepId=" in e.text for m in _SLURM_JOB.finditer(e.text)}
    return ids.pop() if len(ids) == 1 else None


def fill_job_id(report: Report, job_id: str) -> None:
    """The rules' fix steps say ``sacct -j JOBID``; with the job known, say its id (a copy of each fix: a fix object
    may be shared, as Slurm's node findings share theirs)."""
    for f in report.findings:
        if any("JOBID" in step for step in f.fix.steps) or "JOBID" in (f.fix.summary or ""):
            f.fix = dataclasses.replace(f.fix, steps=[step.replace("JOBID", job_id) for step in f.fix.steps],
                                        summary=(f.fix.summary or "").replace("JOBID", job_id))


def fit_words(report: Report) -> None:
    """Drop ``NCCL_DEBUG`` from every fix when the log already shows NCCL's warnings, pointing at the first one;
    name the job in ``sacct -j JOBID`` when Slurm's lines say which it is."""
    if any("JOBID" in step for f in report.findings for step in f.fix.steps):
        job = slurm_job_id(report)
        if job:
            fill_job_id(report, job)
    several = len({i.path for i in report.inputs}) > 1
    for f in report.findings:
        if not any(e.name == "NCCL_DEBUG" for e in f.fix.env):
            continue
        warn = _first_warn(report, f)
        if warn is None:
            continue
        f.fix.env = [e for e in f.fix.env if e.name != "NCCL_DEBUG"]
        where = f"line {warn.line}" + (f" of {warn.path}" if several else "")
        if is_probe_warn(warn.text):
            f.fix.steps.insert(0, f"NCCL_DEBUG is already on in this log. Its only NCCL WARN ({where}) is NCCL's "
                                  "InfiniBand probe (no libibverbs on the host, so NCCL uses sockets): it is not the "
                                  "failure. Read NCCL's INFO lines just before the error (the interface and address "
                                  "'NET/Socket : Using' chose, a connect that was refused or timed out)")
            continue
        f.fix.steps.insert(0, f"NCCL_DEBUG is already on in this log: its first NCCL WARN ({where}) names "
                              "what NCCL tried and failed")
