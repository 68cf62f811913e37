"""Checks on parallel sizes, batch sizes, activation offloading and precision.

Sources: Megatron-Bridge ``training/config.py`` (``validate``, ``get_data_parallel_size`` ~L1013,
``_validate_mixed_precision_consistency`` ~L2140), megatron-core ``model_parallel_config.py`` and
``transformer/transformer_config.py`` ``__post_init__`` (0.16.1), ``num_microbatches_calculator.py`` ~L341.
"""

from __future__ import annotations

from collections.abc import Iterable

from diagnose.explain.validate.registry import CheckContext, Fixes, Violation, check, ov, simple_check

_CORE_TC = "megatron-core transformer/transformer_config.py __post_init__ (0.16.1 {})"
MSG_SP_WITHOUT_TP = "Cannot use sequence parallelism without tensor parallelism"
MSG_SEQ_CP = "Sequence length must be divisible by 2 * context parallel size if context parallel is used."
MSG_CPU_OFFLOAD_LAYERS = "CPU offloading can be done only for layers less than {num_layers}"
MSG_CPU_OFFLOAD_PP = "Currently there is no support for Pipeline parallelism with CPU offloading"
MSG_CPU_OFFLOAD_RECOMPUTE = "CPU offloading does not work when activation recomputation is enabled"
MSG_CPU_OFFLOAD_CUDA_GRAPHS = "CUDA graphs not supported with CPU offloading."
MSG_CPU_OFFLOAD_FINE_GRAINED = "fine_grained_activation_offloading cannot be enabled with cpu_offloading."
MSG_BF16_FP16 = "Model config cannot have both bf16=True and fp16=True. Please set only one precision mode."
MSG_MFSDP_V2_BF16 = "MFSDP V2 requires BF16 training (model.bf16=True and optimizer.bf16=True)."
MSG_MFSDP_V2_DP_ONLY = "MFSDP V2 currently supports DP-only training; unsupported settings: {settings}"
MSG_MFSDP_V2_CKPT = "MFSDP V2 checkpoint save and load are not yet supported."
MSG_MFSDP_V2_CPU_OFFLOAD = "MFSDP V2 does not support optimizer CPU offload."


def data_parallel_size(ctx: CheckContext) -> int | None:
    """DP = world // (TP*PP*CP) (EP is not in the product), or None when the world size is unknown."""
    world = ctx.number("launch.world_size")
    if not world:
        return None
    model = ctx.tp * ctx.pp * ctx.cp
    return world // model if model and world % model == 0 else None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def smaller_tp(ctx: CheckContext, below: int) -> int | None:
    """The largest TP < ``below`` that the heads, query groups and world size all allow (None if none)."""
    heads, groups = ctx.number("model.num_attention_heads"), ctx.number("model.num_query_groups")
    world = ctx.number("launch.world_size")
    rest = ctx.pp * ctx.cp
    for d in range(below - 1, 0, -1):
        if heads and heads % d:
            continue
        if groups and groups % d and d % groups:
            continue
        if world and world % (d * rest):
            continue
        return d
    return None


# Where upstream divides by each size (or asserts on the quotient): 0 raises ZeroDivisionError there, a negative size
# gives a negative data-parallel size or micro-batch count further on.
_DIVIDES = {
    "train.micro_batch_size": "megatron-core num_microbatches_calculator.py divides the global batch size by "
                              "micro_batch_size * data_parallel_size",
    "train.global_batch_size": "megatron-core num_microbatches_calculator.py asserts 'number of microbatches should be "
                               "at least 1'",
    "model.tensor_model_parallel_size": "get_data_parallel_size divides the world size by TP * PP * CP",
    "model.pipeline_model_parallel_size": "get_data_parallel_size divides the world size by TP * PP * CP",
    "model.context_parallel_size": "get_data_parallel_size divides the world size by TP * PP * CP",
}
# The sizes this check explains when below one: replay leaves them to it rather than refusing the config outright.
VALIDATED_SIZES = frozenset(_DIVIDES)


@check("sizes_positive", "Megatron-Bridge training/config.py get_data_parallel_size ~L1013 (world_size % "
       "total_model_size); Megatron-LM arguments.py L316; megatron-core num_microbatches_calculator.py "
       "ConstantNumMicroBatchesCalculator (0.16.1 ~L324-350)")
