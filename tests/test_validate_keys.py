"""A misspelt key or an invalid choice in a fix / --set is never "proven" (QA: ddp.use_megatron_fdsp=true and
data_parallel_sharding_strategy=zero3 used to pass validation with exit 0)."""

from __future__ import annotations

from pathlib import Path

from diagnose.explain.config import ConfigView, apply_defaults
from diagnose.explain.replay import replay
from diagnose.present.cli import main

DATA = Path(__file__).parent / "data" / "configs"


def _view() -> ConfigView:
    view = ConfigView(framework="megatron-bridge", version="0.6.2")
    view.set("model.tensor_model_parallel_size", 1, "log:1")
    return apply_defaults(view)


def test_a_misspelt_override_key_fails_and_names_the_field():
    result = replay(_view(), ["ddp.use_megatron_fdsp=true"])
    assert not result.passes
    v = next(v for v in result.after.violations if v.check == "override_unknown_key")
    assert "did you mean ddp.use_megatron_fsdp?" in v.message and v.keys == ["ddp.use_megatron_fdsp"]


def test_an_invalid_sharding_strategy_fails():
    result = replay(_view(), ["ddp.use_megatron_fsdp=true", "ddp.data_parallel_sharding_strategy=zero3"])
    assert not result.passes
    assert any(v.check == "invalid_choice" and "Invalid data_parallel_sharding_strategy: zero3" in v.message
               for v in result.after.violations)


def test_valid_keys_and_choices_and_unlisted_fields_still_pass():
    result = replay(_view(), ["ddp.use_megatron_fsdp=true", "ddp.data_parallel_sharding_strategy=optim_grads",
                              "model.recompute_granularity=full", "train.train_iters=100"])
    assert result.passes, [v.message for v in result.after.violations]


def test_replay_cli_exit_code_is_1_for_a_typo(capsys):
    assert main(["replay", str(DATA / "llama8b_bridge.yaml"), "--set", "ddp.use_megatron_fdsp=true"]) == 1
    assert "did you mean ddp.use_megatron_fsdp" in " ".join(capsys.readouterr().out.split())
