"""The memory section on OOMs captured from real Megatron-Bridge / megatron-core runs on an H200
(sample_logs/captured/, each with a .meta.json saying what really happened)."""

from __future__ import annotations

from pathlib import Path

import pytest

CAPTURED = Path(__file__).resolve().parents[1] / "sample_logs" / "captured"
GIB = 2**30

# log -> (verdict, phase, strategy as run, what the failing request was (or None))
CASES = {
    "b042_ddp_wrap_oom": ("capacity", "dp_wrap", "ddp", "the fp32 grad buffer"),
    "b062_distopt_wrap_oom": ("capacity", "dp_wrap", "distributed_optimizer", "the fp32 grad buffer"),
    "b062_mfsdp_optim_wrap_oom": ("capacity", "dp_wrap", "fsdp:optim", "the fp32 main-weight buffer"),
    "b042_mfsdp_ogp_wrap_oom": ("capacity", "dp_wrap", "fsdp:optim_grads_params", None),
    "b062_adam_step_oom": ("capacity", "optimizer_step", "distributed_optimizer", None),
    "b062_first_iter_activation_oom": ("activations", "first_iteration", None, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_captured_oom(name):
    path = CAPTURED / f"{name}.log"
    if not path.exists():
        pytest.skip(f"{path.name} not captured in this checkout")
    from diagnose.pipeline import analyze

    mem = analyze([str(path)]).memory
    assert mem is not None, "no memory section for a CUDA OOM"
    verdict, phase, strategy, request = CASES[name]
    assert mem["verdict"] == verdict
    assert mem["phase"] == phase
    assert mem["gpu_capacity_bytes"] == pytest.approx(139.80 * GIB, rel=1e-3)
    if strategy:
        assert mem["current"]["strategy"] == strategy
    if request:
        assert mem["request_is"] == request
    fitting = [o for o in mem["options"] if o["fits"]]
    assert fitting, "at least one option that fits"
    assert all(o["valid"] is not False for o in fitting)
    assert all(o["peak_bytes"] <= mem["gpu_capacity_bytes"] for o in fitting)
