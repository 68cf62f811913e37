"""An early NCCL hang on one host whose GPUs NCCL joined only peer-to-peer over PCIe is read as the link (hardware).

Synthetic logs in NCCL's and torch's own line formats (NCCL INFO channel set-up, ProcessGroupNCCL's watchdog);
every instance detail invented. Each test changes one piece of evidence and checks that the reading follows it.
"""

from __future__ import annotations

import pytest
from conftest import root_finding


def _init(transport: str = "P2P/IPC", host: str = "ws7", extra: list[str] | None = None) -> list[str]:
    lines = [
        "NCCL version 2.18.1+cuda12.1",
        f"{host}:4101:4180 [0] NCCL INFO Channel 00/02 :    0   1",
        f"{host}:4101:4180 [0] NCCL INFO Channel 00/0 : 0[1000] -> 1[2000] via {transport}",
        f"{host}:4102:4181 [1] NCCL INFO Channel 00/0 : 1[2000] -> 0[1000] via {transport}",
    ]
    lines += extra or []
    lines += [
        f"{host}:4101:4180 [0] NCCL INFO Connected all rings",
        f"{host}:4101:4180 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE",
    ]
    return lines


def _watchdog(seq: int, op: str = "BROADCAST", ranks=(0, 1)) -> list[str]:
    return [
        f"[rank{r}]:[E1002 11:41:07.100000000 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=4096, NumelOut=4096, Timeout(ms)=1800000) "
        "ran for 1800031 milliseconds before timing out."
        for r in ranks
    ]


def test_first_broadcast_hang_over_pcie_p2p_is_the_link(builtin_catalogue):
    f = root_finding(builtin_catalogue, _init() + _watchdog(2))
    assert f.category == "hardware"
    assert f.basis == "inferred" and f.basis_detail.startswith("topology:")
    assert any(e.name == "NCCL_P2P_DISABLE" for e in f.fix.env)
    assert "via P2P/IPC" in f.evidence[0].text  # the topology line is shown first


@pytest.mark.parametrize("transport", ["P2P/CUMEM/read", "P2P/direct pointer", "P2P/IPC/read"])
def test_every_p2p_flavour_counts(builtin_catalogue, transport):
    assert root_finding(builtin_catalogue, _init(transport) + _watchdog(1)).category == "hardware"


def test_old_nccl_ring_lines_count(builtin_catalogue):
    lines = ["NCCL version 2.4.8+cuda10.1", "ws7:4101:4180 [0] NCCL INFO Ring 00 : 0[0] -> 1[1] via P2P/IPC",
             "ws7:4101:4180 [0] NCCL INFO Ring 00 : 1[1] -> 0[0] via P2P/IPC"] + _watchdog(1, "ALLREDUCE")
    assert root_finding(builtin_catalogue, lines).category == "hardware"


def test_shared_memory_transport_is_not_p2p(builtin_catalogue):
    # NCCL fell back to SHM (P2P unavailable or disabled): the P2P path is not what hung
    assert root_finding(builtin_catalogue, _init("SHM/direct/direct") + _watchdog(2)).category == "nccl_timeout"


def test_hang_after_many_collectives_is_not_the_link(builtin_catalogue):
    # the first collectives worked over the same P2P path: a hang at SeqNum 305 is something else
    assert root_finding(builtin_catalogue, _init() + _watchdog(305, "ALLREDUCE")).category == "nccl_timeout"


def test_hang_after_training_progress_is_not_the_link(builtin_catalogue):
    progress = [" [2024-10-02 11:00:00] iteration       10/    1000 | consumed samples:          640 | "
                "elapsed time per iteration (ms): 812.4 | lm loss: 7.112E+00 |"]
    assert root_finding(builtin_catalogue, _init() + progress + _watchdog(3, "ALLREDUCE")).category == "nccl_timeout"


def test_a_second_node_over_the_network_is_not_read_as_pcie(builtin_catalogue):
    net = ["ws7:4101:4180 [0] NCCL INFO Channel 00/0 : 3[3000] -> 0[1000] [receive] via NET/IB/0/GDRDMA"]
    assert root_finding(builtin_catalogue, _init(extra=net) + _watchdog(2)).category == "nccl_timeout"


