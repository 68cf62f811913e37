"""FP8 (weight copies and transposes, FP8 parameters, FP8-saved GEMM inputs) and CUDA graphs' static buffers:
estimates, checked here against hand computations in direction and size."""

from __future__ import annotations

import pytest
from conftest import config_view

from diagnose.explain.config import ConfigView
from diagnose.explain.memory.activations import Workload, activation_bytes, cuda_graph_bytes
from diagnose.explain.memory.from_config import layout_from_config, shape_from_config, workload_from_config
from diagnose.explain.memory.options import Scenario, evaluate
from diagnose.explain.memory.shape import ModelShape, count_params
from diagnose.explain.memory.state import Layout, model_state, phases

GIB = 2**30
SHAPE = ModelShape(num_layers=16, hidden_size=2048, num_attention_heads=16, num_query_groups=8,
                   ffn_hidden_size=8192, vocab_size=32000, gated_linear_unit=True, add_bias_linear=False,
                   layernorm=False, position_embedding="rope", untie_embeddings=True)


def test_linear_weights_are_the_transformer_layers():
    c = count_params(SHAPE)
    h, v = 2048, SHAPE.padded_vocab(1)
    # every parameter but the two embeddings and the final norm (layer norms are counted in: 2h of ~50M per layer)
    assert c.linear == c.total - 2 * v * h - h
    per_layer = (2048 + 2 * 8 * 128) * h + h * 2048 + 3 * h * 8192 + 2 * h
    assert c.linear == 16 * per_layer


def test_fp8_compute_keeps_an_fp8_copy_and_a_transpose_of_each_linear_weight():
    c = count_params(SHAPE)
    bf16 = Layout(strategy="distributed_optimizer", gpus=8, grad_bytes=4)
    fp8 = Layout(strategy="distributed_optimizer", gpus=8, grad_bytes=4, fp8=True)
    s16, s8 = model_state(c, bf16), model_state(c, fp8)
    assert "fp8" not in s16.components
    assert s8.components["fp8"] == 2 * c.linear
    assert s8.persistent - s16.persistent == 2 * c.linear
    # the copies appear with the first forward: not at the DP wrap, in every later peak
    p16, p8 = phases(s16, bf16), phases(s8, fp8)
    assert p8.wrap_peak == p16.wrap_peak
    assert p8.steady_peak - p16.steady_peak == 2 * c.linear


def test_fp8_params_halve_the_param_buffer_for_linear_weights():
    c = count_params(SHAPE)
    fp8 = Layout(strategy="distributed_optimizer", gpus=8, grad_bytes=4, fp8=True)
    fp8p = Layout(strategy="distributed_optimizer", gpus=8, grad_bytes=4, fp8=True, fp8_params=True)
    a, b = model_state(c, fp8), model_state(c, fp8p)
    assert a.components["params"] - b.components["params"] == pytest.approx(c.linear, abs=1)
    assert b.components["fp8"] == c.linear  # only the transpose
    assert a.components["grads"] == b.components["grads"]
    assert a.components["main_params"] == b.components["main_params"]
    assert a.persistent - b.persistent == pytest.approx(2 * c.linear, abs=1)


def test_fp8_params_with_full_sharding_divide_by_the_shard_group():
    c = count_params(SHAPE)
    bf16 = Layout(strategy="fsdp:optim_grads_params", gpus=8, grad_bytes=4, fp8=True)
    fp8p = Layout(strategy="fsdp:optim_grads_params", gpus=8, grad_bytes=4, fp8=True, fp8_params=True)
    saved = model_state(c, bf16).components["params"] - model_state(c, fp8p).components["params"]
    assert saved == pytest.approx(c.linear / 8, abs=1)


