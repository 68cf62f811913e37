"""The validator checks behind rules CV050-CV098: for each, a config that fails it (the exact upstream message),
the check's own fix making the whole validator pass, and a near miss that must not fire. Then megatron-core's real
TransformerConfig (where installed) raising the same message, and three logs end to end through ``analyze``."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from diagnose.explain.config import ConfigView, apply_defaults, apply_overrides
from diagnose.explain.validate import validate

ROOT = Path(__file__).resolve().parent.parent
SHAPE = {"model.num_layers": 32, "model.hidden_size": 1024, "model.num_attention_heads": 16,
         "launch.world_size": 64}
MOE = {"model.num_moe_experts": 64}
A2A = {**MOE, "comm_overlap.overlap_moe_expert_parallel_comm": True, "model.overlap_moe_expert_parallel_comm": True,
       "model.expert_model_parallel_size": 8, "model.moe_token_dispatcher_type": "alltoall", "model.bf16": True}
OPGWOS = {"mlm.overlap_param_gather_with_optimizer_step": True, "ddp.use_distributed_optimizer": True,
          "optimizer.use_distributed_optimizer": True}


@dataclass
class Case:
    check: str
    settings: dict[str, Any]
    message: str
    near_miss: dict[str, Any]  # changes to ``settings`` that must make the check silent
    framework: str = "megatron-bridge"
    version: str | None = "0.6.2"
    mcore: str | None = None  # the job's megatron-core release when the log shows it
    rule: str = ""


CASES = [
    Case("vpp_model_chunks", {"model.pipeline_model_parallel_size": 4, "model.virtual_pipeline_model_parallel_size": 3},
         "Make sure the number of model chunks is the same across all pipeline stages.",
         {"model.virtual_pipeline_model_parallel_size": 4}, rule="CV050"),
    Case("account_for_pipeline_split_vpp",
         {"model.num_layers": 30, "model.account_for_embedding_in_pipeline_split": True,
          "model.account_for_loss_in_pipeline_split": True, "model.pipeline_model_parallel_size": 4,
          "model.virtual_pipeline_model_parallel_size": 3},
         "number of layers on each pipeline rank: 8(after enable account_for_embedding_in_pipeline_split or "
         "account_for_loss_in_pipeline_split) must be divisible byvirtual_pipeline_model_parallel_size3",
         {"model.virtual_pipeline_model_parallel_size": 2}, rule="CV050"),
    Case("account_for_pipeline_split", {"model.num_layers": 31, "model.account_for_embedding_in_pipeline_split": True,
                                        "model.account_for_loss_in_pipeline_split": True,
                                        "model.pipeline_model_parallel_size": 4},
         "number of middle layers: 33 must be divisible by middle pipeline_model_parallel_size 4",
         {"model.account_for_loss_in_pipeline_split": False}, rule="CV012"),
    Case("account_for_pipeline_split", {"model.num_layers": 31, "model.account_for_embedding_in_pipeline_split": True,
                                        "model.account_for_loss_in_pipeline_split": True,
                                        "model.pipeline_model_parallel_size": 4},
         "Number of layers should be divisible by the pipeline-model-parallel size",
         {"model.num_layers": 30}, framework="megatron-lm", version=None, rule="CV012"),
    Case("vpp_needs_pipeline", {"model.virtual_pipeline_model_parallel_size": 2},
         "pipeline-model-parallel size should be greater than 1 with interleaved schedule",
         {"model.pipeline_model_parallel_size": 2}, rule="CV051"),
    Case("vpp_needs_pipeline", {"model.virtual_pipeline_model_parallel_size": 2,
                                "model.pipeline_model_parallel_size": 2},
         "When interleaved schedule is used and p2p communication overlap is disabled, pipeline-model-parallel size "
         "should be greater than 2 to avoid having multiple p2p sends and recvs between same 2 ranks per "
         "communication batch",
         {"mlm.overlap_p2p_comm": True}, framework="megatron-lm", version=None, rule="CV051"),
    Case("uneven_pipeline_stages", {"model.pipeline_model_parallel_size": 2,
                                    "model.num_layers_in_first_pipeline_stage": 2,
                                    "model.num_layers_in_last_pipeline_stage": 2},
         "Mismatch: 28 middle layers remaining but 0 middle PP stages available.",
         {"model.num_layers_in_first_pipeline_stage": 16, "model.num_layers_in_last_pipeline_stage": 16},
         rule="CV052"),
    Case("uneven_pipeline_stages", {"model.pipeline_model_parallel_size": 4,
                                    "model.num_layers_in_first_pipeline_stage": 0},
         "num_layers_in_first_pipeline_stage must be larger than 0",
         {"model.num_layers_in_first_pipeline_stage": 2}, rule="CV052"),
    Case("pipeline_split_settings", {"model.pipeline_model_parallel_size": 4,
                                     "model.num_layers_in_first_pipeline_stage": 2,
                                     "model.account_for_embedding_in_pipeline_split": True},
         "num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot beset at the same time "
         "with account_for_embedding_in_pipeline_splitand account_for_loss_in_pipeline_split",
         {"model.account_for_embedding_in_pipeline_split": False}, rule="CV052"),
    Case("uneven_pipeline_vpp", {"model.pipeline_model_parallel_size": 4, "model.num_layers_in_first_pipeline_stage": 3,
                                 "model.num_layers_in_last_pipeline_stage": 5,
                                 "model.virtual_pipeline_model_parallel_size": 2},
         "number of layers at first stage: 3must be divisible by virtual pipelineparallel degree 2",
         {"model.num_layers_in_first_pipeline_stage": 4, "model.num_layers_in_last_pipeline_stage": 4},
         rule="CV050"),
    Case("pipeline_layout_conflict", {"model.pipeline_model_parallel_size": 4,
                                      "model.pipeline_model_parallel_layout": "Et*8|t*8|t*8|t*8L",
                                      "model.num_layers_in_first_pipeline_stage": 8},
         "pipeline_model_parallel_layout cannot be set with other pipeline layout arguments. "
         "self.num_layers_in_first_pipeline_stage=8, self.num_layers_in_last_pipeline_stage=None, "
         "self.account_for_embedding_in_pipeline_split=False, self.account_for_loss_in_pipeline_split=False.",
         {"model.num_layers_in_first_pipeline_stage": None}, rule="CV053"),
    Case("experts_divisible_by_ep", {**MOE, "model.num_moe_experts": 60, "model.expert_model_parallel_size": 8},
         "assert self.config.num_moe_experts % ep_size == 0", {"model.num_moe_experts": 64}, rule="CV060"),
    Case("experts_divisible_by_ep", {**MOE, "model.num_moe_experts": 60, "model.expert_model_parallel_size": 8},
         "Number of experts should be a multiple of expert model parallel_size.",
         {"model.expert_model_parallel_size": 4}, framework="megatron-lm", version=None, rule="CV060"),
    Case("moe_tp_needs_sequence_parallel", {**MOE, "model.tensor_model_parallel_size": 2,
                                            "model.sequence_parallel": False},
         "During training, performance may degrade if MoE and tensor parallelismare enabled without also enabling "
         "sequence parallelism.", {"model.tensor_model_parallel_size": 1}, rule="CV061"),
    Case("moe_tp_needs_sequence_parallel", {**MOE, "model.tensor_model_parallel_size": 2,
                                            "model.expert_model_parallel_size": 2, "model.sequence_parallel": False},
         "When using expert parallelism and tensor parallelism, sequence parallelism must be used",
         {"model.sequence_parallel": True}, mcore="0.14.0", rule="CV061"),
    Case("expert_world_size_divisible", {**MOE, "launch.world_size": 8, "model.expert_model_parallel_size": 16},
         "world_size (8) is not divisible by expert_tensor_model_pipeline_parallel size (16)",
         {"model.expert_model_parallel_size": 8}, rule="CV062"),
    Case("expert_world_size_divisible", {**MOE, "launch.world_size": 16, "model.tensor_model_parallel_size": 2,
                                         "model.sequence_parallel": True,
                                         "model.expert_model_parallel_size": 8, "model.expert_tensor_parallel_size": 4},
         "world_size (16) is not divisible by expert_tensor_model_pipeline_parallel size (32)",
         {"model.expert_tensor_parallel_size": 1}, rule="CV062"),
    Case("moe_deepep_needs_flex", {**MOE, "model.moe_enable_deepep": True,
                                   "model.moe_token_dispatcher_type": "alltoall"},
         "DeepEP backend is only supported with flex token dispatcher.",
         {"model.moe_token_dispatcher_type": "flex"}, rule="CV063"),
    Case("moe_one_flex_backend", {**MOE, "model.moe_enable_deepep": True, "model.moe_token_dispatcher_type": "flex",
                                  "model.moe_flex_dispatcher_backend": "hybridep"},
         "Only one backend is supported for flex token dispatcher.",
         {"model.moe_flex_dispatcher_backend": "deepep"}, rule="CV063"),
    Case("moe_shared_expert_overlap", {**MOE, "model.moe_shared_expert_intermediate_size": 2048,
                                       "model.moe_shared_expert_overlap": True,
                                       "model.moe_token_dispatcher_type": "allgather"},
         "moe_shared_expert_overlap only works with alltoall token dispatcher.",
         {"model.moe_token_dispatcher_type": "alltoall"}, rule="CV064"),
    Case("moe_shared_expert_overlap", {**MOE, "model.moe_shared_expert_intermediate_size": 2048,
                                       "model.moe_shared_expert_overlap": True,
                                       "model.moe_token_dispatcher_type": "allgather"},
         "moe_shared_expert_overlap only works with alltoall or flex token dispatcher.",
         {"model.moe_token_dispatcher_type": "flex"}, mcore="0.18.0", rule="CV064"),
    Case("moe_deepep_pad", {**MOE, "model.moe_token_dispatcher_type": "flex",
                            "model.moe_flex_dispatcher_backend": "deepep", "model.moe_expert_capacity_factor": 1.0,
                            "model.moe_pad_expert_input_to_capacity": True},
         "Flex token dispatcher with deepep backend does not support moe_pad_expert_input_to_capacity",
         {"model.moe_flex_dispatcher_backend": "hybridep"}, rule="CV065"),
    Case("moe_capacity_load_balancing", {**MOE, "model.moe_expert_capacity_factor": 1.25,
                                         "model.moe_router_load_balancing_type": "sinkhorn"},
         "moe_expert_capacity_factor only works with aux_loss, seq_aux_loss, global_aux_loss or none load balancing",
         {"model.moe_expert_capacity_factor": -1}, rule="CV065"),
    Case("moe_capacity_load_balancing", {**MOE, "model.moe_expert_capacity_factor": 1.25,
                                         "model.moe_router_load_balancing_type": "seq_aux_loss"},
         "moe_expert_capacity_factor only works with aux_loss or none load balancing",
         {"model.moe_router_load_balancing_type": "aux_loss"}, mcore="0.13.0", rule="CV065"),
    Case("moe_pad_needs_capacity", {**MOE, "model.moe_pad_expert_input_to_capacity": True},
         "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity",
         {"model.moe_expert_capacity_factor": 1.0}, rule="CV065"),
    Case("ep_a2a_overlap_requirements", {**A2A, "model.expert_model_parallel_size": 1},
         "overlap_moe_expert_parallel_comm is only supported when expert_model_parallel_size > 1",
         {"comm_overlap.overlap_moe_expert_parallel_comm": False}, rule="CV067"),
    Case("ep_a2a_overlap_requirements", {**A2A, "model.moe_token_dispatcher_type": "allgather"},
         "overlap_moe_expert_parallel_comm is only supported when moe_token_dispatcher_type == 'alltoall' or 'flex',"
         + " " * 22 + "but got allgather", {"model.moe_token_dispatcher_type": "flex"}, rule="CV067"),
    Case("ep_a2a_overlap_requirements", {**A2A, "model.recompute_granularity": "full",
                                         "model.recompute_method": "uniform", "model.recompute_num_layers": 1},
         "disable full recomputation when enabling overlap_moe_expert_parallel_comm",
         {"model.recompute_granularity": "selective", "model.recompute_method": None,
          "model.recompute_num_layers": None}, rule="CV067"),
    Case("ep_a2a_overlap_requirements", {**A2A, "model.pipeline_model_parallel_size": 4},
         "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified when "
         "pipeline_model_parallel_size > 1", {"model.virtual_pipeline_model_parallel_size": 2}, rule="CV067"),
    Case("overlap_param_gather_with_optimizer_step", {**OPGWOS},
         "Must use --overlap-param-gather-with-optimizer-step with --overlap-param-gather",
         {"ddp.overlap_param_gather": True, "optimizer.overlap_param_gather": True,
          "model.pipeline_model_parallel_size": 4, "model.virtual_pipeline_model_parallel_size": 2},
         framework="megatron-lm", version=None, rule="CV085"),
    Case("overlap_param_gather_with_optimizer_step", {**OPGWOS, "ddp.overlap_param_gather": True,
                                                      "optimizer.overlap_param_gather": True},
         "--overlap-param-gather-with-optimizer-step only supported with interleaved pipeline parallelism",
         {"model.pipeline_model_parallel_size": 4, "model.virtual_pipeline_model_parallel_size": 2},
         framework="megatron-lm", version=None, rule="CV085"),
    Case("distributed_optimizer_instances", {"launch.world_size": 8, "model.tensor_model_parallel_size": 2,
                                             "ddp.num_distributed_optimizer_instances": 3},
         "Data parallel size should be divisible by partial DistOpt shard factor",
         {"ddp.num_distributed_optimizer_instances": 2}, rule="CV086"),
    Case("distributed_optimizer_instances", {**MOE, "launch.world_size": 16, "model.expert_model_parallel_size": 8,
                                             "ddp.num_distributed_optimizer_instances": 4},
         "Expert data parallel size should be divisible by partial DistOpt shard factor",
         {"model.expert_model_parallel_size": 4}, rule="CV086"),
    Case("fp8_param_needs_fp8", {"model.fp8_param": True}, "fp8_param must be used together with fp8 mode.",
         {"model.fp8": "hybrid"}, rule="CV070"),
    Case("fp8_param_needs_fp8", {"model.fp8_param": True, "mixed_precision.fp8_param": True},
         "fp8_param must be used together with fp8 mode.", {"mixed_precision.fp8": "e4m3"}, rule="CV070"),
    Case("fp4_param_needs_fp4", {"model.fp4_param": True}, "fp4_param must be used together with fp4 mode.",
         {"model.fp4": "e2m1"}, rule="CV070"),
    Case("fp4_and_fp8", {"model.fp8": "hybrid", "model.fp4": "e2m1", "model.fp8_recipe": "tensorwise"},
         "fp4 and fp8 cannot be used simultaneously. Please choose one.", {"model.fp4": None}, rule="CV071"),
    Case("fp8_delayed_first_last_bf16", {"model.fp8": "hybrid", "model.fp8_recipe": "delayed",
                                         "model.first_last_layers_bf16": True},
         "Delayed scaling does not support first / last layer in BF16.",
         {"model.fp8_recipe": "tensorwise"}, rule="CV073"),
    Case("fp8_bf16_layers_per_stage", {"model.fp8": "hybrid", "model.fp8_recipe": "tensorwise",
                                       "model.first_last_layers_bf16": True, "model.pipeline_model_parallel_size": 4,
                                       "model.num_layers_at_start_in_bf16": 9},
         "num_layers_at_start_in_bf16 (9) must be between 0 and number of layers per pipeline stage (8).",
         {"model.num_layers_at_start_in_bf16": 8}, rule="CV073"),
    Case("fp8_delayed_recompute_modules", {"model.fp8": "hybrid", "model.fp8_recipe": "delayed",
                                           "model.recompute_granularity": "selective",
                                           "model.recompute_modules": ["core_attn", "layernorm"]},
         "Delayed scaling does not support moe_act and layernorm recompute for fp8.",
         {"model.recompute_modules": ["core_attn", "mlp"]}, rule="CV073"),
    Case("selective_recompute_settings", {"model.recompute_granularity": "selective",
                                          "model.recompute_num_layers": 4},
         "When using recompute_granularity: selective recompute_num_layers must be None.",
         {"model.recompute_granularity": "full", "model.recompute_method": "uniform"}, rule="CV080"),
    Case("selective_recompute_settings", {"model.recompute_granularity": "selective",
                                          "model.recompute_method": "uniform"},
         "recompute method is not yet supported for selective recomputing granularity",
         {"model.recompute_method": None}, framework="megatron-lm", version=None, rule="CV080"),
    Case("cp_comm_type_hierarchical", {"model.context_parallel_size": 4, "model.cp_comm_type": "a2a+p2p"},
         "hierarchical_context_parallel_sizes must be set when cp_comm_type contains 'a2a+p2p'. Without it, CP "
         "communication is silently disabled and each rank attends only to its local chunk, producing artificially "
         "high throughput but broken training. Example: for cp=16 across 4 nodes of 8 GPUs, set "
         "hierarchical_context_parallel_sizes=[8, 2].",
         {"model.hierarchical_context_parallel_sizes": [2, 2]}, rule="CV090"),
    Case("cp_comm_type_hierarchical", {"model.context_parallel_size": 8, "model.cp_comm_type": "a2a+p2p",
                                       "model.hierarchical_context_parallel_sizes": [2, 2]},
         "Product of hierarchical_context_parallel_sizes [2, 2] (=4) must equal context_parallel_size (=8).",
         {"model.hierarchical_context_parallel_sizes": [2, 4]}, rule="CV090"),
    Case("context_parallel_needs_te", {"model.context_parallel_size": 2, "model.transformer_impl": "local"},
         "Context parallelism is only supported by TEDotProductAttention!",
         {"model.transformer_impl": "transformer_engine"}, framework="megatron-lm", version=None, rule="CV091"),
    Case("context_parallel_needs_te", {"model.context_parallel_size": 2, "model.transformer_layer_spec":
                                       "megatron.bridge.models.gpt_provider.local_layer_spec"},
         "Context parallelism is only supported by TEDotProductAttention!",
         # Bridge builds its layers from transformer_layer_spec: transformer_impl=local alone keeps TE attention
         {"model.transformer_layer_spec": "megatron.bridge.models.gpt_provider.default_layer_spec",
          "model.transformer_impl": "local"}, rule="CV091"),
    Case("scheduler_units", {"train.train_iters": 1000, "scheduler.lr_decay_samples": 50000},
         "Use lr_decay_iters for iteration-based training, not lr_decay_samples",
         {"scheduler.lr_decay_samples": None, "scheduler.lr_decay_iters": 900}, rule="CV097"),
    Case("scheduler_units", {"train.train_samples": 100000, "scheduler.lr_warmup_iters": 100},
         "Use lr_warmup_samples for sample-based training, not lr_warmup_iters",
         {"scheduler.lr_warmup_iters": 0, "scheduler.lr_warmup_samples": 1000}, rule="CV097"),
    Case("scheduler_units", {"train.train_iters": 1000, "scheduler.lr_decay_iters": 1000,
                             "scheduler.lr_warmup_iters": 100, "scheduler.lr_decay_samples": 50000},
         "Cannot mix iteration-based and sample-based scheduler fields. Found iteration fields: lr_decay_iters=1000, "
         "lr_warmup_iters=100, lr_wsd_decay_iters=None. Found sample fields: lr_decay_samples=50000, "
         "lr_warmup_samples=0, lr_wsd_decay_samples=None. Use either iteration fields OR sample fields, not both.",
         {"scheduler.lr_decay_samples": None}, rule="CV097"),
    Case("cuda_graphs_need_te_rng_tracker", {"model.cuda_graph_impl": "local"},
         "Transformer engine's RNG tracker is required for cudagraphs, it can be enabled with "
         "use_te_rng_tracker=True'.", {"rng.te_rng_tracker": True}, rule="CV098"),
    Case("cuda_graphs_need_te_rng_tracker", {"model.enable_cuda_graph": True},
         "Transformer engine's RNG tracker is required for cudagraphs, it can be enabled with "
         "use_te_rng_tracker=True'.", {"model.use_te_rng_tracker": True}, version="0.1.0", rule="CV098"),
]
NEW_CHECKS = {c.check for c in CASES}


def _view(settings: dict[str, Any], case: Case) -> ConfigView:
    view = ConfigView(framework=case.framework, version=case.version)
    view.mcore_version = case.mcore
    for key, value in {**SHAPE, **settings}.items():
        view.set(key, value, "log:1")
    return apply_defaults(view)


def _fired(view: ConfigView, check: str) -> list[str]:
    return [v.message for v in validate(view, real_mcore=False) if v.check == check]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.rule}-{c.check}-{c.framework}-{c.mcore}")
def test_violation_message_and_fix(case):
    view = _view(case.settings, case)
    found = [v for v in validate(view, real_mcore=False) if v.check == case.check]
    assert [v.message for v in found] == [case.message]
    violation = found[0]
    assert violation.source and violation.keys and violation.fixes
    fixed = apply_overrides(view, violation.fixes[0])
    # the check's own first fix makes the whole validator accept the config
    assert validate(fixed, real_mcore=False) == [], [v.message for v in validate(fixed, real_mcore=False)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.rule}-{c.check}-{c.framework}-{c.mcore}")
def test_near_miss_does_not_fire(case):
    assert _fired(_view({**case.settings, **case.near_miss}, case), case.check) == []


def test_the_violation_ties_to_the_rule_the_log_matched():
    """Each message is what the rule's patterns match, so replay can say reproduced=true."""
    from diagnose.match import match_text
    from diagnose.match.rules import load_catalogue

    catalogue = load_catalogue([])
    for case in CASES:
        report = match_text(f"ValueError: {case.message}\n", catalogue)
        assert case.rule in {f.rule for f in report.findings}, (case.check, case.message)


