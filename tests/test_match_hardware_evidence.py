"""Hardware evidence anywhere in the job leads the NCCL errors it explains (built-in catalogue, synthetic logs).

A diagnostic's picture of a node (ibstat's port state, systemctl's fabric manager status, nvidia-smi's ECC counters)
printed after the failure is the cause of the NCCL error or timeout the ranks reported before it; a device fault also
leads a communicator failure read as a failed link only because training had run (HW131, reports = link_failure).
"""

from __future__ import annotations

import pytest

from diagnose.match import load_catalogue, match_text

CAT = load_catalogue()

PROGRESS = (" [2024-07-11 10:10:00] iteration      110/  300000 | consumed samples:        56320 | elapsed time per "
            "iteration (ms): 2310.0 | learning rate: 1.200000E-04 | global batch size:   512 | lm loss: 4.930000E+00 |")
INIT_ERROR = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970,"
              " unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")
TIMEOUT = ("[rank3]:[E1105 10:12:01.123456789 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum=41862, OpType=ALLREDUCE, NumelIn=9437184, NumelOut=9437184, Timeout(ms)=600000) "
           "ran for 600047 milliseconds before timing out.")
REMOTE = ("[rank3]:[E1105 10:12:01.123456789 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) Rank 3] Process "
          "group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network "
          "error, NCCL version 2.21.5\n"
          "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.")

IBSTAT_DOWN = ("$ ibstat mlx5_2\nCA 'mlx5_2'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tFirmware version: 28.39.1002\n"
               "\tPort 1:\n\t\tState: Down\n\t\tPhysical state: Polling\n\t\tRate: 400\n\t\tLink layer: InfiniBand")
IBSTAT_ACTIVE = IBSTAT_DOWN.replace("State: Down", "State: Active").replace("Polling", "LinkUp")
IBV_DOWN = ("$ ibv_devinfo -d mlx5_2\nhca_id:\tmlx5_2\n\ttransport:\t\t\tInfiniBand (0)\n\tphys_port_cnt:\t\t\t1\n"
            "\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_DOWN (1)\n\t\t\tmax_mtu:\t\t4096 (5)")
FM_FAILED = ("$ systemctl status nvidia-fabricmanager\n"
             "\u25cf nvidia-fabricmanager.service - NVIDIA fabric manager service\n"
             "     Loaded: loaded (/lib/systemd/system/nvidia-fabricmanager.service; enabled; vendor preset: enabled)\n"
             "     Active: failed (Result: exit-code) since Tue 2024-11-05 09:58:11 UTC; 2h ago")
FM_JOURNAL = "Nov 05 09:58:11 gpu12 systemd[1]: nvidia-fabricmanager.service: Failed with result 'exit-code'."
FM_RUNNING = FM_FAILED.replace("failed (Result: exit-code)", "active (running)")
ECC_VOLATILE = ("$ nvidia-smi -q -d ECC -i 5\n    ECC Errors\n        Volatile\n            SRAM Correctable              : 0\n"
                "            SRAM Uncorrectable            : 2\n            DRAM Correctable              : 0\n"
                "            DRAM Uncorrectable            : 0")
ECC_AGGREGATE_ONLY = ("    ECC Errors\n        Volatile\n            SRAM Correctable              : 0\n"
                      "            SRAM Uncorrectable            : 0\n            DRAM Correctable              : 0\n"
                      "            DRAM Uncorrectable            : 0\n        Aggregate\n"
                      "            SRAM Correctable              : 0\n            SRAM Uncorrectable            : 0\n"
                      "            DRAM Correctable              : 0\n            DRAM Uncorrectable            : 7")
AER_GPU = ("[ 8812.401233] nvidia 0000:41:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction "
           "Layer, (Requester ID)")
XID_DBE = ("NVRM: Xid (PCI:0000:3b:00): 48, pid=22311, name=python, An uncorrectable double bit error (DBE) has been "
           "detected on GPU in the framebuffer at partition 6, subpartition 0.")


def _root(text: str):
    report = match_text(text, CAT)
    assert report.root is not None
    return report.root


@pytest.mark.parametrize(("failure", "evidence", "code"), [
    (INIT_ERROR, IBSTAT_DOWN, "HW069"),
    (INIT_ERROR, IBV_DOWN, "HW069"),
    (TIMEOUT, IBSTAT_DOWN, "HW069"),
    (INIT_ERROR, FM_FAILED, "HW072"),
    (TIMEOUT, FM_FAILED, "HW072"),
    (TIMEOUT, FM_JOURNAL, "HW070"),
    (INIT_ERROR, ECC_VOLATILE, "HW071"),
    (TIMEOUT, ECC_VOLATILE, "HW071"),
    (INIT_ERROR, AER_GPU, "HW053"),
])
def test_a_node_diagnostic_printed_after_the_nccl_failure_leads_it(failure, evidence, code):
    root = _root(f"{PROGRESS}\n{failure}\n{evidence}\n")
    assert root.rule == code and root.category == "hardware"


@pytest.mark.parametrize("evidence", [IBSTAT_ACTIVE, FM_RUNNING, ECC_AGGREGATE_ONLY])
def test_a_healthy_diagnostic_leaves_the_nccl_failure_the_root(evidence):
    root = _root(f"{INIT_ERROR}\n{evidence}\n")
    assert root.category == "nccl_error"


def test_a_node_diagnostic_does_not_lead_an_error_that_is_not_nccls():
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.10 GiB"
    root = _root(f"{PROGRESS}\n{oom}\n{IBSTAT_DOWN}\n")
    assert root.category == "cuda_oom"


def test_a_device_fault_leads_a_remote_error_read_as_a_failed_link_by_its_timing():
    alone = _root(f"{PROGRESS}\n{REMOTE}\n")
    assert alone.rule == "HW131"  # training had run: a link that failed mid-run
    root = _root(f"{PROGRESS}\n{REMOTE}\n{XID_DBE}\n")
    assert root.category == "hardware" and root.rule in {"HW003", "HW004"}
    root = _root(f"{PROGRESS}\n{REMOTE}\n{IBSTAT_DOWN}\n")
    assert root.rule == "HW069"
