"""Replay: reproduce with the job's config, apply a fix, extend it until it passes, render it."""

from __future__ import annotations

from pathlib import Path

from diagnose.explain.config import ConfigView, apply_defaults
from diagnose.explain.replay import render_fix, replay
from diagnose.model import Evidence, Finding, Override

DATA = Path(__file__).parent / "data" / "configs"


def _view(settings: dict, version: str | None = "0.6.2", framework: str = "megatron-bridge") -> ConfigView:
    view = ConfigView(framework=framework, version=version)
    for key, value in settings.items():
        view.set(key, value, "log:3")
    return apply_defaults(view)


def _finding(rule: str, text: str) -> Finding:
    return Finding(rule=rule, name=rule.lower(), title="t", category="fsdp_config", phase="dp_wrap",
                   severity="error", role="root", confidence=0.9, evidence=[Evidence("job.log", 10, text)])


def test_turning_on_fsdp_with_checkpoint_save_extends_the_fix_with_fsdp_dtensor():
    view = _view({"checkpoint.save": "/ckpt", "model.num_layers": 4})
    result = replay(view, ["ddp.use_megatron_fsdp=true"])
    assert result.reproduced is False  # the job's config itself validates
    assert [(o.key, o.value) for o in result.added] == [("checkpoint.ckpt_format", "fsdp_dtensor")]
    assert result.passes
    render = result.rendered
    assert render["cli"] == "ddp.use_megatron_fsdp=true checkpoint.ckpt_format=fsdp_dtensor"
    assert render["python"] == "cfg.ddp.use_megatron_fsdp = True\ncfg.checkpoint.ckpt_format = 'fsdp_dtensor'"
    assert render["yaml"] == "ddp:\n  use_megatron_fsdp: true\ncheckpoint:\n  ckpt_format: fsdp_dtensor\n"
    d = result.to_dict()
    assert set(d) >= {"reproduced", "violations", "fix", "after_fix", "render"}
    assert d["after_fix"] == {"violations": [], "passes": True}
    assert d["fix"] == [{"key": "ddp.use_megatron_fsdp", "value": True},
                        {"key": "checkpoint.ckpt_format", "value": "fsdp_dtensor"}]


def test_extension_never_undoes_a_requested_override():
    view = _view({"checkpoint.save": "/ckpt"})
    result = replay(view, ["ddp.use_megatron_fsdp=false", "checkpoint.ckpt_format=fsdp_dtensor"])
    assert not result.passes
    assert result.added == []
    assert [v.check for v in result.after.violations] == ["fsdp_dtensor_only_megatron_fsdp"]


def test_reproduced_true_when_the_finding_message_is_a_violation_and_fix_is_proven():
    view = _view({"ddp.use_megatron_fsdp": True, "checkpoint.save": "/ckpt"})
    finding = _finding("MB111", "AssertionError: Megatron-FSDP requires the fsdp_dtensor checkpointing format!")
    result = replay(view, [Override("checkpoint.ckpt_format", "fsdp_dtensor")], finding=finding)
    assert result.reproduced is True
    d = result.to_dict()
    assert d["rule"] == "MB111" and d["proven"] is True
    assert d["summary"] == ("reproduced by replay: Megatron-FSDP requires the fsdp_dtensor checkpointing format!; "
                            "fix proven to pass validation: checkpoint.ckpt_format=fsdp_dtensor")
    assert d["violations"] == [{"check": "fsdp_requires_fsdp_dtensor",
                                "message": "Megatron-FSDP requires the fsdp_dtensor checkpointing format!",
                                "keys": ["ddp.use_megatron_fsdp", "checkpoint.ckpt_format"]}]


def test_reproduced_false_when_the_config_does_not_fail_that_way():
    view = _view({"ddp.use_megatron_fsdp": True, "checkpoint.save": "/ckpt", "checkpoint.ckpt_format": "fsdp_dtensor"})
    finding = _finding("MB111", "AssertionError: Megatron-FSDP requires the fsdp_dtensor checkpointing format!")
    assert replay(view, [Override("checkpoint.ckpt_format", "fsdp_dtensor")], finding=finding).reproduced is False


