"""A capacity OOM's fix is the memory model's first option that FITS (with the GPUs it needs), replayed valid;
replay reports both "valid" and "fits" (QA #2)."""

from __future__ import annotations

from pathlib import Path

import diagnose.explain.memory as memory
from diagnose.explain import enrich
from diagnose.memory_types import Breakdown, MemoryAnalysis, MemoryOption, MemoryPrediction, PhasePeaks
from diagnose.model import Evidence, Finding, Fix, Override, Report
from diagnose.pipeline import AnalyzeOptions, analyze

SAMPLES = Path(__file__).resolve().parent.parent / "sample_logs"
GIB = 1024 ** 3


def test_ddp_wrap_oom_fix_is_the_fitting_option_on_8_gpus():
    report = analyze([str(SAMPLES / "ddp_wrap_oom.log")], AnalyzeOptions())
    root = report.root
    assert root.rule == "OOM102" and report.memory.verdict == "capacity"
    replay = report.to_dict()["replay"]
    assert replay["fits"] is True and replay["after_fix"]["passes"] is True
    assert replay["fit"]["gpus"] == 8 and replay["fit"]["job_gpus"] == 1
    assert replay["fit"]["peak_bytes"] < replay["fit"]["capacity_bytes"]
    fix = {f["key"]: f["value"] for f in replay["fix"]}
    assert fix["ddp.use_megatron_fsdp"] is True and fix["launch.world_size"] == 8
    assert fix["ddp.data_parallel_sharding_strategy"] == "optim_grads_params"
    # the GPU count is stated in the summary and in the rendered fix, never as a Bridge override
    assert "needs >= 8 GPUs" in replay["summary"] and "fits" in replay["summary"]
    assert "valid" in replay["summary"]
    assert replay["render"]["python"].startswith("# needs >= 8 GPUs")
    assert replay["render"]["yaml"].startswith("# needs >= 8 GPUs")
    assert "launch." not in replay["render"]["cli"]
    # the finding's proven fix (what text/markdown/TUI show) is the same fitting set; the rule's fix stays beside it
    keys = {o.key: o.value for o in root.proven_fix.overrides}
    assert keys == {k: v for k, v in fix.items() if not k.startswith("launch.")}
    assert root.shown_fix is root.proven_fix and root.proven_fix.summary.startswith("needs >= 8 GPUs")
    assert root.fix.summary.startswith("Shard parameters") and not root.fix.summary.startswith("needs")
    assert report.to_dict()["findings"][report.root_cause]["fix"]["summary"].startswith("needs >= 8 GPUs")


def _oom() -> Finding:
    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB."
    return Finding(rule="OOM102", name="oom", title="CUDA OOM", category="cuda_oom", phase="dp_wrap",
                   severity="error", role="root", confidence=0.9, evidence=[Evidence("job.log", 5, text)],
                   fix=Fix(summary="shard with Megatron FSDP", safety="unsafe",
                           overrides=[Override("ddp.use_megatron_fsdp", True),
                                      Override("ddp.data_parallel_sharding_strategy", "optim_grads_params")]))


def _option(overrides: dict, **given) -> MemoryOption:
    fields = dict(label="", cost="", strategy="ddp", gpus=1, dp=1, tp=1, pp=1, cp=1, model_state_bytes=0,
                  transient_bytes=0, activation_bytes=None, peak_bytes=None, fits=False)
    return MemoryOption([Override(k, v) for k, v in overrides.items()], **{**fields, **given})


def _memory(options: list[MemoryOption], verdict: str = "capacity") -> MemoryAnalysis:
    """A memory section on an 80 GiB GPU for a job that ran on one GPU."""
    current = MemoryPrediction("ddp", 1, True, 1, "fp32", 18.0, 0, 0, Breakdown(), None, PhasePeaks(0, 0, 0, 0, 0),
                               peak_bytes=0, usable_bytes=76 * GIB)
    return MemoryAnalysis(80 * GIB, None, verdict, None, None, "dp_wrap", current=current, options=options)


def test_no_fitting_option_says_valid_but_does_not_fit(monkeypatch):
    opts = [_option({"ddp.use_megatron_fsdp": True, "ddp.data_parallel_sharding_strategy": "optim_grads_params"},
                    fits=False, peak_bytes=609 * GIB, valid=True, label="fsdp")]
    monkeypatch.setattr(memory, "run", lambda report, view, options: _memory(opts))
    report = Report(findings=[_oom()], root_cause=0)
    enrich(report, {}, AnalyzeOptions())
    assert report.replay.fits is False and report.to_dict()["replay"]["after_fix"]["passes"] is True
    assert "valid but does not fit: 609.0 GiB per GPU" in report.to_dict()["replay"]["summary"]
    assert report.findings[0].fix.summary == "shard with Megatron FSDP"  # the rule's fix is kept, not dressed up
    assert report.findings[0].proven_fix is None


