"""Read a model shape, a layout and a workload from a job's config (a ConfigView of dotted Megatron-Bridge paths),
with the defaults that changed across releases.

Release-dependent defaults (../shared/knowledge/megatron-core.md §2b):
- Megatron-FSDP's default ``data_parallel_sharding_strategy`` is ``no_shard`` up to megatron-core 0.17 and
  ``optim_grads_params`` from 0.18 (applied only when the job did not set it);
- Megatron-FSDP grads: ``grad_reduce_in_fp32`` decides up to core 0.18; from 0.19 only
  ``ddp.megatron_fsdp_main_grads_dtype`` does (default: the param dtype, bf16);
- Megatron-Bridge's ``mixed_precision`` (``bf16_mixed``) sets ``grad_reduce_in_fp32=True`` unless told otherwise.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from diagnose.configview import ConfigView
from diagnose.explain.config.defaults import version_tuple
from diagnose.explain.config.mlm_args import moe_freq_value
from diagnose.explain.config.tokenizers import VOCAB_KEYS
from diagnose.explain.config.values import FALSE_WORDS, NULL_WORDS, as_bool
from diagnose.explain.memory import pp_layout
from diagnose.explain.memory.activations import Workload, attention_kind
from diagnose.explain.memory.options import Scenario
from diagnose.explain.memory.shape import ModelShape
from diagnose.explain.memory.state import STRATEGIES, Layout
from diagnose.model import DiagnoseError

View = ConfigView | None  # the job's config as read, or None when there is none
_FALSE = FALSE_WORDS | NULL_WORDS | {"0"}  # what as_bool reads as False


def _get(view: View, key: str, default: Any = None) -> Any:
    value = view.get(key) if view is not None else None
    return default if value is None else value


def _origin(view: View, key: str) -> str | None:
    return view.origin(key) if view is not None else None


def set_in_job(view: View, key: str) -> bool:
    """The job's config sets ``key`` (not a release default)."""
    origin = _origin(view, key)
    return origin is not None and origin != "default"


def _bool(v: Any, default: bool = False) -> bool:
    return default if v is None else as_bool(v)


def _int(v: Any, default: int | None = None) -> int | None:
    """A non-negative integer, or ``default`` (config values may be strings, floats, junk)."""
    if v is None or isinstance(v, bool):
        return default
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return default
    if f != f or f in (float("inf"), float("-inf")) or not f.is_integer() or f < 0:
        return default
    return int(f)


def _float(v: Any, default: float = 0.0) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def mcore_version(view: View) -> tuple[int, ...] | None:
    return version_tuple((view.mcore_version if view is not None else None) or _get(view, "versions.megatron_core"))


def _model(view: View, name: str, default: Any = None, mlm: str | None = None) -> Any:
    """``model.<name>``, else the Megatron-LM argument kept as ``mlm.<name>`` (or ``mlm.<mlm>``)."""
    value = _get(view, f"model.{name}")
    if value is None:
        value = _get(view, f"mlm.{mlm or name}")
    return default if value is None else value


# More layers than any model has: the memory model keeps a list per layer, so a typo'd 1e12 (``--set
# model.num_layers=99999999999999999999999``) crashed with OverflowError and 1e9 asked for 8 GB.
MAX_LAYERS = 100_000


