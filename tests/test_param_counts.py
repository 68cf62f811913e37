"""Parameter counts of public models within 0.5 % of their published counts, in each form a user has: a full
Bridge run_config.yaml (every model key written out), a recipe YAML naming the provider ``_target_`` with a few
overrides, and a Megatron-LM argument list (tests/data/param_counts/*.args, reconstructed from Megatron-LM's
``examples/post_training/modelopt/conf/<org>/<model>.sh`` and ``examples/mixtral/train_mixtral_8x7b_distributed.sh``:
the model flags as upstream writes them, the tokenizer variable replaced by the Hugging Face id).

Ground truth (published; "exact" = the safetensors total on the model's Hugging Face page):
- Llama 3 / 3.1 8B 8,030,261,248; 70B 70,553,706,496; 3.1 405B 405,853,388,800 (huggingface.co/meta-llama, exact).
- Qwen3 4B 4,022,468,096; 8B 8,190,735,360; 14B 14,768,307,200; 32B 32,762,123,264; 30B-A3B 30,532,122,624;
  235B-A22B 235,093,634,560 (huggingface.co/Qwen, exact). Qwen3 0.6B 751,632,384 and 1.7B 2,031,739,904: those
  checkpoints also store the tied ``lm_head``, so the model Megatron builds (tied) holds V x h fewer; the model
  cards' "non-embedding" counts (0.44B, 1.4B) agree.
- Mixtral 8x7B 46,702,792,704; 8x22B 140,620,634,112 (huggingface.co/mistralai, exact).
- DeepSeek-V3 671B main model (its README: 685B on the hub = 671B main model + 14B MTP module).
- gpt-oss-120b 116.83B, gpt-oss-20b 20.91B (OpenAI's gpt-oss model card, total parameters).
- Nemotron-H-8B 8.1B (huggingface.co/nvidia/Nemotron-H-8B-Base-8K model card; counted from the hybrid pattern).
"""

from __future__ import annotations

import os

import pytest
import yaml

from diagnose.explain.config.extract import load_config
from diagnose.explain.config.providers import resolve
from diagnose.explain.memory.from_config import count_assumptions, shape_from_config
from diagnose.explain.memory.plan import memory_plan
from diagnose.explain.memory.shape import count_params
from diagnose.model import DiagnoseError

DATA = os.path.join(os.path.dirname(__file__), "data", "param_counts")
P = "megatron.bridge.models."


# name: (provider target, tokenizer (when the provider has no vocabulary), published count, tied lm_head stored)
MODELS: dict[str, tuple[str | None, str | None, float, bool]] = {
    "llama3-8b": (P + "llama.llama_provider.Llama3ModelProvider8B", "meta-llama/Meta-Llama-3-8B", 8_030_261_248, False),
    "llama3-70b": (P + "llama.llama_provider.Llama3ModelProvider70B", "meta-llama/Meta-Llama-3-70B",
                   70_553_706_496, False),
    "llama31-8b": (P + "llama.llama_provider.Llama31ModelProvider8B", "meta-llama/Llama-3.1-8B", 8_030_261_248, False),
    "llama31-70b": (P + "llama.llama_provider.Llama31ModelProvider70B", "meta-llama/Llama-3.1-70B",
                    70_553_706_496, False),
    "llama31-405b": (P + "llama.llama_provider.Llama31ModelProvider405B", "meta-llama/Llama-3.1-405B",
                     405_853_388_800, False),
    "qwen3-0.6b": (P + "qwen.qwen_provider.Qwen3ModelProvider600M", None, 751_632_384, True),
    "qwen3-1.7b": (P + "qwen.qwen_provider.Qwen3ModelProvider1P7B", None, 2_031_739_904, True),
    "qwen3-4b": (P + "qwen.qwen_provider.Qwen3ModelProvider4B", None, 4_022_468_096, False),
    "qwen3-8b": (P + "qwen.qwen_provider.Qwen3ModelProvider8B", None, 8_190_735_360, False),
    "qwen3-14b": (P + "qwen.qwen_provider.Qwen3ModelProvider14B", None, 14_768_307_200, False),
    "qwen3-32b": (P + "qwen.qwen_provider.Qwen3ModelProvider32B", None, 32_762_123_264, False),
    "qwen3-30b-a3b": (P + "qwen.qwen_provider.Qwen3MoEModelProvider30B_A3B", None, 30_532_122_624, False),
    "qwen3-235b-a22b": (P + "qwen.qwen_provider.Qwen3MoEModelProvider235B_A22B", None, 235_093_634_560, False),
    "deepseek-v3": (P + "deepseek.deepseek_provider.DeepSeekV3ModelProvider", None, 671e9, False),
    "gpt-oss-120b": (P + "gpt_oss.gpt_oss_provider.GPTOSSProvider120B", None, 116.83e9, False),
    "gpt-oss-20b": (P + "gpt_oss.gpt_oss_provider.GPTOSSProvider20B", None, 20.91e9, False),
    "nemotron-h-8b": (P + "nemotronh.nemotron_h_provider.NemotronHModelProvider8B", "nvidia/Nemotron-H-8B-Base-8K",
                      8.1e9, False),
    # no Bridge provider class: the full form only (and the Megatron-LM script for 8x7B)
    "mixtral-8x7b": (None, None, 46_702_792_704, False),
    "mixtral-8x22b": (None, None, 140_620_634_112, False),
}

