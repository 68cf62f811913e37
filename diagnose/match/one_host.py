"""An NCCL failure of a node's own that only one host reports, while the other hosts report its consequence: the node.

How a person reads a multi-node failure on any cluster: NCCL's own errors (``unhandled cuda error``: a CUDA call
inside NCCL failed; ``unhandled system error`` / ``internal error``: a system call or NCCL's state failed) are raised
where the fault is. When every one of them comes from the same host, and ranks on other hosts only say what that
did to them (the remote peer went away, the connection was reset, the collective timed out, the communicator was
aborted), the fault sits on that host: its GPU, its NIC, its driver. A job-wide misconfiguration (a wrong
interface name, a library mismatch) fails on every node alike, so the origin errors would name several hosts.

Which findings are a node's own failure and which report another's is not decided here from their words: the rule
that matched says it (``fault_on = "own_node"`` / ``"other_node"``, on the rule or on one of its patterns; see
rules/README.md), and the finding carries it (``Finding.fault_on``).

Runs after ranking, on the chosen root only; it needs the hosts the findings carry (from NCCL's ``host:pid:tid``
prefix, Ray's ``ip=``, pdsh, srun and torchrun's summary), so a log of one node says nothing here.
"""

from __future__ import annotations

from diagnose.inert import inert, shorten
from diagnose.match.rereading import read_as_hardware
from diagnose.match.rules import FAULT_ON
from diagnose.model import Finding

NCCL_ERROR = "nccl_error"
OWN_NODE, OTHER_NODE = FAULT_ON
CONFIDENCE = 0.55
WHY = ("every NCCL error of a node's own came from one host while the other hosts only reported its consequence "
       "(a peer gone, a connection reset, a timeout): the fault is on that host")


def _node_like(host: str) -> bool:
    """A cluster node's name or address carries a number (node07, gn-116, 10.0.3.17); a Ray actor's or a process's
    name taken from its prefix (Runner, WorkerDict, main_task) does not, and two of those are not two hosts."""
    return any(c.isdigit() for c in host)


def node_confined_origin(findings: list[Finding], root_index: int | None) -> None:
    """Read a root NCCL error whose origin errors all come from one host, the others' consequences from other
    hosts, as that host's fault (hardware)."""
    if root_index is None:
        return
    root = findings[root_index]
    if root.category != NCCL_ERROR or root.fault_on != OWN_NODE:
        return
    origins = [f for f in findings if f.severity == "error" and f.category == NCCL_ERROR and f.fault_on == OWN_NODE]
    if any(not f.hosts for f in origins):
        return  # an origin error whose host is unknown may be another node's
    hosts = {h for f in origins for h in f.hosts}
    if len(hosts) != 1 or not all(_node_like(h) for h in hosts):
        return
    host = shorten(inert(next(iter(hosts))), 80)
    own = {id(f) for f in origins}
    elsewhere = {h for f in findings if id(f) not in own and f.fault_on == OTHER_NODE
                 for h in f.hosts if _node_like(h)} - hosts
    if not elsewhere:
        return
    others = ", ".join(shorten(inert(h), 80) for h in sorted(elsewhere)[:4])
    read_as_hardware(root, f"one host: {WHY} ({host}; consequences on {others})",
                     f"Read across the hosts: {WHY} ({host}).", CONFIDENCE)
    root.fix.steps = [f"take {host} out of the job (srun --exclude={host}) and check its GPUs and NICs "
                      "(nvidia-smi, dmesg Xid lines, ibstat, nccl-tests on it alone)"] + list(root.fix.steps)
