"""Parameter counts: the analytic formula against megatron-core's GPTModel built on the meta device."""

from __future__ import annotations

import pytest

from diagnose.explain.memory.meta_count import available, exact_count, exact_counts
from diagnose.explain.memory.shape import ModelShape, count_params

LLAMA_36B = ModelShape(  # ../shared/real_logs/repro.py "31b": the model of ddp_wrap_oom.log
    num_layers=40, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64, num_query_groups=8,
    vocab_size=128256, seq_length=8192, gated_linear_unit=True, untie_embeddings=True, add_bias_linear=False,
    layernorm=False, position_embedding="rope",
)

SHAPES = {
    "gpt2-like": ModelShape(num_layers=3, hidden_size=256, num_attention_heads=4, vocab_size=1000, seq_length=128),
    "gqa-swiglu-untied": ModelShape(num_layers=2, hidden_size=512, ffn_hidden_size=1376, num_attention_heads=8,
                                    num_query_groups=2, vocab_size=5000, seq_length=64, gated_linear_unit=True,
                                    untie_embeddings=True, add_bias_linear=False, layernorm=False,
                                    position_embedding="rope"),
    "qkv-bias-qk-norm": ModelShape(num_layers=2, hidden_size=384, num_attention_heads=6, num_query_groups=3,
                                   vocab_size=3001, seq_length=32, add_bias_linear=False, add_qkv_bias=True,
                                   qk_layernorm=True, layernorm=False, position_embedding="rope", kv_channels=96),
    "moe-shared-experts": ModelShape(num_layers=4, hidden_size=512, num_attention_heads=8, vocab_size=1000,
                                     seq_length=64, num_moe_experts=8, moe_ffn_hidden_size=256,
                                     moe_shared_expert_intermediate_size=512, moe_shared_expert_gate=True,
                                     moe_layer_freq=2, add_bias_linear=False, gated_linear_unit=True),
}


def test_36b_model_of_the_real_log():
    # " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 36327530496" (ddp_wrap_oom.log)
    assert count_params(LLAMA_36B).total == 36_327_530_496


def test_vocab_padded_to_multiple_of_128_times_tp():
    s = ModelShape(num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=50257)
    assert s.padded_vocab(1) == 50304
    assert s.padded_vocab(8) == 51200


def test_tp_shards_matrices_and_keeps_norms_and_row_biases_whole():
    s = SHAPES["gpt2-like"]
    full, half = count_params(s, tp=1).total, count_params(s, tp=2).total
    h, L = s.hidden_size, s.num_layers
    replicated = (
        L * (2 * 2 * h)  # two LayerNorms (weight + bias) per layer
        + L * 2 * h  # row-parallel biases (proj, fc2)
        + 2 * h  # final norm
        + s.seq_length * h  # learned position embedding
    )
    assert half == (full - replicated) // 2 + replicated


def test_pp_most_loaded_stage_and_stages_sum_to_the_model():
    s = LLAMA_36B
    stages = [count_params(s, pp=4, stage=i).total for i in range(4)]
    assert sum(stages) == count_params(s).total
    assert count_params(s, pp=4).total == max(stages)


def test_ep_divides_experts_only():
    s = SHAPES["moe-shared-experts"]
    one, four = count_params(s, ep=1), count_params(s, ep=4)
    assert four.dense == one.dense
    assert four.expert * 4 == one.expert


@pytest.fixture(scope="module")
def meta_counts() -> dict[str, int | None]:
    if not available():
        pytest.skip("torch and megatron-core are not installed")
    names = sorted(SHAPES) + ["llama-36b"]
    counts = exact_counts([SHAPES[n] for n in sorted(SHAPES)] + [LLAMA_36B])
    assert counts is not None, "the meta-device build did not run"
    return dict(zip(names, counts))


@pytest.mark.megatron
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_analytic_count_matches_meta_device_build(name, meta_counts):
    assert meta_counts[name] == count_params(SHAPES[name]).total


@pytest.mark.megatron
def test_meta_build_of_the_36b_model_needs_no_memory(meta_counts):
    assert meta_counts["llama-36b"] == 36_327_530_496


@pytest.mark.megatron
def test_exact_count_of_one_shape():
    if not available():
        pytest.skip("torch and megatron-core are not installed")
    assert exact_count(SHAPES["gpt2-like"], cache=False) == count_params(SHAPES["gpt2-like"]).total


def test_reconcile_with_the_logged_count_finds_untied_rope():
    from dataclasses import replace

    from diagnose.explain.memory.shape import reconcile

    guessed = replace(LLAMA_36B, untie_embeddings=False, position_embedding="learned_absolute")
    fixed, note = reconcile(guessed, 36_327_530_496)
    assert fixed == LLAMA_36B
    assert "untied embeddings" in note and "rope" in note
    same, none = reconcile(LLAMA_36B, 36_327_530_496)
    assert same == LLAMA_36B and none is None
    unexplained, nothing = reconcile(guessed, 12345)
    assert unexplained == guessed and nothing is None