MIXTRAL = {  # the model keys a Bridge run_config.yaml holds for Mixtral (Hugging Face config.json values)
    "mixtral-8x7b": dict(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                         num_query_groups=8, num_moe_experts=8, moe_ffn_hidden_size=14336, vocab_size=32000),
    "mixtral-8x22b": dict(num_layers=56, hidden_size=6144, ffn_hidden_size=16384, num_attention_heads=48,
                          num_query_groups=8, num_moe_experts=8, moe_ffn_hidden_size=16384, vocab_size=32768),
}
MIXTRAL_COMMON = dict(kv_channels=128, gated_linear_unit=True, add_bias_linear=False, normalization="RMSNorm",
                      position_embedding_type="rope", share_embeddings_and_output_weights=False,
                      moe_router_topk=2, activation_func="silu")

ARGS = {  # Megatron-LM argument lists (tests/data/param_counts)
    "llama31-8b": "Llama-3.1-8B-Instruct.args",
    "qwen3-0.6b": "Qwen3-0.6B.args",
    "qwen3-8b": "Qwen3-8B.args",
    "qwen3-30b-a3b": "Qwen3-30B-A3B.args",
    "qwen3-235b-a22b": "Qwen3-235B-A22B.args",
    "deepseek-v3": "DeepSeek-R1.args",  # DeepSeek-R1 has DeepSeek-V3's architecture
    "gpt-oss-20b": "gpt-oss-20b.args",
    "gpt-oss-120b": "gpt-oss-120b.args",
    "nemotron-h-8b": "Nemotron-H-8B-Base-8K.args",
    "mixtral-8x7b": "Mixtral-8x7B.args",
}


def _expected(name: str, shape) -> float:
    _, _, truth, tied_stored = MODELS[name]
    if tied_stored:  # the published total holds a stored copy of the tied output layer
        truth -= shape.padded_vocab(1) * shape.hidden_size
    return truth


def _count(path: str) -> tuple[int, object, list[str]]:
    view = load_config(path)
    shape = shape_from_config(view)
    assert shape is not None, path
    return count_params(shape).total, shape, count_assumptions(view)


def _write(tmp_path, name: str, data: dict) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _full_model_section(name: str) -> dict:
    """Every model key written out, as a run_config.yaml dump holds them (Bridge >= 0.4 names the generic
    provider class there, so nothing may come from a sized provider)."""
    target, tokenizer, _, _ = MODELS[name]
    if target is None:
        return {"_target_": P + "gpt_provider.GPTModelProvider", **MIXTRAL_COMMON, **MIXTRAL[name]}
    fields = dict(resolve(target).fields)
    if tokenizer is not None:
        fields["vocab_size"] = {"nemotron-h-8b": 131072}.get(name, 128256)
    generic = P + ("mamba.mamba_provider.MambaModelProvider" if "hybrid_layer_pattern" in fields
                   else "gpt_provider.GPTModelProvider")
    return {"_target_": generic, **{k: v for k, v in fields.items() if v is not None}}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_full_run_config(tmp_path, name):
    path = _write(tmp_path, name, {"model": _full_model_section(name), "train": {"micro_batch_size": 1}})
    n, shape, assumed = _count(path)
    assert assumed == []
    assert abs(n - _expected(name, shape)) / _expected(name, shape) < 0.005, f"{name}: {n:,}"


