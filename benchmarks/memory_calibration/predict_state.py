"""Predict what ``measure.py`` (this folder) measures on a real GPU, record by record.

A record is one model x strategy x phase run by real megatron-core (see docs/memory.md for the keys). The model
predicts ``allocated_bytes`` and ``max_allocated_bytes`` (peak since just before the model build) at:
- ``after_wrap``: the DP wrap done, no optimizer yet;
- ``after_step``: after one forward/backward of ``batch`` and the first ``optimizer.step()``. The fp32 copy of bf16
  grads handed to the optimizer (``main_param.grad = main_grad.float()``) is still allocated at that point: it is
  freed by the next ``zero_grad``; with Megatron FSDP ``optim_grads_params`` and ``overlap_param_gather`` the
  gathered weights of the next forward are too. The peak includes torch Adam's temporary (no TE/apex there).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's diagnose

from diagnose.explain.memory.activations import Workload, activation_bytes  # noqa: E402
from diagnose.explain.memory.shape import ModelShape, count_params  # noqa: E402
from diagnose.explain.memory.state import Layout, layer_params_max, model_state, phases  # noqa: E402


@dataclass
class Prediction:
    allocated: int
    max_allocated: int


def shape_of(record: dict[str, Any]) -> ModelShape:
    """The measured model (the activation records' too): megatron-core's local spec, RMSNorm, RoPE, no biases."""
    m = record["model"]
    return ModelShape(
        num_layers=m["num_layers"], hidden_size=m["hidden_size"], ffn_hidden_size=m.get("ffn_hidden_size"),
        num_attention_heads=m["num_attention_heads"], num_query_groups=m.get("num_query_groups"),
        vocab_size=m.get("vocab_size", 128256), seq_length=m.get("seq_length", 4096),
        gated_linear_unit=bool(m.get("swiglu", True)), untie_embeddings=bool(m.get("untie_embeddings", True)),
        add_bias_linear=False, layernorm=False, position_embedding="rope", num_moe_experts=m.get("num_moe_experts"),
        moe_ffn_hidden_size=m.get("moe_ffn_hidden_size"), moe_router_topk=m.get("moe_router_topk"),
    )


def layout_of(record: dict[str, Any]) -> Layout:
    dp, tp, pp = int(record.get("dp", 1)), int(record.get("tp", 1)), int(record.get("pp", 1))
    strategy = record["strategy"]
    return Layout(strategy=strategy, gpus=dp * tp * pp, tp=tp, pp=pp,
                  grad_bytes=4 if record.get("grad_reduce_in_fp32", True) else 2,
                  meta_init=bool(record.get("meta_init", False)),
                  overlap_grad_reduce=bool(record.get("overlap_grad_reduce", strategy.startswith("fsdp:"))),
                  overlap_param_gather=bool(record.get("overlap_param_gather", strategy.startswith("fsdp:"))),
                  # the measurement environment had neither Transformer Engine nor apex: torch.optim.Adam
                  fused_adam=bool(record.get("fused_adam", False)))


def predict(record: dict[str, Any]) -> Prediction:
    shape, layout = shape_of(record), layout_of(record)
    count = count_params(shape, layout.tp, layout.pp)
    state = model_state(count, layout, layer_params_max(shape, layout))
    batch = record.get("batch") or {}
    act = 0
    if batch and record.get("forward", True):
        work = Workload(int(batch.get("micro_batch_size", 1)), int(batch.get("seq_length", 512)))
        act = activation_bytes(shape, work, layout.tp, layout.pp)
    ph = phases(state, layout, act)
    if record["phase"] == "after_wrap":
        return Prediction(ph.after_wrap, ph.wrap_peak)
    cast = ph.detail.get("grad_cast", 0)
    allocated = state.persistent + cast
    if layout.strategy == "fsdp:optim_grads_params" and layout.overlap_param_gather:
        allocated += state.components["buffers"]  # the next iteration's weights are being gathered already
    return Prediction(allocated, max(ph.wrap_peak, ph.first_step_peak, allocated))


def compare(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per usable record: measured vs predicted and the relative errors."""
    rows = []
    for r in records:
        if "error" in r or "allocated_bytes" not in r or r.get("baseline_bytes", 0) > 64 << 20:
            continue
        p = predict(r)
        rows.append({
            "name": r["name"], "phase": r["phase"], "strategy": r["strategy"], "dp": r.get("dp", 1),
            "measured": r["allocated_bytes"], "predicted": p.allocated,
            "measured_max": r["max_allocated_bytes"], "predicted_max": p.max_allocated,
            "error": (p.allocated - r["allocated_bytes"]) / r["allocated_bytes"],
            "error_max": (p.max_allocated - r["max_allocated_bytes"]) / r["max_allocated_bytes"],
        })
    return rows
