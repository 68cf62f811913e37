"""``enrich()``: config and replay sections from captured blocks, the memory model called, failures isolated."""

from __future__ import annotations

from pathlib import Path

import diagnose.explain.memory as memory
from diagnose.explain import enrich
from diagnose.explain.config.extract import blocks_from_lines, lines_of
from diagnose.memory_types import MemoryAnalysis
from diagnose.model import Evidence, Finding, Fix, Override, Report
from diagnose.pipeline import AnalyzeOptions

DATA = Path(__file__).parent / "data" / "configs"


def _blocks(name: str) -> dict:
    path = DATA / name
    return blocks_from_lines(lines_of(path.read_text(), str(path)))


def _oom_finding() -> Finding:
    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    return Finding(rule="OOM103", name="oom", title="CUDA OOM", category="cuda_oom", phase="first_iteration",
                   severity="error", role="root", confidence=0.9, evidence=[Evidence("job.log", 50, text)],
                   fix=Fix(summary="shard with Megatron FSDP", safety="unsafe",
                           overrides=[Override("ddp.use_megatron_fsdp", True)]))


def test_enrich_fills_config_and_proves_an_extended_fix():
    report = Report(findings=[_oom_finding()], root_cause=0)
    enrich(report, _blocks("task_configuration.log"), AnalyzeOptions())
    assert report.to_dict()["config"]["framework"] == "megatron-bridge"
    assert report.to_dict()["config"]["values"]["model.tensor_model_parallel_size"]["value"] == 2
    replay = report.to_dict()["replay"]
    # the OOM is not a validation failure; the job already had FSDP with fsdp_dtensor, so nothing is added
    assert replay["reproduced"] is False
    assert replay["after_fix"]["passes"] is True and replay["proven"] is True
    assert "extended" not in replay
    assert report.findings[0].replay.proven is True


def test_enrich_extends_a_rule_fix_that_trips_the_checkpoint_check(tmp_path):
    log = tmp_path / "job.log"
    log.write_text((DATA / "task_configuration.log").read_text().replace("ckpt_format: fsdp_dtensor", "")
                   .replace("use_megatron_fsdp: true", "use_megatron_fsdp: false"))
    report = Report(findings=[_oom_finding()], root_cause=0)
    enrich(report, blocks_from_lines(lines_of(log.read_text(), str(log))), AnalyzeOptions())
    assert report.to_dict()["replay"]["extended"] == [{"key": "checkpoint.ckpt_format", "value": "fsdp_dtensor"}]
    assert report.to_dict()["replay"]["render"]["cli"] == "ddp.use_megatron_fsdp=true checkpoint.ckpt_format=fsdp_dtensor"
    assert report.findings[0].replay.to_dict()["added"] == [{"key": "checkpoint.ckpt_format", "value": "fsdp_dtensor"}]


def test_enrich_without_config_leaves_replay_unproven():
    report = Report(findings=[_oom_finding()], root_cause=0)
    enrich(report, {}, AnalyzeOptions())
    assert report.to_dict()["config"]["values"] == {} and report.to_dict()["config"]["framework"] is None
    assert report.to_dict()["replay"]["reproduced"] is None and report.to_dict()["replay"]["proven"] is None


def test_enrich_reads_an_explicit_config_file_and_the_log_wins():
    report = Report(findings=[], root_cause=None)
    enrich(report, _blocks("task_configuration.log"), AnalyzeOptions(config_path=str(DATA / "run_config.yaml")))
    values = report.to_dict()["config"]["values"]
    assert values["dist.use_torch_fsdp2"] == {"value": False, "from": values["dist.use_torch_fsdp2"]["from"]}
    assert values["dist.use_torch_fsdp2"]["from"].startswith("log:")
    assert values["train.micro_batch_size"]["value"] == 1  # log (file has 2)
    assert "file:run_config.yaml" in report.to_dict()["config"]["source"]


def test_bad_config_file_is_a_warning_not_a_crash(tmp_path):
    report = Report()
    enrich(report, {}, AnalyzeOptions(config_path=str(tmp_path / "missing.yaml")))
    assert report.config is None
    assert any("config file not found" in w for w in report.warnings)


def test_memory_model_failure_is_isolated(monkeypatch):
    # Simulated failure of another stage's component: the contract under test is that enrich() keeps the
    # config and replay sections and reports one warning line.
    def broken(report, view, options):
        raise RuntimeError("boom")

    monkeypatch.setattr(memory, "run", broken)
    report = Report(findings=[_oom_finding()], root_cause=0)
    enrich(report, _blocks("task_configuration.log"), AnalyzeOptions())
    assert report.config is not None and report.replay is not None
    assert report.warnings == ["memory model failed: RuntimeError: boom"]


def test_memory_model_receives_the_view(monkeypatch):
    seen = {}
    answer = MemoryAnalysis(None, None, "unknown", None, None, "training")

    def spy(report, view, options):
        seen["tp"] = view.get("model.tensor_model_parallel_size")
        seen["origin"] = view.origin("model.tensor_model_parallel_size")
        return answer

    monkeypatch.setattr(memory, "run", spy)
    report = Report(findings=[_oom_finding()], root_cause=0)
    enrich(report, _blocks("task_configuration.log"), AnalyzeOptions())
    assert seen["tp"] == 2 and seen["origin"].startswith("log:")
    assert report.memory is answer


def test_a_key_the_fix_deletes_is_null_in_the_json_not_a_python_object():
    """issue 17: a finding's ``facts["replay"]["added"]`` printed the ``~key`` sentinel as
    ``"<object object at 0x...>"``, a different string on every run."""
    from diagnose.model import is_delete
    from diagnose.pipeline import analyze
    from diagnose.present.json_report import render_json

    log = Path(__file__).parent.parent / "sample_logs" / "bridge07_dist_use_megatron_fsdp_override.log"
    report = analyze([str(log)], AnalyzeOptions())
    deleted = [(f, o.key) for f in report.findings if f.replay for o in f.replay.added if is_delete(o)]
    assert deleted
    assert "<object object" not in render_json(report)
    for finding, key in deleted:
        added = report.to_dict()["findings"][report.findings.index(finding)]["facts"]["replay"]["added"]
        assert {"key": key, "value": None} in added