def test_fp8_saves_the_gemm_inputs_at_one_byte():
    work16 = Workload(micro_batch_size=1, seq_length=4096)
    work8 = Workload(micro_batch_size=1, seq_length=4096, fp8=True)
    saved = activation_bytes(SHAPE, work16) - activation_bytes(SHAPE, work8)
    # per layer and token: QKV input h, projection input h, fc1 input h, fc2 input f (1 byte instead of 2)
    assert saved == pytest.approx(16 * 4096 * (3 * 2048 + 8192), abs=2)


def test_cuda_graphs_static_buffers_by_hand():
    work = Workload(micro_batch_size=2, seq_length=4096, cuda_graphs="local", num_microbatches=32)
    tokens, h = 8192, 2048
    # PP=1: one graph per layer, reused: input, output and their two gradients, bf16
    assert cuda_graph_bytes(SHAPE, work) == 16 * 4 * 2 * tokens * h
    # PP=4: 4 layers per stage, one set per micro batch in flight (4 on the first stage, 1 on the last)
    assert cuda_graph_bytes(SHAPE, work, pp=4, stage=0) == 4 * 4 * 4 * 2 * tokens * h
    assert cuda_graph_bytes(SHAPE, work, pp=4, stage=3) == 4 * 1 * 4 * 2 * tokens * h
    assert cuda_graph_bytes(SHAPE, Workload(micro_batch_size=2, seq_length=4096)) == 0


def test_cuda_graphs_raise_the_planned_peak():
    layout = Layout(strategy="distributed_optimizer", gpus=8, grad_bytes=4)
    plain = Workload(micro_batch_size=1, seq_length=4096)
    graphs = Workload(micro_batch_size=1, seq_length=4096, cuda_graphs="transformer_engine")
    scn = Scenario(SHAPE, layout, plain, 80 * GIB)
    a = evaluate(scn, "a", [], layout, plain, "", 0.0)
    b = evaluate(scn, "b", [], layout, graphs, "", 0.0)
    assert b.state.components["cuda_graphs"] == 16 * 4 * 2 * 4096 * 2048
    assert b.peak - a.peak == b.state.components["cuda_graphs"]
    assert b.state.bytes_per_param == pytest.approx(a.state.bytes_per_param)  # not a per-parameter cost


def _view(values: dict) -> ConfigView:
    return config_view({"model.num_layers": 4, "model.hidden_size": 1024, "model.num_attention_heads": 16, **values})


@pytest.mark.parametrize("values, fp8, params", [
    ({}, False, False),
    ({"model.fp8": "hybrid"}, True, False),
    ({"model.fp8": None}, False, False),
    ({"mixed_precision": "bf16_mixed"}, False, False),
    ({"mixed_precision": "bf16_with_fp8_delayed_scaling_mixed"}, True, True),
    ({"mixed_precision": "bf16_with_fp8_current_scaling_mixed"}, True, False),
    ({"mixed_precision.fp8": "e4m3", "mixed_precision.fp8_param_gather": True}, True, True),
    ({"model.fp8": "hybrid", "ddp.fp8_param_gather": True}, True, True),
    ({"mlm.fp8": "hybrid", "mlm.fp8_param_gather": True}, True, True),
    ({"mlm.fp8_format": "e4m3"}, True, False),
])
def test_config_fp8(values, fp8, params):
    layout = layout_from_config(_view(values))
    assert (layout.fp8, layout.fp8_params) == (fp8, params)
    view = _view(values)
    assert workload_from_config(view, shape_from_config(view), layout).fp8 == fp8


@pytest.mark.parametrize("values, impl", [
    ({}, None),
    ({"model.cuda_graph_impl": "local"}, "local"),
    ({"model.cuda_graph_impl": "transformer_engine"}, "transformer_engine"),
    ({"model.cuda_graph_impl": "none", "model.enable_cuda_graph": True}, "local"),
    ({"mlm.external_cuda_graph": True}, "transformer_engine"),
])
def test_config_cuda_graphs(values, impl):
    view = _view(values)
    assert workload_from_config(view, shape_from_config(view), layout_from_config(view)).cuda_graphs == impl
