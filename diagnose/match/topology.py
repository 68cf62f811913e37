"""A collective that hangs at the start of a single-node job whose GPUs talk peer-to-peer over PCIe: the link.

How a person reads it, on any cluster: every rank reached the first collectives (NCCL's init completed on all of
them) and they never finished, although no rank raised, was killed or called a different collective. When the only
path between the ranks is NCCL's P2P transport (``via P2P/IPC``, ``via P2P/CUMEM``, ``via P2P/direct pointer``)
inside one host, with no network transport (``via NET/...``: a second node) and no sign of NVLink (NVLS, an NVLink
matrix entry ``NV4``), the copies go through PCIe bridges. PCIe peer-to-peer that never completes is the platform's
doing: ACS redirecting peer traffic to the root complex, an IOMMU (VT-d, AMD-Vi) translating it, or consumer cards
(GeForce) whose P2P the platform does not carry; ``NCCL_P2P_DISABLE=1`` makes such a job run, slower. A hang after
many steps (training had progress, a large SeqNum) or over NVLink is not this: the first collectives worked.

The evidence is a few lines the scanner captures for us (``CAPTURES``, first occurrence only); the function runs
after ranking and re-reads the chosen root, as ``collective_skew`` does. It changes only a root that is an NCCL
timeout or hang before training (nothing else explained the failure) whose ranks all agree (no desync, no
straggler), so every other answer is untouched.
"""

from __future__ import annotations

from diagnose.inert import inert, shorten
from diagnose.match.collective_skew import FACT_DESYNC, FACT_STRAGGLERS
from diagnose.match.rereading import read_as_hardware
from diagnose.match.silent_ranks import FACT as SILENT_RANKS
from diagnose.model import Block, CaptureSpec, EnvVar, Evidence, Finding, Fix, LogLine

P2P = "topology.p2p"
NETWORK = "topology.network"
NVLINK = "topology.nvlink"
PCIE = "topology.pcie"

_PCIE = r"(?:PIX|PXB|PHB|NODE|SYS)"
# a matrix row of one GPU: its own "X", at least one PCIe path to another device, then CPU/NUMA affinity columns
_PCIE_ROW = (rf"^\s*GPU\d+(?:\s+(?:X|{_PCIE}))*\s+{_PCIE}(?:\s+(?:X|{_PCIE}))*(?:\s+(?:[\d,-]+|N/A))*\s*$")

CAPTURES: list[CaptureSpec] = [
    # NCCL's channel set-up line: "Channel 00/0 : 0[1000] -> 1[21000] via P2P/IPC" (older: "Channel 00 : 0[31000]")
    # (NCCL before 2.7: "Ring 00 : 0[0] -> 1[1] via P2P/IPC")
    CaptureSpec(P2P, "via P2P/",
                regex=r"NCCL INFO (?:Channel|Ring) \d+(?:/\d+)? ?: \d+\[\w+\] -> \d+\[\w+\].* via P2P/"),
    # PCIe-only paths without NCCL's INFO lines: nvidia-smi's matrix with only PCIe entries between GPUs, or consumer
    # cards (GeForce: no NVLink on the card's bus, P2P carried by PCIe alone)
    CaptureSpec(PCIE + ".matrix", " X ", regex=_PCIE_ROW),
    CaptureSpec(PCIE + ".consumer", "GeForce", regex=r"\bNVIDIA GeForce (?:RTX|GTX) \d{3,4}"),
    # a peer reached over the network (IB, RoCE, sockets): more than one host, the hang may be the fabric's
    CaptureSpec(NETWORK, "via NET/", regex=r"NCCL INFO (?:Channel|Ring) .* via NET/"),
    # NVLink between the GPUs: NVLS (NVLink SHARP) lines, nvidia-smi's matrix entries (NV4, NV12), NVLink status
    CaptureSpec(NVLINK + ".nvls", "NVLS", regex=r"NCCL INFO .*\bNVLS\b"),
    CaptureSpec(NVLINK + ".matrix", "\tNV", regex=r"^\s*GPU\d+\s.*\bNV\d+\b"),
    CaptureSpec(NVLINK + ".status", "NVLink", regex=r"(?i)\bNVLink\b.*\b(?:GB/s|active|link \d)"),
]

