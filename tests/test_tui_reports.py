"""Report fixtures for the TUI tests, and checks that they mirror the real logs they stand for.

``ddp_wrap_oom_report`` is what a diagnosis of /work/shared/real_logs/ddp_wrap_oom.log looks like (root cause:
CUDA OOM while DistributedDataParallel allocates its fp32 grad buffer at wrap time), with ``replay`` and
``memory`` sections in the shapes of issues 3 and 4. The TUI tests use it where they need a report that does not
depend on the state of the engine; the tests against the real pipeline live in test_tui_real_logs.py.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
from pathlib import Path

import pytest

from diagnose.explained import ReplayResult, ValidationResult
from diagnose.memory_types import Breakdown, MemoryAnalysis, MemoryOption, MemoryPrediction, PhasePeaks
from diagnose.model import Evidence, Finding, Fix, InputInfo, Override, Report

REAL_LOGS = Path(os.environ.get("DIAGNOSE_REAL_LOGS", "/work/shared/real_logs"))
REPO = Path(__file__).resolve().parent.parent
SAMPLE_LOGS = REPO / "sample_logs"
GIB = 1024**3


def run_async(fn):
    """Run an ``async def`` test with asyncio.run (no pytest async plugin is a dependency)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


def find_log(name: str) -> Path | None:
    """A real log by name: in the repo's sample_logs (CI) or in the shared capture folder (here)."""
    for folder in (SAMPLE_LOGS, REAL_LOGS):
        if (folder / name).is_file():
            return folder / name
    return None


def need_log(name: str) -> Path:
    """The log, or skip the test (fail in CI, where sample_logs/ must have it)."""
    log = find_log(name)
    if log is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} missing from sample_logs/")
        pytest.skip(f"{name} not available")
    return log


def copy_log(name: str, dest: Path) -> Path:
    src = need_log(name)
    target = dest / name
    shutil.copyfile(src, target)
    return target


def line_of(path: Path, needle: str) -> tuple[int, str]:
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if needle in line:
            return n, line
    raise AssertionError(f"{needle!r} not in {path}")


def ddp_wrap_oom_report(log: Path, shown_path: str | None = None) -> Report:
    shown = shown_path or str(log)
    oom_line, oom_text = line_of(log, "torch.OutOfMemoryError: CUDA out of memory")
    frame_line, frame_text = line_of(log, "self.grad_data = torch.zeros(")
    nccl_line, nccl_text = line_of(log, "destroy_process_group() was not called")
    child_line, child_text = line_of(log, "failed (exitcode: 1)")
    size = log.stat().st_size
    lines = len(log.read_text(encoding="utf-8").splitlines())
    oom = Finding(
        rule="OOM103",
        name="cuda-oom-dp-wrap",
        title="CUDA out of memory while wrapping the model for data parallelism",
        category="cuda_oom",
        phase="dp_wrap",
        severity="error",
        role="root",
        confidence=0.9,
        ranks=[0],
        hosts=["localhost"],
        count=1,
        first_line=oom_line,
        evidence=[Evidence(shown, oom_line, oom_text), Evidence(shown, frame_line, frame_text)],
        explanation=(
            "DistributedDataParallel allocates the gradient buffer for every parameter when it wraps the model. "
            "With grad_reduce_in_fp32 the buffer holds 4 bytes per parameter: 135.33 GiB for 36.3B parameters, "
            "on top of the 67.67 GiB of bf16 weights."
        ),
        fix=Fix(
            summary="Shard the model state with Megatron FSDP",
            safety="safe",
            overrides=[
                Override("ddp.use_megatron_fsdp", True),
                Override("ddp.data_parallel_sharding_strategy", "optim_grads_params"),
            ],
            steps=["Or run on more GPUs so that each holds a smaller shard"],
        ),
        facts={"requested_bytes": int(135.33 * GIB), "capacity_bytes": int(139.80 * GIB), "gpu": 0},
    )
    destroy = Finding(
        rule="LA010",
        name="destroy-process-group-not-called",
        title="destroy_process_group() was not called",
        category="launcher",
        phase="shutdown",
        severity="warning",
        role="cascade",
        confidence=0.5,
        ranks=[0],
        count=1,
        first_line=nccl_line,
        evidence=[Evidence(shown, nccl_line, nccl_text)],
        explanation="Printed because the process died; a consequence, not a cause.",
    )
    child = Finding(
        rule="LA001",
        name="torchrun-child-failed",
        title="torchrun: a worker failed (exit code 1)",
        category="launcher",
        phase="shutdown",
        severity="error",
        role="cascade",
        confidence=0.6,
        ranks=[0],
        count=1,
        first_line=child_line,
        evidence=[Evidence(shown, child_line, child_text)],
        explanation="torchrun reports the worker that failed first.",
        facts={"exitcode": 1, "local_rank": 0},
    )
    replay = ReplayResult(
        reproduced=True,
        before=ValidationResult(),
        fix=[
            Override("ddp.use_megatron_fsdp", True),
            Override("ddp.data_parallel_sharding_strategy", "optim_grads_params"),
            Override("checkpoint.ckpt_format", "fsdp_dtensor"),
        ],
        after=ValidationResult(),
        rendered={
            "cli": "ddp.use_megatron_fsdp=true ddp.data_parallel_sharding_strategy=optim_grads_params "
            "checkpoint.ckpt_format=fsdp_dtensor",
            "python": "cfg.ddp.use_megatron_fsdp = True\ncfg.ddp.data_parallel_sharding_strategy = "
            "'optim_grads_params'\ncfg.checkpoint.ckpt_format = 'fsdp_dtensor'",
            "yaml": "ddp:\n  use_megatron_fsdp: true\n  data_parallel_sharding_strategy: optim_grads_params\n"
            "checkpoint:\n  ckpt_format: fsdp_dtensor",
        },
    )
    params = 36_327_530_496
    state = 18 * params
    current = MemoryPrediction(
        strategy="ddp", dp=1, dp_known=False, gpus=1, grad_dtype="fp32", bytes_per_param=18.0,
        model_state_bytes=state, transient_bytes=0,
        components=Breakdown(params=2 * params, grads=4 * params, main_params=4 * params, optimizer=8 * params),
        activation_bytes=None, phase_peaks=PhasePeaks(6 * params, 6 * params, state, state, state),
        peak_bytes=state, usable_bytes=int(134.21 * GIB))

    def option(key: str, value: object, gpus: int, state: int, fits: bool, cost: str) -> MemoryOption:
        return MemoryOption([Override(key, value)], label="", cost=cost, strategy="ddp", gpus=gpus, dp=gpus, tp=1,
                            pp=1, cp=1, model_state_bytes=state, transient_bytes=None, activation_bytes=None,
                            peak_bytes=None, fits=fits)

    memory = MemoryAnalysis(
        int(139.80 * GIB), int(135.33 * GIB), "capacity", params, "log", "dp_wrap", current=current,
        options=[option("ddp.use_megatron_fsdp", True, 16, 18 * params // 16, True,
                        "more communication: all-gather of parameters every step"),
                 option("ddp.grad_reduce_in_fp32", False, 1, 16 * params, False,
                        "bf16 gradient reduction: small numerics change")])
    return Report(
        inputs=[InputInfo(shown, size, lines)],
        findings=[child, oom, destroy],
        root_cause=1,
        replay=replay,
        memory=memory,
    )


