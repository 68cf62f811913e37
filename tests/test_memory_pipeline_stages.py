"""Uneven pipeline stages: the layer split megatron-core builds, the embedding / output layer on the first / last
stage, micro batches in flight per stage, and the peak taken on the worst stage (also in ``diagnose check``)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import config_view

from diagnose.explain.memory.activations import Workload, activation_bytes, in_flight
from diagnose.explain.memory.from_config import shape_from_config
from diagnose.explain.memory.options import Scenario, evaluate
from diagnose.explain.memory.plan import memory_plan
from diagnose.explain.memory.shape import ModelShape, stage_counts
from diagnose.explain.memory.state import Layout, model_state

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
# Llama-3-8B-like: RoPE, tied embeddings for the stage arithmetic below
LLAMA = ModelShape(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                   ffn_hidden_size=14336, vocab_size=128256, gated_linear_unit=True, add_bias_linear=False,
                   layernorm=False, position_embedding="rope")


@pytest.mark.parametrize("fields, pp, expected", [
    ({}, 4, [8, 8, 8, 8]),
    ({"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True,
      "num_layers": 30}, 4, [7, 8, 8, 7]),  # (30 + 2) / 4 = 8, one fewer on the first and the last
    ({"account_for_embedding_in_pipeline_split": True, "num_layers": 31}, 4, [7, 8, 8, 8]),
    ({"num_layers_in_first_pipeline_stage": 3, "num_layers_in_last_pipeline_stage": 2, "num_layers": 61},
     16, [3] + [4] * 14 + [2]),
    ({"num_layers_in_last_pipeline_stage": 2, "num_layers": 32}, 4, [10, 10, 10, 2]),
    ({"num_layers_in_first_pipeline_stage": 3, "num_layers_in_last_pipeline_stage": 5, "num_layers": 8}, 2, [3, 5]),
])
def test_stage_layers_follow_get_num_layers_to_build(fields, pp, expected):
    shape = replace(LLAMA, **fields)
    assert shape.stage_layers(pp) == expected
    assert sum(shape.stage_layers(pp)) == shape.num_layers


def test_the_embedding_stage_holds_vocab_times_hidden_times_bytes_per_param_more_than_a_middle_stage():
    v, h = LLAMA.padded_vocab(1), LLAMA.hidden_size
    counts = stage_counts(LLAMA, tp=1, pp=4)
    assert counts[0].total - counts[1].total == v * h
    assert counts[3].total - counts[1].total == v * h + h  # the output layer (tied copy) and the final norm
    layout = Layout(strategy="ddp", gpus=4, pp=4, grad_bytes=4)  # 18 bytes / parameter
    first, middle = model_state(counts[0], layout), model_state(counts[1], layout)
    assert first.persistent - middle.persistent == pytest.approx(18 * v * h, abs=4)
    # distributed optimizer over 8 data-parallel ranks: 6 + 12/8 = 7.5 bytes / parameter
    dist = Layout(strategy="distributed_optimizer", gpus=32, pp=4, grad_bytes=4)
    assert (model_state(counts[0], dist).persistent - model_state(counts[1], dist).persistent
            == pytest.approx(7.5 * v * h, abs=4))


def test_1f1b_stage_i_holds_pp_minus_i_micro_batches():
    work = Workload(num_microbatches=64)
    assert [in_flight(work, 4, i) for i in range(4)] == [4, 3, 2, 1]
    assert in_flight(Workload(num_microbatches=2), 4, 0) == 2  # fewer micro batches than stages
    # interleaved: Megatron's first-stage factor pp * (1 + (pp - 1) / (pp * vpp))
    assert in_flight(Workload(num_microbatches=64, virtual_pp=2), 4, 0) == pytest.approx(4 * (1 + 3 / 8))


def _layer(tokens: int) -> int:
    """One Llama-3-8B layer by hand (a Transformer Engine job: TE norms, flash attention, fused SwiGLU), bytes:
    norms 2 x 2h, QKV and fc1 inputs 2 x 2h, Q 2h, K 2kv, the QKV output 2(h + 2kv), the attention output 2h,
    softmax statistics 4a, SwiGLU 6f; kv = 8 groups x 128."""
    h, kv, a, f = 4096, 1024, 32, 14336
    return tokens * (4 * h + 4 * h + 2 * h + 2 * kv + 2 * (h + 2 * kv) + 2 * h + 4 * a + 6 * f)


def test_activation_per_stage_by_hand():
    work = Workload(micro_batch_size=1, seq_length=2048, num_microbatches=64)
    tokens, layer = 2048, _layer(2048)
    h = LLAMA.hidden_size
    embed_out = 2 * tokens * h * 4  # embedding outputs of the 4 micro batches in flight
    logits = 4 * tokens * h + 6 * tokens * LLAMA.padded_vocab(1)
    assert activation_bytes(LLAMA, work, pp=4, stage=0) == int(8 * layer * 4 + embed_out)
    assert activation_bytes(LLAMA, work, pp=4, stage=3) == int(8 * layer * 1 + logits)
    assert activation_bytes(LLAMA, work, pp=4) == activation_bytes(LLAMA, work, pp=4, stage=0)


def test_pp1_activations_unchanged_by_hand():
    # PP=1: layers x per-layer + the final norm (2h), the output layer's input (2h) and the loss: the fp32 softmax
    # of the logits (4V) while the bf16 logits (2V) exist
    work = Workload(micro_batch_size=2, seq_length=1024)
    tokens, h = 2048, LLAMA.hidden_size
    expected = 32 * _layer(tokens) + 4 * tokens * h + 6 * tokens * LLAMA.padded_vocab(1)
    assert activation_bytes(LLAMA, work) == int(expected)


def test_the_peak_is_on_the_worst_stage_not_the_first():
    # a heavy last stage: 20 of 32 layers there (with the output layer and the logits)
    heavy_last = replace(LLAMA, num_layers_in_last_pipeline_stage=20)
    layout = Layout(strategy="distributed_optimizer", gpus=32, pp=4, grad_bytes=4)
    work = Workload(micro_batch_size=1, seq_length=4096, num_microbatches=16)
    plan = evaluate(Scenario(heavy_last, layout, work, 140 * GIB), "x", [], layout, work, "", 0.0)
    assert plan.stage == 3
    assert plan.peak == max(plan.stage_peaks) and plan.stages_differ
    assert heavy_last.stage_layers(4) == [4, 4, 4, 20]
    # the reported state is the last stage's: 20 layers + the output layer + the final norm
    assert plan.state.params == stage_counts(heavy_last, pp=4)[3].total
    # an even split peaks on the first stage (4 micro batches in flight)
    even = evaluate(Scenario(LLAMA, layout, work, 140 * GIB), "x", [], layout, work, "", 0.0)
    assert even.stage == 0 and even.peak < plan.peak


_view = config_view


CONFIG = {
    "model.num_layers": 32, "model.hidden_size": 4096, "model.num_attention_heads": 32,
    "model.num_query_groups": 8, "model.ffn_hidden_size": 14336, "model.vocab_size": 128256,
    "model.seq_length": 4096, "model.gated_linear_unit": True, "model.normalization": "RMSNorm",
    "model.position_embedding_type": "rope", "model.pipeline_model_parallel_size": 4,
    "model.num_layers_in_first_pipeline_stage": 2, "model.num_layers_in_last_pipeline_stage": 14,
    "ddp.use_distributed_optimizer": True, "train.micro_batch_size": 1, "train.global_batch_size": 128,
}


def test_config_uneven_split_reaches_the_plan_and_names_the_worst_stage():
    view = _view(CONFIG)
    shape = shape_from_config(view)
    assert shape.stage_layers(4) == [2, 8, 8, 14]
    plan = memory_plan(view, 32, 140 * GIB)
    given = plan.given
    assert given.worst_stage == 3 and given.peak_bytes == max(given.stage_peak_bytes)
    assert any("stage 3" in n and "last" in n for n in plan.notes)
    d = plan.to_dict()["plans"][0]
    assert d["worst_stage"] == 3 and d["stage_peak_bytes"] == given.stage_peak_bytes
    assert d["peak_bytes"] == max(d["stage_peak_bytes"])


def test_config_account_for_embedding_and_loss():
    view = _view({**CONFIG, "model.num_layers": 30, "model.num_layers_in_first_pipeline_stage": None,
                  "model.num_layers_in_last_pipeline_stage": None,
                  "model.account_for_embedding_in_pipeline_split": True,
                  "model.account_for_loss_in_pipeline_split": True})
    assert shape_from_config(view).stage_layers(4) == [7, 8, 8, 7]


def test_diagnose_check_reports_the_worst_stage(tmp_path):
    lines = ["model:"] + [f"  {k.split('.', 1)[1]}: {json.dumps(v)}" for k, v in CONFIG.items()
                          if k.startswith("model.")]
    lines += ["ddp:", "  use_distributed_optimizer: true", "train:", "  micro_batch_size: 1",
              "  global_batch_size: 128"]
    cfg = tmp_path / "uneven.yaml"
    cfg.write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, "-m", "diagnose", "check", str(cfg), "--gpus", "32", "--gpu", "h200"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr
    text = " ".join(out.stdout.split())
    assert "peak is on stage 3 of 0..3 (the last stage)" in text


@pytest.mark.parametrize("fields, ok, bad", [
    ({}, [1, 2, 4, 8, 16, 32], [3, 5, 6]),
    ({"num_layers": 61, "num_layers_in_first_pipeline_stage": 3, "num_layers_in_last_pipeline_stage": 2},
     [3, 4, 9, 16], [1, 2, 5, 8]),  # 56 middle layers over pp - 2 stages; pp=3: one middle stage of 56
    ({"num_layers": 30, "account_for_embedding_in_pipeline_split": True,
      "account_for_loss_in_pipeline_split": True}, [2, 4, 8, 16], [1, 3, 5]),
])
def test_pipeline_sizes_megatron_accepts(fields, ok, bad):
    shape = replace(LLAMA, **fields)
    assert [p for p in ok + bad if shape.pipeline_split_ok(p)] == ok
    for p in ok:
        assert sum(shape.stage_layers(p)) == shape.num_layers


def test_split_search_keeps_only_pipeline_sizes_the_config_can_split():
    from diagnose.explain.memory.options import valid_splits

    shape = replace(LLAMA, num_layers=61, num_layers_in_first_pipeline_stage=3, num_layers_in_last_pipeline_stage=2)
    layout = Layout(strategy="distributed_optimizer", gpus=64, pp=16, grad_bytes=4)
    pps = sorted({p for _, p in valid_splits(Scenario(shape, layout, Workload(), 140 * GIB))})
    assert pps == [4, 16]  # 64 GPUs: 3 and 9 do not divide them; 1, 2, 8 cannot split 61 this way