def shape_from_config(view: View) -> ModelShape | None:
    """The model's shape, or None when the config lacks the sizes (layers, hidden, heads) or they are absurd."""
    hybrid = hybrid_pattern(view)
    layers = len(hybrid) if hybrid else _int(_get(view, "model.num_layers"))
    hidden = _int(_get(view, "model.hidden_size"))
    heads = _int(_get(view, "model.num_attention_heads"))
    if not (layers and hidden and heads) or min(layers, hidden, heads) < 1 or hidden < heads or layers > MAX_LAYERS:
        return None
    vocab = next((v for v in (_int(_get(view, k)) for k in VOCAB_KEYS) if v), 32000)
    norm = str(_model(view, "normalization", "LayerNorm"))
    freq = _model(view, "moe_layer_freq", 1)
    if isinstance(freq, str):  # "([0]*3+[1]*58)", as MoE model-zoo YAMLs over Bridge write it
        freq = moe_freq_value(freq)
    freq = tuple(int(x) for x in freq) if isinstance(freq, (list, tuple)) else _int(freq, 1) or 1
    shape = ModelShape(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        ffn_hidden_size=_int(_model(view, "ffn_hidden_size")),
        num_query_groups=_int(_model(view, "num_query_groups")),
        kv_channels=_int(_model(view, "kv_channels")),
        vocab_size=vocab,
        make_vocab_size_divisible_by=_int(_model(view, "make_vocab_size_divisible_by"), 128) or 128,
        seq_length=_int(_get(view, "model.seq_length")) or _int(_get(view, "dataset.seq_length")) or _int(
            _get(view, "mlm.seq_length")) or 4096,
        gated_linear_unit=_bool(_model(view, "gated_linear_unit", mlm="swiglu")),
        untie_embeddings=not _bool(_get(view, "model.share_embeddings_and_output_weights"), True)
        or _bool(_get(view, "mlm.untie_embeddings_and_output_weights")),
        add_bias_linear=_bool(_get(view, "model.add_bias_linear"), not _bool(_get(view, "mlm.disable_bias_linear"))),
        add_qkv_bias=_bool(_model(view, "add_qkv_bias")),
        layernorm=norm.lower() != "rmsnorm",
        qk_layernorm=_bool(_model(view, "qk_layernorm")),
        position_embedding=str(_model(view, "position_embedding_type", "learned_absolute")),
        num_moe_experts=_int(_model(view, "num_moe_experts", mlm="num_experts")),
        moe_ffn_hidden_size=_int(_model(view, "moe_ffn_hidden_size")),
        moe_shared_expert_intermediate_size=_int(_model(view, "moe_shared_expert_intermediate_size")),
        moe_shared_expert_gate=_bool(_model(view, "moe_shared_expert_gate")),
        moe_layer_freq=freq,
        moe_router_topk=_int(_model(view, "moe_router_topk")),
        **_mla_fields(view),
        mtp_num_layers=_int(_model(view, "mtp_num_layers"), 0) or 0,
        num_layers_in_first_pipeline_stage=_int(_model(
            view, "num_layers_in_first_pipeline_stage", mlm="decoder_first_pipeline_num_layers")),
        num_layers_in_last_pipeline_stage=_int(_model(
            view, "num_layers_in_last_pipeline_stage", mlm="decoder_last_pipeline_num_layers")),
        account_for_embedding_in_pipeline_split=_bool(_model(view, "account_for_embedding_in_pipeline_split")),
        account_for_loss_in_pipeline_split=_bool(_model(view, "account_for_loss_in_pipeline_split")),
        **_mamba_fields(view, hybrid),
    )
    # a custom layout megatron-core would refuse is not modelled (pipeline_layout_problem says why)
    stages = _pipeline_layout(view)[0]
    if stages is not None and not _layout_problems(view, shape, stages):
        shape = replace(shape, pipeline_layout=stages)
    return shape


# keys that move the parameter count, the value megatron-core's TransformerConfig / GPTModel takes when the
# config does not say, and how the report names it
_COUNT_KEYS: tuple[tuple[str, Any, str], ...] = (
    ("model.gated_linear_unit", False, "gated_linear_unit (GLU/SwiGLU)"),
    ("model.share_embeddings_and_output_weights", True, "share_embeddings_and_output_weights (tied embeddings)"),
    ("model.normalization", "LayerNorm", "normalization"),
    ("model.add_bias_linear", True, "add_bias_linear"),
    ("model.position_embedding_type", "learned_absolute", "position_embedding_type"),
)


