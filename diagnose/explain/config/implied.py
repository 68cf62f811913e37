"""Settings implied by an error message, for logs that fail before printing their config.

Validation failures happen before Megatron-Bridge prints its configuration, so those logs carry no config block.
The message itself still pins a few settings (``num_attention_heads (7) must be a multiple of
tensor_model_parallel_size (2)`` means 7 heads and TP=2). Those values get the origin ``implied:log:<line>``: replay
merges them under whatever part of the config the log printed (the log wins where it states a value). When the
validator then prints the same failure, replay says "reproduced (from the settings the error states)"
(``implied: true``). Only values the message states are set; nothing is invented.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from diagnose.explain.config.view import ConfigView
from diagnose.model import Finding

SET = "(set)"  # a path the message proves was set, without saying which
NOT_ONE = "(not 1)"  # an environment variable the message proves was not 1 (unset or another value)

Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], dict[str, Any]]]


def _const(values: dict[str, Any]) -> Callable[[re.Match[str]], dict[str, Any]]:
    return lambda m: dict(values)


RULES: list[Rule] = [
    (re.compile(r"num_attention_heads \((\d+)\) must be a multiple of tensor_model_parallel_size \((\d+)\)"),
     lambda m: {"model.num_attention_heads": int(m[1]), "model.tensor_model_parallel_size": int(m[2])}),
    (re.compile(r"num_query_groups \((\d+)\) must be a multiple or divisor of tensor_model_parallel_size \((\d+)\)"),
     lambda m: {"model.num_query_groups": int(m[1]), "model.tensor_model_parallel_size": int(m[2])}),
    (re.compile(r"world size \((\d+)\) is not divisible by total_model_size \(model_cfg\.tensor_model_parallel_size=(\d+)"
                r" \* model_cfg\.pipeline_model_parallel_size=(\d+) \* model_cfg\.context_parallel_size=(\d+)\)"),
     lambda m: {"launch.world_size": int(m[1]), "model.tensor_model_parallel_size": int(m[2]),
                "model.pipeline_model_parallel_size": int(m[3]), "model.context_parallel_size": int(m[4])}),
    (re.compile(r"Megatron-FSDP requires the `?fsdp_dtensor`? checkpointing format|"
                r"Megatron FSDP only supports fsdp_dtensor checkpoint format"),
     _const({"ddp.use_megatron_fsdp": True, "checkpoint.save": SET, "checkpoint.ckpt_format": "torch_dist"})),
    (re.compile(r"fsdp_dtensor checkpoint format only supports Megatron FSDP"),
     _const({"ddp.use_megatron_fsdp": False, "checkpoint.save": SET, "checkpoint.ckpt_format": "fsdp_dtensor"})),
    (re.compile(r"FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset|"
                r"FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one"),
     _const({"ddp.use_megatron_fsdp": True, "env.CUDA_DEVICE_MAX_CONNECTIONS": "1"})),
    (re.compile(r"Using tensor model parallelism or context parallelism require setting the environment variable "
                r"CUDA_DEVICE_MAX_CONNECTIONS to 1"),
     _const({"env.CUDA_DEVICE_MAX_CONNECTIONS": NOT_ONE})),
    (re.compile(r"use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive|"
                r"Using use_megatron_fsdp and use_torch_fsdp2 at the same time is not supported"),
     _const({"ddp.use_megatron_fsdp": True, "dist.use_torch_fsdp2": True})),
    (re.compile(r"TorchFullyShardedDataParallel\.__init__\(\) got an unexpected keyword argument 'pg_collection'"),
     _const({"dist.use_torch_fsdp2": True, "ddp.use_megatron_fsdp": False})),
    (re.compile(r"use_tp_pp_dp_mapping is not supported with Megatron FSDP"),
     _const({"ddp.use_megatron_fsdp": True, "dist.use_tp_pp_dp_mapping": True})),
    (re.compile(r"Cannot use sequence parallelism without tensor parallelism"),
     _const({"model.sequence_parallel": True, "model.tensor_model_parallel_size": 1})),
    (re.compile(r"CPU offloading can be done only for layers less than (\d+)"),
     lambda m: {"model.cpu_offloading": True, "model.num_layers": int(m[1]),
                "model.cpu_offloading_num_layers": int(m[1])}),
    (re.compile(r"DDP\.fsdp_manual_registration requires DDP\.nccl_ub!"),
     _const({"ddp.use_megatron_fsdp": True, "ddp.fsdp_manual_registration": True, "ddp.nccl_ub": False})),
    # Megatron-Bridge >= 0.7 refusing (or skipping) the moved field: the job set dist.use_megatron_fsdp
    (re.compile(r"Could not override 'dist\.use_megatron_fsdp'|"
                r"DistributedInitConfig\.__init__\(\) got an unexpected keyword argument 'use_megatron_fsdp'|"
                r"Key 'use_megatron_fsdp' in overrides not found in config object DistributedInitConfig"), _const({"dist.use_megatron_fsdp": True})),
]


# The validator check that prints each message (any release's wording): replay has reproduced a finding when
# that check fires on the job's settings, whatever the wording of the release it models.
STATED_CHECKS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"num_attention_heads \(\d+\) must be a multiple of tensor_model_parallel_size"), "heads_divisible_by_tp"),
    (re.compile(r"num_query_groups \(\d+\) must be a multiple or divisor of tensor_model_parallel_size"),
     "query_groups_vs_tp"),
    (re.compile(r"world size \(\d+\) is not divisible by total_model_size"), "world_size_divisible"),
    (re.compile(r"Megatron-FSDP requires the `?fsdp_dtensor`? checkpointing format|"
                r"Megatron FSDP only supports fsdp_dtensor checkpoint format"), "fsdp_requires_fsdp_dtensor"),
    (re.compile(r"fsdp_dtensor checkpoint format only supports Megatron FSDP"), "fsdp_dtensor_only_megatron_fsdp"),
    (re.compile(r"Could not override 'dist\.use_megatron_fsdp'|"
                r"DistributedInitConfig\.__init__\(\) got an unexpected keyword argument 'use_megatron_fsdp'|"
                r"Key 'use_megatron_fsdp' in overrides not found in config object DistributedInitConfig"), "stale_moved_field"),
    (re.compile(r"FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset|"
                r"FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one"),
     "fsdp_cuda_device_max_connections"),
    (re.compile(r"Using tensor model parallelism or context parallelism require setting the environment variable "
                r"CUDA_DEVICE_MAX_CONNECTIONS to 1"), "mlm_tp_cp_cuda_device_max_connections"),
    (re.compile(r"use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive|"
                r"Using use_megatron_fsdp and use_torch_fsdp2 at the same time is not supported"), "fsdp_exclusive"),
    (re.compile(r"TorchFullyShardedDataParallel\.__init__\(\) got an unexpected keyword argument 'pg_collection'"),
     "fsdp2_pg_collection"),
    (re.compile(r"use_tp_pp_dp_mapping is not supported with Megatron FSDP"), "fsdp_tp_pp_dp_mapping"),
    (re.compile(r"Cannot use sequence parallelism without tensor parallelism"), "sequence_parallel_needs_tp"),
    (re.compile(r"CPU offloading can be done only for layers less than"), "cpu_offloading_layers"),
    (re.compile(r"DDP\.fsdp_manual_registration requires DDP\.nccl_ub"), "fsdp_manual_registration_needs_nccl_ub"),
]


def stated_checks(finding: Finding) -> set[str]:
    """Names of the validator checks whose message (in any release's wording) is in the finding's evidence."""
    out: set[str] = set()
    for ev in finding.evidence:
        for pattern, name in STATED_CHECKS:
            if pattern.search(ev.text):
                out.add(name)
    return out


def implied_view(findings: Iterable[Finding]) -> ConfigView:
    """Settings stated by the findings' error messages (first statement of a key wins)."""
    view = ConfigView()
    for finding in findings:
        for ev in finding.evidence:
            for pattern, settings in RULES:
                m = pattern.search(ev.text)
                if not m:
                    continue
                for key, value in settings(m).items():
                    if not view.has(key):
                        view.set(key, value, f"implied:log:{ev.line}")
                source = f"implied:log:{ev.line} error message"
                if source not in view.sources:
                    view.sources.append(source)
    return view