def test_bridge_preset_wins_over_model_fields():
    """Bridge copies the mixed-precision preset onto the model: a preset without FP8 drops a stray fp8_param."""
    case = Case("fp8_param_needs_fp8", {}, "", {})
    assert _fired(_view({"model.fp8_param": True, "mixed_precision": "bf16_mixed"}, case), case.check) == []
    delayed = _view({"mixed_precision": "bf16_with_fp8_delayed_scaling_mixed", "model.first_last_layers_bf16": True},
                    case)
    assert _fired(delayed, "fp8_delayed_first_last_bf16") == []  # the preset's first_last_layers_bf16 is False
    # the rule's fix (a current-scaling preset) is accepted where delayed scaling with BF16 ends fails
    failing = _view({"mixed_precision.fp8": "hybrid", "mixed_precision.fp8_recipe": "delayed",
                     "mixed_precision.first_last_layers_bf16": True}, case)
    assert _fired(failing, "fp8_delayed_first_last_bf16")
    fixed = apply_overrides(failing, {"mixed_precision": "bf16_with_fp8_current_scaling_mixed"})
    assert validate(fixed, real_mcore=False) == []
    # a preset this release table does not know: no claim either way
    assert _fired(_view({"model.fp8_param": True, "mixed_precision": "my_custom_preset"}, case), case.check) == []


