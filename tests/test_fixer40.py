"""fixer40: the leftovers of QA round 12 (docs/qa-report-12.md, "Left, and why") and of fixer39.

Each test failed on the tree before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.model import Finding, Override

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"
GIB = 2**30


@pytest.fixture(scope="module")
def mfsdp_buffer_oom():
    from diagnose.pipeline import analyze

    return analyze([str(SAMPLES / "mfsdp_optim_grads_buffer_oom.log")])


def test_a_capacity_fix_without_activations_says_only_the_model_state_fits(mfsdp_buffer_oom):
    """qa-12 L2: the log gives a parameter count, no model shape. The chosen option led with "fix valid and fits:
    ... predicted peak 24.8 GiB" while a note said the activations were not counted. The verdict is capacity (the
    model state did not fit), so the option may lead, but every 'fits' it shows must say the activations are not
    counted."""
    report = mfsdp_buffer_oom
    assert report.memory.verdict == "capacity"
    fit = report.replay.fit
    assert fit.fits is True and fit.model_state_only is True
    summary = report.replay.summary
    assert "and fits" not in summary
    assert "the model state fits" in summary and "activations not counted" in summary
    assert "activations not counted" in report.root.proven_fix.summary
    assert "activations not counted" in report.memory.explanation
    assert report.to_dict()["replay"]["fit"]["model_state_only"] is True


def test_memory_fit_of_the_same_option_gives_the_same_answer(mfsdp_buffer_oom):
    """qa-12 L2, one rule for both paths: sizing the capacity fix's own overrides through memory_fit (as replay
    --set and a validator's fix are) said 'not sized' where capacity_fix said 'fits'. Now both say the model state
    fits, with the same peak."""
    from diagnose.explain.fit import memory_fit

    report = mfsdp_buffer_oom
    chosen = report.replay.fit
    option = next(o for o in report.memory.options if o.label == chosen.label)
    again = memory_fit(report, None, list(option.overrides))
    assert again is not None
    assert (again.fits, again.model_state_only, again.peak_bytes) == (True, True, chosen.peak_bytes)


def test_a_state_only_fit_is_not_a_fit_when_the_state_was_not_what_failed():
    from diagnose.explain.fit import _from_prediction
    from diagnose.memory_types import Breakdown, MemoryPrediction, PhasePeaks

    root = Finding(rule="x", name="x", title="t", category="cuda_oom", phase="training", severity="error",
                   role="root", confidence=1.0)
    pred = MemoryPrediction("ddp", 8, True, 8, "fp32", 18.0, 10 * GIB, 0, Breakdown(), None,
                            PhasePeaks(*(5 * [10 * GIB])), peak_bytes=10 * GIB, usable_bytes=70 * GIB)
    fix = [Override("ddp.use_distributed_optimizer", True)]
    for verdict in ("activations", "unknown", None):
        fit = _from_prediction(root, fix, pred, 80 * GIB, 8, verdict)
        assert fit.fits is None and not fit.model_state_only
    fit = _from_prediction(root, fix, pred, 80 * GIB, 8, "capacity")
    assert fit.fits is True and fit.model_state_only and "activations not counted" in fit.peak_text


def _notes(text: str) -> str:
    """The check's notes, one line each (the terminal wraps them)."""
    joined = " ".join(text.split())
    return " ".join(part.split(" As given:")[0] for part in joined.split(" note: ")[1:])


def test_check_notes_say_what_the_plans_are_when_none_is_listed():
    """qa-12 L5: `check examples/mlm_args.txt --gpus 1` (TP 2): nothing fits on 1 GPU, the cheapest plan needs 4.
    The notes said 'the plans below' with none below, and that the plans 'also need the validator's fix
    (--tensor-model-parallel-size 1)', though TP 2 validates on the 4 GPUs the plan needs. The notes now come
    from the plans: none below, and the config validated on the plan's GPUs."""
    from tests.cli_run import ROOT, run

    proc = run("check", str(ROOT / "examples" / "mlm_args.txt"), "--gpus", "1", "--color", "never")
    notes = _notes(proc.stdout)
    assert "the cheapest that fits needs 4 GPUs" in notes
    assert "below" not in notes
    assert "--tensor-model-parallel-size 1" not in notes
    assert "on the 4 GPUs the cheapest plan that fits needs, it passes validation with no validator's fix" in notes


