"""Fill in ranks and hosts that the evidence line itself does not carry.

Many failure lines have no rank prefix: torchrun's agent writes "Signal 9 (SIGKILL) received" for a worker, srun
writes "srun: error: node07: task 3: Exited with exit code 1", and a job without ``--tee`` prints tracebacks
bare. The rank is then in the facts: srun's task list (Slurm task id = global rank under srun), or the torchrun
summary's "Root Cause (first observed failure)" block, which names the global rank and host that failed first.
"""

from __future__ import annotations

from typing import Any

from diagnose.model import Finding
from diagnose.normalize.facts import expand_task_list


def _summary_root(findings: list[Finding]) -> dict[str, Any] | None:
    for f in findings:
        rc = f.facts.get("root_cause")
        if isinstance(rc, dict) and isinstance(rc.get("rank"), int):
            return rc
    return None


def attribute_ranks(findings: list[Finding], root_index: int | None) -> None:
    """Give rank/host to findings that lack them, from srun task lists and the torchrun summary."""
    for f in findings:
        if not f.ranks and f.facts.get("tasks") is not None:
            tasks = f.facts["tasks"]
            if isinstance(tasks, str):  # a rule's named group keeps srun's text, e.g. "0-3,8"
                tasks = expand_task_list(tasks) or []
            tasks = [t for t in tasks if isinstance(t, int)] if isinstance(tasks, list) else []
            if tasks:
                f.ranks = sorted(set(tasks))
        if not f.hosts and isinstance(f.facts.get("node"), str) and f.facts["node"]:
            f.hosts = [f.facts["node"]]
        rc = f.facts.get("root_cause")
        if isinstance(rc, dict) and not f.ranks and isinstance(rc.get("rank"), int):
            f.ranks = [rc["rank"]]
            if not f.hosts and isinstance(rc.get("host"), str):
                f.hosts = [rc["host"]]
    if root_index is None:
        return
    root = findings[root_index]
    if root.ranks:
        return
    rc = _summary_root(findings)
    if rc is None:
        return
    # Only adopt the summary's rank when it cannot contradict the root's own facts (same local rank if known).
    local = root.facts.get("local_rank")
    try:
        local = int(local) if local is not None else None
    except (TypeError, ValueError):
        local = None
    if local is not None and rc.get("local_rank") is not None and rc.get("local_rank") != local:
        return
    root.ranks = [rc["rank"]]
    if not root.hosts and isinstance(rc.get("host"), str):
        root.hosts = [rc["host"]]
