"""What slurmctld says now about the nodes a job ran on (``scontrol show node``): state, flags and Reason.

A node that went DOWN, DRAIN or FAIL with a Reason (a health check, slurmd's "Kill task failed", an admin's words)
is evidence the job's log does not carry. Reading it is best effort: a node Slurm no longer knows is left out, and
scontrol failing or not answering gives no records and one note, never an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from diagnose.ingest.slurm.commands import CommandResult, SlurmUnavailable, run_slurm
from diagnose.ingest.slurm.hostlist import expand_hostlist
from diagnose.ingest.slurm.parse import NodeRecord, parse_scontrol_nodes

MAX_NODES = 4096  # one scontrol call names them all; a larger job's nodes past this are not looked at
NODE_TIMEOUT_S = 15.0  # with the default runner: a controller that does not answer costs this much, once per call
Runner = Callable[[list[str]], CommandResult]
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")


@dataclass(slots=True)
class NodeLookup:
    names: list[str] = field(default_factory=list)  # the job's nodes, expanded, in Slurm's order
    records: list[NodeRecord] = field(default_factory=list)  # those scontrol knows, in the same order
    unknown: list[str] = field(default_factory=list)  # nodes scontrol no longer knows
    note: str = ""  # why the states could not be read, when they could not


def _run(argv: list[str], runner: Runner) -> CommandResult | None:
    """The command's result, or None when it is missing or timed out (the node states are only extra evidence)."""
    try:
        return runner(argv) if runner is not run_slurm else run_slurm(argv, timeout=NODE_TIMEOUT_S)
    except SlurmUnavailable:
        return None


def expand_nodes(node_list: str, runner: Runner = run_slurm) -> list[str]:
    """The job's NodeList as host names: ``scontrol show hostnames`` (Slurm's own expansion), else our parser."""
    names: list[str] = []
    if "[" in node_list:  # a plain "a,b" needs no expanding
        result = _run(["scontrol", "show", "hostnames", node_list], runner)
        names = result.stdout.split() if result is not None and result.ok else []
    if not names or not all(_HOST_NAME.fullmatch(n) for n in names):  # not a list of host names: ours instead
        names = expand_hostlist(node_list, limit=MAX_NODES)
    return [n for n in names if _HOST_NAME.fullmatch(n)][:MAX_NODES]


def lookup_nodes(node_list: str, runner: Runner = run_slurm) -> NodeLookup:
    """``scontrol show node -o`` for every node of ``node_list`` (one call)."""
    names = expand_nodes(node_list, runner) if node_list else []
    out = NodeLookup(names=names)
    if not names:
        return out
    result = _run(["scontrol", "show", "node", "-o", ",".join(names)], runner)
    if result is None:
        out.note = "the state of the job's nodes could not be read (scontrol did not answer)"
        return out
    records, missing = parse_scontrol_nodes(result.stdout)
    wanted = set(names)
    by_name = {r.name: r for r in records if r.name in wanted}  # a forged record inside a Reason names no job node
    out.records = [by_name[n] for n in names if n in by_name]
    out.unknown = [n for n in names if n not in by_name]
    if not result.ok and not records and not missing:
        out.note = f"the state of the job's nodes could not be read: {result.first_error_line()}"
    return out
