"""Bytes per parameter per strategy (megatron-core.md §2 tables) and phase-aware peaks."""

from __future__ import annotations

import pytest

from diagnose.explain.memory.shape import ParamCount
from diagnose.explain.memory.state import Layout, model_state, phases

P = 1_000_000_000


@pytest.mark.parametrize("n", [1, 2, 8, 64])
@pytest.mark.parametrize(
    "strategy, g4, g2",
    [
        ("ddp", lambda n: 18, lambda n: 16),
        ("distributed_optimizer", lambda n: 6 + 12 / n, lambda n: 4 + 12 / n),
        ("fsdp:no_shard", lambda n: 18, lambda n: 16),
        ("fsdp:optim", lambda n: 6 + 12 / n, lambda n: 4 + 12 / n),
        ("fsdp:optim_grads", lambda n: 2 + 16 / n, lambda n: 2 + 14 / n),
        ("fsdp:optim_grads_params", lambda n: 18 / n, lambda n: 16 / n),
    ],
)
def test_bytes_per_param_tables(strategy, g4, g2, n):
    for grad_bytes, table in ((4, g4), (2, g2)):
        state = model_state(ParamCount(P), Layout(strategy, gpus=n, grad_bytes=grad_bytes))
        assert state.bytes_per_param == pytest.approx(table(n))


def test_shard_group_is_dp_times_cp_over_instances():
    lay = Layout("fsdp:optim_grads_params", gpus=64, tp=2, pp=2, cp=2, dist_opt_instances=2)
    assert lay.dp == 8
    assert lay.shard_group == 8 * 2 // 2
    state = model_state(ParamCount(P), lay)
    assert state.components["optimizer"] == pytest.approx(8 * P / 8, rel=1e-9)


def test_expert_params_shard_over_expert_dp():
    lay = Layout("distributed_optimizer", gpus=64, tp=1, ep=8)
    dense_only = model_state(ParamCount(P), lay)
    with_experts = model_state(ParamCount(P, expert=8 * P), lay)
    # dense optimizer state over DP=64, expert state over expert DP = 64 / 8 = 8
    extra_opt = with_experts.components["optimizer"] - dense_only.components["optimizer"]
    assert extra_opt == pytest.approx(8 * 8 * P / 8, rel=1e-9)


def test_cpu_offload_moves_optimizer_and_main_params_off_the_gpu():
    lay = Layout("distributed_optimizer", gpus=8, optimizer_offload_fraction=1.0)
    c = model_state(ParamCount(P), lay).components
    assert c["optimizer"] == 0 and c["main_params"] == 0 and c["params"] == 2 * P


def test_wrap_peak_ddp_with_distributed_optimizer_holds_two_bf16_copies_and_the_grad_buffer():
    lay = Layout("distributed_optimizer", gpus=1, grad_bytes=4)
    st = model_state(ParamCount(P), lay)
    ph = phases(st, lay)
    assert ph.wrap_peak == 2 * P + 2 * P + 4 * P
    assert ph.after_wrap == 2 * P + 4 * P
    assert ph.first_step_peak == 18 * P  # Adam appears at the first step


def test_wrap_peak_fsdp_per_strategy():
    def peak(strategy, meta=False, gpus=8):
        lay = Layout(strategy, gpus=gpus, grad_bytes=4, meta_init=meta)
        return phases(model_state(ParamCount(P), lay, layer_params=P // 32), lay)

    # optim_grads: the whole weight buffer next to the module and the main shard, more than the state after it
    assert peak("fsdp:optim_grads").after_wrap == 2 * P + 4 * P // 8 + 4 * P // 8
    assert peak("fsdp:optim_grads").wrap_peak == 2 * P + 2 * P + 4 * P // 8
    # optim: the whole grad buffer allocated last dominates
    assert peak("fsdp:optim").wrap_peak == 2 * P + 4 * P + 4 * P // 8
    # optim_grads_params: the module plus one layer in flight, or the sharded state once done
    ogp = peak("fsdp:optim_grads_params")
    assert ogp.after_wrap == int(10 * P / 8)
    assert ogp.wrap_peak == 2 * P + model_state(ParamCount(P), Layout("fsdp:optim_grads_params", gpus=8),
                                                layer_params=P // 32).components["buffers"]
    assert peak("fsdp:optim_grads_params", meta=True).wrap_peak == ogp.after_wrap  # meta init: no module
    assert peak("fsdp:no_shard").wrap_peak == 10 * P


def test_bf16_grads_add_an_fp32_cast_at_the_step():
    lay = Layout("distributed_optimizer", gpus=4, grad_bytes=2)
    st = model_state(ParamCount(P), lay)
    ph = phases(st, lay)
    assert ph.detail["grad_cast"] == st.components["main_params"] == P  # 4 bytes / 4 ranks
    assert ph.first_step_peak == st.persistent + P


def test_fsdp_optim_grads_without_overlap_holds_the_whole_grad():
    overlap = Layout("fsdp:optim_grads", gpus=8, overlap_grad_reduce=True)
    single_bucket = Layout("fsdp:optim_grads", gpus=8, overlap_grad_reduce=False)
    a = model_state(ParamCount(P), overlap, layer_params=P // 32)
    b = model_state(ParamCount(P), single_bucket, layer_params=P // 32)
    assert b.components["buffers"] == int(4 * P * 7 / 8)
    assert a.components["buffers"] < b.components["buffers"] / 4


def test_activations_reported_in_the_steady_peak():
    lay = Layout("fsdp:optim_grads_params", gpus=8)
    st = model_state(ParamCount(P), lay)
    assert phases(st, lay, activations=5 * P).steady_peak == st.total + 5 * P


def test_checkpoint_phase_stages_a_copy_of_the_local_shard():
    lay = Layout("fsdp:optim_grads_params", gpus=8)
    st = model_state(ParamCount(P), lay)
    ph = phases(st, lay)
    assert ph.checkpoint_peak == st.persistent + st.components["main_params"]


def test_bytes_per_param_is_persistent_state_without_the_transient_fsdp_buffers():
    # QA report #10: optim_grads_params at DP=64 is 18/64 B/param (megatron-core.md §2); the gathered weights and
    # unsharded grads in flight are reported apart (components.buffers, transient) and still count in the peaks
    lay = Layout(strategy="fsdp:optim_grads_params", gpus=64, grad_bytes=4)
    st = model_state(ParamCount(36 * P), lay, layer_params=900_000_000)
    assert st.transient > 0 and st.components["buffers"] == st.transient
    assert st.bytes_per_param == pytest.approx(18 / 64, rel=1e-6)
    assert st.persistent == st.total - st.transient
    assert phases(st, lay).steady_peak == st.total