def sizes_positive(ctx: CheckContext) -> Iterable[Violation]:
    """A batch or parallel size of 0 or less: upstream takes it as given and fails (or miscounts) where it divides
    by it; the other checks read such a size as 1 (``CheckContext.size``), so it is refused here first."""
    for key, where in _DIVIDES.items():
        value = ctx.number(key)
        if value is not None and value < 1:
            if ctx.mlm:
                where = where.replace("get_data_parallel_size", "Megatron-LM arguments.py")
            yield Violation("sizes_positive", f"{key} is {value}: it must be 1 or more ({where})", [key],
                            fixes=[] if key == "train.global_batch_size" else [[ov(key, 1)]])


@check("world_size_divisible", "Megatron-Bridge training/config.py get_data_parallel_size ~L1013; "
       "Megatron-LM arguments.py L316")
def world_size_divisible(ctx: CheckContext) -> Iterable[Violation]:
    world = ctx.number("launch.world_size")
    tp, pp, cp = ctx.tp, ctx.pp, ctx.cp
    if not world or world % (tp * pp * cp) == 0:
        return
    if ctx.mlm:
        msg = f"world size ({world}) is not divisible by total_model_size (total_model_size={tp * pp * cp})"
    else:
        msg = (
            f"world size ({world}) is not divisible by total_model_size (model_cfg.tensor_model_parallel_size={tp} * "
            f"model_cfg.pipeline_model_parallel_size={pp} * model_cfg.context_parallel_size={cp})"
        )
    yield Violation(
        "world_size_divisible", msg,
        ["launch.world_size", "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
         "model.context_parallel_size"],
        fixes=[[ov(k, v) for k, v in alt] for alt in _smaller_tp_fix(ctx)],
    )