def test_check_json_notes_match_the_plans_listed():
    """The same in JSON: a note naming 'each plan below' only when plans follow the config as given."""
    import json

    from tests.cli_run import ROOT, run

    out = json.loads(run("check", str(ROOT / "examples" / "mlm_args.txt"), "--gpus", "1", "--format",
                         "json").stdout)
    memory = out["memory"]
    assert len(memory["plans"]) == 1  # the config as given: nothing on 1 GPU to list below it
    assert not any("below" in n for n in memory["notes"])
    assert any("passes validation with no validator's fix" in n for n in memory["notes"])


def _mlm_args(tmp_path: Path, precision: str) -> Path:
    from tests.cli_run import ROOT

    text = (ROOT / "examples" / "mlm_args.txt").read_text(encoding="utf-8").replace("--bf16", precision)
    path = tmp_path / "args.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_half_grads_plan_of_an_fp16_megatron_lm_job_drops_the_fp32_flag(tmp_path: Path):
    """qa-12 L8: an fp16 Megatron-LM job passing --accumulate-allreduce-grads-in-fp32 was told '--grad-reduce-in-bf16'
    for its 'bf16 grads' plan: arguments.py reads that flag only under --bf16, so nothing changed. The plan now
    says to drop the flag the job passed, and that the grads go to fp16."""
    from tests.cli_run import run

    path = _mlm_args(tmp_path, "--fp16 --accumulate-allreduce-grads-in-fp32")
    out = run("check", str(path), "--gpus", "2", "--color", "never").stdout
    assert "--grad-reduce-in-bf16" not in out
    lines = out.splitlines()
    half = [i for i, line in enumerate(lines) if line.split()[1:2] == ["(remove"]]
    assert half, out
    assert lines[half[0]].split(None, 1)[1] == "(remove --accumulate-allreduce-grads-in-fp32)"
    assert "grads reduced in fp16" in lines[half[0] + 1]


def test_a_bf16_megatron_lm_job_keeps_grad_reduce_in_bf16(tmp_path: Path):
    from tests.cli_run import run

    out = run("check", str(_mlm_args(tmp_path, "--bf16")), "--gpus", "2", "--color", "never").stdout
    assert "--grad-reduce-in-bf16" in out and "accumulate-allreduce" not in out


def test_a_worded_override_equals_the_plain_one():
    from diagnose.explain.render import mlm_flag
    from diagnose.model import WordedOverride

    worded = WordedOverride("ddp.grad_reduce_in_fp32", False, "(remove --accumulate-allreduce-grads-in-fp32)")
    plain = Override("ddp.grad_reduce_in_fp32", False)
    assert worded == plain and plain == worded and plain in [worded]
    assert mlm_flag(worded) == "(remove --accumulate-allreduce-grads-in-fp32)"
    assert mlm_flag(plain) == "--grad-reduce-in-bf16"


def test_the_fragmentation_rule_on_a_nearly_full_gpu_says_demand_in_its_why_too():
    """fixer39's leftover: OOM190 on a nearly full GPU (94.6 % allocated) took the memory lever as its fix and the
    memory section said demand, but the Why (and the title) still said 'the memory is fragmented'."""
    from diagnose.pipeline import AnalyzeOptions, analyze

    log = Path(__file__).resolve().parents[1] / "corpus" / "dev" / (
        "ck-thunder-litgpt-fsdp-8gpu-activation-checkpointing-regression-oom-backward.log")
    report = analyze([str(log)], AnalyzeOptions())
    root = report.root
    assert root is not None and root.rule == "OOM190" and report.memory.verdict != "fragmentation"
    assert "fragmented" not in root.explanation
    assert "2.11 GiB" in root.explanation and "Free memory first" in root.explanation
    assert "not fragmentation" in root.title


def test_a_real_fragmentation_oom_keeps_the_rules_why():
    from diagnose.pipeline import AnalyzeOptions, analyze

    log = Path(__file__).resolve().parents[1] / "corpus" / "dev" / "bz-nemorl-sft-packed-seq-reserved-fragmentation-oom.log"
    root = analyze([str(log)], AnalyzeOptions()).root
    assert root is not None and root.rule == "OOM190" and "the memory is fragmented" in " ".join(root.explanation.split())
