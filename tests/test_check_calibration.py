"""`diagnose check` pinned to real H200 measurements (one and two GPUs): for each measured model and strategy, the
plan of the same config (as given) must predict the model state measured after the first optimizer step within 3 %
(docs/memory.md): params + grads + main params + Adam state, plus the fp32 copy of bf16 grads still held then.
The plan's peak adds activations on top of the full state (iteration 2 onwards), which a one-step run never sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from diagnose.checking import prepare_view
from diagnose.explain.memory.plan import memory_plan

TABLE = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_calibration" / "h200_measurements.json"
TOL_STATE = 0.03
FSDP = {"fsdp:no_shard": "no_shard", "fsdp:optim": "optim", "fsdp:optim_grads": "optim_grads",
        "fsdp:optim_grads_params": "optim_grads_params"}


def _records() -> list[dict]:
    if not TABLE.exists():
        pytest.skip(f"{TABLE.name} not measured yet (benchmarks/memory_calibration/measure.py on a GPU)")
    data = json.loads(TABLE.read_text())
    data = data if isinstance(data, list) else data.get("records", [])
    recs = [r for r in data if r.get("phase") == "after_step" and "error" not in r and "allocated_bytes" in r
            and r.get("baseline_bytes", 0) <= 64 << 20]
    assert recs, "no usable after_step records"
    return recs


def _config(r: dict) -> dict:
    m, batch = r["model"], r.get("batch") or {"micro_batch_size": 1, "seq_length": 512}
    strategy = r["strategy"]
    return {
        "model": {"num_layers": m["num_layers"], "hidden_size": m["hidden_size"],
                  "ffn_hidden_size": m["ffn_hidden_size"], "num_attention_heads": m["num_attention_heads"],
                  "num_query_groups": m["num_query_groups"], "vocab_size": m["vocab_size"],
                  "seq_length": batch["seq_length"], "gated_linear_unit": m.get("swiglu", True),
                  "share_embeddings_and_output_weights": not m.get("untie_embeddings", True),
                  "add_bias_linear": False, "normalization": "RMSNorm", "position_embedding_type": "rope",
                  "bf16": True},
        "train": {"micro_batch_size": batch["micro_batch_size"], "global_batch_size": batch["micro_batch_size"] * r["dp"]},
        "ddp": {"grad_reduce_in_fp32": r["grad_reduce_in_fp32"],
                "use_distributed_optimizer": strategy != "ddp",
                "use_megatron_fsdp": strategy in FSDP, "overlap_grad_reduce": strategy in FSDP,
                "overlap_param_gather": strategy in FSDP,
                **({"data_parallel_sharding_strategy": FSDP[strategy]} if strategy in FSDP else {})},
        "optimizer": {"use_distributed_optimizer": strategy != "ddp"},
    }


def test_check_plan_matches_the_measured_state(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_EXACT_PARAMS", "0")
    bad = []
    for i, r in enumerate(_records()):
        path = tmp_path / f"c{i}.yaml"
        path.write_text(yaml.safe_dump(_config(r)))
        capacity = r.get("gpu_capacity_bytes") or 150_109_106_995
        view = prepare_view(str(path), r["dp"], [])
        plan = memory_plan(view, r["dp"], capacity, prove=None).given
        assert plan.strategy == r["strategy"] and plan.dp == r["dp"]
        c = plan.components
        expected = c.params + c.grads + c.main_params + c.optimizer
        if not r["grad_reduce_in_fp32"]:
            expected += c.main_params  # main_param.grad = main_grad.float(), freed by the next zero_grad
        if r["strategy"] == "fsdp:optim_grads_params" and r["dp"] > 1:
            expected += c.buffers  # weights of the next forward already gathered (overlap_param_gather)
        err = (expected - r["allocated_bytes"]) / r["allocated_bytes"]
        if abs(err) > TOL_STATE:
            bad.append((r["name"], round(100 * err, 1)))
    assert not bad, f"check plan vs H200 state beyond {TOL_STATE:.0%}: {bad}"


def test_measurements_include_one_and_two_gpus():
    dps = {r["dp"] for r in _records()}
    if 2 not in dps:
        pytest.skip("no two-GPU measurements in the table yet")
    assert 1 in dps