def test_fixture_evidence_is_the_real_log_text(tmp_path: Path) -> None:
    log = copy_log("ddp_wrap_oom.log", tmp_path)
    report = ddp_wrap_oom_report(log)
    text = log.read_text(encoding="utf-8").splitlines()
    for finding in report.findings:
        for ev in finding.evidence:
            assert text[ev.line - 1] == ev.text
    assert report.root is not None and report.root.category == "cuda_oom"
    assert "Tried to allocate 135.33 GiB" in report.root.evidence[0].text


def _plan(strategy: str, dp: int, tp: int, pp: int, cp: int, bpp: float, state: float, act: float, cost: str,
          overrides: dict | None = None, label: str = "") -> MemoryOption:
    peak = int((state + act) * GIB)
    return MemoryOption(
        [Override(k, v) for k, v in (overrides or {}).items()], label=label or strategy, cost=cost,
        strategy=strategy, gpus=dp * tp * pp * cp, dp=dp, tp=tp, pp=pp, cp=cp, model_state_bytes=int(state * GIB),
        transient_bytes=0, activation_bytes=int(act * GIB), peak_bytes=peak, fits=peak <= 80 * GIB, valid=True,
        bytes_per_param=bpp, components=Breakdown(params=int(state / 9 * GIB), grads=int(state / 9 * 2 * GIB)))


def llama8b_plan_result():
    """What the plan screen shows for tests/data/configs/llama8b_bridge.yaml with train.micro_batch_size=2 on 8
    GPUs of 80 GiB (``diagnose check``'s model, numbers of 2026-11-29): fixed, so the snapshot pins the screen, not
    the memory model; ``test_plan_fixture_mirrors_the_model`` checks its shape against the live model."""
    from diagnose.explain.memory.plan import MemoryPlan
    from diagnose.present.tui.plan import PlanResult

    tp = {"model.sequence_parallel": True}
    plans = [
        _plan("ddp", 8, 1, 1, 1, 18.0, 134.6, 90.4, ""),
        _plan("ddp", 2, 4, 1, 1, 18.0, 33.7, 21.5, "tensor parallel 4: activation all-gathers every layer, keep TP "
              "inside a node", {"model.tensor_model_parallel_size": 4, **tp}),
        _plan("ddp", 1, 8, 1, 1, 18.0, 16.8, 10.8, "tensor parallel 8: activation all-gathers every layer, keep TP "
              "inside a node", {"model.tensor_model_parallel_size": 8, **tp}),
        _plan("fsdp:optim_grads_params", 8, 1, 1, 1, 2.0, 15.0, 15.2, "Megatron FSDP, everything sharded (ZeRO-3): "
              "weights all-gathered every forward and backward", {"ddp.use_megatron_fsdp": True,
                                                                 "ddp.data_parallel_sharding_strategy":
                                                                     "optim_grads_params"}),
        _plan("ddp", 1, 1, 8, 1, 18.0, 23.4, 82.9, "pipeline parallel 8: pipeline bubbles, more micro batches needed",
              {"model.pipeline_model_parallel_size": 8}),
        _plan("distributed_optimizer", 8, 1, 1, 1, 6.0, 44.9, 90.4, "distributed optimizer: reduce-scatter + "
              "all-gather instead of all-reduce, same speed", {"ddp.use_distributed_optimizer": True}),
    ]
    memory = MemoryPlan(80 * GIB, 8_030_261_248, "config", plans)
    from diagnose.checking import Validation

    return PlanResult(Validation(ReplayResult(None, ValidationResult([]), [], ValidationResult([]))), memory)