def test_release_gates():
    cp = {"model.context_parallel_size": 4, "model.cp_comm_type": "a2a+p2p"}
    old = Case("cp_comm_type_hierarchical", cp, "", {}, version="0.4.2")
    assert _fired(_view(cp, old), old.check) == []  # _validate_cp_comm_type arrived in Bridge 0.5.0
    mlm = Case("cuda_graphs_need_te_rng_tracker", {}, "", {}, framework="megatron-lm", version=None)
    assert _fired(_view({"model.cuda_graph_impl": "local"}, mlm), mlm.check) == []  # a Bridge provider assert
    # megatron-core < 0.16 had no 'Mismatch' wording: no claim
    uneven = Case("uneven_pipeline_stages", {}, "", {}, mcore="0.15.0")
    settings = {"model.pipeline_model_parallel_size": 2, "model.num_layers_in_first_pipeline_stage": 2,
                "model.num_layers_in_last_pipeline_stage": 2}
    assert _fired(_view(settings, uneven), uneven.check) == []


# ----- megatron-core's own TransformerConfig agrees (installed here and in CI) -----

MCORE_CASES = [c for c in CASES if c.check in {
    "uneven_pipeline_stages", "pipeline_split_settings", "uneven_pipeline_vpp", "pipeline_layout_conflict",
    "account_for_pipeline_split_vpp", "account_for_pipeline_split", "moe_deepep_needs_flex", "moe_one_flex_backend", "moe_deepep_pad",
    "moe_capacity_load_balancing", "moe_pad_needs_capacity", "moe_shared_expert_overlap", "fp8_param_needs_fp8",
    "fp4_param_needs_fp4", "fp4_and_fp8", "fp8_delayed_first_last_bf16", "fp8_bf16_layers_per_stage",
    "fp8_delayed_recompute_modules", "selective_recompute_settings",
} and c.framework == "megatron-bridge" and c.mcore is None
    and not any(k.startswith("mixed_precision") for k in c.settings)]


