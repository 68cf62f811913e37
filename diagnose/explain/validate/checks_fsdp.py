"""Checks on data-parallel wrapping: Megatron FSDP, Torch FSDP2, checkpoint format and the environment they need.

Sources: Megatron-Bridge ``src/megatron/bridge/training/config.py`` (``ConfigContainer.validate`` and
``_validate_and_apply_megatron_fsdp_v1_configs``), ``_ddp_wrap`` (``models/model_provider.py`` <= 0.3.x,
``models/common/unimodal.py`` 0.4.x), megatron-core ``distributed_data_parallel_config.py`` and Megatron-LM
``megatron/training/arguments.py``. Messages are the ones the real code prints, per release family
(../shared/knowledge/megatron-bridge.md §1.2, §1.4, §2; megatron-core.md §1a, §3).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from diagnose.explain.config.releases import FAMILY_LABELS, FIELD_MOVES, field_exists
from diagnose.explain.config.values import as_bool
from diagnose.explain.memory.gpus import BLACKWELL
from diagnose.explain.validate.registry import CheckContext, Violation, check, ov, simple_check
from diagnose.model import DELETE, Override

MSG_BOTH_FSDP_OLD = "Using use_megatron_fsdp and use_torch_fsdp2 at the same time is not supported."
MSG_BOTH_FSDP_NEW = "use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive."
MSG_FSDP_CKPT_OLD = "Megatron FSDP only supports fsdp_dtensor checkpoint format"
MSG_FSDP_CKPT_NEW = "Megatron-FSDP requires the fsdp_dtensor checkpointing format!"
MSG_DTENSOR_ONLY_MFSDP = "fsdp_dtensor checkpoint format only supports Megatron FSDP"
MSG_MAX_CONN_BRIDGE = "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."
MSG_MAX_CONN_MLM_FSDP = "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one"
MSG_MAX_CONN_MLM_TP = (
    "Using tensor model parallelism or context parallelism require setting the environment variable "
    "CUDA_DEVICE_MAX_CONNECTIONS to 1"
)
MSG_TP_PP_DP_MAPPING = "use_tp_pp_dp_mapping is not supported with Megatron FSDP"
MSG_MANUAL_REG = "DDP.fsdp_manual_registration requires DDP.nccl_ub!"
MSG_WEIGHT_HASH = (
    "TrainingConfig.check_weight_hash_across_dp_replicas_interval is not supported with the Megatron-FSDP "
    "optim_grads_params sharding strategy"
)
MSG_WEIGHT_HASH_MLM = "check_weight_hash_across_dp_replicas_interval is not supported with optim_grads_params"
MSG_NCCL_UB_EXPANDABLE = (
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is currently not supported with nccl_ub due to "
    "compatibility issue with torch.cuda.MemPool API."
)
MSG_FSDP2_PG_COLLECTION = "TorchFullyShardedDataParallel.__init__() got an unexpected keyword argument 'pg_collection'"
MSG_DIST_OPT_FORCED = "use_distributed_optimizer=True is required for Megatron-FSDP. Activating..."
MSG_DIST_OPT_SYNC = (
    "Distributed optimizer settings were not in sync: ddp.use_distributed_optimizer={a}, "
    "optimizer.use_distributed_optimizer={b}. Automatically enabling distributed optimizer for both settings."
)
MSG_AVG_COLLECTIVE = {
    "old_0.3": "average_in_collective is not supported with Megatron FSDP, setting to True",
    "old_0.4": "average_in_collective is not supported with NCCL symmetric registration, setting to False",
    "new": "average_in_collective not supported with NCCL symmetric registration. Deactivating...",
}
MSG_FSDP_VERSION = "megatron_fsdp_version must be either 1 or 2"
MSG_ASYNC_SAVE_OLD = "async_save is only supported with ckpt_format='torch_dist'"
MSG_ASYNC_SAVE_NEW = "async_save is only supported with ckpt_format='torch_dist','fsdp_dtensor'"
MSG_ASYNC_NO_SAVE = "async_save is enabled, but save is not set. Set save to a valid path."
MSG_FSDP2_PP_MLM = "--use-torch-fsdp2 is not supported with pipeline parallelism"


simple_check("fsdp_exclusive", "Megatron-Bridge training/config.py validate() ~L1480 (>=0.5); _ddp_wrap (<=0.4.x)",
             lambda ctx: ctx.megatron_fsdp and ctx.flag("dist.use_torch_fsdp2"),
             lambda ctx: MSG_BOTH_FSDP_OLD if ctx.family == "old" else MSG_BOTH_FSDP_NEW,
             ["ddp.use_megatron_fsdp", "dist.use_torch_fsdp2"],
             [[("dist.use_torch_fsdp2", False)], [("ddp.use_megatron_fsdp", False), ("dist.use_megatron_fsdp", False)]])


@check("fsdp_requires_fsdp_dtensor",
       "Megatron-Bridge training/config.py _validate_and_apply_megatron_fsdp_v1_configs ~L1099; "
       "Megatron-LM arguments.py ~L690")
def fsdp_requires_fsdp_dtensor(ctx: CheckContext) -> Iterable[Violation]:
    if not ctx.megatron_fsdp or ctx.get("checkpoint.ckpt_format") == "fsdp_dtensor":
        return
    if ctx.mlm:  # Megatron-LM asserts at argument parsing, with or without --save/--load
        new = "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format."
        msg = MSG_FSDP_CKPT_OLD if ctx.family == "old" else new
    elif ctx.saves_or_loads:
        msg = MSG_FSDP_CKPT_OLD if ctx.family == "old" else MSG_FSDP_CKPT_NEW
    else:
        return
    yield Violation(
        "fsdp_requires_fsdp_dtensor", msg, ["ddp.use_megatron_fsdp", "checkpoint.ckpt_format"],
        fixes=[[ov("checkpoint.ckpt_format", "fsdp_dtensor")]],
    )


@check("fsdp_dtensor_only_megatron_fsdp", "Megatron-Bridge training/config.py validate() ~L1526")
def fsdp_dtensor_only_megatron_fsdp(ctx: CheckContext) -> Iterable[Violation]:
    if ctx.mlm or ctx.get("checkpoint.ckpt_format") != "fsdp_dtensor" or not ctx.saves_or_loads:
        return
    if ctx.megatron_fsdp and not ctx.flag("dist.use_torch_fsdp2"):
        return
    fixes = [[ov("checkpoint.ckpt_format", "torch_dist")],
             [ov("ddp.use_megatron_fsdp", True), ov("dist.use_torch_fsdp2", False)]]
    if ctx.release == "latest" and ctx.flag("dist.use_megatron_fsdp") and not ctx.flag("dist.use_torch_fsdp2"):
        fixes.reverse()  # Megatron FSDP was asked for with the moved field: the migration, not another format
    yield Violation(
        "fsdp_dtensor_only_megatron_fsdp", MSG_DTENSOR_ONLY_MFSDP,
        ["checkpoint.ckpt_format", "ddp.use_megatron_fsdp", "dist.use_torch_fsdp2"], fixes=fixes,
    )


simple_check("fsdp_cuda_device_max_connections",
             "Megatron-Bridge training/config.py _validate_and_apply_megatron_fsdp_v1_configs (>=0.5.0, PR #3510); "
             "Megatron-LM arguments.py ~L680",
             # Bridge <= 0.4.x does not check it
             lambda ctx: ((ctx.megatron_fsdp or (ctx.mlm and ctx.flag("dist.use_torch_fsdp2")))
                          and ctx.env("CUDA_DEVICE_MAX_CONNECTIONS") == "1" and (ctx.mlm or ctx.family == "new")),
             lambda ctx: MSG_MAX_CONN_MLM_FSDP if ctx.mlm and ctx.family == "old" else MSG_MAX_CONN_BRIDGE,
             ["env.CUDA_DEVICE_MAX_CONNECTIONS", "ddp.use_megatron_fsdp"],
             [[("env.CUDA_DEVICE_MAX_CONNECTIONS", "32")]])


A2A_OVERLAP_KEYS = ("comm_overlap.overlap_moe_expert_parallel_comm", "model.overlap_moe_expert_parallel_comm")


def tp_cp_export_waiver(view: Any) -> str | None:
    """Why Megatron-LM's assert that TP or CP > 1 without FSDP runs with CUDA_DEVICE_MAX_CONNECTIONS=1 (arguments.py
    ~L1453-1479) does not apply to this config, or None: ``overlap_moe_expert_parallel_comm`` (its ``elif`` before
    the assert only warns), or the Blackwell GPU named (``launch.gpu``, the one ``check --gpu`` named: the assert runs
    only when ``get_device_arch_version() < 10``). The validator and ``check``'s note read it here."""
    if any(as_bool(view.get(key, False)) for key in A2A_OVERLAP_KEYS):
        return "overlap_moe_expert_parallel_comm"
    gpu = view.get("launch.gpu")
    return str(gpu) if gpu in BLACKWELL else None


