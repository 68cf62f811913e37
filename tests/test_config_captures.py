"""CAPTURES through the real engine: every kind of config line in one log ends up in report.config."""

from __future__ import annotations

import re

from diagnose.explain.config import CAPTURES
from diagnose.pipeline import AnalyzeOptions, analyze

LOG = """\
+ export CUDA_DEVICE_MAX_CONNECTIONS=1
+ export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
SLURM_NTASKS=16
torch 2.11.0 | megatron-core 0.19.2 | megatron-bridge 0.6.2
+ torchrun --nproc_per_node=8 --nnodes=2 scripts/training/run_recipe.py --recipe llama3_8b_pretrain_config \\
    -tp 2 ddp.use_megatron_fsdp=true checkpoint.save=/ckpt \\
    checkpoint.ckpt_format=torch_dist
[rank0]: Setting up DistributedDataParallel with config DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_megatron_fsdp=True, data_parallel_sharding_strategy='optim_grads_params', nccl_ub=False)
 > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 4015263744
 > number of parameters on (tensor, pipeline) model parallel rank (1, 0): 4015263745
[rank0]: AssertionError: Megatron-FSDP requires the fsdp_dtensor checkpointing format!
"""


def test_capture_regexes_are_linear_time_and_contain_their_anchor_literal():
    for spec in CAPTURES:
        assert spec.anchor
        if spec.regex:
            re.compile(spec.regex)
            assert not re.search(r"\(\?[=!<]|\\[1-9]", spec.regex), spec.name  # no look-around/back-references


def test_all_config_lines_reach_the_report_through_the_engine(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(LOG)
    report = analyze([str(log)], AnalyzeOptions(jobs=1))
    values = report.to_dict()["config"]["values"]
    get = lambda k: values[k]["value"]  # noqa: E731
    assert report.to_dict()["config"]["version"] == "0.6.2"
    assert get("env.CUDA_DEVICE_MAX_CONNECTIONS") == "1"
    assert get("env.PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True"
    assert get("launch.world_size") == 16 and values["launch.world_size"]["from"] == "log:5"
    assert get("model.tensor_model_parallel_size") == 2
    assert get("checkpoint.ckpt_format") == "torch_dist" and values["checkpoint.ckpt_format"]["from"] == "log:5"
    assert get("ddp.data_parallel_sharding_strategy") == "optim_grads_params"
    assert get("launch.num_parameters") == 4015263745
    replay = report.to_dict()["replay"]
    assert replay["reproduced"] is True
    checks = {v["check"] for v in replay["violations"]}
    assert {"fsdp_requires_fsdp_dtensor", "fsdp_cuda_device_max_connections"} <= checks
    fix = {f["key"]: f["value"] for f in replay["fix"]}
    assert fix["checkpoint.ckpt_format"] == "fsdp_dtensor"
    assert fix["env.CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert replay["after_fix"]["passes"] is True
