"""One answer per job (issue 16): analyze, replay, check and the TUI plan use the same parameter count, the same
layout and the same memory verdict, and every fix shown is checked against memory as well as validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose.model import Override

CAPTURED = Path(__file__).resolve().parents[1] / "sample_logs" / "captured"
B062 = CAPTURED / "b062_first_iter_activation_oom.log"
DDP_WRAP = CAPTURED / "b042_ddp_wrap_oom.log"


@pytest.fixture(scope="module")
def b062():
    if not B062.exists():
        pytest.skip("b062_first_iter_activation_oom.log not in this checkout")
    from diagnose.pipeline import analyze

    return analyze([str(B062)])


def test_root_cause_fix_is_checked_against_memory(b062):
    """Full recompute is the rule's fix: it validates, and the memory model (the same one as the MEMORY section)
    says it does not fit. A fix the tool's own model refutes does not lead (qa-report-12 L1): the cheapest option
    that fits does, proven by replay, and a note names the rule's fix with the MEMORY section's peak for it."""
    from diagnose.units import fmt_gib

    replay, memory = b062.replay, b062.memory
    assert replay.passes is True
    same = next(o for o in memory.options if o.label == "full recompute")
    assert same.fits is False
    assert replay.fits is True and replay.fit.fits is True
    best = next(o for o in memory.options if o.fits)
    assert replay.fit.label == best.label and replay.fit.peak_bytes == best.peak_bytes
    assert "fits" in replay.summary and "does not fit" not in replay.summary
    (note,) = [n for n in replay.fit.notes if "rule's own fix" in n]
    assert "model.recompute_granularity=full" in note and fmt_gib(same.peak_bytes, 2) in note


def test_replay_summary_does_not_deny_the_config_it_read(b062):
    assert len(b062.to_dict()["config"]["values"]) > 100
    assert "config not in the log" not in b062.to_dict()["replay"]["summary"]


def test_tui_plan_counts_the_same_model_as_analyze(b062, monkeypatch):
    from diagnose.present.tui.plan import PlanRequest, compute

    monkeypatch.setenv("DIAGNOSE_EXACT_PARAMS", "0")  # the analytic count, reconciled with the log's line

    view = b062.config.copy()
    result = compute(PlanRequest(base=view, gpus=1, capacity=b062.memory.gpu_capacity_bytes, real_mcore=False))
    assert result.memory.params == b062.memory.params == 8_030_261_248
    assert result.memory.assumed == []  # the log's own parameter line confirms the count
    plan = next(p for p in result.memory.plans if p.label == "full recompute")
    same = next(o for o in b062.memory.options if o.label == "full recompute")
    assert plan.fits is same.fits is False


def test_replay_set_on_an_oom_log_is_checked_against_memory(tmp_path, capsys):
    if not B062.exists():
        pytest.skip("b062_first_iter_activation_oom.log not in this checkout")
    from diagnose.present.cli import main

    code = main(["replay", str(B062), "--set", "model.recompute_granularity=selective", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert out["replay"]["fits"] is False and out["replay"]["fit"]["peak_bytes"] > out["replay"]["fit"][
        "capacity_bytes"]
    assert code == 1  # validates, but would run out of memory again


def test_bf16_grads_option_says_so_when_fp32_grads_were_inferred_from_the_oom():
    """ddp_wrap_oom: the log does not set grad_reduce_in_fp32 (the view holds the release default, False), the
    model infers fp32 grads from the OOM size; the bf16-grads option must carry the override, or it is the plain
    option at a lower price."""
    if not DDP_WRAP.exists():
        pytest.skip("b042_ddp_wrap_oom.log not in this checkout")
    from diagnose.pipeline import analyze

    memory = analyze([str(DDP_WRAP)]).memory
    assert memory.current.grad_dtype == "fp32"
    plain = next(o for o in memory.options if o.label == "fsdp:optim_grads_params on 8 GPUs")
    bf16 = next(o for o in memory.options if o.label == "fsdp:optim_grads_params + bf16 grads on 8 GPUs")
    assert Override("ddp.grad_reduce_in_fp32", False) in bf16.overrides
    assert bf16.overrides != plain.overrides and bf16.peak_bytes < plain.peak_bytes


def test_memory_fit_never_says_fits_without_activations():
    from diagnose.explain.fit import _from_prediction
    from diagnose.memory_types import Breakdown, MemoryPrediction, PhasePeaks
    from diagnose.model import Finding

    root = Finding(rule="x", name="x", title="t", category="cuda_oom", phase="training", severity="error",
                   role="root", confidence=1.0)
    gib = 2**30
    pred = MemoryPrediction("ddp", 8, True, 8, "fp32", 18.0, 10 * gib, 0, Breakdown(), None,
                            PhasePeaks(*(5 * [10 * gib])), peak_bytes=10 * gib, usable_bytes=70 * gib)
    fit = _from_prediction(root, [Override("ddp.use_distributed_optimizer", True)], pred, 80 * 2**30, 8)
    assert fit.fits is None and "activations unknown" in fit.notes[0]


def test_a_fit_without_activations_says_they_were_left_out():
    """ddp_wrap_oom.log gives a parameter count and no model shape: the options size the model state only, and
    both the memory section and the fix say so instead of a bare 'fits'."""
    path = CAPTURED.parent / "ddp_wrap_oom.log"
    from diagnose.pipeline import analyze

    report = analyze([str(path)])
    unsized = [o for o in report.memory.options if o.activation_bytes is None]
    assert unsized
    assert any(n.startswith("activations not sized") for n in report.memory.notes)
    if report.to_dict()["replay"].get("fits") is True and report.to_dict()["replay"]["fit"]:
        assert any("activations not sized" in n for n in report.to_dict()["replay"]["fit"].get("notes", []))


FSDP_BOTH = """\
model:
  _target_: megatron.bridge.models.llama.llama_provider.Llama3ModelProvider8B
