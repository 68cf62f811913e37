"""Activation memory of one training step per pipeline stage: what megatron-core's layers keep for backward, and
the transient peak of the layer running when the stage peaks.

Calibrated on real megatron-core 0.16.1 on one H200 (``benchmarks/memory_calibration/h200_activations.json``:
forward+backward peaks of a 1.53B Llama-like GPT and a 2.34B MoE, micro batch 1-4, sequence 2k-8k, no / selective
/ full recompute, megatron-core's local ``DotProductAttention`` and a flash kernel; tested in
``tests/test_activation_calibration.py``). Bytes per token of one layer (``h`` hidden, ``f`` FFN, ``a`` heads, ``d``
head dim, ``kv = g*d`` for ``g`` query groups), what autograd holds after the forward (counted on the GPU by
storage):

- norms: Transformer Engine / apex keep the bf16 input, ``2h`` per norm; the local spec's torch fallback
  (``WrappedTorchNorm``, no apex) keeps two fp32 copies, ``8h`` per norm (measured);
- the inputs of the QKV and fc1 GEMMs (the norm outputs), ``2h`` each;
- attention: Q (``2a*d``), K (``2kv``), the fused QKV output that V is a view of (``2(a*d + 2kv)``), the output
  (``2a*d``, also the projection's input) and the softmax statistics (``4a``) with flash / fused kernels; with
  megatron-core's local ``DotProductAttention`` (``transformer_impl=local`` or ``attention_backend=local``) Q, K
  and V repeated to all heads and the contiguous context (``8a*d``) plus the ``[b, a, s, s]`` scores: the fp32
  softmax output and its bf16 copy (``6`` bytes per score with ``attention_softmax_in_fp32``, the default) or
  the bf16 softmax output alone (``2``); attention dropout adds its mask and output. Its ``baddbmm`` input is a
  global buffer of ``2*a*b*s^2`` bytes kept between iterations. Selective recompute (``core_attn``) keeps the
  checkpoint's inputs (Q, K, the QKV output) and output instead;
- the MLP inner part: ``10f`` for a gated unit without ``bias_activation_fusion`` (fc1 output, SiLU output, the
  product: measured), ``6f`` with the fused SwiGLU (measured), ``4f`` without a gate; MoE layers: for each of the
  ``k`` experts a token is routed to, its inner part and ``4h`` (its permuted input and output), plus the shared
  experts and the router (measured within 3 % on SequentialMLP);
- RoPE without ``apply_rope_fusion``: the bf16 cos/sin of Q and K, ``8d``; hidden dropout: two masks, ``2h``.

Transients, in bytes per score of the running layer (local attention only; measured): its forward peaks at
``12`` (bf16 scores, their fp32 copy, the fp32 softmax and its bf16 copy; ``6`` with a bf16 softmax), its
backward at ``16`` (``8``) including what the layer keeps. The last stage adds the loss: megatron-core's
vocab-parallel cross entropy keeps the fp32 softmax of the logits, ``4V/tp`` per token, while the bf16 logits
(``2V/tp``) exist. The stage peak is the largest of: the forward at the loss, the forward inside the last layer,
and the backward inside a layer (with full recompute: the stored layer inputs, ``2h`` each, plus the recomputed
chunk). Tensor parallelism divides the heads, ``f``, ``V`` and, with sequence parallelism, everything; without
SP the norm parts, GEMM inputs and dropout masks stay whole. Context parallelism divides ``s``.

Estimates, not calibrated on hardware:
- Transformer Engine's spec (TE norms) and its unfused attention (``attention_backend=unfused``: bf16 softmax
  output ``2`` per score, transients ``4`` / ``6``, no global buffer), TP/SP/CP and pipeline stages (1F1B: stage
  ``i`` of ``pp`` holds ``min(pp - i, microbatches)`` micro batches in flight, interleaved ``((pp-i-1)*2 +
  (vpp-1)*pp + 1) / vpp``; the first stage the embedding outputs), fused cross entropy (counted as the unfused);
- multi-latent attention (what ``MLASelfAttention`` keeps: the norm output ``2h``, the q path ``4*q_lora_rank``,
  the kv path ``2*(kv_lora_rank + qk_pos_emb_head_dim) + 2*kv_lora_rank``, Q and K ``2*2*a*q_head``, V and the
  output ``2*2*a*v_head_dim``, the dropout mask ``h``) in place of the attention term;
- MTP: each MTP layer is one more transformer layer on the stage holding it plus its concatenated input
  (``4sbh``), and its own fp32 logits on the last stage;
- FP8 (TE keeps the inputs of the GEMMs for backward in FP8, 1 byte instead of 2): ``3h + f`` bytes per token less;
- CUDA graphs: ``cuda_graph_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.explain.memory.shape import ModelShape, stage_layer_kinds


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
    # How the layers are implemented (``attention_kind`` reads them from a config):
    attention: str = "flash"  # "flash" (TE flash / fused, any kernel that keeps no scores) | "local" | "te_unfused"
    torch_norm: bool = False  # the local spec without apex: torch's RMSNorm / LayerNorm, fp32 copies kept
    softmax_fp32: bool = True  # local attention: attention_softmax_in_fp32 (megatron-core's default)
    activation_fusion: bool = True  # bias_activation_fusion: the fused SwiGLU / GeLU keeps only its input
    rope_fusion: bool = True  # apply_rope_fusion: no cos/sin copies kept
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0


def attention_kind(transformer_impl: str | None, attention_backend: str | None) -> str:
    """Which attention a job runs: megatron-core's local ``DotProductAttention`` with the local spec
    (``transformer_impl=local``) or ``attention_backend=local``; TE's unfused attention with
    ``attention_backend=unfused``; otherwise (``flash``, ``fused``, ``auto``, unset) a kernel that keeps no scores."""
    impl = str(transformer_impl or "").strip().lower().rsplit(".", 1)[-1]
    backend = str(attention_backend or "").strip().lower().rsplit(".", 1)[-1]
    if impl == "local" or backend == "local":
        return "local"
    if backend == "unfused":
        return "te_unfused"
    return "flash"


def _mla_attention_per_token(shape: ModelShape) -> float:
    a = shape.num_attention_heads
    q_head = shape.qk_head_dim + shape.qk_pos_emb_head_dim
    q_path = 4 * shape.q_lora_rank if shape.q_lora_rank else 0
    kv_path = 2 * (shape.kv_lora_rank + shape.qk_pos_emb_head_dim) + 2 * shape.kv_lora_rank
    return 3 * shape.hidden_size + q_path + kv_path + 4 * a * q_head + 4 * a * shape.v_head_dim


def _inner(f: float, gated: bool, fused: bool) -> float:
    """What the MLP keeps between fc1 and fc2, per token (bytes)."""
    if not gated:
        return 4 * f
    return 6 * f if fused else 10 * f


def _mlp_per_token(shape: ModelShape, work: Workload, moe: bool) -> float:
    gated, fused, h = shape.gated_linear_unit, work.activation_fusion, shape.hidden_size
    if moe and shape.num_moe_experts and shape.moe_ffn_hidden_size:
        k = shape.moe_router_topk or 2
        shared = shape.moe_shared_expert_intermediate_size or 0
        routed = k * (_inner(shape.moe_ffn_hidden_size, gated, fused) + 4 * h)
        return routed + (_inner(shared, gated, fused) if shared else 0) + 16 * shape.num_moe_experts
    return _inner(shape.ffn, gated, fused)


def _score_bytes(work: Workload) -> tuple[float, float, float]:
    """Bytes per attention score: (kept after the forward, forward peak, backward peak incl. kept)."""
    drop = work.attention_dropout > 0
    if work.attention == "local":
        if work.softmax_fp32:
            return (7.0 if drop else 6.0), 12.0, (17.0 if drop else 16.0)
        return (5.0 if drop else 2.0), 6.0, (11.0 if drop else 8.0)
    if work.attention == "te_unfused":
        return (5.0 if drop else 2.0), 4.0, (9.0 if drop else 6.0)
    return 0.0, 0.0, 0.0


@dataclass(frozen=True)
class _Layer:
    """One layer, per token (bytes): what stays whole over TP without SP, and what TP divides."""

    replicated: float
    split: float

    def bytes(self, tokens: float, tp: int, sp: bool) -> float:
        if sp or tp == 1:
            return tokens * (self.replicated + self.split) / tp
        return tokens * (self.replicated + self.split / tp)


def _layer(shape: ModelShape, work: Workload, moe: bool, selective: bool = False) -> _Layer:
    h, d, a, g = shape.hidden_size, shape.kv, shape.num_attention_heads, shape.groups
    qd, kvd = a * d, g * d
    norm = 8 * h if work.torch_norm else 2 * h
    replicated = 2 * norm + 2 * 2 * h  # two norms, the QKV and fc1 inputs
    if work.hidden_dropout > 0:
        replicated += 2 * h  # the two dropout masks (1 byte per element)
    if shape.multi_latent_attention:
        attention = _mla_attention_per_token(shape) - 3 * h  # its norm output and mask are counted above
    elif selective or work.attention != "local":
        # Q, K, the QKV output V is a view of, the output (= the projection input); flash: + softmax statistics
        attention = 2 * qd + 2 * kvd + 2 * (qd + 2 * kvd) + 2 * qd + (0 if selective else 4 * a)
    else:
        attention = 8 * qd  # Q, K and V repeated to every head, the contiguous context
    if not work.rope_fusion and shape.position_embedding in ("rope", "yarn", "mrope"):
        attention += 8 * d
    mlp = _mlp_per_token(shape, work, moe)
    if work.fp8:  # the inputs of the QKV, projection, fc1 and fc2 GEMMs in FP8: half their bytes
        replicated -= 2 * h
        attention -= qd
        mlp -= _fc2_input(shape, moe)
    return _Layer(replicated, attention + mlp)


def _fc2_input(shape: ModelShape, moe: bool) -> float:
    """Elements per token entering fc2 (top-k experts' and the shared experts' in an MoE layer)."""
    if moe and shape.num_moe_experts and shape.moe_ffn_hidden_size:
        return (shape.moe_router_topk or 2) * shape.moe_ffn_hidden_size + (
            shape.moe_shared_expert_intermediate_size or 0)
    return shape.ffn


def layer_kept_bytes(shape: ModelShape, work: Workload, tokens: float, tp: int = 1, sp: bool = False,
                     moe: bool = False, s_kv: float | None = None) -> float:
    """What one layer keeps for backward (no recompute), in bytes, for ``tokens`` tokens of one micro batch."""
    kept = _layer(shape, work, moe).bytes(tokens, tp, sp)
    kept_score = _score_bytes(work)[0]
    if kept_score and not shape.multi_latent_attention:
        kept += kept_score * _scores(shape, tokens, tp, s_kv if s_kv is not None else tokens)
    return kept


def _scores(shape: ModelShape, tokens: float, tp: int, s_kv: float) -> float:
    """Attention scores of one layer on one TP rank: heads / tp x queries (micro batch x s) x keys."""
    return shape.num_attention_heads / tp * tokens * s_kv


def in_flight(work: Workload, pp: int, stage: int, vpp: int | None = None) -> float:
    """Micro batches whose activations stage ``stage`` holds at its peak (1F1B / interleaved warm-up + 1).
    ``vpp``: virtual stages per rank when a custom pipeline layout implies them (else the workload's)."""
    if pp <= 1:
        return 1.0
    vpp = vpp or work.virtual_pp
    n = ((pp - stage - 1) * 2 + (vpp - 1) * pp + 1) / vpp if vpp and vpp > 1 else float(pp - stage)
    if work.num_microbatches:
        n = min(n, work.num_microbatches)
    return n


def _stage_kinds(shape: ModelShape, pp: int, stage: int) -> tuple[int, int]:
    """The dense and MoE decoder layers of pipeline stage ``stage``: from the per-stage count of layers by kind that
    the parameter count reads (shape.stage_layer_kinds, counted once per shape and pipeline size: qa-report-14 L1),
    so both read the same layers. An MoE kind is an MoE layer (True) or a hybrid pattern's ``E``."""
    kinds = stage_layer_kinds(shape, pp)[stage]
    moe = sum(n for kind, (n, _first) in kinds.items() if kind is True or kind == "E")
    return sum(n for n, _first in kinds.values()) - moe, moe


def activation_bytes(shape: ModelShape, work: Workload, tp: int = 1, pp: int = 1, cp: int = 1,
                     stage: int | None = None) -> int:
    """Peak activation bytes of pipeline stage ``stage``; ``None``: the largest over the stages."""
    tp, pp, cp = max(1, tp), max(1, pp), max(1, cp)
    if stage is None:
        return max(activation_bytes(shape, work, tp, pp, cp, i) for i in range(pp))
    seq = max(1, work.seq_length // cp)
    tokens = work.micro_batch_size * seq
    s_kv = float(work.seq_length)  # keys per query: with CP the ring passes every chunk's keys through
    sp = work.sequence_parallel and tp > 1
    h = shape.hidden_size
    dense_n, moe_n = _stage_kinds(shape, pp, stage)
    mtp = shape.stage_mtp_layers(pp)[stage]
    mtp_moe = bool(mtp) and shape.last_layer_moe()  # an MTP layer is built as the model's last layer
    kept_score, fwd_score, bwd_score = (0.0, 0.0, 0.0) if shape.multi_latent_attention else _score_bytes(work)
    scores = _scores(shape, tokens, tp, s_kv)
    whole = {m: layer_kept_bytes(shape, work, tokens, tp, sp, m, s_kv) for m in (False, True)}
    hidden = 2 * tokens * h / (tp if sp else 1)  # one bf16 hidden state of the micro batch
    # how many layers of each kind (dense, MoE) the stage holds, its MTP layers counted as the model's last layer's
    count = {False: dense_n + (0 if mtp_moe else mtp), True: moe_n + (mtp if mtp_moe else 0)}
    total = count[False] + count[True]
    if work.recompute == "full":
        chunk = max(1, work.recompute_num_layers or 1)
        kept = -(-total // chunk) * hidden  # the stored input of each recompute chunk
        # backward: the chunk recomputed with grad, the running layer at its backward peak
        worst = max((whole[m] for m in (False, True) if count[m]), default=0.0)
        inside_bwd = kept + chunk * worst + (bwd_score - kept_score) * scores if total else kept
        inside_fwd = kept + fwd_score * scores  # no_grad forward: only the running attention's scores
    else:
        if work.recompute == "selective":
            per = {m: _layer(shape, work, m, selective=True).bytes(tokens, tp, sp) for m in (False, True)}
            own = 0.0  # the checkpointed attention keeps no scores; recomputed in backward
        else:
            per, own = whole, kept_score * scores
        kept = count[False] * per[False] + count[True] * per[True] + mtp * 2 * hidden  # + each MTP layer's input
        inside_fwd = kept - own + fwd_score * scores
        inside_bwd = kept - own + bwd_score * scores
    n = in_flight(work, pp, stage, shape.layout_vpp(pp)) if pp > 1 else 1.0
    held = (n - 1) * kept  # the other micro batches in flight keep their activations
    if pp > 1 and stage == 0:
        held += tokens * h * 2 * pp / (tp if sp else 1)  # embedding outputs
    peak = held + max(inside_fwd, inside_bwd, kept)
    if stage == pp - 1:
        # final norm output and its input copies, the fp32 softmax of the logits and the bf16 logits (the MTP
        # layers' logits are computed with the output layer on the last stage, wherever the MTP layers are)
        vocab = shape.padded_vocab(tp)
        norm = (8 if work.torch_norm else 2) * tokens * h + hidden
        logits = (4 + 2) * tokens * vocab / tp * (1 + shape.mtp_num_layers)
        peak = max(peak, held + kept + norm + logits)
    if work.attention == "local" and not shape.multi_latent_attention:
        peak += 2 * scores  # megatron-core's global buffer for the baddbmm input, kept between iterations
    return int(peak)


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
