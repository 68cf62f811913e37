"""Checks on the pipeline split: virtual pipeline (interleaved) sizes, uneven first/last stages, explicit layouts,
and the interleaved-only parameter all-gather overlap.

Rules CV050-CV053 and CV085. Sources: megatron-core 0.16.1 ``parallel_state.py`` ``initialize_model_parallel``
(~L746) and ``transformer/transformer_config.py`` ``TransformerConfig.__post_init__`` (~L1299-L1460), Megatron-LM
d98e8a64 ``megatron/training/arguments.py`` ``validate_args`` (~L1000, L1066), Megatron-Bridge 067f987d
``models/gpt_provider.py`` ``GPTModelProvider.provide`` (~L240). The messages are upstream's, missing spaces
included (an f-string pair without a separator), so replay can find them in a log.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from diagnose.explain.validate.registry import KNOWN_KEYS, CheckContext, Violation, check, ov

VPP = "model.virtual_pipeline_model_parallel_size"
PP = "model.pipeline_model_parallel_size"
FIRST = "model.num_layers_in_first_pipeline_stage"
LAST = "model.num_layers_in_last_pipeline_stage"
EMB = "model.account_for_embedding_in_pipeline_split"
LOSS = "model.account_for_loss_in_pipeline_split"
LAYOUT = "model.pipeline_model_parallel_layout"
MLM_P2P = "mlm.overlap_p2p_comm"  # Megatron-LM arguments with no Bridge path are kept as mlm.<name>
OPGWOS = "mlm.overlap_param_gather_with_optimizer_step"

MSG_MODEL_CHUNKS = "Make sure the number of model chunks is the same across all pipeline stages."
MSG_VPP_NEEDS_PP = "pipeline-model-parallel size should be greater than 1 with interleaved schedule"
MSG_MLM_VPP_PP1 = "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1"
MSG_MLM_VPP_PP2 = (
    "When interleaved schedule is used and p2p communication overlap is disabled, pipeline-model-parallel size "
    "should be greater than 2 to avoid having multiple p2p sends and recvs between same 2 ranks per communication "
    "batch"
)
MSG_SPLIT_AND_ACCOUNT = (
    "num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot beset at the same time with "
    "account_for_embedding_in_pipeline_splitand account_for_loss_in_pipeline_split"
)

KNOWN_KEYS.update({VPP, PP, FIRST, LAST, EMB, LOSS, LAYOUT, "model.overlap_p2p_comm",
                   "optimizer.overlap_param_gather_with_optimizer_step"})


def _vpp(ctx: CheckContext) -> int | None:
    """The virtual pipeline size, None when unset (0 is treated as unset, like upstream's truthiness test)."""
    return ctx.number(VPP) or None


def _set(ctx: CheckContext, key: str) -> bool:
    return ctx.get(key) is not None


def _vpp_divisors(per_stage: int, below: int) -> list[list[Any]]:
    """Fix alternatives for a VPP that does not divide ``per_stage`` layers: the largest VPP > 1 below the current
    one that does, then no interleaving at all."""
    fixes = [[ov(VPP, d)] for d in range(below - 1, 1, -1) if per_stage and per_stage % d == 0][:1]
    return fixes + [[ov(VPP, None)]]


@check("vpp_model_chunks", "Megatron-Bridge models/gpt_provider.py GPTModelProvider.provide (067f987d ~L240; same "
       "assert since v0.1), at model build", ("megatron-bridge",))
def vpp_model_chunks(ctx: CheckContext) -> Iterable[Violation]:
    """``(num_layers // PP) % VPP == 0`` unless the split is flexible (first/last stage sizes, account_for_* or a
    layout), in which case megatron-core's per-stage checks below apply."""
    vpp, layers, pp = _vpp(ctx), ctx.number("model.num_layers"), ctx.pp
    if not vpp or not layers:
        return
    flexible = ctx.flag(EMB) or ctx.flag(LOSS) or _set(ctx, FIRST) or _set(ctx, LAST) or _set(ctx, LAYOUT)
    if flexible or (layers // pp) % vpp == 0:
        return
    yield Violation("vpp_model_chunks", MSG_MODEL_CHUNKS, ["model.num_layers", PP, VPP],
                    fixes=_vpp_divisors(layers // pp, vpp))


@check("vpp_needs_pipeline", "megatron-core parallel_state.py initialize_model_parallel (0.16.1 ~L746); Megatron-LM "
       "arguments.py validate_args (d98e8a64 ~L1000: PP > 2 unless overlap_p2p_comm)")
def vpp_needs_pipeline(ctx: CheckContext) -> Iterable[Violation]:
    vpp, pp = _vpp(ctx), ctx.pp
    if vpp is None:
        return
    keys = [VPP, PP]
    if ctx.mlm:
        # validate_args runs before initialize_model_parallel and asserts its own wording
        overlap = ctx.flag(MLM_P2P) or ctx.flag("model.overlap_p2p_comm")
        if overlap and pp <= 1:
            yield Violation("vpp_needs_pipeline", MSG_MLM_VPP_PP1, keys, fixes=[[ov(VPP, None)]])
        elif not overlap and pp <= 2:
            fixes = [[ov(VPP, None)]] + ([[ov(MLM_P2P, True)]] if pp == 2 else [])
            yield Violation("vpp_needs_pipeline", MSG_MLM_VPP_PP2, keys + [MLM_P2P], fixes=fixes)
        return
    if pp <= 1:
        yield Violation("vpp_needs_pipeline", MSG_VPP_NEEDS_PP, keys, fixes=[[ov(VPP, None)]])


@check("pipeline_split_settings", "megatron-core transformer/transformer_config.py TransformerConfig.__post_init__ "
       "(0.16.1 ~L1299-L1460: account_for_* vs first/last, layout conflicts, uneven split arithmetic)")
def pipeline_split_settings(ctx: CheckContext) -> Iterable[Violation]:
    """The uneven-pipeline part of ``__post_init__``, in its order: it raises the first problem only."""
    first, last = ctx.number(FIRST), ctx.number(LAST)
    emb, loss = ctx.flag(EMB), ctx.flag(LOSS)
    split_keys = [FIRST, LAST, EMB, LOSS]
    if (_set(ctx, FIRST) or _set(ctx, LAST)) and (emb or loss):
        yield Violation("pipeline_split_settings", MSG_SPLIT_AND_ACCOUNT, split_keys,
                        fixes=[[ov(EMB, False), ov(LOSS, False)], [ov(FIRST, None), ov(LAST, None)]])
        return
    if _set(ctx, LAYOUT):
        if _set(ctx, FIRST) or _set(ctx, LAST) or emb or loss:
            message = (
                "pipeline_model_parallel_layout cannot be set with other pipeline layout arguments. "
                f"self.num_layers_in_first_pipeline_stage={ctx.get(FIRST)!r}, "
                f"self.num_layers_in_last_pipeline_stage={ctx.get(LAST)!r}, "
                f"self.account_for_embedding_in_pipeline_split={emb!r}, "
                f"self.account_for_loss_in_pipeline_split={loss!r}."
            )
            yield Violation("pipeline_layout_conflict", message, [LAYOUT] + split_keys,
                            fixes=[[ov(FIRST, None), ov(LAST, None), ov(EMB, False), ov(LOSS, False)]])
        return  # the layout's own arithmetic (PipelineParallelLayerLayout) is not mirrored
    layers = ctx.number("model.num_layers")
    if not layers:
        return
    if _set(ctx, FIRST) or _set(ctx, LAST):
        if first is not None or last is not None:  # not whole numbers: no claim
            yield from _uneven(ctx, layers, first, last)
    elif emb or loss:
        yield from _account_for(ctx, layers + int(emb) + int(loss))


def _uneven(ctx: CheckContext, layers: int, first: int | None, last: int | None) -> Iterable[Violation]:
    vpp, stages, remaining = _vpp(ctx), ctx.pp, layers
    keys = ["model.num_layers", PP, FIRST, LAST]
    drop_split = [[ov(FIRST, None), ov(LAST, None)]]
    for name, value, _key in (("first", first, FIRST), ("last", last, LAST)):
        if value is None:
            continue
        if value <= 0:
            yield Violation("uneven_pipeline_stages", f"num_layers_in_{name}_pipeline_stage must be larger than 0",
                            keys, fixes=drop_split)
            return
        if vpp is not None and value % vpp:
            yield Violation(
                "uneven_pipeline_vpp",
                f"number of layers at {name} stage: {value}must be divisible by virtual pipelineparallel degree {vpp}",
                keys + [VPP], fixes=[[ov(VPP, None)]] + drop_split)
            return
        remaining -= value
        stages -= 1
    if bool(remaining) != bool(stages) and not ctx.core_before((0, 16, 0)):
        yield Violation(
            "uneven_pipeline_stages",
            f"Mismatch: {remaining} middle layers remaining but {stages} middle PP stages available.",
            keys, fixes=drop_split)
        return
    if stages > 0 and remaining % stages:
        yield Violation(
            "uneven_pipeline_stages",
            f"number of layers at middle stage: {remaining} must be divisible bythe middle pipeline model parallel "
            f"size {stages}", keys, fixes=drop_split)
        return
    if stages > 0 and vpp is not None and (remaining // stages) % vpp:
        yield Violation(
            "uneven_pipeline_vpp",
            f"number of layers on each middle pipeline rank:{remaining // stages} must be divisible by "
            f"virtualpipeline parallel degree {vpp}", keys + [VPP], fixes=[[ov(VPP, None)]] + drop_split)


def _account_for_fixes(ctx: CheckContext, base: int, pp: int) -> list[list[Any]]:
    """Turn off one of the account_for_* flags when that makes the count divide PP, else both."""
    return [[ov(key, False)] for key, other in ((LOSS, EMB), (EMB, LOSS))
            if ctx.flag(key) and (base + int(ctx.flag(other))) % pp == 0] + [[ov(EMB, False), ov(LOSS, False)]]


def _account_for(ctx: CheckContext, layers: int) -> Iterable[Violation]:
    pp, vpp = ctx.pp, _vpp(ctx)
    keys = ["model.num_layers", PP, EMB, LOSS]
    drop = _account_for_fixes(ctx, layers - int(ctx.flag(EMB)) - int(ctx.flag(LOSS)), pp)
    if ctx.mlm and layers % pp:
        # validate_args (d98e8a64 ~L997) asserts this before the model config is built
        yield Violation("account_for_pipeline_split",
                        "Number of layers should be divisible by the pipeline-model-parallel size", keys, fixes=drop)
        return
    if vpp is None:
        if layers % pp:
            yield Violation(
                "account_for_pipeline_split",
                f"number of middle layers: {layers} must be divisible by middle pipeline_model_parallel_size {pp}",
                keys, fixes=drop)
        return
    if layers % pp:
        yield Violation(
            "account_for_pipeline_split",
            f"num_layers: {layers} after enableaccount_for_embedding_in_pipeline_split or "
            f"account_for_loss_in_pipeline_split must be divisibleby pipeline_model_parallel_size {pp}",
            keys + [VPP], fixes=drop)
        return
    if (layers // pp) % vpp:
        yield Violation(
            "account_for_pipeline_split_vpp",
            f"number of layers on each pipeline rank: {layers // pp}(after enable "
            "account_for_embedding_in_pipeline_split or account_for_loss_in_pipeline_split) must be divisible by"
            f"virtual_pipeline_model_parallel_size{vpp}",
            keys + [VPP], fixes=_vpp_divisors(layers // pp, vpp) + drop)


@check("overlap_param_gather_with_optimizer_step", "Megatron-LM arguments.py validate_args (d98e8a64 L1066-L1074; "
       "the distributed-optimizer assert before these is CV025's)", ("megatron-lm",))
def overlap_param_gather_with_optimizer_step(ctx: CheckContext) -> Iterable[Violation]:
    key = OPGWOS if ctx.view.has(OPGWOS) else "optimizer.overlap_param_gather_with_optimizer_step"
    if not ctx.flag(key) or not ctx.flag("optimizer.use_distributed_optimizer"):
        return
    fixes = [[ov(key, False)]]
    if not (ctx.flag("ddp.overlap_param_gather") or ctx.flag("optimizer.overlap_param_gather")):
        yield Violation("overlap_param_gather_with_optimizer_step",
                        "Must use --overlap-param-gather-with-optimizer-step with --overlap-param-gather",
                        [key, "ddp.overlap_param_gather"], fixes=fixes)
    elif _vpp(ctx) is None:
        yield Violation("overlap_param_gather_with_optimizer_step",
                        "--overlap-param-gather-with-optimizer-step only supported with interleaved pipeline "
                        "parallelism", [key, VPP], fixes=fixes)


MLM_LAYOUT = "mlm.pipeline_model_parallel_layout"
MTP_LAYERS = "model.mtp_num_layers"
KNOWN_KEYS.update({MTP_LAYERS})
_LAYER_TYPE = {"E": "LayerType.embedding", "t": "LayerType.decoder", "m": "LayerType.mtp", "L": "LayerType.loss"}


def _layout_message(stages: tuple[str, ...], pp: int, vpp: int | None, layers: int | None, mtp: int,
                    strict_mtp: bool = True) -> str | None:
    """The first assertion megatron-core 0.16.1 raises for this layout, in its words (None: it accepts it).

    ``PipelineParallelLayerLayout.__init__`` (stages divisible by PP), ``TransformerConfig.__post_init__`` (VPP),
    then ``validate_layer_layout``, in that order. The MTP-placement message is cut short upstream (its second
    f-string is a separate statement), so it is given as it really prints. Releases after 0.16 also accept one loss
    per MTP layer (``mtp_loss_split``) and MTP layers spread over consecutive ranks (``mtp_split``): with MTP layers
    and a megatron-core not known to be 0.16 or older (``strict_mtp`` False), those conditions are not claimed."""
    from diagnose.explain.memory.pp_layout import rank_chunks

    if len(stages) % pp:
        return (f"pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size "
                f"(len(layout)={len(stages)}, pipeline_model_parallel_size={pp})")
    detected = len(stages) // pp
    if vpp is not None and vpp != detected:
        return (f"virtual_pipeline_model_parallel_size conflicts with pipeline_model_parallel_layout, "
                f"(self.virtual_pipeline_model_parallel_size={vpp},  detected_vpp_size={detected})")
    flat = "".join(stages)
    if not flat:
        return "The first layer must be embedding, but got nothing"
    if flat[0] != "E":
        return f"The first layer must be embedding, but got {_LAYER_TYPE[flat[0]]}"
    if flat[-1] != "L":
        return f"The last layer must be loss, but got {_LAYER_TYPE[flat[-1]]}"
    if flat.count("E") != 1:
        return "Embedding must be specified exactly once"
    if flat.count("L") != 1 and (strict_mtp or not mtp or flat.count("L") != 1 + mtp):
        return "Loss must be specified exactly once"
    if layers is not None and flat.count("t") != layers:
        return f"Number of decoder layers {flat.count('t')}must match num_layers {layers}"
    if flat.count("m") != mtp:
        return "Number of mtp layers in layout must match mtp_num_layers"
    if "m" in flat and "t" in flat[flat.index("m"):]:
        return "decoder layers must be placed before MTP layers"
    if mtp and not strict_mtp:
        return None  # MTP placement rules differ after 0.16 (mtp_split): not claimed for an unknown release
    chunks = rank_chunks(stages, pp)
    if any("m" in c for rank in chunks for c in rank[:-1]):
        return "Currently we restrict that the MTP should be always in the last "
    if any("m" in rank[-1] and rank[-1].count("m") != mtp for rank in chunks):
        return "All of the MTP layers must be in the same one virtual pipeline stage"
    return None


@check("pipeline_layout_invalid", "megatron-core transformer/pipeline_parallel_layer_layout.py "
       "PipelineParallelLayerLayout.__init__ / validate_layer_layout and TransformerConfig.__post_init__ (0.16.1 "
       "~L1307-L1360); the layout is parsed by diagnose's own grammar (explain/memory/pp_layout.py), never evaluated")
def pipeline_layout_invalid(ctx: CheckContext) -> Iterable[Violation]:
    from diagnose.explain.memory.pp_layout import LayoutError, parse_layout

    key = LAYOUT if _set(ctx, LAYOUT) else MLM_LAYOUT if _set(ctx, MLM_LAYOUT) else None
    if key is None:
        return
    if _set(ctx, FIRST) or _set(ctx, LAST) or ctx.flag(EMB) or ctx.flag(LOSS):
        return  # pipeline_split_settings raises first (the conflict)
    drop = [[ov(key, None)]]  # the even split; replay proves whether this model allows it
    try:
        stages = parse_layout(ctx.get(key))
    except LayoutError as e:
        yield Violation("pipeline_layout_invalid", str(e), [key], fixes=drop)
        return
    message = _layout_message(stages, ctx.pp, _vpp(ctx), ctx.number("model.num_layers"),
                              ctx.number(MTP_LAYERS) or 0, strict_mtp=ctx.core_before((0, 17, 0)))
    if message is not None:
        keys = [key, PP, VPP, "model.num_layers", MTP_LAYERS]
        yield Violation("pipeline_layout_invalid", message, keys, fixes=drop)