@pytest.mark.parametrize("name", sorted(k for k, v in MODELS.items() if v[0]))
def test_recipe_yaml_with_target(tmp_path, name):
    target, tokenizer, _, _ = MODELS[name]
    data = {"model": {"_target_": target, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
                      "sequence_parallel": True},
            "train": {"micro_batch_size": 1, "global_batch_size": 128}}
    if tokenizer:
        data["tokenizer"] = {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": tokenizer}
    view = load_config(_write(tmp_path, name, data))
    n = count_params(shape_from_config(view)).total
    assert count_assumptions(view) == []
    assert abs(n - _expected(name, shape_from_config(view))) / _expected(name, shape_from_config(view)) < 0.005
    # every value that moves the count says where it came from: the provider (with its release) or the tokenizer
    assert view.origin("model.hidden_size").startswith("provider:" + target.rsplit(".", 1)[-1] + " (Megatron-Bridge")
    assert view.origin("model.tensor_model_parallel_size").startswith("file:")
    if tokenizer:
        assert view.origin("model.vocab_size") == f"tokenizer:{tokenizer}"


@pytest.mark.parametrize("name", sorted(ARGS))
def test_megatron_lm_argument_list(name):
    n, shape, assumed = _count(os.path.join(DATA, ARGS[name]))
    assert assumed == []
    assert abs(n - _expected(name, shape)) / _expected(name, shape) < 0.005, f"{name}: {n:,}"


def test_at_least_15_models_in_two_forms_or_more():
    assert len(MODELS) >= 15
    assert len(ARGS) >= 8


def test_partial_yaml_without_provider_warns_instead_of_meta(tmp_path, monkeypatch):
    """Sizes only, no provider: the count is megatron-core's defaults (LayerNorm, no GLU, tied, 32k vocab), and
    the plan says so: a warning naming each assumed value, never a silent '(meta)'."""
    monkeypatch.setenv("DIAGNOSE_EXACT_PARAMS", "0")  # the warning does not depend on the meta-device build
    path = _write(tmp_path, "bare", {"model": {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                                               "ffn_hidden_size": 14336, "num_query_groups": 8},
                                     "train": {"micro_batch_size": 1, "global_batch_size": 64}})
    view = load_config(path)
    assumed = count_assumptions(view)
    joined = " ".join(assumed)
    for word in ("vocab_size", "gated_linear_unit", "share_embeddings_and_output_weights"):
        assert word in joined
    plan = memory_plan(view, 2, 141 * 2**30).to_dict()
    assert plan["params_assumed"] == assumed
    assert plan["notes"][0].startswith("WARNING: the parameter count assumes vocab_size 32,000")


def test_megatron_lm_list_without_vocab_or_known_tokenizer_warns():
    text = open(os.path.join(DATA, "Mixtral-8x7B.args")).read().replace("mistralai/Mixtral-8x7B-v0.1",
                                                                         "/data/tokenizers/tokenizer.model")
    view = _load_text(text)
    assert [a for a in count_assumptions(view) if a.startswith("vocab_size 32,000")]


def _load_text(text: str):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".args", delete=False) as fh:
        fh.write(text)
    try:
        return load_config(fh.name)
    finally:
        os.unlink(fh.name)


def test_megatron_lm_position_flags():
    base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 1000 --seq-length 128 "
    learned = count_params(shape_from_config(_load_text(base))).total
    for flags in ("--use-rotary-position-embeddings", "--position-embedding-type rope", "--no-position-embedding"):
        view = _load_text(base + flags)
        assert count_params(shape_from_config(view)).total == learned - 128 * 64, flags


def test_target_only_refusal_names_the_provider(tmp_path):
    path = _write(tmp_path, "x", {"model": {"_target_": "acme.models.SecretProvider70B",
                                            "tensor_model_parallel_size": 2}})
    with pytest.raises(DiagnoseError, match=r"provider acme\.models\.SecretProvider70B, which diagnose could not "
                                            r"read"):
        memory_plan(load_config(path), 2, 80 * 2**30)


