"""NCCL's duplicate GPU (or torch's `invalid usage` for it) under a per-GPU launcher is the launch's doing: the
program never turned its local rank into a device (NC533, category launcher). With an inference engine in the job
the duplicate is a trainer and a co-located server (NC010, nccl_error). The communicator's first collective names
the phase: the DDP wrap when the error's own traceback runs through it."""

from __future__ import annotations

from conftest import analyzed

TORCHRUN = "WARNING:torch.distributed.run:\n*****************************************"
DDP_TRACEBACK = """Traceback (most recent call last):
  File "/work/train.py", line 88, in <module>
    model = torch.nn.parallel.DistributedDataParallel(
  File "/usr/lib/python3.10/site-packages/torch/nn/parallel/distributed.py", line 795, in __init__
    _verify_param_shape_across_processes(self.process_group, parameters)
  File "/usr/lib/python3.10/site-packages/torch/distributed/utils.py", line 265, in _verify_param_shape_across_processes
    return dist._verify_params_across_processes(process_group, tensors, logger)
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3
ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
Last error:
Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"""


def _root(report):
    return next(f for f in report.findings if f.role == "root")


def test_duplicate_gpu_under_torchrun_is_the_launch_and_its_phase_is_the_wrap(tmp_path):
    root = _root(analyzed(tmp_path, TORCHRUN + "\n" + DDP_TRACEBACK + "\n"))
    assert (root.rule, root.category, root.phase) == ("NC533", "launcher", "dp_wrap")


def test_without_a_launcher_it_stays_nccl(tmp_path):
    root = _root(analyzed(tmp_path, DDP_TRACEBACK + "\n"))
    assert root.category == "nccl_error" and root.rule != "NC533"


def test_a_colocated_inference_engine_keeps_it_nccl(tmp_path):
    text = TORCHRUN + "\nINFO 03-01 10:00:01 llm_engine.py:237] Initializing a vLLM engine (v0.6.3)\n" + DDP_TRACEBACK
    root = _root(analyzed(tmp_path, text + "\n"))
    assert root.category == "nccl_error" and root.rule != "NC533"
