"""Model shape and the analytic parameter count of a Megatron-Core GPT model, per rank.

Counts follow how megatron-core builds ``GPTModel`` (local and Transformer Engine layer specs hold the same
parameters; TE only fuses the norms into the next linear layer):

- word embedding ``V x h`` (vocab-parallel: split over TP), learned absolute position embedding ``s x h``
  (replicated) unless RoPE / none, output layer ``V x h`` when embeddings are untied;
- per layer: ``linear_qkv`` ``(a*d + 2*g*d) x h`` (column-parallel) with an optional bias, ``linear_proj``
  ``h x a*d`` (row-parallel, bias replicated), two norms of ``h`` (+ bias for LayerNorm), optional q/k norms of ``d``;
  dense MLP ``fc1`` ``(2f if GLU else f) x h`` and ``fc2`` ``h x f``;
- MoE layers: router ``E x h`` (replicated), ``E`` experts of the same MLP shape with ``moe_ffn_hidden_size``
  (split over EP, and over the expert TP), optional shared experts (+ a gate ``h``);
- final norm ``h``.
``a`` heads, ``g`` query groups, ``d`` kv_channels (``h/a`` by default), ``V`` the padded vocabulary.

Multi-latent attention (DeepSeek-V2/V3; megatron-core ``multi_latent_attention.py`` ``MLASelfAttention``, the same
terms as Megatron-LM's ``theoretical_memory_usage.py``) replaces ``linear_qkv``: ``q_head = qk_head_dim +
qk_pos_emb_head_dim``; without ``q_lora_rank`` a column-parallel ``linear_q_proj`` ``a*q_head x h``, else
``linear_q_down_proj`` ``q_lora_rank x h`` (a TE ``duplicated`` linear: whole on every TP rank), a q norm of
``q_lora_rank`` and a column-parallel ``linear_q_up_proj`` ``a*q_head x q_lora_rank``; ``linear_kv_down_proj``
``(kv_lora_rank + qk_pos_emb_head_dim) x h`` (duplicated), a kv norm of ``kv_lora_rank``, column-parallel
``linear_kv_up_proj`` ``a*(qk_head_dim + v_head_dim) x kv_lora_rank``, row-parallel ``linear_proj``
``h x a*v_head_dim``.
No biases. Duplicated down projections follow the TE layer spec; the local spec splits them over TP.

Multi-token prediction (``multi_token_prediction.py`` ``MultiTokenPredictionLayer``): each of ``mtp_num_layers``
holds ``enorm`` and ``hnorm`` (``h``), a column-parallel ``eh_proj`` ``h x 2h``, one transformer layer (MoE when the
main model's last layer is, as ``theoretical_memory_usage.py`` assumes) and a final norm; all on the last pipeline
stage (``mtp_on_this_rank`` without a custom layout), which then also builds a word embedding
(``gpt_model.py``: ``if self.pre_process or self.mtp_process: self.embedding = ...``) and shares the output layer.

Pipeline split (``transformer_block.py`` ``get_num_layers_to_build``): a custom ``pipeline_model_parallel_layout``
(``pp_layout.py``) says what every (virtual) stage builds, decoder and MTP layers included; else
``num_layers_in_first/last_pipeline_stage`` fix those stages and the middle stages share the rest evenly; else
``account_for_embedding/loss_in_pipeline_split`` count the embedding / loss as one layer each, and the first / last
stage builds one transformer layer fewer. Per-stage numbers are per pipeline *rank*: with virtual pipeline
stages a rank holds the sum of its chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from diagnose.explain.memory import pp_layout


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int | None = None  # default 4h
    num_query_groups: int | None = None  # default = heads (MHA)
    kv_channels: int | None = None  # default h / heads
    vocab_size: int = 32000  # before padding
    make_vocab_size_divisible_by: int = 128
    seq_length: int = 4096
    gated_linear_unit: bool = False  # SwiGLU / GeGLU
    untie_embeddings: bool = False  # share_embeddings_and_output_weights=False
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    layernorm: bool = True  # LayerNorm has a bias; RMSNorm has not
    qk_layernorm: bool = False
    position_embedding: str = "learned_absolute"  # | "rope" | "none" | "yarn" | "mrope"
    num_moe_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_shared_expert_gate: bool = False
    moe_layer_freq: int | tuple[int, ...] = 1  # every n-th layer is MoE, or a 0/1 pattern per layer
    moe_router_topk: int | None = None  # experts per token (activations); 2 when unknown
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None  # None: no query compression (a plain linear_q_proj)
    kv_lora_rank: int = 512  # MLATransformerConfig defaults
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    mtp_num_layers: int = 0
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # pipeline_model_parallel_layout, parsed (``pp_layout.parse_layout``): stages in virtual order, e.g. "Ettt"
    pipeline_layout: tuple[str, ...] | None = None
    # hybrid Mamba models (Nemotron-H; megatron-core MambaModel): one symbol per layer, M Mamba, * attention,
    # - MLP, E MoE (``hybrid_override_pattern`` / ``hybrid_layer_pattern``); None: a GPT model
    hybrid_pattern: str | None = None
    mamba_num_heads: int | None = None  # None: d_inner = 2h, heads = d_inner / mamba_head_dim
    mamba_head_dim: int = 64
    mamba_state_dim: int = 128
    mamba_num_groups: int = 8
    mamba_conv_kernel: int = 4

    def layout_for(self, pp: int) -> tuple[str, ...] | None:
        """The custom layout when megatron-core accepts it at this pipeline size (else the usual split applies)."""
        if self.pipeline_layout is None:
            return None
        return self.pipeline_layout if _layout_ok(self.pipeline_layout, max(1, pp), self.num_layers,
                                                  self.mtp_num_layers) else None

    def layout_vpp(self, pp: int) -> int | None:
        """Virtual stages per rank that the layout implies at this pipeline size (None without a layout)."""
        stages = self.layout_for(pp)
        return None if stages is None else len(stages) // max(1, pp)

    def stage_layer_ids(self, pp: int) -> list[list[int]]:
        """Decoder layer indices on each pipeline rank (with a layout and VPP, not contiguous)."""
        stages = self.layout_for(pp)
        if stages is not None:
            return pp_layout.rank_layer_ids(stages, max(1, pp))
        out, start = [], 0
        for n in self.stage_layers(pp):
            out.append(list(range(start, start + n)))
            start += n
        return out

    def stage_mtp_layers(self, pp: int) -> list[int]:
        """MTP layers on each pipeline rank: the layout's placement, else all on the last rank."""
        pp = max(1, pp)
        stages = self.layout_for(pp)
        if stages is not None:
            return pp_layout.rank_mtp_layers(stages, pp)
        return [0] * (pp - 1) + [self.mtp_num_layers]

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def kv(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    def padded_vocab(self, tp: int = 1) -> int:
        multiple = max(1, self.make_vocab_size_divisible_by) * max(1, tp)
        return -(-self.vocab_size // multiple) * multiple

    def stage_layers(self, pp: int) -> list[int]:
        """Transformer layers built by each pipeline stage (megatron-core ``get_num_layers_to_build``).

        Where Megatron would assert (layers not divisible), the remainder goes to the first stages so that an
        estimate is still possible; the validator reports the config itself."""
        pp = max(1, pp)
        stages = self.layout_for(pp)
        if stages is not None:
            return [sum(c.count("t") for c in chunks) for chunks in pp_layout.rank_chunks(stages, pp)]
        if pp == 1:
            return [self.num_layers]
        first, last = self.num_layers_in_first_pipeline_stage, self.num_layers_in_last_pipeline_stage
        if first is not None or last is not None:
            rest = self.num_layers - (first or 0) - (last or 0)
            n_middle = pp - (first is not None) - (last is not None)
            middle = _spread(max(0, rest), n_middle) if n_middle > 0 else []
            return ([first] if first is not None else []) + middle + ([last] if last is not None else [])
        extra = int(self.account_for_embedding_in_pipeline_split) + int(self.account_for_loss_in_pipeline_split)
        layers = _spread(self.num_layers + extra, pp)
        if self.account_for_embedding_in_pipeline_split:
            layers[0] = max(0, layers[0] - 1)
        if self.account_for_loss_in_pipeline_split:
            layers[-1] = max(0, layers[-1] - 1)
        return layers

    def pipeline_split_ok(self, pp: int) -> bool:
        """Whether megatron-core builds exactly ``num_layers`` layers over ``pp`` stages with this config's split
        settings (its asserts: the middle stages, or the layers plus embedding / loss, divide evenly)."""
        pp = max(1, pp)
        if self.pipeline_layout is not None:
            # the same layout at another PP is read with another VPP (stages / PP); PP=1 with several stages
            # would be virtual stages without a pipeline, not something to propose
            return self.layout_for(pp) is not None and (pp > 1 or len(self.pipeline_layout) == 1)
        first, last = self.num_layers_in_first_pipeline_stage, self.num_layers_in_last_pipeline_stage
        if first is not None or last is not None:
            stages = pp - (first is not None) - (last is not None)
            rest = self.num_layers - (first or 0) - (last or 0)
            if pp == 1 or stages < 0 or rest < 0:
                return False
            return rest == 0 if stages == 0 else rest % stages == 0
        extra = int(self.account_for_embedding_in_pipeline_split) + int(self.account_for_loss_in_pipeline_split)
        return (self.num_layers + extra) % pp == 0 and (pp > 1 or not extra)

    def last_layer_moe(self) -> bool:
        """Whether the last decoder layer is an MoE layer (``moe_layers()[-1]`` without building the list): what an
        MTP layer is built as. A layer past a hybrid pattern shorter than the model (which megatron-core refuses) is
        read as ``_layer_kind`` reads it, an MLP layer."""
        return self.num_layers > 0 and self.is_moe_layer(self.num_layers - 1)

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` is an MoE layer: its hybrid symbol is ``E``, else the MoE layer frequency
        (every Nth layer, or a per-layer list; layers past the list are dense)."""
        if self.hybrid_pattern:
            return index < len(self.hybrid_pattern) and self.hybrid_pattern[index] == "E"
        if not self.num_moe_experts:
            return False
        freq = self.moe_layer_freq
        if isinstance(freq, int):
            return index % max(1, freq) == 0
        return index < len(freq) and bool(freq[index])

    def moe_layers(self) -> list[bool]:
        n = min(self.num_layers, len(self.hybrid_pattern)) if self.hybrid_pattern else self.num_layers
        return [self.is_moe_layer(i) for i in range(n)]

@lru_cache(maxsize=256)
def _layout_ok(stages: tuple[str, ...], pp: int, num_layers: int, mtp_num_layers: int) -> bool:
    return not pp_layout.layout_problems(stages, pp, num_layers, mtp_num_layers)


def _spread(n: int, parts: int) -> list[int]:
    """``n`` layers over ``parts`` stages, the remainder on the first ones."""
    per, extra = divmod(n, max(1, parts))
    return [per + (1 if i < extra else 0) for i in range(max(1, parts))]


@dataclass(frozen=True)
class ParamCount:
    """Parameters held by one rank. ``dense`` is everything sharded over (DP x CP); ``expert`` over expert DP."""

    dense: int
    expert: int = 0
    embedding: int = 0  # part of ``dense``: word (+ output) embeddings on this rank
    details: dict[str, int] = field(default_factory=dict, compare=False)
    linear: int = 0  # part of the total: transformer-layer weights (what FP8 casts); not embeddings

    @property
    def total(self) -> int:
        return self.dense + self.expert


def _mlp(h: int, f: int, glu: bool, bias: bool, tp: int) -> int:
    fc1_out = (2 * f if glu else f) // tp
    fc1 = fc1_out * h + (fc1_out if bias else 0)
    fc2 = h * (f // tp) + (h if bias else 0)
    return fc1 + fc2


def _mla_attention(s: ModelShape, tp: int) -> int:
    """Multi-latent attention on one TP rank (see the module docstring; TE spec: down projections duplicated)."""
    h, a = s.hidden_size, s.num_attention_heads
    norm = 2 if s.layernorm else 1
    q_head = s.qk_head_dim + s.qk_pos_emb_head_dim
    if s.q_lora_rank:
        q = s.q_lora_rank * h + norm * s.q_lora_rank + (a * q_head // tp) * s.q_lora_rank
    else:
        q = (a * q_head // tp) * h
    kv = ((s.kv_lora_rank + s.qk_pos_emb_head_dim) * h + norm * s.kv_lora_rank
          + (a * (s.qk_head_dim + s.v_head_dim) // tp) * s.kv_lora_rank)
    proj = h * (a * s.v_head_dim // tp) + (h if s.add_bias_linear else 0)
    return q + kv + proj


def _attention(s: ModelShape, tp: int) -> int:
    if s.multi_latent_attention:
        return _mla_attention(s, tp)
    h, a, g, d = s.hidden_size, s.num_attention_heads, s.groups, s.kv
    qkv_out = (a * d + 2 * g * d) // tp
    qkv = qkv_out * h + (qkv_out if (s.add_bias_linear or s.add_qkv_bias) else 0)
    proj = h * (a * d // tp) + (h if s.add_bias_linear else 0)
    qk_norm = 2 * d * (2 if s.layernorm else 1) if s.qk_layernorm else 0
    return qkv + proj + qk_norm


def _norm(s: ModelShape) -> int:
    return s.hidden_size * (2 if s.layernorm else 1)


def layer_params(s: ModelShape, moe: bool, tp: int = 1, ep: int = 1, etp: int | None = None) -> tuple[int, int]:
    """(dense, expert) parameters of one transformer layer on one rank."""
    etp = etp or tp
    dense = _attention(s, tp) + 2 * _norm(s)
    expert = 0
    if not moe:
        dense += _mlp(s.hidden_size, s.ffn, s.gated_linear_unit, s.add_bias_linear, tp)
        return dense, expert
    experts = s.num_moe_experts or 0
    f = s.moe_ffn_hidden_size or s.ffn
    dense += experts * s.hidden_size  # router
    if s.moe_shared_expert_intermediate_size:
        dense += _mlp(s.hidden_size, s.moe_shared_expert_intermediate_size, s.gated_linear_unit, s.add_bias_linear, tp)
        if s.moe_shared_expert_gate:
            dense += s.hidden_size
    local_experts = -(-experts // ep)
    expert = local_experts * _mlp(s.hidden_size, f, s.gated_linear_unit, s.add_bias_linear, etp)
    return dense, expert


def _mamba(s: ModelShape, tp: int) -> int:
    """One Mamba layer on one TP rank (megatron-core ``mamba_mixer.py`` ``MambaMixer`` with the TE spec: the
    layer's norm fused into ``in_proj``): ``in_proj`` ``h -> 2*d_inner + 2*groups*state + heads`` and ``conv1d``
    over ``d_inner + 2*groups*state`` channels (kernel 4, bias) column-parallel; ``dt_bias``, ``A_log``, ``D`` per
    head; a gated RMSNorm of ``d_inner``; ``out_proj`` ``d_inner -> h`` row-parallel. No linear biases."""
    h = s.hidden_size
    d_inner = s.mamba_num_heads * s.mamba_head_dim if s.mamba_num_heads else 2 * h
    heads = s.mamba_num_heads or d_inner // s.mamba_head_dim
    groups_state = 2 * s.mamba_num_groups * s.mamba_state_dim
    in_proj = (2 * d_inner + groups_state + heads) // tp * h
    conv_dim = (d_inner + groups_state) // tp
    conv = conv_dim * s.mamba_conv_kernel + conv_dim
    return _norm(s) + in_proj + conv + 3 * (heads // tp) + d_inner // tp + (d_inner // tp) * h


def hybrid_layer_params(s: ModelShape, symbol: str, tp: int = 1, ep: int = 1,
                        etp: int | None = None) -> tuple[int, int]:
    """(dense, expert) parameters of one layer of a hybrid model: each symbol is a whole layer with one norm."""
    if symbol == "M":
        return _mamba(s, tp), 0
    if symbol == "*":
        return _attention(s, tp) + _norm(s), 0
    if symbol == "-":
        return _mlp(s.hidden_size, s.ffn, s.gated_linear_unit, s.add_bias_linear, tp) + _norm(s), 0
    d, e = layer_params(s, True, tp, ep, etp)  # "E": MoE layer
    return d - _attention(s, tp) - _norm(s), e


def _layer_kind(s: ModelShape, index: int, flags: list[bool]) -> object:
    """What decides a layer's count in ``_layer_at``: its hybrid symbol, else whether it is an MoE layer."""
    if s.hybrid_pattern:
        return s.hybrid_pattern[index] if index < len(s.hybrid_pattern) else "-"
    return flags[index] if index < len(flags) else False


def stage_layer_kinds(s: ModelShape, pp: int) -> list[dict[object, tuple[int, int]]]:
    """Per pipeline stage: each kind of decoder layer it holds (``_layer_kind``) -> (how many, one layer's index).
    Counted once per shape and pipeline size (every plan of a search asks again; qa-report-14 L1)."""
    try:
        return _stage_layer_kinds_cached(s, pp)
    except TypeError:  # an unhashable field (a layout given as a list): counted each time
        return _stage_layer_kinds(s, pp)


def _stage_layer_kinds(s: ModelShape, pp: int) -> list[dict[object, tuple[int, int]]]:
    flags = s.moe_layers()
    out = []
    for ids in s.stage_layer_ids(pp):
        kinds: dict[object, tuple[int, int]] = {}
        for layer in ids:
            kind = _layer_kind(s, layer, flags)
            count, first = kinds.get(kind, (0, layer))
            kinds[kind] = (count + 1, first)
        out.append(kinds)
    return out


_stage_layer_kinds_cached = lru_cache(maxsize=256)(_stage_layer_kinds)


def _layer_at(s: ModelShape, index: int, flags: list[bool], tp: int, ep: int, etp: int | None) -> tuple[int, int]:
    if s.hybrid_pattern:
        return hybrid_layer_params(s, s.hybrid_pattern[index] if index < len(s.hybrid_pattern) else "-", tp, ep, etp)
    return layer_params(s, flags[index] if index < len(flags) else False, tp, ep, etp)


def mtp_params(s: ModelShape, tp: int = 1, ep: int = 1, etp: int | None = None) -> tuple[int, int]:
    """(dense, expert) parameters of the MTP block on the last stage (without the word embedding it adds)."""
    if not s.mtp_num_layers:
        return 0, 0
    d, e = layer_params(s, s.last_layer_moe(), tp, ep, etp)
    h = s.hidden_size
    per = d + 3 * _norm(s) + (h // tp) * 2 * h  # enorm, hnorm, final norm; eh_proj (column-parallel 2h -> h)
    return s.mtp_num_layers * per, s.mtp_num_layers * e


def stage_counts(s: ModelShape, tp: int = 1, pp: int = 1, ep: int = 1, etp: int | None = None) -> list[ParamCount]:
    """Parameters on each pipeline stage of one TP rank (index = pipeline rank).

    The first stage holds the embeddings, the last one the final norm, the output layer (a copy of the word
    embedding when tied and PP>1), and the MTP block with its own word embedding when untied and PP>1. A custom
    layout decides which rank builds which decoder layers and the MTP block; a rank other than the last holding
    the MTP block (megatron-core's ``mtp_standalone``) builds a word embedding of its own for it.
    """
    tp, pp, ep = max(1, tp), max(1, pp), max(1, ep)
    v = s.padded_vocab(tp)
    h = s.hidden_size
    word = v // tp * h
    pos = s.seq_length * h if s.position_embedding == "learned_absolute" else 0
    flags = s.moe_layers()
    mtp_per_rank = s.stage_mtp_layers(pp)
    md, me = mtp_params(s, tp, ep, etp)
    per_mtp = (md // s.mtp_num_layers, me // s.mtp_num_layers) if s.mtp_num_layers else (0, 0)
    stages = []
    # A layer's count depends only on its kind (MoE or not; its hybrid symbol): sized once per kind, not per layer
    # (a typo'd 100,000-layer config sized every layer of every plan: check ran for minutes).
    per_kind: dict[object, tuple[int, int]] = {}
    for i, kinds in enumerate(stage_layer_kinds(s, pp)):
        dense = expert = 0
        for kind, (count, layer) in kinds.items():
            if kind not in per_kind:
                per_kind[kind] = _layer_at(s, layer, flags, tp, ep, etp)
            d, e = per_kind[kind]
            dense += d * count
            expert += e * count
        linear = dense + expert
        emb = 0
        mtp = mtp_per_rank[i]
        if i == 0:
            dense += word + pos
            emb += word
        if mtp:
            dense += per_mtp[0] * mtp
            expert += per_mtp[1] * mtp
            linear += (per_mtp[0] + per_mtp[1]) * mtp
        if i == pp - 1:
            dense += _norm(s)  # final norm
            if s.untie_embeddings or pp > 1:
                dense += word
                emb += word
            if mtp and s.untie_embeddings and pp > 1:
                dense += word  # the MTP block's word embedding on the last stage (output layer shared)
                emb += word
        elif mtp and (i > 0 or (s.layout_vpp(pp) or 1) > 1):
            dense += word  # a standalone MTP chunk (not the first stage's): its own word embedding, tied to it
            emb += word
        layers = sum(c for c, _ in kinds.values())
        stages.append(ParamCount(dense, expert, emb, {"stage": i, "layers": layers, "mtp_layers": mtp}, linear=linear))
    return stages


def count_params(
    s: ModelShape, tp: int = 1, pp: int = 1, ep: int = 1, etp: int | None = None, stage: int | None = None
) -> ParamCount:
    """Parameters on one (TP, PP) rank; ``stage=None`` means the most-loaded pipeline stage.

    This is the number Megatron prints as " > number of parameters on (tensor, pipeline) model parallel rank".
    Layers are split over PP as ``ModelShape.stage_layers`` says (``stage_counts`` has every stage).
    """
    stages = stage_counts(s, tp, pp, ep, etp)
    if stage is not None:
        return stages[stage]
    return max(stages, key=lambda c: c.total)


def reconcile(s: ModelShape, logged: int, tp: int = 1, pp: int = 1, ep: int = 1,
              etp: int | None = None) -> tuple[ModelShape, str | None]:
    """Make the shape agree with the parameter count the job printed, when a setting the log does not show
    explains the difference: Megatron-Bridge's summary lists values that differ from megatron-core's
    TransformerConfig, so provider fields (tied embeddings, position embedding type) are often missing.
    Returns the shape (changed or not) and what was changed (None when nothing matched or nothing was needed)."""
    if count_params(s, tp, pp, ep, etp).total == logged:
        return s, None
    for untie in (s.untie_embeddings, not s.untie_embeddings):
        for pos in (s.position_embedding, "rope", "learned_absolute"):
            candidate = replace(s, untie_embeddings=untie, position_embedding=pos)
            if count_params(candidate, tp, pp, ep, etp).total == logged:
                changes = []
                if untie != s.untie_embeddings:
                    changes.append(f"{'untied' if untie else 'tied'} embeddings")
                if pos != s.position_embedding:
                    changes.append(f"{pos} position embeddings")
                return candidate, "the log's parameter count implies " + " and ".join(changes)
    return s, None
