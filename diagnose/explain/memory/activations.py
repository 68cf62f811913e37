"""Activation memory of one micro batch on the most-loaded rank (Korthikanti et al. 2022, as Megatron-LM uses it).

Bytes per layer for ``s`` tokens x ``b`` micro batch x hidden ``h`` (bf16, flash attention so no ``a*s^2`` term):
attention 11sbh + norms 4sbh + MLP 3sbh + MLP inner ``4*s*b*f`` (``6*s*b*f`` with a gated linear unit: the
fc1 output is 2f wide and the activation's output is kept for fc2). Tensor parallel divides the inner parts, and
with sequence parallelism everything; without SP the ``10*sbh`` part stays whole (Megatron's
``compute_activation_memory_without_sp``: ``sbh(10 + 24/tp)`` when f=4h). Context parallelism divides ``s``.
Full recompute keeps only each layer's input (2sbh) plus one layer being recomputed. The first pipeline stage holds
activations of ``pp`` micro batches in flight (1F1B), and with PP=1 the output layer adds fp32 logits: 4*s*b*V/tp
for the logits and their gradient (Megatron: ``4*sbh*(1 + V/h)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.explain.memory.shape import ModelShape


@dataclass(frozen=True)
class Workload:
    micro_batch_size: int = 1
    seq_length: int = 4096
    sequence_parallel: bool = False
    recompute: str | None = None  # None | "selective" | "full"
    recompute_num_layers: int | None = None  # with full/uniform: layers per recompute chunk
    num_microbatches: int | None = None
    virtual_pp: int | None = None


def _layer_bytes(shape: ModelShape, tokens: int, tp: int, sp: bool) -> float:
    h, f = shape.hidden_size, shape.ffn
    inner = (6 if shape.gated_linear_unit else 4) * f / h
    moe = shape.num_moe_experts and shape.moe_ffn_hidden_size
    if moe:
        # tokens are routed to top-k experts: count the MLP inner part as k experts' worth (k=2 if unknown)
        inner = (6 if shape.gated_linear_unit else 4) * (shape.moe_ffn_hidden_size or f) / h * 2
    per_token = h * (18 + inner)
    if sp or tp == 1:
        return tokens * per_token / tp
    # without SP: LN inputs, dropout masks and the attention/MLP inputs (10 sbh) are replicated over TP
    return tokens * (10 * h + (per_token - 10 * h) / tp)


def activation_bytes(shape: ModelShape, work: Workload, tp: int = 1, pp: int = 1, cp: int = 1) -> int:
    """Peak activation bytes held by the first pipeline stage (the most loaded) for one training step."""
    tp, pp, cp = max(1, tp), max(1, pp), max(1, cp)
    tokens = work.micro_batch_size * max(1, work.seq_length // cp)
    layers = -(-shape.num_layers // pp)
    per_layer = _layer_bytes(shape, tokens, tp, work.sequence_parallel and tp > 1)
    h = shape.hidden_size
    if work.recompute == "full":
        chunk = max(1, work.recompute_num_layers or 1)
        kept = 2 * tokens * h / (tp if work.sequence_parallel and tp > 1 else 1)
        total = layers / chunk * kept + chunk * per_layer
    else:
        total = layers * per_layer
    in_flight = pp
    if pp > 1:
        if work.virtual_pp:
            in_flight = pp * (1 + (pp - 1) / (pp * work.virtual_pp))
        if work.num_microbatches:
            in_flight = min(in_flight, work.num_microbatches)
        total *= in_flight
        total += tokens * h * 2 * pp / (tp if work.sequence_parallel and tp > 1 else 1)  # embedding outputs
    else:
        vocab = shape.padded_vocab(tp)
        total += 4 * tokens * h / tp + 4 * tokens * vocab / tp  # final norm output + fp32 logits and their grad
    if not (work.sequence_parallel and tp > 1):
        total *= 1.05  # Megatron-LM's allowance for what the formula leaves out without SP
    return int(total)
