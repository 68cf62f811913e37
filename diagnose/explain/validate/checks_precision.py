"""Checks on low precision (FP8/FP4), recomputation, CUDA graphs, context parallelism and the run-length units.

Rules CV070, CV071, CV073, CV080, CV090, CV091, CV097, CV098. Sources: megatron-core 0.16.1
``transformer/transformer_config.py`` ``__post_init__`` (L988-L1035, L1180-L1249),
``transformer/dot_product_attention.py`` ``DotProductAttention.__init__``; Megatron-Bridge 067f987d
``training/mixed_precision.py`` (presets, ``MixedPrecisionConfig.finalize``,
``update_config_with_precision_overrides``), ``training/config.py`` (``SchedulerConfig.finalize`` ~L406,
``_validate_cp_comm_type`` ~L1665, ``_validate_training_scheduler_compatibility`` ~L1699, the rng sync ~L1415),
``models/gpt_provider.py`` ``provide`` (~L233); Megatron-LM d98e8a64 ``arguments.py`` ``validate_args`` (~L1426).
"""

from __future__ import annotations

from collections.abc import Iterable
from math import prod
from typing import Any

from diagnose.explain.config.values import as_bool
from diagnose.explain.validate.registry import KNOWN_KEYS, CheckContext, Violation, check, ov, simple_check