# before these phases the job had not run a training step: the first collectives of the job (init, the DDP or
# DeepSpeed wrap's parameter broadcast, a test's first allreduce)
EARLY_PHASES = frozenset({"init", "dp_wrap", "model_build", "checkpoint_load"})
FIRST_COLLECTIVES = 10  # a watchdog SeqNum at most this: one of the job's first collectives
CONFIDENCE = 0.55
WHY = ("the first collectives hung on one host whose GPUs NCCL connected peer-to-peer with no NVLink and no network "
       "path: PCIe peer-to-peer that never completes (ACS, IOMMU / VT-d, consumer cards)")
FIX = Fix(
    summary="Check PCIe peer-to-peer on this host (ACS, IOMMU/VT-d); NCCL_P2P_DISABLE=1 runs without it",
    safety="manual",
    env=[EnvVar("NCCL_P2P_DISABLE", "1")],
    steps=[
        "nvidia-smi topo -m  (PIX/PXB/PHB/SYS between the GPUs: PCIe paths)",
        "sudo lspci -vvv | grep ACSCtl  (SrcValid+ ... ReqRedir+ on a bridge: ACS redirects P2P; disable ACS)",
        "cat /proc/cmdline; dmesg | grep -i -e dmar -e iommu  (translation on: boot with iommu=pt or VT-d off)",
        "run nccl-tests' all_reduce_perf with NCCL_P2P_DISABLE=1: if it passes, the P2P path is the fault",
    ],
)


def _first(blocks: dict[str, list[Block]], name: str) -> LogLine | None:
    """The first line the scanner captured under ``name`` (a capture keeps its first occurrence only)."""
    got = blocks.get(name) or []
    return got[0].lines[0] if got and got[0].lines else None


def _first_collectives(f: Finding) -> bool:
    """Did ``f`` hang in one of the job's first collectives: before training, at a small watchdog SeqNum or at one
    the log does not give (early by its phase alone)?"""
    if f.phase not in EARLY_PHASES:
        return False
    seq = f.facts.get("seq_num")
    try:
        return seq is None or int(seq) <= FIRST_COLLECTIVES
    except (TypeError, ValueError):
        return False


def pcie_p2p_hang(findings: list[Finding], root_index: int | None, blocks: dict[str, list[Block]]) -> None:
    """Read an early NCCL hang on a PCIe-only, single-host P2P topology as the link's fault (hardware)."""
    if root_index is None:
        return
    f = findings[root_index]
    if f.category != "nccl_timeout" or not _first_collectives(f):
        return
    if any(f.facts.get(fact) for fact in (FACT_DESYNC, FACT_STRAGGLERS, SILENT_RANKS)):
        return  # a rank called another collective or never reached it: the code or that rank, not the link
    if len(f.ranks) == 1:
        return  # one rank waited; whether its peers were in the collective at all, the log does not say
    # NCCL's own word that it joined the GPUs peer-to-peer, else the hardware's: only PCIe paths between them
    p2p = _first(blocks, P2P) or _first(blocks, PCIE + ".matrix") or _first(blocks, PCIE + ".consumer")
    if p2p is None or _first(blocks, NETWORK) is not None:
        return
    if any(name.startswith(NVLINK) and got for name, got in blocks.items()):
        return
    read_as_hardware(f, f"topology: {WHY} ({p2p.text.strip()[:200]})", f"Read with the topology: {WHY}.", CONFIDENCE)
    f.fix = Fix(FIX.summary, FIX.safety, list(FIX.overrides), list(FIX.env), list(FIX.steps))
    f.evidence.insert(0, Evidence(p2p.path, p2p.lineno, shorten(inert(p2p.raw), 500)))
