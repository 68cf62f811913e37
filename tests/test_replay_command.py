"""``diagnose replay`` end to end through the real CLI, and analyze's config/replay sections on a log that
carries its config."""

from __future__ import annotations

import json
from pathlib import Path

from diagnose.present.cli import main

DATA = Path(__file__).parent / "data" / "configs"


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_replay_yaml_with_fix_that_gets_extended_exits_1_and_shows_the_complete_set(capsys):
    rc = main(["replay", str(DATA / "run_config.yaml"), "--bridge-version", "0.4.2", "--gpus", "8",
               "--set", "dist.use_torch_fsdp2=false", "--set", "ddp.use_megatron_fsdp=true", "--format", "json"])
    assert rc == 1  # the requested set alone trips the fsdp_dtensor check (checkpoint.save is set)
    d = _json(capsys)
    assert d["requested_passes"] is False
    assert d["schema"] == "diagnose/replay@1"
    assert d["config"]["values"]["dist.use_torch_fsdp2"] == {"value": True, "from": "file:run_config.yaml"}
    assert d["config"]["values"]["launch.world_size"] == {"value": 8, "from": "override"}
    r = d["replay"]
    assert r["reproduced"] is True  # bridge 0.4.2 + use_torch_fsdp2: the pg_collection TypeError
    assert [v["check"] for v in r["violations"]] == ["fsdp2_pg_collection"]
    assert r["after_fix"] == {"violations": [], "passes": True}
    assert r["render"]["cli"] == ("dist.use_torch_fsdp2=false ddp.use_megatron_fsdp=true "
                                  "checkpoint.ckpt_format=fsdp_dtensor")


def test_replay_complete_set_exits_0(capsys):
    rc = main(["replay", str(DATA / "run_config.yaml"), "--bridge-version", "0.4.2", "--set",
               "dist.use_torch_fsdp2=false", "--set", "ddp.use_megatron_fsdp=true", "--set",
               "checkpoint.ckpt_format=fsdp_dtensor"])
    assert rc == 0
    assert "passes validation" in capsys.readouterr().out


def test_replay_without_fix_on_new_release_exits_1_for_remaining_violation(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 8\n"
                   "  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n"
                   "ddp:\n  use_megatron_fsdp: true\ndist:\n  use_torch_fsdp2: true\n")
    rc = main(["replay", str(cfg), "--set", "dist.use_torch_fsdp2=true", "--set", "ddp.use_megatron_fsdp=true",
               "--format", "json"])
    assert rc == 1  # the requested set keeps both FSDP flags: no compatible extension exists
    d = _json(capsys)
    assert [v["message"] for v in d["replay"]["after_fix"]["violations"]] == [
        "use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive."]