def _tp_cp_must_export_one(ctx: CheckContext) -> bool:
    if ctx.megatron_fsdp or ctx.flag("dist.use_torch_fsdp2") or not (ctx.tp > 1 or ctx.cp > 1):
        return False
    if tp_cp_export_waiver(ctx.view) is not None:
        return False
    return ctx.view.has("env.CUDA_DEVICE_MAX_CONNECTIONS") and ctx.env("CUDA_DEVICE_MAX_CONNECTIONS") != "1"


simple_check("mlm_tp_cp_cuda_device_max_connections",
             "Megatron-LM arguments.py ~L928-953 (TP>1 or CP>1 without FSDP, before Blackwell)",
             _tp_cp_must_export_one,
             MSG_MAX_CONN_MLM_TP,
             ["env.CUDA_DEVICE_MAX_CONNECTIONS", "model.tensor_model_parallel_size", "model.context_parallel_size"],
             [[("env.CUDA_DEVICE_MAX_CONNECTIONS", "1")]], ("megatron-lm",))


simple_check("fsdp_tp_pp_dp_mapping", "Megatron-Bridge training/config.py _validate_and_apply_megatron_fsdp_v1_configs "
             "(>=0.2.0, PR #716)",
             lambda ctx: (ctx.megatron_fsdp and ctx.flag("dist.use_tp_pp_dp_mapping")
                          and not ctx.surely_before((0, 2, 0))),
             MSG_TP_PP_DP_MAPPING, ["dist.use_tp_pp_dp_mapping", "ddp.use_megatron_fsdp"],
             [[("dist.use_tp_pp_dp_mapping", False)]], ("megatron-bridge",))


