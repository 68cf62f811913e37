"""Activation memory of one micro batch per pipeline stage (Korthikanti et al. 2022, as Megatron-LM uses it).

Bytes per layer for ``s`` tokens x ``b`` micro batch x hidden ``h`` (bf16, flash attention so no ``a*s^2`` term):
attention 11sbh + norms 4sbh + MLP 3sbh + MLP inner ``4*s*b*f`` (``6*s*b*f`` with a gated linear unit: the
fc1 output is 2f wide and the activation's output is kept for fc2). In an MoE layer ``f`` is top-k experts' FFN
plus the shared experts' (dense and MoE layers are counted apart, ``moe_layer_freq``). Tensor parallel divides the inner parts, and
with sequence parallelism everything; without SP the ``10*sbh`` part stays whole (Megatron's
``compute_activation_memory_without_sp``: ``sbh(10 + 24/tp)`` when f=4h). Context parallelism divides ``s``.
Full recompute keeps only each layer's input (2sbh) plus one layer being recomputed. With 1F1B, pipeline stage
``i`` of ``pp`` holds ``min(pp - i, microbatches)`` micro batches in flight (interleaved: ``((pp-i-1)*2 +
(vpp-1)*pp + 1) / vpp``, which is Megatron's ``pp * (1 + (pp-1)/(pp*vpp))`` on the first stage); the last stage
adds the output layer's fp32 logits: 4*s*b*V/tp for the logits and their gradient (Megatron: ``4*sbh*(1 + V/h)``).

Estimates, not calibrated on hardware (the H200 calibration covers dense GPT, bf16, PP=1):
- multi-latent attention replaces the 11sbh attention term by what MLA keeps for backward, per token: the norm
  output ``2h``, the q path ``4*q_lora_rank`` (down-projection output and its norm), the kv path
  ``2*(kv_lora_rank + qk_pos_emb_head_dim) + 2*kv_lora_rank``, Q and K ``2*2*a*q_head``, V and the attention
  output ``2*2*a*v_head_dim``, the dropout mask ``h``;
- MTP: each MTP layer is one more transformer layer on the stage holding it (the last one, or where a custom
  ``pipeline_model_parallel_layout`` puts it), plus its concatenated input (``4sbh``), and its own fp32 logits on
  the last stage;
- FP8 (Transformer Engine keeps the inputs of the GEMMs for backward in FP8, 1 byte instead of 2): the QKV input,
  the projection input, the fc1 input and the fc2 input, ``3h + f`` bytes per token less;
- CUDA graphs: ``cuda_graph_bytes``.
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
    fp8: bool = False  # FP8 GEMMs (Transformer Engine): their saved inputs are 1 byte per element
    cuda_graphs: str | None = None  # None | "local" | "transformer_engine"


def _mla_attention_per_token(shape: ModelShape) -> float:
    a = shape.num_attention_heads
    q_head = shape.qk_head_dim + shape.qk_pos_emb_head_dim
    q_path = 4 * shape.q_lora_rank if shape.q_lora_rank else 0
    kv_path = 2 * (shape.kv_lora_rank + shape.qk_pos_emb_head_dim) + 2 * shape.kv_lora_rank
    return 3 * shape.hidden_size + q_path + kv_path + 4 * a * q_head + 4 * a * shape.v_head_dim


def _layer_bytes(shape: ModelShape, tokens: int, tp: int, sp: bool, fp8: bool = False, moe: bool = True) -> float:
    """One layer's activations; ``moe``: the layer is an MoE layer (when the model has experts)."""
    h, f = shape.hidden_size, shape.ffn
    f_eff = f
    if moe and shape.num_moe_experts and shape.moe_ffn_hidden_size:
        # tokens are routed to top-k experts: count the MLP inner part as k experts' worth (k=2 if unknown),
        # plus the shared experts every token goes through
        k = shape.moe_router_topk or 2
        f_eff = shape.moe_ffn_hidden_size * k + (shape.moe_shared_expert_intermediate_size or 0)
    inner = (6 if shape.gated_linear_unit else 4) * f_eff / h
    attention = _mla_attention_per_token(shape) if shape.multi_latent_attention else 11 * h
    per_token = attention + h * (7 + inner)
    if fp8:
        per_token -= 3 * h + f_eff
    if sp or tp == 1:
        return tokens * per_token / tp
    # without SP: LN inputs, dropout masks and the attention/MLP inputs (10 sbh) are replicated over TP
    return tokens * (10 * h + (per_token - 10 * h) / tp)


