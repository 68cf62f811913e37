"""The H200 memory table (benchmarks/memory_calibration/h200_measurements.json) is well formed and self-consistent.

The table was measured once on the GPU machine by measure.py; the memory model is compared with it in
tests/test_memory_calibration.py. Here: the agreed record format, parameter counts that follow from each record's
shape, clean measurements (nothing left allocated from an earlier configuration), and the facts of sharding that
any correct measurement shows (nothing is sharded at DP=1; at DP=2 each sharding step saves memory).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

TABLE = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_calibration" / "h200_measurements.json"
STRATEGIES = {"ddp", "distributed_optimizer", "fsdp:no_shard", "fsdp:optim", "fsdp:optim_grads",
              "fsdp:optim_grads_params"}
MODEL_KEYS = {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "vocab_size",
              "seq_length", "swiglu", "untie_embeddings"}


@pytest.fixture(scope="module")
def records() -> list[dict]:
    data = json.loads(TABLE.read_text())
    assert isinstance(data, list) and data
    return data


def gpt_params(model: dict) -> int:
    """Parameters of megatron-core's local-spec GPT: RMSNorm (no bias), no linear biases, RoPE (no position table)."""
    h, layers, ffn = model["hidden_size"], model["num_layers"], model["ffn_hidden_size"]
    kv = model["num_query_groups"] * h // model["num_attention_heads"]
    attention = h * (h + 2 * kv) + h * h
    mlp = h * ffn * (2 if model["swiglu"] else 1) + ffn * h
    per_layer = attention + mlp + 2 * h
    embeddings = model["vocab_size"] * h * (2 if model["untie_embeddings"] else 1)
    return layers * per_layer + embeddings + h


def test_record_format(records):
    for r in records:
        assert "error" not in r, r
        assert set(r["model"]) == MODEL_KEYS
        assert r["strategy"] in STRATEGIES
        assert r["phase"] in ("after_wrap", "after_step")
        assert isinstance(r["grad_reduce_in_fp32"], bool)
        assert r["dp"] in (1, 2) and r["tp"] == 1 and r["pp"] == 1
        assert isinstance(r["allocated_bytes"], int) and isinstance(r["max_allocated_bytes"], int)
        assert r["max_allocated_bytes"] >= r["allocated_bytes"] > 0
        assert r["torch"].startswith("2.") and r["megatron_core"].startswith("0.")


def test_params_follow_from_the_shape(records):
    for r in records:
        assert r["params"] == gpt_params(r["model"]), r["name"]


def test_each_measurement_started_from_an_empty_gpu(records):
    assert all(r["baseline_bytes"] == 0 for r in records)


def test_coverage(records):
    seen = {(r["strategy"], r["dp"], r["phase"]) for r in records}
    for strategy in STRATEGIES:
        for dp in (1, 2):
            for phase in ("after_wrap", "after_step"):
                assert (strategy, dp, phase) in seen
    assert len({r["params"] for r in records if r["dp"] == 1}) >= 3


def _by(records, dp, phase):
    table = defaultdict(dict)
    for r in records:
        if r["dp"] == dp and r["phase"] == phase and r["grad_reduce_in_fp32"]:
            table[r["params"]][r["strategy"]] = r["allocated_bytes"]
    return table


def test_nothing_is_sharded_at_dp1(records):
    for params, row in _by(records, 1, "after_wrap").items():
        fsdp = [row[s] for s in STRATEGIES if s.startswith("fsdp:")]
        assert max(fsdp) - min(fsdp) < 0.01 * max(fsdp), params


def test_each_sharding_step_saves_memory_at_dp2(records):
    order = ["fsdp:no_shard", "fsdp:optim", "fsdp:optim_grads", "fsdp:optim_grads_params"]
    for params, row in _by(records, 2, "after_wrap").items():
        sizes = [row[s] for s in order]
        assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes), (params, sizes)
    for params, row in _by(records, 2, "after_step").items():
        assert row["distributed_optimizer"] < row["ddp"], params