@check("fsdp_manual_registration_needs_nccl_ub",
       "Megatron-Bridge training/config.py _validate_and_apply_megatron_fsdp_v1_configs (>=0.5.0); "
       "Megatron-LM arguments.py ~L695")
def fsdp_manual_registration_needs_nccl_ub(ctx: CheckContext) -> Iterable[Violation]:
    if not ctx.flag("ddp.fsdp_manual_registration"):
        return
    if ctx.mlm and not ctx.megatron_fsdp:
        yield Violation(
            "fsdp_manual_registration_needs_nccl_ub", "FSDP manual registration is only supported with Megatron FSDP",
            ["ddp.fsdp_manual_registration", "ddp.use_megatron_fsdp"],
            fixes=[[ov("ddp.fsdp_manual_registration", False)]],
        )
        return
    if ctx.flag("ddp.nccl_ub"):
        return
    if ctx.mlm:
        msg = "FSDP manual registration is only supported with nccl-ub option"
    elif ctx.megatron_fsdp and ctx.family == "new":
        msg = MSG_MANUAL_REG
    else:
        return
    yield Violation(
        "fsdp_manual_registration_needs_nccl_ub", msg, ["ddp.fsdp_manual_registration", "ddp.nccl_ub"],
        fixes=[[ov("ddp.fsdp_manual_registration", False)]],
    )


simple_check("fsdp_optim_grads_params_weight_hash",
             "Megatron-Bridge training/config.py _validate_and_apply_megatron_fsdp_v1_configs; "
             "Megatron-LM arguments.py ~L675",
             lambda ctx: (ctx.megatron_fsdp and ctx.get("ddp.data_parallel_sharding_strategy") == "optim_grads_params"
                          and ctx.get("train.check_weight_hash_across_dp_replicas_interval") is not None),
             lambda ctx: MSG_WEIGHT_HASH_MLM if ctx.mlm else MSG_WEIGHT_HASH,
             ["train.check_weight_hash_across_dp_replicas_interval", "ddp.data_parallel_sharding_strategy"],
             [[("train.check_weight_hash_across_dp_replicas_interval", None)]])


@check("nccl_ub_expandable_segments",
       "megatron-core distributed/distributed_data_parallel_config.py __post_init__ "
       "(0.16.1 L149-161; torch<2.11 in main)")
