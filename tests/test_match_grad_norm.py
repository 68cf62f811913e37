"""A gradient norm that grew by orders of magnitude and stayed there is a numerics failure (NU025).

Synthetic step lines in the shapes trainers print (verl's ``actor/grad_norm:0.29``, Megatron's ``grad norm: 1.2 |``,
the Hugging Face Trainer's ``'grad_norm': 0.8``); every value invented. Each test changes one property of the series
(how far it rises, whether it comes back, what else the log says) and checks that the reading follows it.
"""

from __future__ import annotations

from conftest import CUDA_OOM_TRACEBACK

from diagnose.match import match_text
from diagnose.normalize.loss_series import grad_norms_of

CANCEL = "slurmstepd: error: *** STEP 4242.0 ON node01 CANCELLED AT 2026-01-01T12:00:00 ***"
RISE = [0.3, 11.0, 150.0, 700.0, 1900.0, 2500.0, 4000.0, 3400.0, 3100.0]


def _verl(norms: list[float]) -> list[str]:
    return [f"(TaskRunner pid=7) step:{i + 1} - actor/pg_loss:-0.01 - actor/grad_norm:{v} - actor/lr:1e-06"
            for i, v in enumerate(norms)]


def _root(lines: list[str]):
    from diagnose.match.rules import load_catalogue

    report = match_text("\n".join(lines) + "\n", load_catalogue())
    return None if report.root_cause is None else report.findings[report.root_cause]


def test_an_exploded_norm_is_a_numerics_failure():
    f = _root(_verl(RISE))
    assert f is not None and f.rule == "NU025"
    assert f.category == "numerics" and f.phase == "training" and f.severity == "error"
    assert f.facts["series"] == "actor/grad_norm"
    assert "grad_norm:4000.0" in " ".join(e.text for e in f.evidence)  # the peak is shown


def test_it_leads_a_cancel_that_says_nothing_of_why():
    f = _root(_verl(RISE) + [CANCEL])
    assert f is not None and f.rule == "NU025"
    assert _root(_verl([0.3, 0.4, 0.35, 0.3, 0.33, 0.31]) + [CANCEL]).rule == "SL002"


def test_an_error_keeps_its_root_cause():
    lines = _verl(RISE) + CUDA_OOM_TRACEBACK
    f = _root(lines)
    assert f is not None and f.rule != "NU025"


def test_a_spike_that_comes_back_a_falling_norm_and_a_short_series_do_not_fire():
    assert _root(_verl([0.8, 0.9, 412.0, 1.1, 0.7, 0.69])) is None
    assert _root(_verl([96.0, 41.0, 12.9, 4.1, 2.2, 1.6])) is None
    assert _root(_verl([0.3, 150.0, 4000.0, 3400.0, 3100.0])) is None  # five steps: too few to read thirds


def test_a_tenfold_rise_or_a_small_level_does_not_fire():
    assert _root(_verl([0.05, 0.11, 0.27, 0.38, 0.45, 0.52])) is None
    # a hundredfold, but still below what any clipping threshold would call large
    assert _root(_verl([0.001, 0.002, 0.05, 0.2, 0.3, 0.4])) is None
    # a tiny first norm (a warm-up, an RL batch of equal rewards) and then a level of tens that healthy runs hold
    # (dev: 14-19, 41-45): the rise is a thousandfold, the level is no explosion
    assert _root(_verl([0.04, 3.0, 18.0, 35.0, 41.0, 44.0, 42.0, 45.0, 43.0])) is None


def test_names_read_and_settings_left_out():
    assert grad_norms_of("step:2 - actor/grad_norm:0.412 - critic/grad_norm:1.5") == [
        ("actor/grad_norm", 0.412, "0.412"), ("critic/grad_norm", 1.5, "1.5")]
    assert grad_norms_of(" iteration 10/ 100 | lm loss: 2.40E+00 | grad norm: 0.741 | ") == [
        ("grad norm", 0.741, "0.741")]
    assert grad_norms_of("{'loss': 1.87, 'grad_norm': 3.21, 'epoch': 0.02}") == [("grad_norm", 3.21, "3.21")]
    for line in ("max_grad_norm: 1.0", "grad_norm_clip=1.0", "clip_grad_norm: 1.0", "grad_norm: nan",
                 "actor/grad_norm:inf"):
        assert grad_norms_of(line) == [], line


# --- NU026: a gradient norm printed inf or nan at many steps to the end

def _steps(norms: list[str]) -> list[str]:
    return [f"step {i + 1} | loss 2.{i:03d} | grad_norm {v} | lr 1.0e-05" for i, v in enumerate(norms)]


def test_a_norm_that_keeps_coming_back_non_finite_is_a_numerics_failure():
    f = _root(_steps(["0.83", "0.79", "inf", "1.06", "inf", "0.91", "inf", "inf", "64.2", "inf"]))
    assert f is not None and f.rule == "NU026"
    assert f.category == "numerics" and f.phase == "training" and f.severity == "error"
    assert f.facts["nonfinite"] == 5 and f.facts["points"] == 10
    assert "grad_norm inf" in f.evidence[1].text  # the first non-finite step, after the last finite one before it
    # nan reads as inf does
    assert _root(_steps(["0.83", "0.79", "nan", "nan", "1.1", "nan"])).rule == "NU026"


def test_it_leads_a_cancel_too():
    f = _root(_steps(["1.2", "1.1", "inf", "inf", "inf"]) + [CANCEL])
    assert f is not None and f.rule == "NU026"


def test_an_fp16_scaler_settling_or_skipping_now_and_then_does_not_fire():
    # the first steps overflow while the scale settles: no finite norm before them
    assert _root(_steps(["inf", "inf", "inf", "inf", "0.91", "0.88", "0.85", "0.84"])) is None
    # one overflowed step now and then in a run that goes on
    assert _root(_steps(["1.2", "inf", "1.0", "0.98", "inf", "0.94", "0.93", "0.92", "0.91", "0.90", "inf",
                         "0.9", "0.89", "0.88"])) is None
    # two non-finite steps are not yet a series
    assert _root(_steps(["1.2", "1.1", "inf", "1.0", "inf"])) is None
    # non-finite steps early, then a run that left them behind
    assert _root(_steps(["1.2", "inf", "inf", "inf"] + ["0.9"] * 2 + ["0.8", "0.7", "0.6", "0.5", "0.4", "0.3"])) is None


def test_non_finite_norms_are_kept_beside_the_values():
    from diagnose.normalize.loss_series import all_grad_norms_of

    assert grad_norms_of("step 2 | grad_norm inf | lr 1e-5") == []
    got = all_grad_norms_of("step 2 | grad_norm inf | grad norm: NaN | 'grad_norm': -Infinity, ")
    assert [(n, p) for n, _v, p in got] == [("grad_norm", "inf"), ("grad norm", "NaN"), ("grad_norm", "-Infinity")]
    assert all_grad_norms_of("grad_norm information") == [] and all_grad_norms_of("grad_norm nano") == []
