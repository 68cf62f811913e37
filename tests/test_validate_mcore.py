"""Real megatron-core (installed here and in CI) agrees with the validator on the checks megatron-core owns.

For each case the config is built into megatron-core's own DistributedDataParallelConfig / OptimizerConfig /
TransformerConfig; what their ``__post_init__`` raises must be exactly the mirrored check's message, and the
mirrored check's fix must make megatron-core accept the config.
"""

from __future__ import annotations

import pytest

from diagnose.explain.config import ConfigView, apply_defaults, apply_overrides
from diagnose.explain.validate import run_checks, validate

pytestmark = pytest.mark.megatron

mcore = pytest.importorskip("diagnose.explain.validate.mcore")
if not mcore.available():  # pragma: no cover - CI installs megatron-core
    pytest.skip("megatron-core is not importable", allow_module_level=True)

SHAPE = {"model.num_layers": 4, "model.hidden_size": 256, "model.num_attention_heads": 8}

CASES = {
    "heads_divisible_by_tp": {"model.num_attention_heads": 7, "model.tensor_model_parallel_size": 2},
    "query_groups_vs_tp": {"model.num_attention_heads": 24, "model.num_query_groups": 3,
                           "model.tensor_model_parallel_size": 2},
    "sequence_parallel_needs_tp": {"model.sequence_parallel": True},
    "cpu_offloading_layers": {"model.cpu_offloading": True, "model.cpu_offloading_num_layers": 4},
    "cpu_offloading_pipeline": {"model.cpu_offloading": True, "model.cpu_offloading_num_layers": 1,
                                "model.pipeline_model_parallel_size": 2, "model.bf16": True},
    "cpu_offloading_recompute": {"model.cpu_offloading": True, "model.cpu_offloading_num_layers": 1,
                                 "model.recompute_granularity": "full", "model.recompute_method": "uniform",
                                 "model.recompute_num_layers": 1},
    "cpu_offloading_cuda_graphs": {"model.cpu_offloading": True, "model.cpu_offloading_num_layers": 1,
                                   "model.cuda_graph_impl": "local"},
    "nccl_ub_expandable_segments": {"ddp.nccl_ub": True, "env.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "precision_aware_optimizer_needs_distributed_optimizer": {"optimizer.use_precision_aware_optimizer": True},
    "precision_aware_optimizer_adam_only": {"optimizer.use_precision_aware_optimizer": True,
                                            "optimizer.optimizer": "sgd"},
    "reuse_grad_buf_needs_fp8_param_gather": {"ddp.reuse_grad_buf_for_mxfp8_param_ag": True},
}


def _view(settings: dict) -> ConfigView:
    view = ConfigView(framework="megatron-bridge", version="0.6.2")
    for key, value in {**SHAPE, **settings}.items():
        view.set(key, value, "log:1")
    return apply_defaults(view)


@pytest.mark.parametrize("check", sorted(CASES))
def test_megatron_core_raises_the_mirrored_message(check):
    view = _view(CASES[check])
    mirrored = [v for v in validate(view, real_mcore=False) if v.check == check]
    assert len(mirrored) == 1
    real = mcore.check_with_mcore(view)
    assert real is not None
    assert mirrored[0].message in {v.message for v in real}, (mirrored[0].message, [v.message for v in real])
    # the validator's fix satisfies megatron-core too
    fixed = apply_overrides(view, mirrored[0].fixes[0])
    assert mirrored[0].message not in {v.message for v in mcore.check_with_mcore(fixed)}


def test_megatron_core_accepts_a_good_config_and_the_environment_is_restored(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6")
    view = _view({"model.tensor_model_parallel_size": 2, "model.sequence_parallel": True, "ddp.nccl_ub": True,
                  "optimizer.use_distributed_optimizer": True, "optimizer.use_precision_aware_optimizer": True,
                  "model.params_dtype": "bfloat16", "model.bf16": True})
    assert mcore.check_with_mcore(view) == []
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.6"


def test_validate_adds_megatron_core_only_violations_and_drops_duplicates():
    # recompute_method without recompute_granularity: a TransformerConfig check we do not mirror
    view = _view({"model.recompute_granularity": "full", "model.recompute_method": "sideways",
                  "optimizer.use_precision_aware_optimizer": True})
    result = run_checks(view)
    assert result.mcore_checked
    checks = [v.check for v in result.violations]
    assert checks.count("precision_aware_optimizer_needs_distributed_optimizer") == 1
    assert "mcore:OptimizerConfig" not in checks  # same message as the mirrored check: dropped
    mcore_only = [v for v in result.violations if v.check.startswith("mcore:")]
    assert [(v.check, v.message) for v in mcore_only] == [
        ("mcore:TransformerConfig", 'recompute_method: sideways must be "block" or "uniform".')]
    assert mcore_only[0].keys == ["model.recompute_method"]
    assert mcore_only[0].source.startswith("megatron-core TransformerConfig.__post_init__ (installed 0.16")


def test_megatron_core_config_does_not_check_even_pipeline_split():
    """Found by this agreement test: TransformerConfig accepts 6 layers on PP=4 (the assert is at model build,
    transformer_block.get_num_layers_to_build), so our check is not attributed to TransformerConfig."""
    view = _view({"model.num_layers": 6, "model.pipeline_model_parallel_size": 4, "model.bf16": True})
    assert mcore.check_with_mcore(view) == []
    assert [v.message for v in validate(view, real_mcore=False)] == [
        "num_layers should be divisible by pipeline_model_parallel_size"
    ]


def test_real_bridge_log_config_builds_in_megatron_core():
    from pathlib import Path

    from diagnose.explain.config import load_config

    log = Path(__file__).resolve().parents[2] / "shared" / "real_logs" / "b042_first_iter_oom.log"
    if not log.exists():
        pytest.skip("shared real logs not present")
    view = load_config(str(log))
    kwargs = mcore._kwargs_from(mcore._load(), mcore._sections(view))  # what each real class is built with
    assert kwargs["TransformerConfig"]["num_layers"] == 8
    assert str(kwargs["TransformerConfig"]["params_dtype"]) == "torch.bfloat16"
    assert kwargs["DistributedDataParallelConfig"]["data_parallel_sharding_strategy"] == "optim_grads_params"
    assert mcore.check_with_mcore(view) == []  # the job really passed validation (it failed later, OOM)