@pytest.mark.megatron
@pytest.mark.parametrize("case", MCORE_CASES, ids=lambda c: f"{c.rule}-{c.check}")
def test_megatron_core_raises_the_mirrored_message(case):
    mcore = pytest.importorskip("diagnose.explain.validate.mcore")
    if not mcore.available():
        pytest.skip("megatron-core is not importable")
    view = _view(case.settings, case)
    real = mcore.check_with_mcore(view)
    assert real is not None
    assert case.message in {v.message for v in real}, [v.message for v in real]
    mirrored = [v for v in validate(view, real_mcore=False) if v.check == case.check]
    # megatron-core knows the model fields, not Bridge's mixed-precision presets
    fix = next(f for f in mirrored[0].fixes if all(o.key.startswith("model.") for o in f))
    fixed = apply_overrides(view, fix)
    assert not [v.message for v in mcore.check_with_mcore(fixed) or []]


# ----- end to end: a Bridge log with its Task Configuration and the upstream error -----

BANNER = """\
[default0]:> initializing torch distributed ...
[default0]:------- Task Configuration -------
[default0]:_target_: megatron.bridge.training.config.ConfigContainer
[default0]:checkpoint:
[default0]:  _target_: megatron.bridge.training.config.CheckpointConfig
[default0]:  save: /results/checkpoints
[default0]:ddp:
[default0]:  _target_: megatron.bridge.training.config.DistributedDataParallelConfig
[default0]:  use_distributed_optimizer: true
[default0]:model:
[default0]:  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider
{model}[default0]:optimizer:
[default0]:  _target_: megatron.core.optimizer.optimizer_config.OptimizerConfig
[default0]:  use_distributed_optimizer: true
[default0]:train:
[default0]:  _target_: megatron.bridge.training.config.TrainingConfig
[default0]:  global_batch_size: 128
[default0]:  micro_batch_size: 1
[default0]:----------------------------------
[default0]:Traceback (most recent call last):
[default0]:  File "/opt/Megatron-Bridge/src/megatron/bridge/training/pretrain.py", line 88, in pretrain
{error}
"""

