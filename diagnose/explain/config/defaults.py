"""Megatron-Bridge defaults per release family, for the keys the validator and the memory model read.

Source: Megatron-Bridge ``src/megatron/bridge/training/config.py`` dataclasses and their megatron-core bases
(../shared/knowledge/megatron-bridge.md §1.5, megatron-core.md §1). Release families: "old" = up to 0.4.x,
"new" = 0.5.0 and later. The defaults that decide the checks did not change between families (Bridge <= 0.3.x
restricted ckpt_format to torch_dist|zarr|fsdp_dtensor; the default is the same), so one table serves both.
"""

from __future__ import annotations

from typing import Any

from diagnose.configview import ConfigView

COMMON_DEFAULTS: dict[str, Any] = {
    # cfg.dist (DistributedInitConfig)
    "dist.distributed_backend": "nccl",
    "dist.use_megatron_fsdp": False,
    "dist.use_torch_fsdp2": False,
    "dist.use_tp_pp_dp_mapping": False,
    "dist.use_gloo_process_groups": True,
    "dist.lazy_mpu_init": False,
    # cfg.ddp (DistributedDataParallelConfig)
    "ddp.grad_reduce_in_fp32": False,
    "ddp.overlap_grad_reduce": False,
    "ddp.overlap_param_gather": False,
    "ddp.use_distributed_optimizer": False,
    "ddp.num_distributed_optimizer_instances": 1,
    "ddp.bucket_size": None,
    "ddp.average_in_collective": False,
    "ddp.use_megatron_fsdp": False,
    "ddp.megatron_fsdp_version": 1,
    "ddp.data_parallel_sharding_strategy": "no_shard",
    "ddp.nccl_ub": False,
    "ddp.fsdp_double_buffer": False,
    "ddp.disable_symmetric_registration": False,
    "ddp.fsdp_manual_registration": False,
    "ddp.fp8_param_gather": False,
    "ddp.reuse_grad_buf_for_mxfp8_param_ag": False,
    # cfg.optimizer (OptimizerConfig)
    "optimizer.optimizer": "adam",
    "optimizer.bf16": False,
    "optimizer.fp16": False,
    "optimizer.use_precision_aware_optimizer": False,
    "optimizer.use_distributed_optimizer": False,
    "optimizer.overlap_param_gather": False,
    "optimizer.optimizer_cpu_offload": False,
    "optimizer.optimizer_offload_fraction": 0.0,
    # cfg.checkpoint (CheckpointConfig)
    "checkpoint.save": None,
    "checkpoint.load": None,
    "checkpoint.ckpt_format": "torch_dist",
    "checkpoint.async_save": False,
    "checkpoint.finetune": False,
    "checkpoint.pretrained_checkpoint": None,
    # cfg.train (TrainingConfig)
    "train.micro_batch_size": None,
    "train.global_batch_size": None,
    "train.check_weight_hash_across_dp_replicas_interval": None,
    # cfg.model (GPTModelProvider: TransformerConfig / ModelParallelConfig)
    "model.tensor_model_parallel_size": 1,
    "model.pipeline_model_parallel_size": 1,
    "model.virtual_pipeline_model_parallel_size": None,
    "model.context_parallel_size": 1,
    "model.expert_model_parallel_size": 1,
    "model.expert_tensor_parallel_size": None,
    "model.sequence_parallel": False,
    "model.recompute_granularity": None,
    "model.recompute_method": None,
    "model.recompute_num_layers": None,
    "model.cpu_offloading": False,
    "model.cpu_offloading_num_layers": 0,
    "model.fine_grained_activation_offloading": False,
    "model.init_model_with_meta_device": False,
    "model.bf16": False,
    "model.fp16": False,
    "model.calculate_per_token_loss": False,
    "model.cuda_graph_impl": "none",
    "model.seq_length": 1024,
}

Version = tuple[int, int, int]
VersionRange = tuple[Version, Version]
_LOWEST: Version = (0, 0, 0)
_HIGHEST: Version = (999, 0, 0)


def version_tuple(version: str | None) -> Version | None:
    """``"0.4.2"`` -> (0, 4, 2); ``"0.5"`` -> (0, 5, 0); ``"0.3.0rc1"`` -> (0, 3, 0); ``"0.4.x"`` -> (0, 4, 999)."""
    if not version:
        return None
    parts: list[int] = []
    for piece in str(version).strip().lstrip("vV").split(".")[:3]:
        if piece.lower() == "x" and parts:
            parts.append(999)
            break
        digits = ""
        for ch in piece:
            if ch.isdigit():
                digits += ch
            else:
                break
        if not digits:
            break
        parts.append(int(digits))
    if not parts:
        return None
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


def version_range(version: str | None) -> VersionRange | None:
    """The releases a version string allows: ``"0.4.2"``, ``">=0.5.0"``, ``"<=0.4.x"``, ``"0.3.0-0.4.2"``,
    or several joined by "," (intersection). None when nothing is known."""
    if not version:
        return None
    lo, hi = _LOWEST, _HIGHEST
    seen = False
    for part in str(version).replace(" ", "").split(","):
        if not part:
            continue
        if part.startswith(">="):
            v = version_tuple(part[2:])
            if v:
                lo, seen = max(lo, v), True
        elif part.startswith("<="):
            v = version_tuple(part[2:])
            if v:
                hi, seen = min(hi, v), True
        elif "-" in part.lstrip("v"):
            a, b = part.split("-", 1)
            va, vb = version_tuple(a), version_tuple(b)
            if va and vb:
                lo, hi, seen = max(lo, va), min(hi, vb), True
        else:
            v = version_tuple(part)
            if v:
                lo, hi, seen = max(lo, v), min(hi, v), True
    return (lo, hi) if seen else None


def family_of(version: str | None) -> str:
    """"old" for Megatron-Bridge <= 0.4.x, "new" for >= 0.5.0 or unknown (validate as the latest release)."""
    r = version_range(version)
    if r is None:
        return "new"
    return "old" if r[1] < (0, 5, 0) else "new"


def apply_defaults(view: ConfigView, version: str | None = None) -> ConfigView:
    """Fill every key the job did not show with the release default (origin "default"). Returns ``view``.
    ``version``: the release to take the defaults of (one table today: see the module docstring)."""
    for key, value in COMMON_DEFAULTS.items():
        view.set_default(key, value)
    return view