def count_assumptions(view: View) -> list[str]:
    """What the parameter count assumed because the config does not say (one phrase each): the vocabulary
    (32,000) when neither a size nor a known tokenizer is given, and for a Bridge config, the keys that move the
    count and were filled by megatron-core's defaults (a provider's or the file's values are not assumptions).
    A Megatron-LM argument list is complete by itself (an absent flag is the argument's default)."""
    out = []
    if not any(_get(view, k) is not None for k in VOCAB_KEYS):
        out.append("vocab_size 32,000 (no vocab_size and no known tokenizer in the config)")
    if view is not None and view.framework == "megatron-lm":
        return out
    return out + [f"{name} = {default} (megatron-core's default: not in the config)"
                  for key, default, name in _COUNT_KEYS if _origin(view, key) in (None, "default")]


def assumption_warning(assumed: list[str], provider_named: bool) -> str:
    """The note that says what a parameter count assumed (``count_assumptions``): one wording for ``check`` and
    ``analyze``."""
    return ("WARNING: the parameter count assumes " + "; ".join(assumed)
            + (": set them in the config for a true count (the provider named does not)" if provider_named
               else ": set them (or the model's provider _target_) for a true count"))


_HYBRID_SYMBOLS = set("M*-E")


def hybrid_pattern(view: View) -> str | None:
    """The hybrid model's layer pattern (``hybrid_override_pattern``, Bridge's newer ``hybrid_layer_pattern``,
    Megatron-LM ``--hybrid-override-pattern``), or None. Megatron-core's MTP separator ``/`` ends the decoder part.
    A pattern with symbols megatron-core does not build is refused (DiagnoseError), never miscounted."""
    for name in ("hybrid_override_pattern", "hybrid_layer_pattern"):
        value = _model(view, name)
        if isinstance(value, str) and value.strip() and value.strip().lower() not in _FALSE:
            text = value.strip().split("/", 1)[0]
            if len(text) > 100_000 or not set(text) <= _HYBRID_SYMBOLS:
                raise DiagnoseError(f"cannot count the hybrid model: model.{name} {value[:40]!r} holds symbols "
                                    "other than M (Mamba), * (attention), - (MLP) and E (MoE)")
            return text
    return None


def _mamba_fields(view: View, pattern: str | None) -> dict[str, Any]:
    if not pattern:
        return {}
    return {
        "hybrid_pattern": pattern,
        "mamba_num_heads": _int(_model(view, "mamba_num_heads")),
        "mamba_head_dim": _int(_model(view, "mamba_head_dim"), 64) or 64,
        "mamba_state_dim": _int(_model(view, "mamba_state_dim"), 128) or 128,
        "mamba_num_groups": _int(_model(view, "mamba_num_groups"), 8) or 8,
    }


def _layout_problems(view: View, shape: ModelShape, stages: tuple[str, ...]) -> list[str]:
    pp = _int(_get(view, "model.pipeline_model_parallel_size"), 1) or 1
    vpp = _int(_get(view, "model.virtual_pipeline_model_parallel_size"))
    return pp_layout.layout_problems(stages, pp, shape.num_layers, shape.mtp_num_layers, vpp)


def _pipeline_layout(view: View) -> tuple[tuple[str, ...] | None, str | None]:
    """``pipeline_model_parallel_layout`` parsed, or (None, why it cannot be read); (None, None) when unset."""
    value = _model(view, "pipeline_model_parallel_layout")
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None, None
    try:
        return pp_layout.parse_layout(value), None
    except pp_layout.LayoutError as e:
        return None, str(e)


def pipeline_layout_problem(view: View, shape: ModelShape) -> str | None:
    """Why the config's custom pipeline layout is not used for the memory model (None: unset, or used)."""
    stages, error = _pipeline_layout(view)
    if error:
        return error
    if stages is None:
        return None
    problems = _layout_problems(view, shape, stages)
    return "pipeline_model_parallel_layout: " + "; ".join(problems) if problems else None


def _present(view: View, name: str) -> bool:
    """The job sets ``model.<name>`` (or ``mlm.<name>``), possibly to null."""
    return any(_origin(view, f"{ns}.{name}") is not None for ns in ("model", "mlm"))