def test_fitting_option_on_the_same_gpus_needs_no_launch_change(monkeypatch):
    opts = [_option({"ddp.grad_reduce_in_fp32": False}, fits=True, peak_bytes=60 * GIB, valid=True,
                    label="bf16 grads", cost="numerics")]
    monkeypatch.setattr(memory, "run", lambda report, view, options: _memory(opts))
    report = Report(findings=[_oom()], root_cause=0)
    enrich(report, {}, AnalyzeOptions())
    assert report.replay.fits is True
    assert report.to_dict()["replay"]["fix"] == [{"key": "ddp.grad_reduce_in_fp32", "value": False}]
    assert "launch" not in report.to_dict()["replay"]["render"] and "needs >=" not in report.to_dict()["replay"]["summary"]
    assert [o.key for o in report.findings[0].shown_fix.overrides] == ["ddp.grad_reduce_in_fp32"]
    assert [o.key for o in report.findings[0].fix.overrides] == ["ddp.use_megatron_fsdp",
                                                                 "ddp.data_parallel_sharding_strategy"]


def test_fits_is_null_when_memory_is_not_a_capacity_question():
    report = Report(findings=[Finding(rule="MB111", name="x", title="t", category="checkpoint_format",
                                      phase="init", severity="error", role="root", confidence=0.9,
                                      fix=Fix(overrides=[Override("checkpoint.ckpt_format", "fsdp_dtensor")]))],
                    root_cause=0)
    enrich(report, {}, AnalyzeOptions())
    assert report.replay.fits is None and "fit" not in report.to_dict()["replay"]


def test_fragmentation_verdict_makes_the_allocator_setting_lead_the_fix(monkeypatch):
    # QA (new #4): the memory section said fragmentation while the fix said "shard the optimizer state"
    frag = _memory([_option({"env.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, fits=True,
                            peak_bytes=74 * GIB, label="expandable segments")], verdict="fragmentation")
    monkeypatch.setattr(memory, "run", lambda report, view, options: frag)
    report = Report(findings=[_oom()], root_cause=0)
    enrich(report, {}, AnalyzeOptions())
    assert report.findings[0].fix == _oom().fix  # the rule's fix, untouched
    fix = report.findings[0].shown_fix
    assert [(e.name, e.value) for e in fix.env] == [("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")]
    assert fix.overrides == [] and fix.summary.startswith("Fragmentation: set PYTORCH_CUDA_ALLOC_CONF")
    assert any("ddp.use_megatron_fsdp" in step for step in fix.steps)  # the rule's advice is kept as a next step
    assert report.to_dict()["replay"]["render"]["env"] == "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert report.replay.fits is True


def test_an_option_whose_peak_exceeds_the_gpu_is_never_called_a_fit(monkeypatch):
    opts = [_option({"model.pipeline_model_parallel_size": 8}, gpus=8, pp=8, fits=True, peak_bytes=90 * GIB,
                    valid=True, label="PP 8")]
    monkeypatch.setattr(memory, "run", lambda report, view, options: _memory(opts))  # an 80 GiB GPU
    report = Report(findings=[_oom()], root_cause=0)
    enrich(report, {}, AnalyzeOptions())
    assert report.replay.fits is False and "does not fit" in report.to_dict()["replay"]["summary"]
    assert report.findings[0].fix.summary == "shard with Megatron FSDP"  # the rule's fix, not the contradicted option


def test_the_gpu_split_is_named_when_more_gpus_are_needed(monkeypatch):
    opts = [_option({"model.pipeline_model_parallel_size": 8}, gpus=8, pp=8, fits=True, peak_bytes=60 * GIB,
                    valid=True, label="PP 8")]
    monkeypatch.setattr(memory, "run", lambda report, view, options: _memory(opts))
    report = Report(findings=[_oom()], root_cause=0)
    enrich(report, {}, AnalyzeOptions())
    assert "needs >= 8 GPUs (PP 8 x DP 1; the job ran on 1)" in report.to_dict()["replay"]["summary"]
    assert report.findings[0].shown_fix.summary.startswith("needs >= 8 GPUs (PP 8 x DP 1")
