"""Predict what ``measure_activations.py`` (this folder) measures on a real GPU, record by record.

A record is one model x attention backend x recompute x micro batch x sequence run by real megatron-core (keys:
docs/memory.md). ``activation_peak_bytes`` is the forward+backward peak of ``max_memory_allocated`` above the
model state; an ``oom`` record ran out of memory. The records were made with megatron-core's local spec without
Transformer Engine or apex (torch norms, unfused RoPE and cross entropy), so the workload says so; the attention
backend, softmax precision, activation fusion and dropout come from each record's ``config``.
"""

from __future__ import annotations

from typing import Any

from predict_state import shape_of  # this folder's; it puts the checkout's diagnose on the path

from diagnose.explain.memory.activations import Workload, activation_bytes
from diagnose.explain.memory.options import headroom
from diagnose.explain.memory.shape import ModelShape, count_params
from diagnose.explain.memory.state import Layout, layer_params_max, model_state


def workload_of(record: dict[str, Any]) -> Workload:
    batch, config = record["batch"], record.get("config") or {}
    backend = record.get("attention_backend", "local")
    return Workload(
        micro_batch_size=int(batch["micro_batch_size"]), seq_length=int(batch["seq_length"]),
        recompute=record.get("recompute"), recompute_num_layers=record.get("recompute_num_layers"),
        attention="local" if backend == "local" else "flash",
        torch_norm=record.get("transformer_impl") == "local",  # no apex on the measurement machine
        softmax_fp32=bool(config.get("attention_softmax_in_fp32", True)),
        activation_fusion=bool(config.get("bias_activation_fusion", False)),
        rope_fusion=bool(config.get("apply_rope_fusion", False)),
        hidden_dropout=float(config.get("hidden_dropout", 0.0)),
        attention_dropout=float(config.get("attention_dropout", 0.0)),
    )


def state_bytes(record: dict[str, Any], shape: ModelShape) -> int:
    """The model state the run held (DDP, fp32 grads, Adam after its first step), from the state model."""
    layout = Layout(strategy=record.get("strategy", "ddp"), gpus=1,
                    grad_bytes=4 if record.get("grad_reduce_in_fp32", True) else 2, fused_adam=False)
    return model_state(count_params(shape, 1, 1), layout, layer_params_max(shape, layout)).persistent


def compare(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per record: measured vs predicted activation peak, and for OOMs whether the model says it fits."""
    rows = []
    for r in records:
        if r.get("outcome") not in ("ok", "oom"):
            continue
        shape = shape_of(r)
        predicted = activation_bytes(shape, workload_of(r))
        row: dict[str, Any] = {"name": r["name"], "outcome": r["outcome"], "predicted": predicted}
        if r["outcome"] == "ok":
            measured = r["activation_peak_bytes"]
            row.update(measured=measured, error=(predicted - measured) / measured)
        else:
            capacity = int(r.get("gpu_capacity_bytes") or 0)
            peak = state_bytes(r, shape) + predicted
            row.update(predicted_peak=peak, capacity=capacity, fits=peak <= capacity - headroom(capacity))
        rows.append(row)
    return rows