def _mla_fields(view: View) -> dict[str, Any]:
    """Multi-latent attention: on with ``multi_latent_attention`` (or, when that is not shown, a ``kv_lora_rank``:
    Bridge's DeepSeek providers subclass MLATransformerConfig, whose flag defaults to True). Unset sizes take
    MLATransformerConfig's defaults; ``q_lora_rank: null`` (DeepSeek-V2-Lite) means no query compression."""
    flag = _model(view, "multi_latent_attention")
    mla = _bool(flag) if flag is not None else _int(_model(view, "kv_lora_rank")) is not None
    if not mla:
        return {}
    q_lora = _int(_model(view, "q_lora_rank"))
    if q_lora is None and not _present(view, "q_lora_rank"):
        q_lora = 512
    return {
        "multi_latent_attention": True,
        "q_lora_rank": q_lora or None,
        "kv_lora_rank": _int(_model(view, "kv_lora_rank"), 512) or 512,
        "qk_head_dim": _int(_model(view, "qk_head_dim"), 128) or 128,
        "qk_pos_emb_head_dim": _int(_model(view, "qk_pos_emb_head_dim"), 64) or 64,
        "v_head_dim": _int(_model(view, "v_head_dim"), 128) or 128,
    }


def fp8_from_config(view: View) -> tuple[bool, bool]:
    """(FP8 GEMMs, FP8 parameters). FP8 is on when ``fp8`` names a format (Megatron-LM ``--fp8-format``: ``fp8``
    in the arguments dump, ``fp8_format`` on a command line), directly or in Bridge's ``mixed_precision``, or
    when the ``mixed_precision`` preset's name says fp8.
    FP8 parameters: ``fp8_param_gather`` (ddp / mixed_precision / Megatron-LM) or ``model.fp8_param``; Bridge's
    ``*_fp8_delayed_scaling_mixed`` presets set ``fp8_param_gather=True`` (Megatron-Bridge ``mixed_precision.py``)."""
    keys = ("model.fp8", "mixed_precision.fp8", "mlm.fp8", "mlm.fp8_format")
    fmt = next((v for v in (_get(view, k) for k in keys) if v is not None), None)
    preset = str(_get(view, "mixed_precision", "") or "").lower()
    fp8 = (fmt is not None and str(fmt).strip().lower() not in _FALSE) or "fp8" in preset
    params = any(_bool(_get(view, k)) for k in ("ddp.fp8_param_gather", "mixed_precision.fp8_param_gather",
                                                   "mlm.fp8_param_gather", "model.fp8_param",
                                                   "mixed_precision.fp8_param"))
    if "fp8_delayed_scaling" in preset and _get(view, "mixed_precision.fp8_param_gather") is None:
        params = True
    return fp8 or params, params


def cuda_graphs_from_config(view: View) -> str | None:
    """``cuda_graph_impl`` ("local" | "transformer_engine"); older ``enable_cuda_graph`` means "local" and
    Megatron-LM's ``--external-cuda-graph`` "transformer_engine"."""
    impl = str(_model(view, "cuda_graph_impl", "none") or "none").lower()
    if impl in ("local", "transformer_engine"):
        return impl
    if _bool(_model(view, "enable_cuda_graph")):
        return "local"
    if _bool(_get(view, "mlm.external_cuda_graph")):
        return "transformer_engine"
    return None


def strategy_from_config(view: View) -> str:
    fsdp = _bool(_get(view, "ddp.use_megatron_fsdp")) or _bool(_get(view, "dist.use_megatron_fsdp"))
    if fsdp:
        key = "ddp.data_parallel_sharding_strategy"
        value = _get(view, key)
        ver = mcore_version(view)
        if value is None or (_origin(view, key) == "default" and ver is not None and ver >= (0, 18)):
            value = "optim_grads_params" if ver is None or ver >= (0, 18) else "no_shard"
        levels = {"0": "no_shard", "1": "optim", "2": "optim_grads", "3": "optim_grads_params"}
        value = levels.get(str(value), str(value))
        return f"fsdp:{value}" if f"fsdp:{value}" in STRATEGIES else "fsdp:optim_grads_params"
    if _bool(_get(view, "ddp.use_distributed_optimizer")) or _bool(_get(view, "optimizer.use_distributed_optimizer")):
        return "distributed_optimizer"
    return "ddp"


