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
    assert mem.verdict == verdict
    assert mem.phase == phase
    assert mem.gpu_capacity_bytes == pytest.approx(139.80 * GIB, rel=1e-3)
    if strategy:
        assert mem.current.strategy == strategy
    if request:
        assert mem.request_is == request
    fitting = [o for o in mem.options if o.fits]
    assert fitting, "at least one option that fits"
    assert all(o.valid is not False for o in fitting)
    assert all(o.peak_bytes <= mem.gpu_capacity_bytes for o in fitting)


def test_fsdp_wrap_oom_without_a_count_infers_params_from_the_buffer():
    # QA report #19: sample_logs/mfsdp_optim_grads_buffer_oom.log has the strategy (optim_grads, fp32 grads) from the
    # DDP config line and no parameter count: the unsharded bf16 weight buffer (2 B/param; the module's bf16 copy,
    # the same size, is what was allocated before it) gives the count, and the options are not empty
    from diagnose.pipeline import AnalyzeOptions, analyze

    path = Path(__file__).resolve().parents[1] / "sample_logs" / "mfsdp_optim_grads_buffer_oom.log"
    mem = analyze([str(path)], AnalyzeOptions()).memory
    assert mem.params == pytest.approx(mem.requested_bytes / 2, rel=1e-6)
    assert mem.params_source == "log" and mem.current.strategy == "fsdp:optim_grads"
    assert mem.request_is == "the bf16 param buffer"
    assert any("inferred from the request: Megatron FSDP" in n for n in mem.notes)
    assert mem.verdict == "capacity"
    assert any(o.fits for o in mem.options)


def test_fsdp_buffer_named_by_the_code_line_is_used():
    from diagnose.explain.config import ConfigView
    from diagnose.explain.memory.analysis import _params_from_fsdp_buffer
    from diagnose.explain.memory.state import Layout
    from diagnose.explain.memory.verdict import OomNumbers

    lay = Layout(strategy="fsdp:optim_grads_params", gpus=8, grad_bytes=4)
    texts = ['File "megatron_fsdp/param_and_grad_buffer.py", line 2876, in _init_each_parameter_group_buffers',
             "    gbuf.init_data(torch.empty(gbuf.data_size, dtype=gbuf.dtype, device=self.device))"]
    params, note = _params_from_fsdp_buffer(OomNumbers(requested=4 * GIB, allocated=3 * GIB), texts, lay, ConfigView())
    assert params == 8 * GIB  # 4 bytes per parameter sharded over 8 ranks: 0.5 B/param
    assert "grad buffer" in note and "sharded over 8 ranks" in note