def nccl_ub_expandable_segments(ctx: CheckContext) -> Iterable[Violation]:
    if not ctx.flag("ddp.nccl_ub"):
        return
    conf = ctx.env("PYTORCH_CUDA_ALLOC_CONF") or ctx.env("PYTORCH_ALLOC_CONF") or ""
    if "expandable_segments:True" not in [part.strip() for part in conf.split(",")]:
        return
    yield Violation(
        "nccl_ub_expandable_segments", MSG_NCCL_UB_EXPANDABLE, ["ddp.nccl_ub", "env.PYTORCH_CUDA_ALLOC_CONF"],
        fixes=[[ov("ddp.nccl_ub", False), ov("ddp.fsdp_manual_registration", False)],
               [ov("env.PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")]],
    )


simple_check("fsdp2_pg_collection", "Megatron-Bridge 0.3.0-0.4.2 _ddp_wrap passes pg_collection= to "
             "TorchFullyShardedDataParallel (models/common/unimodal.py ~L233; issue #2785)",
             lambda ctx: (ctx.flag("dist.use_torch_fsdp2") and not ctx.megatron_fsdp
                          and ctx.version_between((0, 3, 0), (0, 4, 2))),
             MSG_FSDP2_PG_COLLECTION, ["dist.use_torch_fsdp2"],
             [[("dist.use_torch_fsdp2", False), ("ddp.use_megatron_fsdp", True)], [("dist.use_torch_fsdp2", False)]],
             ("megatron-bridge",))
simple_check("mlm_fsdp2_pipeline_parallel", "Megatron-LM arguments.py ~L605",
             lambda ctx: ctx.flag("dist.use_torch_fsdp2") and ctx.pp > 1, MSG_FSDP2_PP_MLM,
             ["dist.use_torch_fsdp2", "model.pipeline_model_parallel_size"],
             [[("dist.use_torch_fsdp2", False), ("ddp.use_megatron_fsdp", True)]], ("megatron-lm",))
simple_check("megatron_fsdp_version", "Megatron-Bridge config.py _validate_and_apply_megatron_fsdp_configs ~L1065; "
             "megatron-core DDP config __post_init__ (main)",
             lambda ctx: ctx.megatron_fsdp and ctx.get("ddp.megatron_fsdp_version", 1) not in (1, 2, None),
             MSG_FSDP_VERSION, ["ddp.megatron_fsdp_version"], [[("ddp.megatron_fsdp_version", 1)]])


@check("async_save_format", "Megatron-Bridge training/config.py validate() ~L1530; CheckpointConfig.finalize ~L589")
def async_save_format(ctx: CheckContext) -> Iterable[Violation]:
    if ctx.mlm or not ctx.flag("checkpoint.async_save"):
        return
    if ctx.get("checkpoint.save") in (None, ""):
        yield Violation(
            "async_save_requires_save", MSG_ASYNC_NO_SAVE, ["checkpoint.async_save", "checkpoint.save"],
            fixes=[[ov("checkpoint.async_save", False)]],
        )
        return
    fmt = ctx.get("checkpoint.ckpt_format")
    allowed = ("torch_dist",) if ctx.family == "old" else ("torch_dist", "fsdp_dtensor")
    if fmt not in allowed:
        yield Violation(
            "async_save_format", MSG_ASYNC_SAVE_OLD if ctx.family == "old" else MSG_ASYNC_SAVE_NEW,
            ["checkpoint.async_save", "checkpoint.ckpt_format"],
            fixes=[[ov("checkpoint.async_save", False)]],
        )


# ----------------------------------------------------------------------------------------------- notes


simple_check("fsdp_forces_distributed_optimizer",
             "Megatron-Bridge training/config.py _validate_and_apply_megatron_fsdp_v1_configs (auto-fix, rank-0 print)",
             lambda ctx: ctx.megatron_fsdp and not (
                 ctx.flag("ddp.use_distributed_optimizer") and ctx.flag("optimizer.use_distributed_optimizer")),
             MSG_DIST_OPT_FORCED, ["ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"],
             kind="note")


@check("distributed_optimizer_sync",
       "Megatron-Bridge training/config.py _validate_and_sync_distributed_optimizer_settings ~L2101 (warning)",
       ("megatron-bridge",))
def distributed_optimizer_sync(ctx: CheckContext) -> Iterable[Violation]:
    a, b = ctx.flag("ddp.use_distributed_optimizer"), ctx.flag("optimizer.use_distributed_optimizer")
    if a != b and not ctx.megatron_fsdp:
        yield Violation(
            "distributed_optimizer_sync", MSG_DIST_OPT_SYNC.format(a=a, b=b),
            ["ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"], kind="note",
        )