def grad_bytes_from_config(view: View, strategy: str) -> int:
    ver = mcore_version(view)
    if strategy.startswith("fsdp:") and ver is not None and ver >= (0, 19):
        dtype = str(_get(view, "ddp.megatron_fsdp_main_grads_dtype", "auto")).lower()
        return 4 if ("32" in dtype or dtype == "float") else 2
    value = _get(view, "ddp.grad_reduce_in_fp32")
    if view is not None and view.framework == "megatron-lm" and not set_in_job(view, "ddp.grad_reduce_in_fp32"):
        # Megatron-LM: --bf16 turns accumulate_allreduce_grads_in_fp32 on unless --grad-reduce-in-bf16
        if _bool(_get(view, "mlm.grad_reduce_in_bf16")):
            return 2
        return 4 if _bool(_get(view, "model.bf16")) or _bool(_get(view, "mlm.bf16")) else 2
    mp = _get(view, "mixed_precision")
    mp_flag = _get(view, "mixed_precision.grad_reduce_in_fp32")
    if mp_flag is not None:
        return 4 if _bool(mp_flag) else 2
    if mp is not None and str(mp).lower() not in _FALSE:
        return 4  # Bridge presets (bf16_mixed...) reduce grads in fp32
    return 4 if _bool(value) else 2


def layout_from_config(view: View, gpus: int | None = None) -> Layout:
    strategy = strategy_from_config(view)
    tp = _int(_get(view, "model.tensor_model_parallel_size"), 1) or 1
    pp = _int(_get(view, "model.pipeline_model_parallel_size"), 1) or 1
    cp = _int(_get(view, "model.context_parallel_size"), 1) or 1
    ep = _int(_get(view, "model.expert_model_parallel_size"), 1) or 1
    world = gpus or _int(_get(view, "launch.world_size")) or tp * pp * cp
    # Bridge's mixed precision (a preset name, or a MixedPrecisionConfig section in recipe dumps) writes the
    # model's bf16/fp16 and params_dtype before the model is built
    params_dtype = str(_get(view, "mixed_precision.params_dtype") or _get(view, "model.params_dtype", "")).lower()
    preset = _get(view, "mixed_precision")
    mixed = (isinstance(preset, str) and preset.strip().lower() not in _FALSE) or any(
        _bool(_get(view, k)) for k in ("mixed_precision.bf16", "mixed_precision.fp16", "model.bf16", "model.fp16"))
    param_bytes = 4 if (("float32" in params_dtype or "fp32" in params_dtype) and not mixed) else 2
    offload = _bool(_get(view, "optimizer.optimizer_cpu_offload"))
    return Layout(
        strategy=strategy,
        gpus=max(1, world),
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=_int(_get(view, "model.expert_tensor_parallel_size")),
        dist_opt_instances=_int(_get(view, "ddp.num_distributed_optimizer_instances"), 1) or 1,
        grad_bytes=grad_bytes_from_config(view, strategy),
        param_bytes=param_bytes,
        optimizer=str(_get(view, "optimizer.optimizer", "adam")),
        optimizer_offload_fraction=_float(_get(view, "optimizer.optimizer_offload_fraction"), 1.0) if offload else 0.0,
        meta_init=_bool(_get(view, "model.init_model_with_meta_device")),
        overlap_grad_reduce=_bool(_get(view, "ddp.overlap_grad_reduce"), False),
        overlap_param_gather=_bool(_get(view, "ddp.overlap_param_gather"), False),
        fp8=fp8_from_config(view)[0],
        fp8_params=fp8_from_config(view)[1],
    )


