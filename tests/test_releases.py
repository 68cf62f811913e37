"""Release families through the newest Megatron-Bridge: ``dist.use_megatron_fsdp`` moved to ``ddp`` (>= 0.7)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from diagnose.configview import ConfigView
from diagnose.explain.config import apply_defaults
from diagnose.explain.config.releases import assumed_release, field_exists, release_family
from diagnose.explain.replay import replay
from diagnose.explain.validate import run_checks
from diagnose.match import load_catalogue, match_text
from diagnose.present.cli import main
from diagnose.present.commands.schema import schema_text

STALE_YAML = """\
dist:
  use_megatron_fsdp: true
ddp:
  data_parallel_sharding_strategy: optim_grads_params
checkpoint:
  ckpt_format: fsdp_dtensor
  save: /ckpt
"""


def _view(values: dict, origin: str = "file:run_config.yaml") -> ConfigView:
    view = ConfigView()
    for key, value in values.items():
        view.set(key, value, origin)
    return apply_defaults(view)


@pytest.mark.parametrize("version, family", [
    ("0.4.2", "old"), ("0.5.0", "new"), ("0.6.0", "new"), ("0.7.0", "latest"), ("0.7.1", "latest"),
    (">=0.7.0", "latest"), (">=0.5.0", "new"), (None, "new"),
])
def test_release_family(version, family):
    assert release_family(version) == family


def test_field_exists_per_release():
    assert field_exists("dist.use_megatron_fsdp", "0.6.0") is True
    assert field_exists("dist.use_megatron_fsdp", "0.7.0") is False
    assert field_exists("dist.use_megatron_fsdp", None) is None
    assert field_exists("dist.use_megatron_fsdp", ">=0.5.0") is None  # could be either side of the move
    assert field_exists("ddp.use_megatron_fsdp", "0.7.0") is True


def test_stale_field_on_latest_is_flagged_and_the_migration_is_proven():
    view = _view({"dist.use_megatron_fsdp": True, "ddp.data_parallel_sharding_strategy": "optim_grads_params",
                  "checkpoint.ckpt_format": "fsdp_dtensor", "checkpoint.save": "/ckpt"})
    result = replay(view, None, "0.7.0", real_mcore=False)
    checks = {v.check for v in result.before.violations}
    assert "stale_moved_field" in checks
    # a YAML key is skipped with this warning on >= 0.7 (omegaconf_utils._apply_overrides)
    assert any("in overrides not found in config object DistributedInitConfig" in v.message
               for v in result.before.violations)
    fix = {o.key: o.value for o in result.fix}
    assert fix["ddp.use_megatron_fsdp"] is True
    assert "dist.use_megatron_fsdp" in fix  # deleted
    assert "checkpoint.ckpt_format" not in fix  # the migration, not a switch away from fsdp_dtensor
    assert result.passes
    out = result.to_dict()
    assert out["after_fix"]["passes"] is True
    assert "'~dist.use_megatron_fsdp'" in out["render"]["cli"] and "ddp.use_megatron_fsdp=true" in out["render"]["cli"]
    assert "cfg.dist.use_megatron_fsdp = " not in out["render"]["python"]  # no assignment to a removed field
    assert out["assumed_release"].startswith("Megatron-Bridge >= 0.7.0")


@pytest.mark.parametrize("version", ["0.6.0", "0.5.0", "0.4.2"])
def test_same_config_passes_on_older_releases(version):
    view = _view({"dist.use_megatron_fsdp": True, "ddp.data_parallel_sharding_strategy": "optim_grads_params",
                  "checkpoint.ckpt_format": "fsdp_dtensor", "checkpoint.save": "/ckpt"})
    result = run_checks(view, version, real_mcore=False)
    assert result.passes, [v.message for v in result.violations]
    assert version in result.assumed_release


def test_unknown_release_gets_a_note_not_a_violation():
    view = _view({"dist.use_megatron_fsdp": True, "checkpoint.ckpt_format": "fsdp_dtensor"})
    result = run_checks(view, None, real_mcore=False)
    assert result.passes
    assert any(n.check == "stale_moved_field" and "ddp.use_megatron_fsdp" in n.message for n in result.notes)
    assert "release unknown" in result.assumed_release


def test_command_line_override_of_the_moved_field_is_refused_on_latest():
    view = _view({}, origin="default")
    result = run_checks(_with_override(view, "dist.use_megatron_fsdp", True), "0.7.0", real_mcore=False)
    assert [v.message for v in result.violations if v.check == "stale_moved_field"] == [
        "Could not override 'dist.use_megatron_fsdp'."]
    # and on 0.6 the same override is fine
    assert not [v for v in run_checks(_with_override(view, "dist.use_megatron_fsdp", True), "0.6.0",
                                       real_mcore=False).violations if v.check == "stale_moved_field"]


def _with_override(view: ConfigView, key: str, value) -> ConfigView:
    out = view.copy()
    out.set(key, value, "override")
    return out


def test_exclusivity_on_latest_reads_ddp_use_megatron_fsdp():
    # dist.use_megatron_fsdp does nothing on >= 0.7, so with FSDP2 there is no exclusivity error there ...
    stale = _view({"dist.use_megatron_fsdp": True, "dist.use_torch_fsdp2": True})
    assert "fsdp_exclusive" not in {v.check for v in run_checks(stale, "0.7.0", real_mcore=False).violations}
    assert "fsdp_exclusive" in {v.check for v in run_checks(stale, "0.6.0", real_mcore=False).violations}
    # ... while ddp.use_megatron_fsdp with FSDP2 is refused on every release
    both = _view({"ddp.use_megatron_fsdp": True, "dist.use_torch_fsdp2": True})
    for version in ("0.4.2", "0.6.0", "0.7.0"):
        assert "fsdp_exclusive" in {v.check for v in run_checks(both, version, real_mcore=False).violations}


def test_megatron_fsdp_v2_selected_by_ddp_version_on_latest():
    view = _view({"ddp.use_megatron_fsdp": True, "ddp.megatron_fsdp_version": 3})
    assert "megatron_fsdp_version" in {v.check for v in run_checks(view, "0.7.0", real_mcore=False).violations}


def test_replay_cli_flags_on_latest_and_passes_on_older(tmp_path, capsys):
    cfg = tmp_path / "run_config.yaml"
    cfg.write_text(STALE_YAML)
    assert main(["replay", str(cfg), "--bridge-version", "0.7.0", "--format", "json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    jsonschema.validate(payload, json.loads(schema_text("replay")))
    section = payload["replay"]
    assert section["after_fix"]["passes"] is True
    assert {"key": "ddp.use_megatron_fsdp", "value": True} in section["fix"]
    assert {"key": "dist.use_megatron_fsdp", "value": None} in section["fix"]
    assert main(["replay", str(cfg), "--bridge-version", "0.6.0", "--format", "json"]) == 0
    capsys.readouterr()
    assert main(["replay", str(cfg), "--bridge-version", "0.7.0", "--color", "never"]) == 1
    text = " ".join(capsys.readouterr().out.split())  # rich wraps at the console width
    assert "validated as: Megatron-Bridge >= 0.7.0 (release 0.7.0)" in text


@pytest.mark.parametrize("line, code", [
    ("megatron.bridge.training.utils.omegaconf_utils.OverridesError: Failed to parse Hydra overrides: "
     "Could not override 'dist.use_megatron_fsdp'.", "MB151"),
    ("TypeError: DistributedInitConfig.__init__() got an unexpected keyword argument 'use_megatron_fsdp'", "MB151"),
    ("Key 'use_megatron_fsdp' in overrides not found in config object DistributedInitConfig. Skipping.", "MB152"),
])
def test_stale_override_errors_are_recognised(line, code):
    report = match_text(line, load_catalogue([]))
    assert code in {f.rule for f in report.findings}
    finding = next(f for f in report.findings if f.rule == code)
    assert "ddp.use_megatron_fsdp" in {o.key for o in finding.fix.overrides}


def test_assumed_release_wording():
    assert assumed_release("0.4.2") == "Megatron-Bridge <= 0.4.x (release 0.4.2)"
    assert "megatron-core" in assumed_release(None, "megatron-lm")


def test_analyze_of_the_refused_override_proves_the_migration(capsys):

    log = Path(__file__).resolve().parent.parent / "sample_logs" / "bridge07_dist_use_megatron_fsdp_override.log"
    assert main(["analyze", str(log), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["findings"][report["root_cause"]]["rule"] == "MB151"
    section = report["replay"]
    assert section["reproduced"] is True and section["implied"] is True and section["proven"] is True
    assert section["render"]["cli"] == "ddp.use_megatron_fsdp=true '~dist.use_megatron_fsdp'"
    assert all(e["value"] is None for e in section.get("extended", []))  # a deletion is null in JSON


WHEELS = Path(__file__).resolve().parent.parent / ".whl" / "new"


@pytest.mark.skipif(not any(WHEELS.glob("megatron_bridge-0.6.*.whl")) or not any(WHEELS.glob("megatron_core-*.whl")),
                    reason="the released wheels are not carried (.whl/new: sample_logs/reproduce/README.md)")
def test_the_mirror_agrees_with_the_released_0_6_source():
    """Read (not import: they need Python 3.12 and torch) the released Megatron-Bridge 0.6.x and megatron-core wheels:
    0.6 still has dist.use_megatron_fsdp and reads it in validate(); a YAML key the dataclass lacks is skipped with
    the warning the stale-field check prints."""
    import ast
    import zipfile

    from diagnose.explain.validate.checks_fsdp import MSG_BOTH_FSDP_NEW, MSG_STALE_SKIPPED

    bridge = zipfile.ZipFile(next(WHEELS.glob("megatron_bridge-0.6.*.whl")))
    core = zipfile.ZipFile(next(WHEELS.glob("megatron_core-*.whl")))
    common = ast.parse(core.read("megatron/training/config/common_config.py"))
    cls = next(n for n in ast.walk(common) if isinstance(n, ast.ClassDef) and n.name == "DistributedInitConfig")
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert "use_megatron_fsdp" in fields and "use_torch_fsdp2" in fields
    assert field_exists("dist.use_megatron_fsdp", "0.6.2") is True
    config = bridge.read("megatron/bridge/training/config.py").decode()
    assert "class DistributedInitConfig(MTrainDistributedInitConfig)" in config
    assert "if self.dist.use_megatron_fsdp or self.ddp.use_megatron_fsdp:" in config
    assert MSG_BOTH_FSDP_NEW in config
    utils = bridge.read("megatron/bridge/training/utils/omegaconf_utils.py").decode()
    template = MSG_STALE_SKIPPED.replace("{leaf}", "{key}").replace("{owner}", "{type(config_obj).__name__}")
    assert template in utils.replace('"\n                f"', "").replace("f\"", "")