@pytest.mark.parametrize("nvlink", [
    "ws7:4101:4180 [0] NCCL INFO NVLS multicast support is available on dev 0",
    "GPU0\t X \tNV12\tNV12\t0-47\t0",
])
def test_nvlink_between_the_gpus_is_not_read_as_pcie(builtin_catalogue, nvlink):
    assert root_finding(builtin_catalogue, _init(extra=[nvlink]) + _watchdog(2)).category == "nccl_timeout"


def test_ranks_that_disagree_are_a_desync_not_the_link(builtin_catalogue):
    # 7 ranks wait in SeqNum 2, one is at SeqNum 3 of another op: a rank took another code path
    lines = _init() + _watchdog(2, ranks=range(7)) + _watchdog(3, "ALLGATHER", ranks=(7,))
    f = root_finding(builtin_catalogue, lines)
    assert f.facts.get("desync")
    assert f.category == "nccl_timeout"


def test_a_rank_error_still_leads(builtin_catalogue):
    # a rank that raised explains its peers' hang; the topology does not get a say
    err = ["[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
           "capacity of 23.64 GiB of which 1.02 GiB is free."]
    assert root_finding(builtin_catalogue, _init() + err + _watchdog(2, ranks=(0,))).category == "cuda_oom"


def test_interrupted_first_test_over_pcie_p2p(builtin_catalogue):
    # nccl-tests' table header printed, no result row, the user pressed ^C: the first allreduce never finished
    lines = _init() + [
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw",
        "^C",
    ]
    assert root_finding(builtin_catalogue, lines).category == "hardware"


def test_no_topology_lines_no_reading(builtin_catalogue):
    assert root_finding(builtin_catalogue, ["NCCL version 2.18.1+cuda12.1"] + _watchdog(2)).category == "nccl_timeout"


_MATRIX_PCIE = ["\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity", "GPU0\t X \tPHB\t0-15\t0", "GPU1\tPHB\t X \t0-15\t0"]
_MATRIX_NVLINK = ["\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity", "GPU0\t X \tNV4\t0-15\t0", "GPU1\tNV4\t X \t0-15\t0"]


@pytest.mark.parametrize("hardware", [
    _MATRIX_PCIE,
    ["| 0  NVIDIA GeForce RTX 4090        Off |   00000000:01:00.0 Off |                  Off |"],
])
def test_pcie_only_hardware_without_nccl_info_lines(builtin_catalogue, hardware):
    # NCCL_DEBUG unset: no transport lines, but the machine's own description says PCIe only
    assert root_finding(builtin_catalogue, hardware + _watchdog(1, "ALLREDUCE")).category == "hardware"


def test_nvlink_matrix_without_nccl_info_lines_is_not_pcie(builtin_catalogue):
    assert root_finding(builtin_catalogue, _MATRIX_NVLINK + _watchdog(1, "ALLREDUCE")).category == "nccl_timeout"


def test_a_single_gpu_matrix_says_nothing(builtin_catalogue):
    lines = ["\tGPU0\tCPU Affinity\tNUMA Affinity", "GPU0\t X \t0-15\t0"] + _watchdog(1, "ALLREDUCE")
    assert root_finding(builtin_catalogue, lines).category == "nccl_timeout"


def test_a_rank_that_never_reported_is_not_the_link(builtin_catalogue):
    # ranks 1-7 wait in the first barrier, rank 0 says nothing: it was elsewhere (preparing data), not in the collective
    assert root_finding(builtin_catalogue, _init() + _watchdog(1, "BARRIER", ranks=range(1, 8))).category == "nccl_timeout"


def test_one_waiting_rank_says_nothing_of_its_peers(builtin_catalogue):
    assert root_finding(builtin_catalogue, _init() + _watchdog(1, "BARRIER", ranks=(1,))).category == "nccl_timeout"
