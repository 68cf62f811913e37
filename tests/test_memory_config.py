"""Reading a job's config into shape / layout / workload, with the defaults that changed across releases."""

from __future__ import annotations

import pytest

from diagnose.explain.config import ConfigView, apply_defaults
from diagnose.explain.memory.from_config import layout_from_config, shape_from_config, workload_from_config


def _view(values: dict, mcore: str | None = None, framework: str = "megatron-bridge", defaults: bool = True):
    view = ConfigView(framework=framework, mcore_version=mcore)
    for k, v in values.items():
        view.set(k, v, "file:cfg")
    return apply_defaults(view) if defaults else view


FSDP = {"ddp.use_megatron_fsdp": True, "ddp.grad_reduce_in_fp32": True}


@pytest.mark.parametrize("mcore, expected", [("0.16.1", "fsdp:no_shard"), ("0.17.1", "fsdp:no_shard"),
                                             ("0.18.0", "fsdp:optim_grads_params"),
                                             ("0.19.2", "fsdp:optim_grads_params")])
def test_fsdp_default_sharding_changed_in_core_0_18(mcore, expected):
    assert layout_from_config(_view(FSDP, mcore)).strategy == expected


def test_explicit_sharding_wins_over_the_release_default():
    view = _view({**FSDP, "ddp.data_parallel_sharding_strategy": "optim"}, "0.19.2")
    assert layout_from_config(view).strategy == "fsdp:optim"


@pytest.mark.parametrize("mcore, grad_bytes", [("0.16.1", 4), ("0.18.0", 4), ("0.19.2", 2)])
def test_fsdp_grad_dtype_from_core_0_19_ignores_grad_reduce_in_fp32(mcore, grad_bytes):
    assert layout_from_config(_view(FSDP, mcore)).grad_bytes == grad_bytes


def test_fsdp_main_grads_dtype_fp32_on_core_0_19():
    view = _view({**FSDP, "ddp.megatron_fsdp_main_grads_dtype": "fp32"}, "0.19.2")
    assert layout_from_config(view).grad_bytes == 4


def test_bridge_mixed_precision_reduces_grads_in_fp32():
    assert layout_from_config(_view({"mixed_precision": "bf16_mixed"})).grad_bytes == 4
    assert layout_from_config(_view({"mixed_precision.grad_reduce_in_fp32": False})).grad_bytes == 2
    assert layout_from_config(_view({})).grad_bytes == 2  # Bridge DDP default grad_reduce_in_fp32=False


def test_megatron_lm_bf16_means_fp32_grads_unless_told_otherwise():
    assert layout_from_config(_view({"model.bf16": True}, framework="megatron-lm")).grad_bytes == 4
    view = _view({"model.bf16": True, "mlm.grad_reduce_in_bf16": True}, framework="megatron-lm")
    assert layout_from_config(view).grad_bytes == 2


def test_either_fsdp_flag_turns_it_on_and_dist_opt_from_either_section():
    assert layout_from_config(_view({"dist.use_megatron_fsdp": True}, "0.19.0")).fsdp
    assert layout_from_config(_view({"optimizer.use_distributed_optimizer": True})).strategy == "distributed_optimizer"


def test_parallel_sizes_world_and_workload():
    view = _view({"model.num_layers": 8, "model.hidden_size": 1024, "model.num_attention_heads": 8,
                  "model.tensor_model_parallel_size": 2, "model.pipeline_model_parallel_size": 2,
                  "model.context_parallel_size": 2, "launch.world_size": 64, "train.micro_batch_size": 2,
                  "train.global_batch_size": 64, "model.recompute_granularity": "full",
                  "model.sequence_parallel": True, "model.seq_length": 8192})
    shape = shape_from_config(view)
    lay = layout_from_config(view)
    work = workload_from_config(view, shape, lay)
    assert (lay.tp, lay.pp, lay.cp, lay.dp, lay.gpus) == (2, 2, 2, 8, 64)
    assert work.micro_batch_size == 2 and work.recompute == "full" and work.sequence_parallel
    assert work.num_microbatches == 64 // (2 * 8)
    assert shape.seq_length == 8192


@pytest.mark.parametrize("bad", [{"model.num_layers": "many"}, {"model.num_layers": -2}, {"model.hidden_size": 0}, {}])
def test_no_shape_when_sizes_are_missing_or_junk(bad):
    base = {"model.num_layers": 4, "model.hidden_size": 256, "model.num_attention_heads": 4}
    base.update(bad)
    if not bad:
        base.pop("model.num_layers")
    assert shape_from_config(_view(base)) is None


@pytest.mark.parametrize("freq", ["([0]*3+[1]*5)", [0, 0, 0, 1, 1, 1, 1, 1]])
def test_moe_layer_freq_as_a_pattern_string_gives_the_same_shape_as_the_list(freq):
    """QA2 #4: a YAML ``moe_layer_freq: "([0]*3+[1]*5)"`` (converted by megatron's moe_freq_type) made every layer MoE."""
    shape = shape_from_config(_view({
        "model.num_layers": 8, "model.hidden_size": 1024, "model.num_attention_heads": 8, "model.num_moe_experts": 16,
        "model.moe_ffn_hidden_size": 512, "model.moe_layer_freq": freq}))
    assert shape is not None and shape.moe_layer_freq == (0, 0, 0, 1, 1, 1, 1, 1)