simple_check("fsdp_average_in_collective",
             "Megatron-Bridge training/config.py _validate_and_apply_megatron_fsdp_v1_configs (auto-fix; PR #729)",
             lambda ctx: (ctx.megatron_fsdp and ctx.flag("ddp.average_in_collective")
                          and not (ctx.family == "new" and ctx.flag("ddp.disable_symmetric_registration"))),
             lambda ctx: MSG_AVG_COLLECTIVE["new" if ctx.family == "new"
                                            else "old_0.3" if ctx.surely_before((0, 4, 0)) else "old_0.4"],
             ["ddp.average_in_collective"], frameworks=("megatron-bridge",), kind="note")


simple_check("fsdp_gradient_accumulation_fusion",
             "Megatron-Bridge 0.2.0-0.3.x training/config.py validate() (auto-fix, rank-0 print)",
             lambda ctx: (ctx.megatron_fsdp and ctx.flag("model.gradient_accumulation_fusion")
                          and ctx.version_between((0, 2, 0), (0, 3, 999))),
             "Gradient accumulation fusion is not supported with Megatron FSDP, setting to False",
             ["model.gradient_accumulation_fusion"], frameworks=("megatron-bridge",), kind="note")


simple_check("fsdp_reuse_grad_buf_mxfp8",
             "Megatron-Bridge training/config.py Megatron FSDP configs (auto-fix, rank-0 print; 0.4.x and >=0.5 "
             "wording)",
             lambda ctx: (ctx.megatron_fsdp and ctx.flag("ddp.reuse_grad_buf_for_mxfp8_param_ag")
                          and (ctx.family == "new" or not ctx.surely_before((0, 4, 0)))),
             lambda ctx: ("reuse_grad_buf_for_mxfp8_param_ag not implemented for Megatron FSDP. Deactivating..."
                          if ctx.family == "new" else
                          "reuse_grad_buf_for_mxfp8_param_ag is not supported with Megatron FSDP, setting to False"),
             ["ddp.reuse_grad_buf_for_mxfp8_param_ag"], frameworks=("megatron-bridge",), kind="note")


# ----------------------------------------------------------------------------------------------- moved fields

MSG_STALE_OVERRIDE = "Could not override '{key}'."
MSG_STALE_SKIPPED = "Key '{leaf}' in overrides not found in config object {owner}. Skipping."
MSG_STALE_UNKNOWN = ("{key} is not a field on {label}: move it to {moved_to} (the release is unknown; on >= 0.7 a "
                     "command-line override is refused and a YAML key is skipped, leaving Megatron FSDP off)")


@check("stale_moved_field",
       "Megatron-Bridge >= 0.7 (the Megatron FSDP skill's validated branch): DistributedInitConfig without "
       "use_megatron_fsdp; utils/omegaconf_utils.py parse_hydra_overrides (struct mode refuses the key) and "
       "_apply_overrides (a YAML key is skipped with a warning); docs/RELEASES.md", ("megatron-bridge",))
def stale_moved_field(ctx: CheckContext) -> Iterable[Violation]:
    """A field the job's release no longer has, set by the job: the migration to its new place is the fix.
    A command-line override fails at start-up; a YAML key is skipped with a warning and the job runs without
    the setting (for ``dist.use_megatron_fsdp``: without Megatron FSDP). Unknown release: a note."""
    for key, move in FIELD_MOVES.items():
        if not ctx.view.has(key):
            continue
        origin = ctx.view.origin(key) or ""
        if origin == "default":
            continue
        value = ctx.get(key)
        if origin != "override" and not ctx.flag(key):
            continue  # a skipped False changes nothing
        # an error message that refuses the field (implied:...) proves the job's release lacks it
        exists = False if origin.startswith("implied:") else field_exists(key, ctx.version_text)
        if exists is True:
            continue
        fix = [ov(move.moved_to, value), Override(key=key, value=DELETE)]
        if exists is None:
            yield Violation("stale_moved_field", MSG_STALE_UNKNOWN.format(
                key=key, label=FAMILY_LABELS["latest"], moved_to=move.moved_to), [key, move.moved_to],
                fixes=[fix], kind="note")
            continue
        if origin == "override" or origin.startswith("implied:"):  # implied: from the refusal (rule MB151)
            msg = MSG_STALE_OVERRIDE.format(key=key)
        else:
            msg = MSG_STALE_SKIPPED.format(leaf=key.rsplit(".", 1)[1], owner=move.owner)
        yield Violation("stale_moved_field", msg, [key, move.moved_to], fixes=[fix])
