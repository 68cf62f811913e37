"""``reproduced`` (QA #1, #4): the settings an error message states are merged into a partly known config (the log
wins where it states a value); true when the validator prints the log's failure on them, null when the deciding keys
are only release defaults, never false on a config the tool barely knows."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.explain import build_view, enrich
from diagnose.explain.config.extract import blocks_from_lines, lines_of
from diagnose.match import load_catalogue
from diagnose.model import Evidence, Finding, Fix, Override, Report
from diagnose.pipeline import AnalyzeOptions, analyze

CATALOGUE = load_catalogue()

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_logs"
DATA = Path(__file__).parent / "data" / "configs"


def _finding(text: str, rule: str = "MB111", fix: list[Override] | None = None) -> Finding:
    """A finding of ``rule`` on line 9, carrying what that rule's message states (as the matcher's would)."""
    implies = CATALOGUE.by_code(rule).implies if CATALOGUE.by_code(rule) else None
    return Finding(rule=rule, name="x", title="config failure", category="checkpoint_format", phase="init",
                   severity="error", role="root", confidence=0.9, first_line=9,
                   evidence=[Evidence("job.log", 9, text)],
                   fix=Fix(overrides=fix or [Override("checkpoint.ckpt_format", "fsdp_dtensor")]), implies=implies)


def _blocks(text: str, tmp_path: Path) -> dict:
    log = tmp_path / "job.log"
    log.write_text(text)
    return blocks_from_lines(lines_of(log.read_text(), str(log)))


def test_world_size_line_does_not_switch_off_the_settings_the_error_states(tmp_path):
    # QA #1: a single 'using world size' line used to make replay run on defaults and say "not reproduced"
    text = ((SAMPLES / "mlm_main_ckpt_format.log").read_text().splitlines()[0] + "\n"
            "AssertionError: Megatron-FSDP requires the `fsdp_dtensor` checkpointing format.\n")
    report = Report(findings=[_finding("AssertionError: Megatron-FSDP requires the `fsdp_dtensor` checkpointing "
                                       "format.")], root_cause=0)
    enrich(report, _blocks(text, tmp_path), AnalyzeOptions())
    values = report.to_dict()["config"]["values"]
    assert values["launch.world_size"]["from"].startswith("log:")
    assert values["ddp.use_megatron_fsdp"] == {"value": True, "from": "implied:log:9"}
    replay = report.to_dict()["replay"]
    assert replay["reproduced"] is True and replay["implied"] is True and replay["proven"] is True
    assert [v["check"] for v in replay["violations"]] == ["fsdp_requires_fsdp_dtensor"]
    assert "not reproduced" not in replay["summary"]


def test_the_log_wins_over_the_settings_the_error_states():
    lines = lines_of((DATA / "task_configuration.log").read_text(), "job.log")
    blocks = blocks_from_lines(lines)
    report = Report(findings=[_finding("AssertionError: fsdp_dtensor checkpoint format only supports Megatron FSDP", "MB112",
                                       fix=[Override("ddp.use_megatron_fsdp", True)])], root_cause=0)
    view = build_view(report, blocks)
    assert view.get("ddp.use_megatron_fsdp") is True and view.origin("ddp.use_megatron_fsdp").startswith("log:")


def test_null_not_false_when_the_deciding_keys_are_only_defaults(tmp_path):
    # the message names no settings the tool can read, the config is not in the log: replay cannot say
    text = (SAMPLES / "mlm_main_ckpt_format.log").read_text().splitlines()[0] + "\n"
    finding = _finding("RuntimeError: checkpoint format problem", "PY001")
    report = Report(findings=[finding], root_cause=0)
    enrich(report, _blocks(text, tmp_path), AnalyzeOptions())
    assert report.to_dict()["replay"]["reproduced"] is None
    assert report.to_dict()["replay"]["proven"] is None
    assert "passes these checks" not in report.to_dict()["replay"]["summary"]


def test_false_only_when_the_job_own_config_passes(tmp_path):
    report = Report(findings=[_finding("RuntimeError: checkpoint format problem", "PY001")], root_cause=0)
    enrich(report, blocks_from_lines(lines_of((DATA / "task_configuration.log").read_text(), "job.log")),
           AnalyzeOptions())
    # the job's config (from its Task Configuration) sets checkpoint.ckpt_format itself and passes that check
    assert report.to_dict()["config"]["values"]["checkpoint.ckpt_format"]["from"].startswith("log:")
    assert report.to_dict()["replay"]["reproduced"] is False


@pytest.mark.parametrize("name", [
    "mbridge04_fsdp2_pg_collection_srun.log",
    "captured/b042_fsdp2_pg_collection.log",
    "mlm_main_ckpt_format.log",
    "mlm_tp_max_connections.log",
    "mlm016_fsdp_max_connections_old.log",
])
def test_sample_logs_that_carry_config_show_reproduced_and_proven(name):
    # issue 3: analyze on a log that carries its config shows "reproduced by replay" and the proven overrides
    report = analyze([str(SAMPLES / name)], AnalyzeOptions())
    replay = report.to_dict()["replay"]
    assert replay["rule"] == report.root.rule
    assert replay["reproduced"] is True and replay["proven"] is True
    assert replay["summary"].startswith("reproduced by replay")
    assert "fix proven to pass validation" in replay["summary"]
    assert report.root.replay.reproduced is True


def test_reproduced_from_the_log_own_setting_is_not_called_implied():
    # the launch line sets dist.use_torch_fsdp2=true: the violation's key is the log's, not the error's
    report = analyze([str(SAMPLES / "mbridge04_fsdp2_pg_collection_srun.log")], AnalyzeOptions())
    replay = report.to_dict()["replay"]
    assert replay["reproduced"] is True and "implied" not in replay
    assert report.to_dict()["config"]["values"]["dist.use_torch_fsdp2"]["from"].startswith("log:")
    assert replay["summary"].startswith("reproduced by replay: ")


def test_an_oom_on_a_known_config_is_not_called_unreproduced(tmp_path):
    oom = Finding(rule="OOM103", name="oom", title="CUDA OOM", category="cuda_oom", phase="first_iteration",
                  severity="error", role="root", confidence=0.9,
                  evidence=[Evidence("job.log", 50, "torch.OutOfMemoryError: CUDA out of memory.")],
                  fix=Fix(overrides=[Override("ddp.use_megatron_fsdp", True)]))
    report = Report(findings=[oom], root_cause=0)
    enrich(report, blocks_from_lines(lines_of((DATA / "task_configuration.log").read_text(), "job.log")),
           AnalyzeOptions())
    assert report.to_dict()["replay"]["summary"].startswith("the job's config passes validation (a cuda_oom failure is not a "
                                               "config check)")
    assert "not reproduced" not in report.to_dict()["replay"]["summary"]