def test_generic_provider_without_sizes_refusal_says_what_is_missing(tmp_path):
    """Bridge >= 0.4 recipes build the provider from a Hugging Face config: a YAML naming only the generic class
    and a model id diagnose has no sizes for is refused with the missing keys named."""
    path = _write(tmp_path, "mixtral", {"model": {"_target_": P + "gpt_provider.GPTModelProvider",
                                                  "hf_model_id": "mistralai/Mixtral-8x7B-v0.1"}})
    with pytest.raises(DiagnoseError, match=r"GPTModelProvider .* does not set model\.num_layers, "
                                            r"model\.hidden_size, model\.num_attention_heads"):
        memory_plan(load_config(path), 2, 80 * 2**30)


def test_hf_model_id_resolves_through_the_provider_table(tmp_path):
    path = _write(tmp_path, "q", {"model": {"_target_": P + "gpt_provider.GPTModelProvider",
                                            "hf_model_id": "Qwen/Qwen3-8B"}})
    n, _, assumed = _count(path)
    assert n == 8_190_735_360 and assumed == []


def test_provider_release_is_chosen_by_the_job_version():
    """DeepSeek-V3's class in Bridge 0.3.1 left the sizes to the bridge; 0.3.0's set them itself."""
    assert resolve(P + "deepseek.deepseek_provider.DeepSeekV3ModelProvider", "0.3.1").fields.get(
        "num_attention_heads") is None
    old = resolve(P + "deepseek.deepseek_provider.DeepSeekV3ModelProvider", "0.3.0")
    assert old.fields["num_attention_heads"] == 128 and "0.3.0" in old.source
    assert resolve(P + "deepseek.deepseek_provider.DeepSeekV3ModelProvider").fields["num_attention_heads"] == 128


def test_installed_megatron_bridge_is_read_instead_of_the_table(monkeypatch):
    """With megatron-bridge importable, the provider class's own dataclass defaults are used (only
    ``megatron.bridge.`` targets; never another module a config names)."""
    import dataclasses
    import importlib
    import types

    from diagnose.explain.config import providers

    @dataclasses.dataclass
    class Llama3ModelProvider8B:
        num_layers: int = 2
        hidden_size: int = 64
        activation_func: object = dataclasses.field(default=pow)

    fake = types.ModuleType("megatron.bridge.models.llama.llama_provider")
    fake.Llama3ModelProvider8B = Llama3ModelProvider8B
    imported = []

    def import_module(name):
        imported.append(name)
        return fake

    monkeypatch.setattr(providers, "_installed_bridge", lambda: True)
    monkeypatch.setattr(importlib, "import_module", import_module)
    got = providers.resolve(MODELS["llama3-8b"][0])
    assert got.fields == {"num_layers": 2, "hidden_size": 64, "activation_func": "pow"}
    assert got.source.startswith("installed megatron-bridge")
    assert providers.from_installed("os.system") is None and imported == ["megatron.bridge.models.llama.llama_provider"]


def test_a_hybrid_pattern_it_cannot_read_is_refused_not_miscounted(tmp_path):
    path = _write(tmp_path, "h", {"model": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
                                            "hybrid_override_pattern": "M-X*"}})
    with pytest.raises(DiagnoseError, match=r"cannot count the hybrid model: .* other than M \(Mamba\)"):
        memory_plan(load_config(path), 1, 80 * 2**30)


def test_hybrid_layers_counted_per_symbol(tmp_path):
    """Every slot of Nemotron-H-8B's pattern counted as a transformer layer gave 12.4B; per symbol it is 8.1B."""
    base = {"_target_": MODELS["nemotron-h-8b"][0], "vocab_size": 131072}
    view = load_config(_write(tmp_path, "n", {"model": base}))
    shape = shape_from_config(view)
    assert shape.hybrid_pattern.count("M") == 24 and shape.hybrid_pattern.count("*") == 4
    assert count_params(shape).total == 8_100_852_736
    as_transformer = count_params(dataclasses_replace(shape, hybrid_pattern=None)).total
    assert as_transformer > 12e9


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)