ddp:
  use_megatron_fsdp: true
  data_parallel_sharding_strategy: optim_grads_params
dist:
  use_megatron_fsdp: true
  use_torch_fsdp2: true
checkpoint:
  save: /ckpt/run
  ckpt_format: fsdp_dtensor
train:
  micro_batch_size: 1
  global_batch_size: 64
tokenizer:
  tokenizer_model: meta-llama/Meta-Llama-3-8B
"""


def test_check_leads_with_the_validators_fix_when_it_fits(tmp_path, capsys, monkeypatch):
    """The config is invalid only because of FSDP2; with the one-key fix it fits on 8 H200s: that is plan #1,
    not a layout or sharding change."""
    from diagnose.present.cli import main

    monkeypatch.setenv("DIAGNOSE_EXACT_PARAMS", "0")  # the analytic count (the meta build is tested elsewhere)
    path = tmp_path / "run_config.yaml"
    path.write_text(FSDP_BOTH)
    code = main(["check", str(path), "--gpus", "8", "--gpu", "h200", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1  # as given it does not validate
    assert out["replay"]["fix"] == [{"key": "dist.use_torch_fsdp2", "value": False}]
    assert out["replay"]["fits"] is True
    first = out["memory"]["plans"][1]
    assert first["overrides"] == out["replay"]["fix"] and first["fits"] is True and first["valid"] is True
    assert out["memory"]["params"] == 8_030_261_248 and out["memory"]["params_assumed"] == []


def test_tui_does_not_draw_a_current_state_the_text_calls_unsizable():
    """cascade_512_ranks_oom.log: the config read from the log predicts more than the GPU holds, yet the job
    trained; the memory section says so and the TUI shows no bars for that state."""
    from diagnose.pipeline import analyze
    from diagnose.present.tui.memoryview import memory_text

    report = analyze([str(CAPTURED.parent / "cascade_512_ranks_oom.log")])
    current = report.memory.current
    assert current.sized is False
    assert any("yet the job trained" in n for n in report.memory.notes)
    text = memory_text(report.memory, report.root).plain
    assert "not drawn" in text and "\n  total" not in text and "\n  params" not in text