E2E = {
    "CV098": ({"cuda_graph_impl": "local", "use_te_rng_tracker": "false"},
              "AssertionError: Transformer engine's RNG tracker is required for cudagraphs, it can be enabled with "
              "use_te_rng_tracker=True'.", {"model.use_te_rng_tracker": True}),
    "CV061": ({"num_moe_experts": 64, "expert_model_parallel_size": 8, "tensor_model_parallel_size": 2,
               "add_bias_linear": "false",
               "sequence_parallel": "false", "moe_token_dispatcher_type": "alltoall"},
              "ValueError: During training, performance may degrade if MoE and tensor parallelismare enabled without "
              "also enabling sequence parallelism.", {"model.sequence_parallel": True}),
    # the rule's own fix is a Bridge preset: replay proves it through the preset's fields (mirror and megatron-core)
    "CV073": ({"fp8": "hybrid", "fp8_recipe": "delayed", "first_last_layers_bf16": "true", "bf16": "true"},
              "ValueError: Delayed scaling does not support first / last layer in BF16.",
              {"mixed_precision": "bf16_with_fp8_current_scaling_mixed"}),
    "CV052": ({"pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 14,
               "num_layers_in_last_pipeline_stage": 14},
              "ValueError: Mismatch: 4 middle layers remaining but 0 middle PP stages available.",
              {"model.num_layers_in_first_pipeline_stage": None, "model.num_layers_in_last_pipeline_stage": None}),
}


def _log(model: dict[str, Any], error: str) -> str:
    fields = {"hidden_size": 1024, "num_attention_heads": 16, "num_layers": 32, **model}
    lines = "".join(f"[default0]:  {k}: {v}\n" for k, v in sorted(fields.items()))
    return BANNER.format(model=lines, error=f"[default0]:{error}")


@pytest.mark.parametrize("rule", sorted(E2E))
def test_analyze_reproduces_and_proves_the_fix(rule, tmp_path):
    model, error, fix = E2E[rule]
    log = tmp_path / "job.log"
    log.write_text(_log(model, error))
    out = subprocess.run([sys.executable, "-m", "diagnose", "analyze", "--format", "json", str(log)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1), out.stderr
    report = json.loads(out.stdout)
    replay = report["replay"]
    assert replay["rule"] == rule
    assert replay["reproduced"] is True, replay
    assert replay["proven"] is True and replay["after_fix"]["passes"] is True
    assert {f["key"]: f["value"] for f in replay["fix"]} == fix