def test_replay_text_output_and_bad_inputs(capsys, tmp_path):
    assert main(["replay", str(DATA / "mlm_arguments.log")]) == 1
    out = capsys.readouterr().out
    assert "fsdp_requires_fsdp_dtensor" in out and "mlm:" in out
    assert main(["replay", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert main(["replay", str(DATA / "run_config.yaml"), "--set", "not-a-pair"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
    assert main(["replay", str(DATA / "billion_laughs.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "alias" in err


def test_replay_text_makes_log_text_inert(capsys, tmp_path):
    cfg = tmp_path / "evil.yaml"
    cfg.write_text('model:\n  num_layers: 2\ncheckpoint:\n  save: "/x\\e[31mRED"\n')
    assert main(["replay", str(cfg), "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[31m" not in out


def test_analyze_log_with_config_reproduces_and_proves_the_fix(capsys):
    rc = main(["analyze", str(DATA / "bridge042_fsdp2_with_config.log"), "--format", "json", "--no-progress"])
    assert rc == 1
    d = _json(capsys)
    config = d["config"]
    assert config["framework"] == "megatron-bridge"
    assert config["version"] == "0.3.1-0.4.2"
    assert config["values"]["dist.use_torch_fsdp2"] == {"value": True, "from": "log:1"}
    assert config["values"]["model.num_layers"]["from"].startswith("log:")
    replay = d["replay"]
    assert replay["reproduced"] is True
    assert replay["proven"] is True and replay["after_fix"]["passes"] is True
    assert {"key": "checkpoint.ckpt_format", "value": "fsdp_dtensor"} in replay["fix"]
    root = d["findings"][d["root_cause"]]
    assert root["facts"]["replay"]["proven"] is True


def test_replay_on_a_log_replays_the_root_cause_fix(capsys):
    rc = main(["replay", str(DATA / "bridge042_fsdp2_with_config.log"), "--format", "json"])
    assert rc == 1  # the job's config failed (as for a config file with the same violation); the fix is proven
    r = _json(capsys)["replay"]
    assert r["rule"] == "MB101" and r["reproduced"] is True and r["proven"] is True


def test_replay_on_a_log_with_a_user_fix_and_no_config_is_checked_against_implied_settings(capsys, tmp_path):
    log = tmp_path / "job.log"
    log.write_text("[rank0]: Traceback (most recent call last):\n"
                   "[rank0]: ValueError: num_attention_heads (12) must be a multiple of tensor_model_parallel_size (8).\n")
    assert main(["replay", str(log), "--set", "model.tensor_model_parallel_size=5", "--format", "json"]) == 1
    r = _json(capsys)["replay"]
    # the validator prints the log's failure from the settings the message states (QA #4)
    assert r["reproduced"] is True and r["implied"] is True
    assert r["after_fix"]["violations"][0]["message"] == (
        "num_attention_heads (12) must be a multiple of tensor_model_parallel_size (5).")
    assert main(["replay", str(log), "--set", "model.tensor_model_parallel_size=4"]) == 0
    capsys.readouterr()


def test_replay_on_a_log_without_any_config_is_bad_input(capsys, tmp_path):
    log = tmp_path / "job.log"
    log.write_text("[rank0]: Traceback (most recent call last):\n[rank0]: RuntimeError: something else\n")
    assert main(["replay", str(log)]) == 2
    assert "no configuration found" in capsys.readouterr().err


def test_replay_text_names_the_check_the_overrides_trip_on_a_passing_config(capsys):
    # QA #13: the config as given passes; the user's override trips the checkpoint check
    rc = main(["replay", str(DATA / "llama8b_bridge.yaml"), "--set", "ddp.use_megatron_fsdp=true",
               "--set", "checkpoint.save=/ckpt", "--color", "never"])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 1  # documented: the requested overrides alone do not pass
    assert "as given: no violations" in out
    assert "your overrides trip fsdp_requires_fsdp_dtensor; passes with the complete fix above" in out
    assert "fails as given" not in out
    assert "(extended with: checkpoint.ckpt_format=fsdp_dtensor)" in out


def test_replay_text_does_not_repeat_the_whole_fix_as_an_extension(capsys):
    main(["replay", str(DATA / "run_config.yaml"), "--bridge-version", "0.4.2", "--color", "never"])
    out = " ".join(capsys.readouterr().out.split())
    assert "extended with" not in out
    assert "fix (suggested by the validator): dist.use_torch_fsdp2=false" in out
    assert "fails as given; passes with the complete fix above" in out


def test_replay_on_a_capacity_oom_log_proves_the_fitting_option_with_its_gpus(capsys):
    samples = Path(__file__).resolve().parent.parent / "sample_logs"
    assert main(["replay", str(samples / "ddp_wrap_oom.log"), "--format", "json"]) == 1  # the job's config OOMed
    r = _json(capsys)["replay"]
    assert r["fits"] is True and r["fit"]["gpus"] == 8
    assert {"key": "launch.world_size", "value": 8} in r["fix"]
    main(["replay", str(samples / "ddp_wrap_oom.log"), "--color", "never"])
    out = capsys.readouterr().out
    # the log gives no model shape: only the model state is sized, and the words say so (fixer40, qa-12 L2)
    assert "memory: the model state fits: needs >= 8 GPUs (DP 8; the job ran on 1)" in " ".join(out.split())
    assert "activations not counted" in " ".join(out.split())
    # the Python form's comment stays one line (a wrapped comment would be broken Python)
    assert any(line.startswith("# needs >= 8 GPUs") and line.endswith("(1 node x 8 GPUs)") for line in out.splitlines())


def _fix_block(out: str) -> list[str]:
    """The "fix...:" line of replay's text output and its indented continuation lines."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("fix"))
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith(" "):
            break
        block.append(line)
    return block


def test_replay_text_fix_shows_the_exports_then_the_bridge_cli(capsys):
    """An env.* override and config overrides together: both are shown, export lines first, each on its line, in
    the one renderer's words (shell-quoted value with a space)."""
    from diagnose.explain.render import cli_line, env_line
    from diagnose.model import Override

    rc = main(["replay", str(DATA / "llama8b_bridge.yaml"), "--set", "env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
               "--set", "ddp.use_megatron_fsdp=true", "--set", "checkpoint.save=/ckpt dir", "--color", "never"])
    assert rc == 1  # fsdp without fsdp_dtensor: extended
    block = _fix_block(capsys.readouterr().out)
    assert len(block) == 2
    label, export = block[0].split(": ", 1)
    assert label == "fix" and export == env_line("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    cli = block[1].strip().split("  (extended with: ")[0]
    assert cli == cli_line([Override("ddp.use_megatron_fsdp", True), Override("checkpoint.save", "/ckpt dir"),
                            Override("checkpoint.ckpt_format", "fsdp_dtensor")])
    assert "'checkpoint.save=\"/ckpt dir\"'" in cli  # Hydra quotes, then shell quotes
    assert block[1].startswith(" " * len("fix: ")) and block[1].endswith("(extended with: checkpoint.ckpt_format=fsdp_dtensor)")


def test_replay_text_env_only_fix_is_the_export_line(capsys):
    assert main(["replay", str(DATA / "llama8b_bridge.yaml"), "--set", "env.NCCL_DEBUG=INFO", "--color", "never"]) == 0
    assert _fix_block(capsys.readouterr().out) == ["fix: export NCCL_DEBUG=INFO"]


def test_fix_lines_order_and_launch_only_fallback():
    from diagnose.explain.render import render_fix
    from diagnose.model import Override
    from diagnose.present.commands.replay import fix_lines

    both = render_fix([Override("ddp.use_megatron_fsdp", True), Override("env.A", "1 2"), Override("env.B", "x")])
    assert fix_lines(both) == ["export A='1 2'", "export B=x", "ddp.use_megatron_fsdp=true"]
    launch = render_fix([Override("launch.world_size", 8)])
    assert fix_lines(launch) == [launch["launch"]] and launch["launch"].startswith("# needs >= 8 GPUs")
    assert fix_lines(render_fix([])) == []


def test_replay_exits_the_same_on_a_log_and_on_its_config(capsys, tmp_path):
    """Issue 16: the same violation gave exit 0 on the log (its fix passed) and 1 on the config file."""
    log = DATA / "bridge042_fsdp2_with_config.log"
    assert main(["replay", str(log), "--format", "json"]) == 1
    fix = _json(capsys)["replay"]["fix"]
    sets = [f"{o['key']}={str(o['value']).lower() if isinstance(o['value'], bool) else o['value']}" for o in fix]
    argv = ["replay", str(log), "--format", "json"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0  # the same config with the proven fix, given by the user: passes
    capsys.readouterr()