def workload_from_config(view: View, shape: ModelShape | None, layout: Layout) -> Workload:
    mbs = _int(_get(view, "train.micro_batch_size"), 1) or 1
    gbs = _int(_get(view, "train.global_batch_size"))
    granularity = _get(view, "model.recompute_granularity")
    granularity = None if granularity is None or str(granularity).lower() in _FALSE else str(granularity).lower()
    seq = (shape.seq_length if shape else None) or _int(_get(view, "model.seq_length")) or 4096
    micro = gbs // (mbs * layout.dp) if gbs and gbs >= mbs * layout.dp else None
    return Workload(
        micro_batch_size=mbs,
        seq_length=seq,
        sequence_parallel=_bool(_get(view, "model.sequence_parallel")),
        recompute=granularity,
        recompute_num_layers=_int(_get(view, "model.recompute_num_layers")),
        num_microbatches=micro,
        virtual_pp=_int(_get(view, "model.virtual_pipeline_model_parallel_size")) or (
            shape.layout_vpp(layout.pp) if shape else None),
        fp8=fp8_from_config(view)[0],
        cuda_graphs=cuda_graphs_from_config(view),
        **layer_implementation(view),
    )


def attention_note(view: View, work: Workload | None) -> str | None:
    """Say so when the activations are sized for an attention that keeps the ``a*s^2`` scores."""
    if work is None or work.attention == "flash":
        return None
    if _get(view, "model.transformer_impl") is None and _get(view, "launch.transformer_engine") is False:
        why = "the log says Transformer Engine is not installed, so the local layer spec"
    else:
        why = (f"transformer_impl={_get(view, 'model.transformer_impl')}, "
               f"attention_backend={_get(view, 'model.attention_backend')}")
    kind = {"local": "megatron-core's local DotProductAttention",
            "te_unfused": "Transformer Engine's unfused attention"}
    return (f"activations sized for {kind.get(work.attention, work.attention)} ({why}): it keeps the "
            f"a*s^2 attention scores ({'fp32' if work.softmax_fp32 and work.attention == 'local' else 'bf16'} "
            "softmax); flash attention or selective recompute does not")


def layer_implementation(view: View) -> dict[str, Any]:
    """How the job's layers are built, for the activation model (``Workload`` fields).

    The attention comes from ``model.transformer_impl`` / ``model.attention_backend`` (Megatron-LM
    ``--transformer-impl`` / ``--attention-backend``); a log that says Transformer Engine is not installed
    (``launch.transformer_engine`` false) means the local spec, whose norms are torch's unless apex is there.
    Unset values take megatron-core's defaults (fp32 softmax, no activation or RoPE fusion, dropout 0.1);
    Megatron-LM's arguments default to the fused SwiGLU and RoPE and a bf16 softmax."""
    mlm = view is not None and view.framework == "megatron-lm"
    impl = _get(view, "model.transformer_impl")
    if impl is None and _get(view, "launch.transformer_engine") is False:
        impl = "local"
    local = str(impl or "").lower() == "local"
    return {
        "attention": attention_kind(impl, _get(view, "model.attention_backend")),
        "torch_norm": local and _get(view, "launch.apex") is not True,
        "softmax_fp32": _bool(_get(view, "model.attention_softmax_in_fp32"), not mlm),
        "activation_fusion": _bool(_get(view, "model.bias_activation_fusion"), mlm),
        "rope_fusion": _bool(_get(view, "model.apply_rope_fusion"), mlm),
        "hidden_dropout": _float(_get(view, "model.hidden_dropout"), 0.1) or 0.0,
        "attention_dropout": _float(_get(view, "model.attention_dropout"), 0.1) or 0.0,
    }


def scenario(view: View, shape: ModelShape | None, layout: Layout, work: Workload | None, capacity: int,
             **known: Any) -> Scenario:
    """The search's starting point for a job read from its config (``known``: what the log adds)."""
    return Scenario(shape, layout, work, capacity, view=view,
                    saves_checkpoints=bool(_get(view, "checkpoint.save") or _get(view, "checkpoint.load")),
                    global_batch_size=_int(_get(view, "train.global_batch_size")), **known)
