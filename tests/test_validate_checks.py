"""Every validation failure the validator knows: a config that fails it, the exact message the real code prints
(per release family where it differs), then the suggested fix applied and the check passing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from diagnose.explain.config import ConfigView, apply_defaults, apply_overrides
from diagnose.explain.validate import CHECKS, run_checks, validate

OLD, NEW = "0.4.2", "0.6.2"


@dataclass
class Case:
    check: str
    settings: dict[str, Any]
    messages: dict[str, str]  # bridge version -> exact message (absent version: the check must not fire)
    framework: str = "megatron-bridge"
    extra: dict[str, Any] = field(default_factory=dict)


FSDP_SAVE = {"ddp.use_megatron_fsdp": True, "checkpoint.save": "/ckpt", "checkpoint.ckpt_format": "fsdp_dtensor"}

CASES = [
    Case("fsdp_exclusive", {"ddp.use_megatron_fsdp": True, "dist.use_torch_fsdp2": True},
         {OLD: "Using use_megatron_fsdp and use_torch_fsdp2 at the same time is not supported.",
          NEW: "use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive."}),
    Case("fsdp_requires_fsdp_dtensor", {"ddp.use_megatron_fsdp": True, "checkpoint.save": "/ckpt"},
         {OLD: "Megatron FSDP only supports fsdp_dtensor checkpoint format",
          NEW: "Megatron-FSDP requires the fsdp_dtensor checkpointing format!"}),
    Case("fsdp_requires_fsdp_dtensor", {"dist.use_megatron_fsdp": True, "checkpoint.load": "/ckpt"},
         {OLD: "Megatron FSDP only supports fsdp_dtensor checkpoint format",
          NEW: "Megatron-FSDP requires the fsdp_dtensor checkpointing format!"}),
    Case("fsdp_dtensor_only_megatron_fsdp", {"checkpoint.save": "/ckpt", "checkpoint.ckpt_format": "fsdp_dtensor"},
         {OLD: "fsdp_dtensor checkpoint format only supports Megatron FSDP",
          NEW: "fsdp_dtensor checkpoint format only supports Megatron FSDP"}),
    Case("fsdp_cuda_device_max_connections", {**FSDP_SAVE, "env.CUDA_DEVICE_MAX_CONNECTIONS": "1"},
         {NEW: "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."}),
    Case("fsdp_tp_pp_dp_mapping", {"ddp.use_megatron_fsdp": True, "dist.use_tp_pp_dp_mapping": True},
         {OLD: "use_tp_pp_dp_mapping is not supported with Megatron FSDP",
          NEW: "use_tp_pp_dp_mapping is not supported with Megatron FSDP"}),
    Case("fsdp_manual_registration_needs_nccl_ub", {"ddp.use_megatron_fsdp": True, "ddp.fsdp_manual_registration": True},
         {NEW: "DDP.fsdp_manual_registration requires DDP.nccl_ub!"}),
    Case("fsdp_optim_grads_params_weight_hash",
         {"ddp.use_megatron_fsdp": True, "ddp.data_parallel_sharding_strategy": "optim_grads_params",
          "train.check_weight_hash_across_dp_replicas_interval": 100},
         {m: "TrainingConfig.check_weight_hash_across_dp_replicas_interval is not supported with the Megatron-FSDP "
             "optim_grads_params sharding strategy" for m in (OLD, NEW)}),
    Case("nccl_ub_expandable_segments", {"ddp.nccl_ub": True, "env.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
         {m: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is currently not supported with nccl_ub due to "
             "compatibility issue with torch.cuda.MemPool API." for m in (OLD, NEW)}),
    Case("fsdp2_pg_collection", {"dist.use_torch_fsdp2": True},
         {OLD: "TorchFullyShardedDataParallel.__init__() got an unexpected keyword argument 'pg_collection'"}),
    Case("megatron_fsdp_version", {"ddp.use_megatron_fsdp": True, "ddp.megatron_fsdp_version": 3},
         {m: "megatron_fsdp_version must be either 1 or 2" for m in (OLD, NEW)}),
    Case("async_save_format", {"checkpoint.save": "/ckpt", "checkpoint.async_save": True,
                               "checkpoint.ckpt_format": "torch_dcp"},
         {OLD: "async_save is only supported with ckpt_format='torch_dist'",
          NEW: "async_save is only supported with ckpt_format='torch_dist','fsdp_dtensor'"}),
    Case("async_save_format", {**FSDP_SAVE, "checkpoint.async_save": True},
         {OLD: "async_save is only supported with ckpt_format='torch_dist'"}),
    Case("async_save_requires_save", {"checkpoint.async_save": True},
         {m: "async_save is enabled, but save is not set. Set save to a valid path." for m in (OLD, NEW)}),
    # qa-report-4 L2: upstream divides by these sizes (ZeroDivisionError for 0); no upstream message of its own
    Case("sizes_positive", {"launch.world_size": 8, "train.micro_batch_size": 0},
         dict.fromkeys((OLD, NEW), "train.micro_batch_size is 0: it must be 1 or more (megatron-core "
                       "num_microbatches_calculator.py divides the global batch size by micro_batch_size * "
                       "data_parallel_size)")),
    Case("sizes_positive", {"launch.world_size": 8, "model.pipeline_model_parallel_size": -1},
         dict.fromkeys((OLD, NEW), "model.pipeline_model_parallel_size is -1: it must be 1 or more "
                       "(get_data_parallel_size divides the world size by TP * PP * CP)")),
    Case("world_size_divisible", {"launch.world_size": 12, "model.tensor_model_parallel_size": 8},
         {m: "world size (12) is not divisible by total_model_size (model_cfg.tensor_model_parallel_size=8 * "
             "model_cfg.pipeline_model_parallel_size=1 * model_cfg.context_parallel_size=1)" for m in (OLD, NEW)}),
    Case("global_batch_divisible", {"launch.world_size": 8, "model.tensor_model_parallel_size": 2,
                                    "train.global_batch_size": 10, "train.micro_batch_size": 2},
         {m: "global batch size (10) is not divisible by micro batch size (2) times data parallel size (4)"
          for m in (OLD, NEW)}),
    Case("heads_divisible_by_tp", {"model.num_attention_heads": 7, "model.tensor_model_parallel_size": 2},
         {m: "num_attention_heads (7) must be a multiple of tensor_model_parallel_size (2)." for m in (OLD, NEW)}),
    Case("query_groups_vs_tp", {"model.num_attention_heads": 24, "model.num_query_groups": 3,
                                "model.tensor_model_parallel_size": 2},
         {m: "num_query_groups (3) must be a multiple or divisor of tensor_model_parallel_size (2)."
          for m in (OLD, NEW)}),
    Case("layers_divisible_by_pp", {"model.num_layers": 10, "model.pipeline_model_parallel_size": 4},
         {m: "num_layers should be divisible by pipeline_model_parallel_size" for m in (OLD, NEW)}),
    Case("sequence_parallel_needs_tp", {"model.sequence_parallel": True},
         {m: "Cannot use sequence parallelism without tensor parallelism" for m in (OLD, NEW)}),
    Case("seq_length_context_parallel", {"model.seq_length": 4100, "model.context_parallel_size": 4},
         {m: "Sequence length must be divisible by 2 * context parallel size if context parallel is used."
          for m in (OLD, NEW)}),
    Case("cpu_offloading_layers", {"model.num_layers": 4, "model.cpu_offloading": True,
                                   "model.cpu_offloading_num_layers": 4},
         {m: "CPU offloading can be done only for layers less than 4" for m in (OLD, NEW)}),
    Case("cpu_offloading_pipeline", {"model.cpu_offloading": True, "model.cpu_offloading_num_layers": 1,
                                     "model.pipeline_model_parallel_size": 2},
         {m: "Currently there is no support for Pipeline parallelism with CPU offloading" for m in (OLD, NEW)}),
    Case("cpu_offloading_recompute", {"model.cpu_offloading": True, "model.recompute_granularity": "full",
                                      "model.recompute_method": "uniform", "model.recompute_num_layers": 1},
         {m: "CPU offloading does not work when activation recomputation is enabled" for m in (OLD, NEW)}),
    Case("cpu_offloading_cuda_graphs", {"model.cpu_offloading": True, "model.cuda_graph_impl": "local"},
         {m: "CUDA graphs not supported with CPU offloading." for m in (OLD, NEW)}),
    Case("cpu_offloading_fine_grained", {"model.cpu_offloading": True, "model.fine_grained_activation_offloading": True},
         {m: "fine_grained_activation_offloading cannot be enabled with cpu_offloading." for m in (OLD, NEW)}),
    Case("bf16_and_fp16", {"model.bf16": True, "model.fp16": True},
         {m: "Model config cannot have both bf16=True and fp16=True. Please set only one precision mode."
          for m in (OLD, NEW)}),
    Case("megatron_fsdp_v2_bf16", {"ddp.use_megatron_fsdp": True, "ddp.megatron_fsdp_version": 2},
         {NEW: "MFSDP V2 requires BF16 training (model.bf16=True and optimizer.bf16=True)."}),
    Case("megatron_fsdp_v2_dp_only", {"ddp.use_megatron_fsdp": True, "ddp.megatron_fsdp_version": 2,
                                      "model.bf16": True, "optimizer.bf16": True,
                                      "model.tensor_model_parallel_size": 2},
         {NEW: "MFSDP V2 currently supports DP-only training; unsupported settings: tensor_model_parallel_size=2"}),
    Case("megatron_fsdp_v2_checkpoint", {"ddp.use_megatron_fsdp": True, "ddp.megatron_fsdp_version": 2,
                                         "model.bf16": True, "optimizer.bf16": True, "checkpoint.save": "/c"},
         {NEW: "MFSDP V2 checkpoint save and load are not yet supported."}),
    Case("megatron_fsdp_v2_cpu_offload", {"ddp.use_megatron_fsdp": True, "ddp.megatron_fsdp_version": 2,
                                          "model.bf16": True, "optimizer.bf16": True,
                                          "optimizer.optimizer_cpu_offload": True},
         {NEW: "MFSDP V2 does not support optimizer CPU offload."}),
    Case("precision_aware_optimizer_needs_distributed_optimizer",
         {"optimizer.use_precision_aware_optimizer": True, "ddp.use_distributed_optimizer": True},
         {m: "--use-precision-aware-optimizer only supported with distributed optimizer" for m in (OLD, NEW)}),
    Case("precision_aware_optimizer_adam_only",
         {"optimizer.use_precision_aware_optimizer": True, "optimizer.optimizer": "sgd"},
         {m: "--use-precision-aware-optimizer only supported with adam" for m in (OLD, NEW)}),
    Case("reuse_grad_buf_needs_fp8_param_gather", {"ddp.reuse_grad_buf_for_mxfp8_param_ag": True},
         {m: "Reuse grad buffer only when keeping params in MXFP8." for m in (OLD, NEW)}),
    # Megatron-LM argument checks
    Case("fsdp_requires_fsdp_dtensor", {"ddp.use_megatron_fsdp": True}, framework="megatron-lm",
         messages={OLD: "Megatron FSDP only supports fsdp_dtensor checkpoint format",
                   NEW: "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format."}),
    Case("fsdp_cuda_device_max_connections",
         {"ddp.use_megatron_fsdp": True, "checkpoint.ckpt_format": "fsdp_dtensor", "env.CUDA_DEVICE_MAX_CONNECTIONS": "1"},
         framework="megatron-lm",
         messages={OLD: "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one",
                   NEW: "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."}),
    Case("mlm_tp_cp_cuda_device_max_connections",
         {"model.tensor_model_parallel_size": 2, "env.CUDA_DEVICE_MAX_CONNECTIONS": "8"}, framework="megatron-lm",
         messages={m: "Using tensor model parallelism or context parallelism require setting the environment "
                      "variable CUDA_DEVICE_MAX_CONNECTIONS to 1" for m in (OLD, NEW)}),
    Case("fsdp_manual_registration_needs_nccl_ub", {"ddp.fsdp_manual_registration": True}, framework="megatron-lm",
         messages={m: "FSDP manual registration is only supported with Megatron FSDP" for m in (OLD, NEW)}),
    Case("fsdp_manual_registration_needs_nccl_ub", {"ddp.use_megatron_fsdp": True, "ddp.fsdp_manual_registration": True,
                                                    "checkpoint.ckpt_format": "fsdp_dtensor"}, framework="megatron-lm",
         messages={m: "FSDP manual registration is only supported with nccl-ub option" for m in (OLD, NEW)}),
    Case("hybrid_pattern_length", {"model.num_layers": 6, "model.hybrid_override_pattern": "M*M*"},
         {m: "The hybrid override pattern is the wrong length: got 4, expected 6" for m in (OLD, NEW)}),
    Case("hybrid_pattern_length", {"model.num_layers": 6, "model.hybrid_layer_pattern": "M*M*/MM"},
         {m: "num_layers (6) does not match the number of layers derived from hybrid_layer_pattern (4). Please "
             "correct num_layers or the pattern." for m in (OLD, NEW)}),
    Case("hybrid_pattern_length", {"model.num_layers": 4, "model.hybrid_override_pattern": "M*M*"}, {}),
    Case("hybrid_pattern_length", {"model.num_layers": 6, "mlm.hybrid_override_pattern": "M*M-E*"}, {},
         framework="megatron-lm"),
    Case("hybrid_pattern_length", {"model.num_layers": 8, "mlm.hybrid_override_pattern": "M*M-E*"},
         framework="megatron-lm",
         messages={m: "The hybrid override pattern is the wrong length: got 6, expected 8" for m in (OLD, NEW)}),
    Case("mlm_fsdp2_pipeline_parallel", {"dist.use_torch_fsdp2": True, "model.pipeline_model_parallel_size": 2,
                                         "model.num_layers": 4}, framework="megatron-lm",
         messages={m: "--use-torch-fsdp2 is not supported with pipeline parallelism" for m in (OLD, NEW)}),
]


MLM_CORE = {OLD: "0.16.1", NEW: "0.19.2"}  # Megatron-LM jobs: the family follows megatron-core


def _view(case: Case, version: str) -> ConfigView:
    if case.framework == "megatron-lm":
        view = ConfigView(framework=case.framework, mcore_version=MLM_CORE[version])
    else:
        view = ConfigView(framework=case.framework, version=version)
    for key, value in case.settings.items():
        view.set(key, value, "log:1")
    return apply_defaults(view)


def _ids(case: Case) -> str:
    return f"{case.check}[{case.framework}:{'+'.join(sorted(case.settings))[:40]}]"


@pytest.mark.parametrize("version", [OLD, NEW])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_check_fails_with_the_real_message_and_its_fix_passes(case: Case, version: str):
    view = _view(case, version)
    found = [v for v in validate(view, real_mcore=False) if v.check == case.check]
    expected = case.messages.get(version)
    if expected is None:
        assert found == [], f"{case.check} must not fire on {version}"
        return
    assert [v.message for v in found] == [expected]
    violation = found[0]
    assert violation.keys and violation.source
    assert violation.fixes, "every violation suggests a fix"
    fixed = apply_overrides(view, violation.fixes[0])
    assert case.check not in {v.check for v in validate(fixed, real_mcore=False)}


def test_every_registered_hard_check_has_a_case():
    from tests.test_validate_new_checks import NEW_CHECKS  # the CV050-CV098 checks have their cases there

    covered = {c.check for c in CASES} | NEW_CHECKS | {"pipeline_layout_invalid"}  # tests/test_validate_layout.py
    note_checks = {"fsdp_forces_distributed_optimizer", "distributed_optimizer_sync", "fsdp_average_in_collective",
                   "fsdp_gradient_accumulation_fusion", "fsdp_reuse_grad_buf_mxfp8",
                   "sequence_parallel_off_without_tp"}  # Megatron-LM's auto-fix: tests/test_qa12.py
    override_checks = {"override_unknown_key", "invalid_choice"}  # checks on what a fix writes: test_validate_keys.py
    release_checks = {"stale_moved_field"}  # fields moved between releases: tests/test_releases.py
    registered = {spec.name for spec in CHECKS} - note_checks - override_checks - release_checks
    # some registered functions emit under several names (async_save_*, megatron_fsdp_v2_*)
    aliases = {"async_save_format": {"async_save_format", "async_save_requires_save"},
               "megatron_fsdp_v2_guards": {n for n in covered if n.startswith("megatron_fsdp_v2_")},
               "precision_aware_optimizer": {n for n in covered if n.startswith("precision_aware_optimizer_")},
               "pipeline_split_settings": {n for n in covered
                                           if n.startswith(("uneven_pipeline_", "pipeline_", "account_for_"))},
               "low_precision_param_needs_mode": {"fp8_param_needs_fp8", "fp4_param_needs_fp4"} & covered,
               "fp8_delayed_scaling_limits": {n for n in covered if n.startswith(("fp8_delayed_", "fp8_bf16_"))},
               "moe_flex_dispatcher": {"moe_deepep_needs_flex", "moe_one_flex_backend", "moe_deepep_pad"} & covered,
               "moe_capacity_factor": {"moe_capacity_load_balancing", "moe_pad_needs_capacity"} & covered}
    for name in registered:
        assert aliases.get(name, {name}) & covered, f"no test case for check {name}"


def test_defaults_pass():
    view = apply_defaults(ConfigView(framework="megatron-bridge"))
    view.set("launch.world_size", 8, "log:1")
    assert validate(view, real_mcore=False) == []


@pytest.mark.parametrize(
    "version, message",
    [
        ("0.3.1", "average_in_collective is not supported with Megatron FSDP, setting to True"),
        ("0.4.2", "average_in_collective is not supported with NCCL symmetric registration, setting to False"),
        ("0.6.2", "average_in_collective not supported with NCCL symmetric registration. Deactivating..."),
    ],
)
def test_auto_fixes_are_notes_not_violations(version, message):
    view = _view(Case("", {"ddp.use_megatron_fsdp": True, "ddp.average_in_collective": True}, {}), version)
    result = run_checks(view, real_mcore=False)
    assert result.passes
    notes = {n.message for n in result.notes}
    assert message in notes
    assert "use_distributed_optimizer=True is required for Megatron-FSDP. Activating..." in notes


def test_distributed_optimizer_out_of_sync_is_a_note():
    view = _view(Case("", {"optimizer.use_distributed_optimizer": True}, {}), NEW)
    result = run_checks(view, real_mcore=False)
    assert result.passes
    assert [n.message for n in result.notes] == [
        "Distributed optimizer settings were not in sync: ddp.use_distributed_optimizer=False, "
        "optimizer.use_distributed_optimizer=True. Automatically enabling distributed optimizer for both settings."
    ]


def test_version_specific_check_does_not_fire_when_release_unknown():
    view = _view(Case("", {"dist.use_torch_fsdp2": True}, {}), None)
    assert "fsdp2_pg_collection" not in {v.check for v in validate(view, real_mcore=False)}
    assert "fsdp2_pg_collection" in {v.check for v in validate(view, bridge_version="0.3.1", real_mcore=False)}


@pytest.mark.parametrize(
    "version, settings, message",
    [
        ("0.3.0", {"model.gradient_accumulation_fusion": True},
         "Gradient accumulation fusion is not supported with Megatron FSDP, setting to False"),
        ("0.4.1", {"ddp.reuse_grad_buf_for_mxfp8_param_ag": True},
         "reuse_grad_buf_for_mxfp8_param_ag is not supported with Megatron FSDP, setting to False"),
        ("0.5.0", {"ddp.reuse_grad_buf_for_mxfp8_param_ag": True},
         "reuse_grad_buf_for_mxfp8_param_ag not implemented for Megatron FSDP. Deactivating..."),
    ],
)
def test_release_specific_fsdp_auto_fix_notes(version, settings, message):
    view = _view(Case("", {"ddp.use_megatron_fsdp": True, **settings}, {}), version)
    result = run_checks(view, real_mcore=False)
    assert message in {n.message for n in result.notes}
    assert "fsdp_gradient_accumulation_fusion" not in {
        n.check for n in run_checks(_view(Case("", {"ddp.use_megatron_fsdp": True,
                                                    "model.gradient_accumulation_fusion": True}, {}), "0.4.2"),
                                    real_mcore=False).notes}