_NO = object()
# What Bridge's mixed-precision presets set (training/mixed_precision.py, 067f987d). Bridge copies every field of the
# MixedPrecisionConfig onto the model (update_config_with_precision_overrides), so with a preset these win over model.*.
_BF16 = {"fp8": None, "fp8_recipe": "tensorwise", "first_last_layers_bf16": False, "fp8_param": False, "fp4": None,
         "fp4_param": False, "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 0}
_BF16_PRESETS: dict[str, dict[str, Any]] = {
    "bf16_mixed": _BF16,
    "bf16_with_fp8_delayed_scaling_mixed": {**_BF16, "fp8": "hybrid", "fp8_recipe": "delayed", "fp8_param": True},
    "bf16_with_mxfp8_mixed": {**_BF16, "fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param": True},
    "bf16_with_fp8_current_scaling_mixed": {**_BF16, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                                            "first_last_layers_bf16": True, "fp8_param": True,
                                            "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1},
    "bf16_with_fp8_subchannel_scaling_mixed": {**_BF16, "fp8": "hybrid", "fp8_recipe": "blockwise", "fp8_param": True},
}
# each fp16_* preset sets what its bf16_* twin sets; NVFP4 has no fp16 twin
PRESETS: dict[str, dict[str, Any]] = {**_BF16_PRESETS, **{"fp16" + k[4:]: v for k, v in _BF16_PRESETS.items()},
                                      "bf16_with_nvfp4_mixed": {**_BF16, "fp4": "e2m1", "fp4_param": True}}
# TransformerConfig defaults for the same fields (0.16.1)
_MCORE_DEFAULTS = {"fp8": None, "fp8_recipe": "delayed", "first_last_layers_bf16": False, "fp8_param": False,
                   "fp4": None, "fp4_param": False, "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1}
FP16_WITH_CURRENT = "fp16_with_fp8_current_scaling_mixed"
BF16_WITH_CURRENT = "bf16_with_fp8_current_scaling_mixed"


def precision(ctx: CheckContext, field: str) -> Any:
    """The value the model trains with: a named preset's, else the mixed_precision section's, else model.*.
    ``_NO`` when ``mixed_precision`` names a preset this table does not know (no claim then)."""
    preset = ctx.get("mixed_precision")
    if isinstance(preset, str) and preset:
        table = PRESETS.get(preset.replace("-", "_"))
        return _NO if table is None else table[field]
    if ctx.view.has(f"mixed_precision.{field}"):
        return ctx.get(f"mixed_precision.{field}")
    return ctx.get(f"model.{field}", _MCORE_DEFAULTS[field])


KNOWN_KEYS.update({"mixed_precision", "model.recompute_modules", "model.cp_comm_type",
                   "model.hierarchical_context_parallel_sizes", "model.transformer_impl", "model.use_te_rng_tracker",
                   "model.transformer_layer_spec", "model.enable_cuda_graph",
                   "rng.te_rng_tracker", "train.train_iters", "train.train_samples", "scheduler.lr_decay_iters",
                   "scheduler.lr_decay_samples", "scheduler.lr_warmup_iters", "scheduler.lr_warmup_samples"})
KNOWN_KEYS.update(f"model.{name}" for name in _MCORE_DEFAULTS)
KNOWN_KEYS.update(f"mixed_precision.{name}" for name in (*_MCORE_DEFAULTS, "fp8_param_gather"))


def bridge_precision_overlay(view: Any) -> dict[str, Any]:
    """The model fields Bridge's mixed-precision config writes before ``model.finalize()`` (what the real
    TransformerConfig then sees): a named preset's values, or the ``mixed_precision.*`` section's; empty when the
    job names no preset or one this table does not know."""
    preset = view.get("mixed_precision")
    if isinstance(preset, str) and preset:
        return dict(PRESETS.get(preset.replace("-", "_"), {}))
    return {name: view.get(f"mixed_precision.{name}") for name in _MCORE_DEFAULTS
            if view.has(f"mixed_precision.{name}")}


def _on(value: Any) -> bool:
    """FP8/FP4 mode fields are format names (``hybrid``, ``e4m3``) or None; the param fields are booleans."""
    if value is _NO or value is None:
        return False
    if isinstance(value, str):
        return value.strip().lower() not in ("", "none", "null", "false", "0")
    return bool(value)


def _known(*values: Any) -> bool:
    return all(v is not _NO for v in values)


def _preset_fix(ctx: CheckContext) -> str:
    return FP16_WITH_CURRENT if ctx.flag("model.fp16") else BF16_WITH_CURRENT


@check("low_precision_param_needs_mode", "megatron-core transformer/transformer_config.py __post_init__ (0.16.1 "
       "L1027-L1032)")
def low_precision_param_needs_mode(ctx: CheckContext) -> Iterable[Violation]:
    fp8, fp8_param = precision(ctx, "fp8"), precision(ctx, "fp8_param")
    fp4, fp4_param = precision(ctx, "fp4"), precision(ctx, "fp4_param")
    if _known(fp8, fp8_param) and _on(fp8_param) and not _on(fp8):
        if ctx.view.has("mixed_precision.fp8_param"):
            # MixedPrecisionConfig keeps fp8_param and fp8_param_gather equal (its __setattr__)
            fix = [ov("mixed_precision.fp8_param", False), ov("mixed_precision.fp8_param_gather", False)]
        else:
            fix = [ov("model.fp8_param", False)]
        if ctx.flag("ddp.fp8_param_gather"):
            fix.append(ov("ddp.fp8_param_gather", False))
        yield Violation("fp8_param_needs_fp8", "fp8_param must be used together with fp8 mode.",
                        ["model.fp8_param", "model.fp8", "mixed_precision"],
                        fixes=[fix, [ov("mixed_precision", _preset_fix(ctx))]])
    elif _known(fp4, fp4_param) and _on(fp4_param) and not _on(fp4):
        yield Violation("fp4_param_needs_fp4", "fp4_param must be used together with fp4 mode.",
                        ["model.fp4_param", "model.fp4", "mixed_precision"], fixes=[[ov("model.fp4_param", False)]])


simple_check("fp4_and_fp8", "Megatron-Bridge training/mixed_precision.py MixedPrecisionConfig.finalize (>= 0.2) "
             "and megatron-core transformer/transformer_config.py __post_init__ (0.16.1 L1034): the same message",
             lambda ctx: _on(precision(ctx, "fp8")) and _on(precision(ctx, "fp4")),
             "fp4 and fp8 cannot be used simultaneously. Please choose one.",
             ["model.fp4", "model.fp8", "mixed_precision"],
             [[("model.fp4", None), ("model.fp4_param", False)], [("model.fp8", None)]])


@check("fp8_delayed_scaling_limits", "megatron-core transformer/transformer_config.py __post_init__ (0.16.1 "
       "L988-L1017 first/last BF16 layers; L1241 moe_act/layernorm recompute, since 0.15)")
def fp8_delayed_scaling_limits(ctx: CheckContext) -> Iterable[Violation]:
    fp8, recipe = precision(ctx, "fp8"), precision(ctx, "fp8_recipe")
    first_last = precision(ctx, "first_last_layers_bf16")
    if not _known(fp8, recipe, first_last) or not _on(fp8):
        return
    keys = ["model.fp8_recipe", "model.first_last_layers_bf16", "mixed_precision"]
    preset = [ov("mixed_precision", _preset_fix(ctx))]
    if as_bool(first_last) and recipe == "delayed":
        yield Violation("fp8_delayed_first_last_bf16", "Delayed scaling does not support first / last layer in BF16.",
                        keys, fixes=[preset, [ov("model.first_last_layers_bf16", False)]])
        return
    layers, pp = ctx.number("model.num_layers"), ctx.pp
    if as_bool(first_last) and layers:
        per_stage = layers // pp
        for end in ("start", "end"):
            n = precision(ctx, f"num_layers_at_{end}_in_bf16")
            n = n if isinstance(n, int) and not isinstance(n, bool) else None
            if n is not None and (n < 0 or n > per_stage):
                yield Violation(
                    "fp8_bf16_layers_per_stage",
                    f"num_layers_at_{end}_in_bf16 ({n}) must be between 0 and number of layers per pipeline stage "
                    f"({per_stage}).",
                    [f"model.num_layers_at_{end}_in_bf16", "model.num_layers", "model.pipeline_model_parallel_size"],
                    fixes=[[ov(f"model.num_layers_at_{end}_in_bf16", max(0, min(n, per_stage)))]])
                return
    modules = ctx.get("model.recompute_modules") or ["core_attn"]
    if (ctx.get("model.recompute_granularity") == "selective" and isinstance(modules, list)
            and ("moe_act" in modules or "layernorm" in modules) and recipe == "delayed"):
        kept = [m for m in modules if m not in ("moe_act", "layernorm")]
        yield Violation("fp8_delayed_recompute_modules",
                        "Delayed scaling does not support moe_act and layernorm recompute for fp8.",
                        ["model.fp8_recipe", "model.recompute_modules", "mixed_precision"],
                        fixes=[preset, [ov("model.recompute_modules", kept)]])


@check("selective_recompute_settings", "megatron-core transformer/transformer_config.py __post_init__ (0.16.1 "
       "L1180); Megatron-LM arguments.py validate_args (d98e8a64 ~L1426, recompute_method)")
def selective_recompute_settings(ctx: CheckContext) -> Iterable[Violation]:
    if ctx.get("model.recompute_granularity") != "selective":
        return
    fix = [[ov("model.recompute_method", None), ov("model.recompute_num_layers", None)]]
    keys = ["model.recompute_granularity", "model.recompute_method", "model.recompute_num_layers"]
    if ctx.mlm and ctx.get("model.recompute_method") is not None:
        # validate_args runs before the model config is built
        yield Violation("selective_recompute_settings",
                        "recompute method is not yet supported for selective recomputing granularity", keys, fixes=fix)
    elif ctx.get("model.recompute_num_layers") is not None:
        yield Violation("selective_recompute_settings",
                        "When using recompute_granularity: selective recompute_num_layers must be None.", keys,
                        fixes=fix)


@check("cp_comm_type_hierarchical", "Megatron-Bridge training/config.py ConfigContainer._validate_cp_comm_type "
       "(>= 0.5.0; 067f987d ~L1665)", ("megatron-bridge",))
def cp_comm_type_hierarchical(ctx: CheckContext) -> Iterable[Violation]:
    if ctx.surely_before((0, 5, 0)):
        return
    comm, sizes = ctx.get("model.cp_comm_type"), ctx.get("model.hierarchical_context_parallel_sizes")
    cp = ctx.cp
    types = comm if isinstance(comm, list) else [comm or "p2p"]
    a2a_p2p = any(isinstance(t, str) and "a2a+p2p" in t for t in types)
    keys = ["model.cp_comm_type", "model.hierarchical_context_parallel_sizes", "model.context_parallel_size"]
    if a2a_p2p and sizes is None:
        yield Violation(
            "cp_comm_type_hierarchical",
            "hierarchical_context_parallel_sizes must be set when cp_comm_type contains 'a2a+p2p'. Without it, CP "
            "communication is silently disabled and each rank attends only to its local chunk, producing "
            "artificially high throughput but broken training. Example: for cp=16 across 4 nodes of 8 GPUs, set "
            "hierarchical_context_parallel_sizes=[8, 2].", keys, fixes=[[ov("model.cp_comm_type", "p2p")]])
        return
    ints = isinstance(sizes, list) and sizes and all(isinstance(s, int) and not isinstance(s, bool) for s in sizes)
    if ints and prod(sizes) != cp:
        fix = [ov("model.hierarchical_context_parallel_sizes", None)]
        if a2a_p2p:
            fix.append(ov("model.cp_comm_type", "p2p"))
        yield Violation(
            "cp_comm_type_hierarchical",
            f"Product of hierarchical_context_parallel_sizes {sizes} (={prod(sizes)}) must equal "
            f"context_parallel_size (={cp}).", keys, fixes=[fix])


@check("context_parallel_needs_te", "megatron-core transformer/dot_product_attention.py DotProductAttention.__init__ "
       "(0.16.1), the attention of the local layer spec, at model build: Megatron-LM builds it for "
       "--transformer-impl local; Megatron-Bridge for transformer_layer_spec=local_layer_spec (gpt_provider.py; "
       "Bridge picks the spec by that field, not by transformer_impl)")
def context_parallel_needs_te(ctx: CheckContext) -> Iterable[Violation]:
    if ctx.cp <= 1:
        return
    message = "Context parallelism is only supported by TEDotProductAttention!"
    if ctx.mlm:
        if ctx.get("model.transformer_impl") == "local":
            yield Violation("context_parallel_needs_te", message,
                            ["model.context_parallel_size", "model.transformer_impl"],
                            fixes=[[ov("model.transformer_impl", "transformer_engine")],
                                   [ov("model.context_parallel_size", 1)]])
        return
    spec = ctx.get("model.transformer_layer_spec")
    if isinstance(spec, str) and spec.rsplit(".", 1)[-1] == "local_layer_spec":
        # a layer-spec function cannot be set from the command line: the fix the tool can prove is CP=1
        yield Violation("context_parallel_needs_te", message,
                        ["model.context_parallel_size", "model.transformer_layer_spec"],
                        fixes=[[ov("model.context_parallel_size", 1)]])


@check("scheduler_units", "Megatron-Bridge training/config.py SchedulerConfig.finalize (mixed units) and "
       "ConfigContainer._validate_training_scheduler_compatibility (both >= 0.2.0; 067f987d ~L406, ~L1699)",
       ("megatron-bridge",))
def scheduler_units(ctx: CheckContext) -> Iterable[Violation]:
    if ctx.surely_before((0, 2, 0)):
        return
    samples_based = ctx.get("train.train_samples") is not None
    keys = ["train.train_iters", "train.train_samples"]
    mixed = _mixed_scheduler_units(ctx, samples_based)
    if mixed is not None:
        yield mixed
        return
    if samples_based:
        wrong = (("lr_decay_iters", None, "Use lr_decay_samples for sample-based training, not lr_decay_iters"),
                 ("lr_warmup_iters", 0, "Use lr_warmup_samples for sample-based training, not lr_warmup_iters"))
    else:
        wrong = (("lr_decay_samples", None, "Use lr_decay_iters for iteration-based training, not lr_decay_samples"),
                 ("lr_warmup_samples", 0, "Use lr_warmup_iters for iteration-based training, not lr_warmup_samples"))
    for name, allowed, message in wrong:
        value = ctx.get(f"scheduler.{name}", allowed)
        if value != allowed and not (allowed == 0 and value is None):
            yield Violation("scheduler_units", message, [f"scheduler.{name}"] + keys,
                            fixes=[[ov(f"scheduler.{name}", allowed)]])
            return


_ITER_FIELDS = (("lr_decay_iters", None), ("lr_warmup_iters", 0), ("lr_wsd_decay_iters", None))
_SAMPLE_FIELDS = (("lr_decay_samples", None), ("lr_warmup_samples", 0), ("lr_wsd_decay_samples", None))
KNOWN_KEYS.update(f"scheduler.{name}" for name, _ in _ITER_FIELDS + _SAMPLE_FIELDS)


def _mixed_scheduler_units(ctx: CheckContext, samples_based: bool) -> Violation | None:
    """SchedulerConfig.finalize (runs before the cross-check above): iteration and sample fields together. The fix
    resets the fields of the unit the run does not use."""
    def values(fields: tuple[tuple[str, Any], ...]) -> list[tuple[str, Any, Any]]:
        return [(name, ctx.get(f"scheduler.{name}", unset), unset) for name, unset in fields]

    iters, samples = values(_ITER_FIELDS), values(_SAMPLE_FIELDS)

    def used(items: list[tuple[str, Any, Any]]) -> bool:
        return any(value != unset and not (unset == 0 and value is None) for _, value, unset in items)

    if not (used(iters) and used(samples)):
        return None
    shown = [", ".join(f"{name}={value}" for name, value, _ in group) for group in (iters, samples)]
    wrong = iters if samples_based else samples
    return Violation(
        "scheduler_units",
        f"Cannot mix iteration-based and sample-based scheduler fields. Found iteration fields: {shown[0]}. "
        f"Found sample fields: {shown[1]}. Use either iteration fields OR sample fields, not both.",
        [f"scheduler.{name}" for name, _, _ in iters + samples] + ["train.train_samples"],
        fixes=[[ov(f"scheduler.{name}", unset) for name, value, unset in wrong if value != unset]])


simple_check(
    "cuda_graphs_need_te_rng_tracker", "Megatron-Bridge models/gpt_provider.py GPTModelProvider.provide (since v0.1; "
    "067f987d ~L233); ConfigContainer.validate turns model.use_te_rng_tracker on when rng.te_rng_tracker is",
    # v0.1.x tested enable_cuda_graph; since v0.2 megatron-core turns that flag into cuda_graph_impl="local" first
    lambda ctx: (ctx.get("model.cuda_graph_impl") not in (None, "none") or ctx.flag("model.enable_cuda_graph"))
    and not (ctx.flag("model.use_te_rng_tracker") or ctx.flag("rng.te_rng_tracker")),
    "Transformer engine's RNG tracker is required for cudagraphs, it can be enabled with use_te_rng_tracker=True'.",
    ["model.cuda_graph_impl", "model.use_te_rng_tracker"],
    [[("model.use_te_rng_tracker", True)], [("model.cuda_graph_impl", "none"), ("model.enable_cuda_graph", False)]],
    ("megatron-bridge",))