def divisible_global_batch(gbs: int, step: int) -> int:
    """The global batch the fix for "not divisible by micro batch x DP" sets: the largest multiple of ``step`` (micro
    batch x DP) not above ``gbs``, at least ``step`` (the memory plans that cannot keep a global batch set the same)."""
    return max(step, (gbs // step) * step)


@check("global_batch_divisible", "megatron-core num_microbatches_calculator.py ~L341")
def global_batch_divisible(ctx: CheckContext) -> Iterable[Violation]:
    gbs, mbs, dp = ctx.number("train.global_batch_size"), ctx.number("train.micro_batch_size"), data_parallel_size(ctx)
    if not gbs or not mbs or not dp or gbs % (mbs * dp) == 0:
        return
    new_gbs = divisible_global_batch(gbs, mbs * dp)
    yield Violation(
        "global_batch_divisible",
        f"global batch size ({gbs}) is not divisible by micro batch size ({mbs}) times data parallel size ({dp})",
        ["train.global_batch_size", "train.micro_batch_size", "launch.world_size"],
        fixes=[[ov("train.global_batch_size", new_gbs)]],
    )


def _smaller_tp_fix(ctx: CheckContext) -> Fixes:
    new_tp = smaller_tp(ctx, ctx.tp)
    return [[("model.tensor_model_parallel_size", new_tp)]] if new_tp else []


simple_check("heads_divisible_by_tp", _CORE_TC.format("~L960"),
             lambda ctx: (ctx.number("model.num_attention_heads") or 0) % ctx.tp != 0,
             lambda ctx: f"num_attention_heads ({ctx.number('model.num_attention_heads')}) must be a multiple of "
                         f"tensor_model_parallel_size ({ctx.tp}).",
             ["model.num_attention_heads", "model.tensor_model_parallel_size"], _smaller_tp_fix)
simple_check("query_groups_vs_tp", _CORE_TC.format("~L970"),
             lambda ctx: ((ctx.number("model.num_query_groups") or 0) % ctx.tp != 0
                          and ctx.tp % (ctx.number("model.num_query_groups") or ctx.tp) != 0),
             lambda ctx: f"num_query_groups ({ctx.number('model.num_query_groups')}) must be a multiple or divisor "
                         f"of tensor_model_parallel_size ({ctx.tp}).",
             ["model.num_query_groups", "model.tensor_model_parallel_size"], _smaller_tp_fix)


@check("layers_divisible_by_pp",
       "megatron-core transformer/transformer_block.py get_num_layers_to_build (0.16.1 ~L157), at model build; "
       "TransformerConfig itself only checks uneven/standalone-stage splits")
def layers_divisible_by_pp(ctx: CheckContext) -> Iterable[Violation]:
    layers, pp = ctx.number("model.num_layers"), ctx.pp
    if not layers or pp == 1 or layers % pp == 0:
        return
    if ctx.get("model.num_layers_in_first_pipeline_stage") is not None or ctx.get(
        "model.num_layers_in_last_pipeline_stage"
    ) is not None or ctx.get("model.pipeline_model_parallel_layout") is not None:
        return  # uneven splits: checks_pipeline.pipeline_split_settings
    if (ctx.flag("model.account_for_embedding_in_pipeline_split")
            or ctx.flag("model.account_for_loss_in_pipeline_split")):
        return  # the embedding/loss count as layers: checks_pipeline.pipeline_split_settings
    fixes = [[ov("model.pipeline_model_parallel_size", d)]
             for d in sorted(_divisors(layers), reverse=True) if d < pp][:1]
    fixes += _uneven_split(layers, pp)  # keeps PP (and the memory per stage): the fix search weighs both
    yield Violation(
        "layers_divisible_by_pp",
        "num_layers should be divisible by pipeline_model_parallel_size",
        ["model.num_layers", "model.pipeline_model_parallel_size"], fixes=fixes,
    )


_HYBRID_LAYERS = set("M*-E")


@check("hybrid_pattern_length",
       "megatron-core ssm/mamba_hybrid_layer_allocation.py _allocate_override (0.16.1 ~L75), at model build; "
       "Megatron-Bridge's MambaModelProvider.finalize where the field is hybrid_layer_pattern")
def hybrid_pattern_length(ctx: CheckContext) -> Iterable[Violation]:
    """A hybrid (Mamba) model's layer pattern has one symbol per decoder layer: megatron-core refuses a pattern
    whose length is not num_layers (it does not pad nor cut it), and newer Bridge releases assert the same when
    they derive num_layers from ``hybrid_layer_pattern``. The memory model counts the pattern's layers."""
    layers = ctx.number("model.num_layers")
    if not layers:
        return
    for name in ("hybrid_override_pattern", "hybrid_layer_pattern"):
        key = f"model.{name}" if ctx.get(f"model.{name}") is not None else f"mlm.{name}"
        value = ctx.get(key)
        if not isinstance(value, str):
            continue
        main = value.strip().split("/", 1)[0].replace("|", "")  # "/" starts the MTP part, "|" marks a stage
        if not main or not set(main) <= _HYBRID_LAYERS:
            continue  # empty, a false word ("None"), or symbols the memory model refuses on its own
        if len(main) == layers:
            return
        message = (f"num_layers ({layers}) does not match the number of layers derived from hybrid_layer_pattern "
                   f"({len(main)}). Please correct num_layers or the pattern." if name == "hybrid_layer_pattern"
                   else f"The hybrid override pattern is the wrong length: got {len(main)}, expected {layers}")
        yield Violation("hybrid_pattern_length", message, ["model.num_layers", key],
                        fixes=[[ov("model.num_layers", len(main))]])
        return


def _uneven_split(layers: int, pp: int) -> list[list]:
    """Keep the pipeline size and give the first and last stages the remainder (megatron-core
    ``num_layers_in_first/last_pipeline_stage``: the middle stages must then divide evenly): 61 layers on PP 16
    -> 3 + 14 x 4 + 2. Empty when no such split exists."""
    if pp < 3:
        return []
    for per in (-(-layers // pp), layers // pp):
        rest = layers - per * (pp - 2)
        if per >= 1 and rest >= 2:
            first = -(-rest // 2)
            return [[ov("model.num_layers_in_first_pipeline_stage", first),
                     ov("model.num_layers_in_last_pipeline_stage", rest - first)]]
    return []


simple_check("sequence_parallel_needs_tp", "megatron-core model_parallel_config.py __post_init__ (0.16.1 ~L404)",
             lambda ctx: ctx.flag("model.sequence_parallel") and ctx.tp <= 1, MSG_SP_WITHOUT_TP,
             ["model.sequence_parallel", "model.tensor_model_parallel_size"], [[("model.sequence_parallel", False)]],
             frameworks=("megatron-bridge",))
simple_check("sequence_parallel_off_without_tp", "Megatron-LM arguments.py validate_args (auto-fix, warning)",
             lambda ctx: ctx.flag("model.sequence_parallel") and ctx.tp <= 1,
             "Disabling sequence parallelism because tensor model parallelism is disabled",
             ["model.sequence_parallel"], frameworks=("megatron-lm",), kind="note")


@check("seq_length_context_parallel", "Megatron-Bridge training/config.py validate() ~L1573", ("megatron-bridge",))
def seq_length_context_parallel(ctx: CheckContext) -> Iterable[Violation]:
    cp = ctx.cp
    seq = ctx.number("model.seq_length")
    if cp <= 1 or not seq or seq % (2 * cp) == 0:
        return
    fixes = [[ov("model.context_parallel_size", d)] for d in range(cp - 1, 0, -1) if seq % (2 * d) == 0 or d == 1][:1]
    yield Violation(
        "seq_length_context_parallel", MSG_SEQ_CP, ["model.seq_length", "model.context_parallel_size"], fixes=fixes,
    )


@check("cpu_offloading_layers", "megatron-core transformer/transformer_config.py __post_init__ (0.16.1 L1137)")
def cpu_offloading_layers(ctx: CheckContext) -> Iterable[Violation]:
    layers = ctx.number("model.num_layers")
    n = ctx.number("model.cpu_offloading_num_layers", 0) or 0
    if ctx.flag("model.cpu_offloading") and layers and (n < 0 or n >= layers):
        yield Violation(
            "cpu_offloading_layers", MSG_CPU_OFFLOAD_LAYERS.format(num_layers=layers),
            ["model.cpu_offloading_num_layers", "model.num_layers"],
            fixes=[[ov("model.cpu_offloading_num_layers", layers - 1)]],
        )


simple_check("cpu_offloading_pipeline", _CORE_TC.format("L1142"),
             lambda ctx: ctx.flag("model.cpu_offloading") and ctx.pp > 1, MSG_CPU_OFFLOAD_PP,
             ["model.cpu_offloading", "model.pipeline_model_parallel_size"], [[("model.cpu_offloading", False)]])
simple_check("cpu_offloading_recompute", _CORE_TC.format("L1147"),
             lambda ctx: ctx.flag("model.cpu_offloading") and ctx.get("model.recompute_granularity") is not None,
             MSG_CPU_OFFLOAD_RECOMPUTE, ["model.cpu_offloading", "model.recompute_granularity"],
             [[("model.recompute_granularity", None), ("model.recompute_method", None),
               ("model.recompute_num_layers", None)], [("model.cpu_offloading", False)]])
simple_check("cpu_offloading_cuda_graphs", _CORE_TC.format("L1722"),
             lambda ctx: ctx.flag("model.cpu_offloading") and ctx.get("model.cuda_graph_impl") not in (None, "none"),
             MSG_CPU_OFFLOAD_CUDA_GRAPHS, ["model.cpu_offloading", "model.cuda_graph_impl"],
             [[("model.cuda_graph_impl", "none")], [("model.cpu_offloading", False)]])
simple_check("cpu_offloading_fine_grained", _CORE_TC.format("L1270"),
             lambda ctx: ctx.flag("model.cpu_offloading") and ctx.flag("model.fine_grained_activation_offloading"),
             MSG_CPU_OFFLOAD_FINE_GRAINED, ["model.cpu_offloading", "model.fine_grained_activation_offloading"],
             [[("model.fine_grained_activation_offloading", False)]])
simple_check("bf16_and_fp16", "Megatron-Bridge training/config.py _validate_mixed_precision_consistency ~L2140",
             lambda ctx: ctx.flag("model.bf16") and ctx.flag("model.fp16"), MSG_BF16_FP16,
             ["model.bf16", "model.fp16"], [[("model.fp16", False)]], ("megatron-bridge",))


@check("megatron_fsdp_v2_guards",
       "Megatron-Bridge training/config.py _validate_and_apply_megatron_fsdp_v2_configs ~L1126 (>=0.6.0)",
       ("megatron-bridge",))
def megatron_fsdp_v2_guards(ctx: CheckContext) -> Iterable[Violation]:
    if not ctx.megatron_fsdp or ctx.get("ddp.megatron_fsdp_version") != 2:
        return
    if ctx.surely_before((0, 6, 0)):
        return
    if not (ctx.flag("model.bf16") and ctx.flag("optimizer.bf16")):
        yield Violation("megatron_fsdp_v2_bf16", MSG_MFSDP_V2_BF16, ["model.bf16", "optimizer.bf16"],
                        fixes=[[ov("model.bf16", True), ov("optimizer.bf16", True)],
                               [ov("ddp.megatron_fsdp_version", 1)]])
    sizes = [(k, ctx.size(f"model.{k}")) for k in (
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
        "expert_model_parallel_size")]
    bad = [(k, v) for k, v in sizes if v > 1]
    if bad:
        yield Violation(
            "megatron_fsdp_v2_dp_only",
            MSG_MFSDP_V2_DP_ONLY.format(settings=", ".join(f"{k}={v}" for k, v in bad)),
            [f"model.{k}" for k, _ in bad] + ["ddp.megatron_fsdp_version"],
            fixes=[[ov("ddp.megatron_fsdp_version", 1)]],
        )
    if ctx.saves_or_loads:
        yield Violation("megatron_fsdp_v2_checkpoint", MSG_MFSDP_V2_CKPT,
                        ["checkpoint.save", "checkpoint.load", "ddp.megatron_fsdp_version"],
                        fixes=[[ov("ddp.megatron_fsdp_version", 1)]])
    if ctx.flag("optimizer.optimizer_cpu_offload"):
        yield Violation("megatron_fsdp_v2_cpu_offload", MSG_MFSDP_V2_CPU_OFFLOAD,
                        ["optimizer.optimizer_cpu_offload", "ddp.megatron_fsdp_version"],
                        fixes=[[ov("optimizer.optimizer_cpu_offload", False)], [ov("ddp.megatron_fsdp_version", 1)]])


@check("precision_aware_optimizer",
       "megatron-core optimizer/optimizer_config.py OptimizerConfig.__post_init__ (0.16.1 ~L375); Bridge runs it in "
       "optimizer.finalize(), before the distributed-optimizer settings are synced")
def precision_aware_optimizer(ctx: CheckContext) -> Iterable[Violation]:
    if not ctx.flag("optimizer.use_precision_aware_optimizer"):
        return
    if (ctx.get("optimizer.optimizer") or "adam") != "adam":
        yield Violation(
            "precision_aware_optimizer_adam_only", "--use-precision-aware-optimizer only supported with adam",
            ["optimizer.use_precision_aware_optimizer", "optimizer.optimizer"],
            fixes=[[ov("optimizer.use_precision_aware_optimizer", False)]],
        )
    elif not ctx.flag("optimizer.use_distributed_optimizer"):
        yield Violation(
            "precision_aware_optimizer_needs_distributed_optimizer",
            "--use-precision-aware-optimizer only supported with distributed optimizer",
            ["optimizer.use_precision_aware_optimizer", "optimizer.use_distributed_optimizer"],
            fixes=[[ov("optimizer.use_distributed_optimizer", True), ov("ddp.use_distributed_optimizer", True)],
                   [ov("optimizer.use_precision_aware_optimizer", False)]],
        )


simple_check("reuse_grad_buf_needs_fp8_param_gather",
             "megatron-core distributed/distributed_data_parallel_config.py __post_init__ (0.16.1 L149); Bridge runs "
             "it in ddp.finalize(), before the Megatron FSDP auto-fixes",
             lambda ctx: ctx.flag("ddp.reuse_grad_buf_for_mxfp8_param_ag") and not ctx.flag("ddp.fp8_param_gather"),
             "Reuse grad buffer only when keeping params in MXFP8.",
             ["ddp.reuse_grad_buf_for_mxfp8_param_ag", "ddp.fp8_param_gather"],
             [[("ddp.reuse_grad_buf_for_mxfp8_param_ag", False)]])
