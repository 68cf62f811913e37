"""Merge Slurm's findings into the log's report and decide which one is the root cause.

The match stage ranks findings from log lines (``diagnose.match.ranking.rank`` works on its internal hit groups,
not on a finished Report), so this is a small merge of its own on the finished Report:

* the log's root cause stays root when it explains Slurm's state: any log error explains FAILED, TIMEOUT (a rank
  died or hung, the others waited until the limit), CANCELLED (someone killed a stuck job) and a failed step; a
  host-memory error explains OUT_OF_MEMORY; a hardware error explains NODE_FAIL/BOOT_FAIL; a Slurm-category log
  line (slurmstepd's "CANCELLED ... DUE TO TIME LIMIT") explains any state. Slurm's finding is then a cascade of it.
* otherwise (no log error, or PREEMPTED/NODE_FAIL with only consequences in the log) Slurm's state is the root
  cause, and the log's former root becomes a cascade of it.
"""

from __future__ import annotations

from diagnose.model import Finding, Report

_EXPLAINED_BY_ANY_ERROR = {"FAILED", "COMPLETED", "TIMEOUT", "CANCELLED"}
_EXPLAINED_BY_CATEGORY = {
    "OUT_OF_MEMORY": {"host_oom"},
    "NODE_FAIL": {"hardware"},
    "BOOT_FAIL": {"hardware"},
}


def explains(log_root: Finding, state: str) -> bool:
    """Does the log's root finding account for the job ending in ``state``?"""
    if log_root.severity != "error":
        return False
    if log_root.category == "slurm":
        return True
    if state in _EXPLAINED_BY_ANY_ERROR:
        return True
    return log_root.category in _EXPLAINED_BY_CATEGORY.get(state, set())


def merge_slurm_findings(report: Report, slurm: list[Finding], state: str) -> None:
    """Add ``slurm`` findings to ``report`` in place, re-ranking as described in the module docstring."""
    if not slurm:
        return
    primary = next((f for f in slurm if f.severity == "error"), None)
    others = [f for f in slurm if f is not primary]
    for f in others:
        f.role = "context"
    log_root = report.root
    if primary is None:
        report.findings.extend(others)
        return
    if log_root is not None and explains(log_root, state):
        primary.role = "cascade"
        primary.cause_of = report.root_cause
        report.findings.extend([primary, *others])
        return
    report.lead_with(primary, others)  # Slurm's state is the root cause
