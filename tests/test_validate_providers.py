"""No false violations on the configs Bridge's own providers produce, with megatron-core's real checks: the
activation function reaches megatron-core as the callable (a string fails its fusion check), and the fused-RoPE
check follows the job's Transformer Engine as the log states it, not this machine's."""

from __future__ import annotations

import pytest

from diagnose.explain.config.extract import load_config
from diagnose.explain.validate import mcore, run_checks

pytestmark = pytest.mark.skipif(not mcore.installed(), reason="megatron-core not installed")

P = "megatron.bridge.models."
PROVIDERS = [
    "llama.llama_provider.Llama3ModelProvider8B",
    "llama.llama_provider.Llama31ModelProvider405B",
    "qwen.qwen_provider.Qwen3ModelProvider8B",
    "qwen.qwen_provider.Qwen3MoEModelProvider30B_A3B",
    "deepseek.deepseek_provider.DeepSeekV3ModelProvider",
    "gpt_oss.gpt_oss_provider.GPTOSSProvider120B",
    "nemotronh.nemotron_h_provider.NemotronHModelProvider8B",
]
RECIPE = """\
model:
  _target_: {target}
  tensor_model_parallel_size: 2
  expert_tensor_parallel_size: 1
  sequence_parallel: true
mixed_precision: bf16_mixed
train:
  micro_batch_size: 1
  global_batch_size: 64
tokenizer:
  tokenizer_model: meta-llama/Meta-Llama-3-8B
"""


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("DIAGNOSE_NO_CACHE", "1")


def _view(tmp_path, target: str, extra: str = ""):
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE.format(target=P + target) + extra)
    return load_config(str(path))


@pytest.mark.parametrize("target", PROVIDERS)
def test_bridge_provider_configs_pass_megatron_core(tmp_path, target):
    view = _view(tmp_path, target)
    assert view.get("model.activation_func") in ("silu", "squared_relu", "quick_gelu")  # the provider's own, read as a name
    assert run_checks(view, None, real_mcore=True).violations == []


def test_a_real_violation_is_still_reported(tmp_path):
    """GPT-OSS's MoE layers have biases: megatron-core refuses expert TP 2 (the recipes set ETP 1)."""
    view = _view(tmp_path, "gpt_oss.gpt_oss_provider.GPTOSSProvider120B")
    view.set("model.expert_tensor_parallel_size", 2, "override")
    found = run_checks(view, None, real_mcore=True).violations
    assert [v.message for v in found if v.check.startswith("mcore:")] == ["Bias in Moe is only supported when ETP==1"]


def test_a_string_activation_is_the_callable_for_megatron_core():
    import torch.nn.functional as F

    assert mcore._activation("silu") is F.silu
    assert mcore._activation("torch.nn.functional.gelu") is F.gelu
    assert mcore._activation("no_such_function") is None


def test_rope_fusion_is_the_jobs_error_only_when_the_log_says_it_had_no_te(tmp_path):
    view = _view(tmp_path, PROVIDERS[0])
    assert view.get("model.apply_rope_fusion") is True
    assert mcore._sections(view)["model"]["apply_rope_fusion"] is False  # not tested against this machine's TE
    view.set("launch.transformer_engine", False, "log:12")
    assert mcore._sections(view)["model"]["apply_rope_fusion"] is True  # the job ran without TE: its own check


def test_quick_gelu_is_the_object_megatron_core_compares():
    from megatron.core.transformer import transformer_config

    assert mcore._activation("quick_gelu") is transformer_config.quick_gelu
