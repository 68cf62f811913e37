"""Fill in ranks and hosts that the evidence line itself does not carry.

Many failure lines have no rank prefix: torchrun's agent writes "Signal 9 (SIGKILL) received" for a worker, srun
writes "srun: error: node07: task 3: Exited with exit code 1", and a job without ``--tee`` prints tracebacks
bare. The rank is then in the facts: srun's task list (Slurm task id = global rank when srun starts the ranks
itself; with torchrun under srun a task is one node's launcher, so its id is no rank), or the torchrun
summary's "Root Cause (first observed failure)" block, which names the global rank and host that failed first.

srun's lines also say which node each task ran on. Where srun's task ids are the ranks (no torchrun in the log),
a finding that knows its ranks but not their hosts gets them from there; a host named after the srun label
("task3", set by normalize when torchrun's local-rank prefixes sit inside ``srun --label``) is replaced by the
node srun names for that task. Unprefixed CUDA OOMs of several processes name no rank at all, only a device
("GPU 1 has a total capacity"): the devices are kept as the fact ``gpus``, not turned into ranks, because a GPU
index is a local device number, not a rank.
"""

from __future__ import annotations

import re
from typing import Any

from diagnose.coerce import as_int
from diagnose.model import Finding
from diagnose.normalize.facts.slurm import expand_task_list

_TASK_HOST = re.compile(r"task(?P<n>\d+)$")  # normalize's name for the node of srun task N
# torch >= 2.1 "GPU 1 has a total capacity of", torch <= 2.0 "(GPU 1; 79.35 GiB total capacity"
_OOM_GPU = re.compile(r"\bGPU (?P<gpu>\d+)(?: has a total capacity|; [\d.]+ \w+ total capacity)")


def task_ids(tasks: Any) -> list[int]:
    """srun's ``tasks`` fact as task ids: a rule's named group keeps srun's text (e.g. "0-3,8"), the ``srun_error``
    parser gives a list."""
    if isinstance(tasks, str):
        tasks = expand_task_list(tasks)
    return [t for t in tasks if isinstance(t, int)] if isinstance(tasks, list) else []


def _summary_root(findings: list[Finding]) -> dict[str, Any] | None:
    for f in findings:
        rc = f.facts.get("root_cause")
        if isinstance(rc, dict) and isinstance(rc.get("rank"), int):
            return rc
    return None


def _srun_tasks(f: Finding) -> dict[int, str]:
    """Task id -> node of every srun per-node line behind ``f``: its facts (first hit) and, for a finding grouped
    by the matcher, every hit's (``Finding.task_nodes``)."""
    out: dict[int, str] = {}
    node = f.facts.get("node")
    if isinstance(node, str) and node:
        out.update((t, node) for t in task_ids(f.facts.get("tasks")))
    for task, task_node in f.task_nodes.items():
        out.setdefault(task, task_node)
    return out


def _tasks_are_ranks(findings: list[Finding], torchrun_codes: frozenset[str]) -> bool:
    """srun task ids are global ranks unless torchrun (one launcher task per node) is in the log: a finding of a
    rule only torchrun's agent produces (``launcher = "torchrun"`` in the catalogue) or its failure summary."""
    return not any(f.rule in torchrun_codes or isinstance(f.facts.get("root_cause"), dict) for f in findings)


def _hosts_from_srun(findings: list[Finding], tasks_are_ranks: bool) -> None:
    task_node: dict[int, str] = {}
    for f in findings:
        for task, node in _srun_tasks(f).items():
            task_node.setdefault(task, node)
    if not task_node:
        return
    for f in findings:
        if f.hosts:
            # "task3" is the node of srun task 3 (normalize's placeholder): say which node that was
            renamed = []
            for host in f.hosts:
                m = _TASK_HOST.match(host)
                renamed.append(task_node.get(int(m.group("n")), host) if m else host)
            f.hosts = sorted(set(renamed))
        elif f.ranks and tasks_are_ranks and all(r in task_node for r in f.ranks):
            f.hosts = sorted({task_node[r] for r in f.ranks})


def _gpus_of_unranked(findings: list[Finding]) -> None:
    """Record the devices named by unprefixed CUDA OOMs of several processes (no rank is known for them)."""
    for f in findings:
        if f.ranks or f.category != "cuda_oom" or f.count < 2 or "gpus" in f.facts:
            continue
        gpus = {int(m.group("gpu")) for ev in f.evidence for m in _OOM_GPU.finditer(ev.text)}
        if len(gpus) > 1:
            f.facts["gpus"] = sorted(gpus)


def attribute_ranks(findings: list[Finding], root_index: int | None, torchrun_codes: frozenset[str]) -> None:
    """Give rank/host to findings that lack them, from srun task lists and the torchrun summary.

    ``torchrun_codes``: the rules only torchrun's agent produces (``launcher = "torchrun"``)."""
    tasks_are_ranks = _tasks_are_ranks(findings, torchrun_codes)
    _fill_from_facts(findings, tasks_are_ranks)
    _summary_for_root(findings, root_index)
    _hosts_from_srun(findings, tasks_are_ranks)
    _gpus_of_unranked(findings)


def _fill_from_facts(findings: list[Finding], tasks_are_ranks: bool) -> None:
    for f in findings:
        if tasks_are_ranks and not f.ranks and (tasks := task_ids(f.facts.get("tasks"))):
            f.ranks = sorted(set(tasks))
        if not f.hosts and isinstance(f.facts.get("node"), str) and f.facts["node"]:
            f.hosts = [f.facts["node"]]
        if f.facts.get("tasks") is not None and f.count > 1:
            # one finding for several srun lines (numbers masked): each line names its own tasks and node
            seen = _srun_tasks(f)
            if tasks_are_ranks:
                f.ranks = sorted(set(f.ranks) | set(seen))
            f.hosts = sorted(set(f.hosts) | set(seen.values()))
        rc = f.facts.get("root_cause")
        if isinstance(rc, dict) and not f.ranks and isinstance(rc.get("rank"), int):
            f.ranks = [rc["rank"]]
            if not f.hosts and isinstance(rc.get("host"), str):
                f.hosts = [rc["host"]]


def _summary_for_root(findings: list[Finding], root_index: int | None) -> None:
    if root_index is None or findings[root_index].ranks:
        return
    root = findings[root_index]
    rc = _summary_root(findings)
    if rc is None:
        return
    # Only adopt the summary's rank when it cannot contradict the root's own facts (same local rank if known).
    local = as_int(root.facts.get("local_rank"))
    if local is not None and rc.get("local_rank") is not None and rc.get("local_rank") != local:
        return
    root.ranks = [rc["rank"]]
    if not root.hosts and isinstance(rc.get("host"), str):
        root.hosts = [rc["host"]]