def in_flight(work: Workload, pp: int, stage: int, vpp: int | None = None) -> float:
    """Micro batches whose activations stage ``stage`` holds at its peak (1F1B / interleaved warm-up + 1).
    ``vpp``: virtual stages per rank when a custom pipeline layout implies them (else the workload's)."""
    if pp <= 1:
        return 1.0
    vpp = vpp or work.virtual_pp
    if vpp and vpp > 1:
        n = ((pp - stage - 1) * 2 + (vpp - 1) * pp + 1) / vpp
    else:
        n = float(pp - stage)
    if work.num_microbatches:
        n = min(n, work.num_microbatches)
    return n


def activation_bytes(shape: ModelShape, work: Workload, tp: int = 1, pp: int = 1, cp: int = 1,
                     stage: int | None = None) -> int:
    """Peak activation bytes of pipeline stage ``stage``; ``None``: the largest over the stages."""
    tp, pp, cp = max(1, tp), max(1, pp), max(1, cp)
    if stage is None:
        return max(activation_bytes(shape, work, tp, pp, cp, i) for i in range(pp))
    tokens = work.micro_batch_size * max(1, work.seq_length // cp)
    sp = work.sequence_parallel and tp > 1
    ids = shape.stage_layer_ids(pp)[stage]
    layers = len(ids)
    all_flags = shape.moe_layers()
    flags = [all_flags[i] for i in ids if i < len(all_flags)]
    last = stage == pp - 1
    mtp = shape.stage_mtp_layers(pp)[stage]
    sizes = {moe: _layer_bytes(shape, tokens, tp, sp, work.fp8, moe) for moe in (False, True)}
    per_layer = max((sizes[m] for m in flags), default=0.0)
    h = shape.hidden_size
    if work.recompute == "full":
        chunk = max(1, work.recompute_num_layers or 1)
        kept = 2 * tokens * h / (tp if sp else 1)
        total = layers / chunk * kept + (chunk * per_layer if layers else 0)
    else:
        total = sum(sizes[m] for m in flags)
    mtp_moe = bool(shape.moe_layers()[-1:] == [True])  # an MTP layer is MoE when the model's last layer is
    total += mtp * (sizes[mtp_moe] + 4 * tokens * h / (tp if sp else 1))
    vocab = shape.padded_vocab(tp)
    # the MTP layers' logits are computed with the output layer on the last stage, wherever the MTP layers are
    logits = (4 * tokens * h / tp + 4 * tokens * vocab / tp) * (1 + shape.mtp_num_layers) if last else 0
    if pp > 1:
        total *= in_flight(work, pp, stage, shape.layout_vpp(pp))
        if stage == 0:
            total += tokens * h * 2 * pp / (tp if sp else 1)  # embedding outputs
    total += logits  # final norm output + fp32 logits and their grad (one micro batch at a time)
    if not sp:
        total *= 1.05  # Megatron-LM's allowance for what the formula leaves out without SP
    return int(total)


def cuda_graph_bytes(shape: ModelShape, work: Workload, tp: int = 1, pp: int = 1, cp: int = 1,
                     stage: int = 0) -> int:
    """Static buffers that per-layer CUDA graphs keep allocated (an estimate, not calibrated).

    ``cuda_graphs.py``: each graphed layer has static inputs and outputs for its forward graph and static
    gradient buffers for its backward graph (``static_grad_outputs`` / ``static_grad_inputs``), allocated in the
    graph's private pool and never returned to PyTorch's allocator. Without PP one set per layer is captured and
    reused (``reuse_cudagraphs = pp.size() == 1``, TE: ``num_microbatches = 1``); with PP a graph is captured
    per micro batch and static inputs are reused only once that micro batch's backward is done, so a stage keeps
    one set per micro batch in flight. Counted: 4 hidden-sized bf16 tensors (input, output, and their grads)
    per layer per set.
    """
    if not work.cuda_graphs:
        return 0
    tp, pp, cp = max(1, tp), max(1, pp), max(1, cp)
    tokens = work.micro_batch_size * max(1, work.seq_length // cp)
    sp = work.sequence_parallel and tp > 1
    layers = shape.stage_layers(pp)[stage] + shape.stage_mtp_layers(pp)[stage]
    sets = in_flight(work, pp, stage, shape.layout_vpp(pp)) if pp > 1 else 1.0
    return int(layers * sets * 4 * 2 * tokens * shape.hidden_size / (tp if sp else 1))