def test_unknown_config_gives_null_reproduced_and_no_proof():
    view = ConfigView()
    view.set("launch.world_size", 8, "log:2")  # a world size alone is not the job's config
    apply_defaults(view)
    finding = _finding("MB111", "AssertionError: Megatron-FSDP requires the fsdp_dtensor checkpointing format!")
    d = replay(view, [Override("checkpoint.ckpt_format", "fsdp_dtensor")], finding=finding).to_dict()
    assert d["reproduced"] is None and d["proven"] is None
    assert d["summary"].startswith("config not in the log")


def test_environment_fix_is_rendered_as_an_export_never_as_recipe_env_vars():
    # QA #3: Bridge applies cfg.env_vars with os.environ.setdefault, so an exported =1 wins over the recipe
    view = _view({"ddp.use_megatron_fsdp": True, "env.CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    result = replay(view, [])
    assert [v.check for v in result.before.violations] == ["fsdp_cuda_device_max_connections"]
    assert result.passes
    render = result.rendered
    assert render["env"] == "export CUDA_DEVICE_MAX_CONNECTIONS=32"
    assert "env_vars[" not in render["python"] and "env_vars:" not in render["yaml"]
    assert render["python"].startswith("# environment, in the launch script")
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=32" in render["python"]
    assert render["cli"] == ""


def test_a_recipe_env_vars_change_does_not_beat_the_exported_value():
    view = _view({"ddp.use_megatron_fsdp": True, "env.CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    result = replay(view, ["env_vars.CUDA_DEVICE_MAX_CONNECTIONS=32"], extend=False)
    assert not result.passes  # setdefault: the exported 1 is still what the job sees
    assert [v.check for v in result.after.violations] == ["fsdp_cuda_device_max_connections"]
    # with nothing exported the recipe value is applied
    fresh = _view({"ddp.use_megatron_fsdp": True})
    assert replay(fresh, ["env_vars.CUDA_DEVICE_MAX_CONNECTIONS=1"], extend=False).after.violations


def test_old_release_needs_no_env_fix():
    view = _view({"ddp.use_megatron_fsdp": True, "env.CUDA_DEVICE_MAX_CONNECTIONS": "1"}, version="0.4.2")
    assert replay(view, []).before.violations == []


def test_megatron_lm_job_gets_flags():
    view = _view({"model.tensor_model_parallel_size": 2, "model.num_attention_heads": 6}, framework="megatron-lm")
    fix = [Override("ddp.use_megatron_fsdp", True), Override("checkpoint.ckpt_format", "fsdp_dtensor"),
           Override("model.sequence_parallel", False)]
    assert render_fix(fix, "megatron-lm")["mlm"] == (
        "--use-megatron-fsdp --ckpt-format fsdp_dtensor (remove --sequence-parallel)")
    inverted = [Override("checkpoint.save_optim", False), Override("model.gradient_accumulation_fusion", True)]
    assert render_fix(inverted, "megatron-lm")["mlm"] == (
        "--no-save-optim (remove --no-gradient-accumulation-fusion)")


def test_unfixable_violation_stops_the_bounded_loop():
    view = _view({"launch.world_size": 7, "model.tensor_model_parallel_size": 1, "model.pipeline_model_parallel_size": 2,
                  "model.num_layers": 4})
    result = replay(view, [])
    assert not result.passes
    assert [v.check for v in result.after.violations] == ["world_size_divisible"]


def test_heads_not_divisible_fix_is_a_smaller_tp_that_validates():
    view = _view({"model.num_attention_heads": 12, "model.tensor_model_parallel_size": 8, "launch.world_size": 8,
                  "model.num_layers": 2, "model.hidden_size": 768})
    result = replay(view, [])
    # 6 divides the heads but not the 8 GPUs: the fix must be a TP both allow
    assert [(o.key, o.value) for o in result.fix] == [("model.tensor_model_parallel_size", 4)]
    assert result.passes
