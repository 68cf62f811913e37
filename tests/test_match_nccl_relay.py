"""NCCL's "unhandled cuda error" is a relay: the CUDA failure it names is the diagnosis (HW220 for CUDA's 999).

Synthetic lines in NCCL's and torch's formats, instance details invented.
"""

from __future__ import annotations

from conftest import root_finding

RELAY = [
    "[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970,"
    " unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",
    "[rank3]: ncclUnhandledCudaError: Call to CUDA function failed.",
    "[rank3]: Last error:",
    "[rank3]: Cuda failure {detail}",
]


def _relay(detail: str) -> list[str]:
    return [line.format(detail=detail) for line in RELAY]


def test_cuda_unknown_error_relayed_by_nccl_is_the_device(builtin_catalogue):
    f = root_finding(builtin_catalogue, _relay("999 'unknown error'"))
    assert (f.rule, f.category) == ("HW220", "hardware")


def test_a_program_side_cuda_failure_stays_nccl(builtin_catalogue):
    # 'invalid argument' inside NCCL is a version or usage problem, not the device
    assert root_finding(builtin_catalogue, _relay("'invalid argument'")).category == "nccl_error"


def test_the_devices_own_report_leads_over_the_relay(builtin_catalogue):
    # the node's kernel log, appended after the job's output, names the fault: it is the root, the relay its echo
    sxid = "[ 8812.004411] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 24007, Fatal, Link 44 sourcetrack timeout error"
    f = root_finding(builtin_catalogue, _relay("999 'unknown error'") + [sxid])
    assert f.rule == "HW064"


def test_nvls_setup_failure_keeps_its_own_rule(builtin_catalogue):
    line = "node07:3121:3188 [2] transport/nvls.cc:223 NCCL WARN Cuda failure 999 'unknown error'"
    assert root_finding(builtin_catalogue, [line]).rule == "HW008"


def test_torch_driver_check_unknown_error_is_the_device(builtin_catalogue):
    f = root_finding(builtin_catalogue, ["[rank1]: RuntimeError: CUDA driver error: unknown error"])
    assert (f.rule, f.category) == ("HW220", "hardware")


def test_nvidia_smi_without_driver_is_the_node_unless_the_driver_said_more(builtin_catalogue):
    smi = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
           "NVIDIA driver is installed and running.")
    assert root_finding(builtin_catalogue, [smi]).rule == "HW221"
    xid = "[ 812.004411] NVRM: Xid (PCI:0000:3b:00): 79, pid=2211, name=python, GPU has fallen off the bus."
    assert root_finding(builtin_catalogue, [smi, xid]).rule == "HW004"
