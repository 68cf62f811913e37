"""A job that ran to the end with a loss that never moved is a failure (NU020), not a clean run.

Synthetic logs in the shapes trainers print (a custom loop's ``train loss 7.21 | lr``, the Hugging Face Trainer's
``{'loss': ..}`` dicts, Megatron's iteration line); every value invented. Each test changes one property of the
series (how many points, how much it moves, where it falls) and checks that the reading follows it.
"""

from __future__ import annotations

import math

from conftest import CUDA_OOM_TRACEBACK

from diagnose.match import match_text
from diagnose.match.flat_loss import MAX_TRAIN_RANGE, flat_series
from diagnose.match.rules import parse_rule
from diagnose.normalize.loss_series import losses_of

WARNING = ("/opt/conda/lib/python3.10/site-packages/accelerate/accelerator.py:1279: UserWarning: FSDP Warning: When "
           "using FSDP, it is efficient and recommended to call prepare for the model before creating the optimizer")
NOISE = [0.0011, -0.0007, 0.0014, -0.0012, 0.0003, -0.0009, 0.0012, -0.0004, 0.0008, -0.0013, 0.0005, -0.0002]


def _loop(values: list[float], evals: list[float] | None = None, every: int = 4) -> list[str]:
    """A custom loop's lines: ``values`` as logged train losses, an eval line after every ``every`` of them."""
    lines, evals = [], list(evals or [])
    lr = 5e-5
    for i, v in enumerate(values):
        lr *= 0.97
        lines.append(f"Epoch {i // every} | step {100 * (i % every + 1)} | train loss {v:.4f} | lr {lr:.2e}")
        if (i + 1) % every == 0 and evals:
            lines.append(f"Epoch {i // every} | eval loss {evals.pop(0):.4f} | rouge1 0.0213")
    return lines + ["Saving model to ./out ...", "Training Finished"]


def _report(lines: list[str]):
    from diagnose.match.rules import load_catalogue

    return match_text("\n".join(lines) + "\n", load_catalogue())


def _root(lines: list[str]):
    report = _report(lines)
    return None if report.root_cause is None else report.findings[report.root_cause]


def test_flat_train_loss_is_a_numerics_failure():
    f = _root(_loop([7.2118 + NOISE[i % len(NOISE)] for i in range(12)]))
    assert f is not None and f.rule == "NU020"
    assert f.category == "numerics" and f.phase == "training" and f.severity == "error"
    assert f.confidence <= 0.5
    assert f.evidence and "train loss" in f.evidence[0].text


def test_identical_eval_losses_alone_fire():
    # few train points (not enough for the train reading) but three evaluations to the last digit
    f = _root(_loop([7.21, 7.25, 7.18, 7.3, 7.22, 7.19], evals=[7.2043, 7.2043, 7.2043], every=2))
    assert f is not None and f.rule == "NU020" and f.facts["series"] == "eval"


def test_decreasing_series_does_not_fire():
    assert _root(_loop([7.2 * 0.93 ** i for i in range(15)], evals=[6.1, 5.2, 4.4])) is None


def test_noisy_but_decreasing_series_does_not_fire():
    values = [3.0 - 0.05 * i + (0.2 if i % 2 else -0.2) for i in range(20)]
    assert _root(_loop(values)) is None


def test_noisy_series_around_one_level_beyond_noise_threshold_does_not_fire():
    # a converged fine-tune: flat on average, but batch noise of a few percent, as dev's clean runs show
    assert _root(_loop([1.20 + (0.03 if i % 3 else -0.02) for i in range(30)])) is None


def test_warm_up_plateau_then_fall_does_not_fire():
    plateau = [9.8012 + NOISE[i % len(NOISE)] for i in range(14)]
    assert _root(_loop(plateau + [9.1, 8.2, 7.0, 6.1])) is None


def test_plateau_followed_by_a_late_fall_past_the_captured_lines_does_not_fire():
    # more loss lines than the scanner keeps from the start: the last line, kept apart, shows the fall
    plateau = [9.8012 + NOISE[i % len(NOISE)] for i in range(300)]
    assert _root(_loop(plateau + [8.0])) is None


def test_a_late_pretraining_window_as_flat_but_low_does_not_fire():
    # a clean run resumed late, its loss averaged over a long log interval: within 0.5 % for twelve lines at 2.1;
    # that is a model that learned (an untrained one prints ~ln(vocabulary)), so the clean run stays clean
    values = [2.1043 + NOISE[i % len(NOISE)] * 0.2 for i in range(12)]
    assert (max(values) - min(values)) / 2.1 <= MAX_TRAIN_RANGE
    assert _root(_loop(values)) is None


def test_a_smoke_test_inside_the_warm_up_does_not_fire():
    # twenty steps of a clean smoke test, lr still warming up: the loss falls by a hair a step, within 0.5 %
    values = [10.9621 - 0.0021 * i + NOISE[i % len(NOISE)] * 0.3 for i in range(20)]
    assert (max(values) - min(values)) / 10.9 <= MAX_TRAIN_RANGE
    assert _root(_loop(values)) is None


def test_short_run_does_not_fire():
    assert _root(_loop([7.2118 + NOISE[i] for i in range(5)], evals=[7.2043], every=5)) is None


def test_two_identical_evals_are_not_enough():
    assert _root(_loop([7.21, 7.25, 7.18, 7.3], evals=[7.2043, 7.2043], every=2)) is None


def test_identical_evals_printed_coarsely_do_not_fire():
    lines = [f"epoch {i} | eval loss 2.3 | acc 0.{i}1" for i in range(4)]
    assert _root(lines) is None


def test_templated_constant_series_says_nothing():
    # every logged step prints the same number to the last digit: a template, not a measured loss
    lines = [f" iteration {10 * i:8d}/     100 | consumed samples: {10240 * i:12d} | learning rate: 1.500000E-04 | "
             "global batch size:  1024 | lm loss: 2.404998E+00 | loss scale: 1.0 | grad norm: 1.234 | "
             "number of skipped iterations:   0 | number of nan iterations:   0 |" for i in range(1, 11)]
    assert _root(lines) is None


def test_loss_near_zero_does_not_fire():
    # a policy-gradient objective sits near 0 whatever happens: no relative noise to compare with
    assert _root([f"step:{i} - actor/pg_loss:0.000 - loss: 0.00{i % 3} - lr 1e-06" for i in range(20)]) is None


def test_rank_repeats_are_one_point():
    # eight ranks printing the same two steps are two points, not sixteen
    lines = [f"[rank{r}]: step {s} | train loss {2.3011 - 0.001 * s:.4f}" for s in (1, 2) for r in range(8)]
    assert _root(lines) is None


def test_warning_alone_does_not_fail_a_clean_log():
    report = _report([WARNING] + _loop([7.2 * 0.93 ** i for i in range(15)], evals=[6.1, 5.2, 4.4]))
    assert report.root_cause is None
    assert [f.rule for f in report.findings] == ["MB220"] and report.findings[0].role == "context"


def test_warning_explains_a_flat_loss_as_fsdp_config():
    f = _root([WARNING] * 4 + _loop([11.8473 + NOISE[i % len(NOISE)] for i in range(15)],
                                    evals=[11.8421] * 3, every=5))
    assert f.rule == "NU020" and f.category == "fsdp_config"
    assert f.facts["explained_by"] == "MB220"
    assert "FSDP Warning" in f.evidence[0].text
    assert any("use_orig_params" in step for step in f.fix.steps)


def test_an_error_keeps_its_root_cause():
    lines = _loop([7.2118 + NOISE[i % len(NOISE)] for i in range(12)]) + CUDA_OOM_TRACEBACK
    f = _root(lines)
    assert f is not None and f.rule != "NU020"


def test_loss_names_read_and_components_left_out():
    assert losses_of("{'loss': 1.87, 'grad_norm': 3.21, 'learning_rate': 1.9e-05, 'epoch': 0.02}") == [
        ("train", 1.87, "1.87")]
    assert [k for k, _v, _t in losses_of("{'eval_loss': 1.2, 'eval_runtime': 3.4}")] == ["eval"]
    assert [k for k, _v, _t in losses_of(" validation loss at iteration 300 | lm loss value: 3.411532E+00 | ")] == [
        "eval"]
    assert losses_of(" iteration 10/ 100 | lm loss: 2.404998E+00 | loss scale: 1.0 |") == [
        ("train", 2.404998, "2.404998E+00")]
    for line in ("actor/pg_loss:0.41", "aux_loss: 0.01", "loss_scale: 65536", "z_loss=0.3", "loss scale: 1.0",
                 "loss: nan", "loss: cross_entropy"):
        assert losses_of(line) == [], line


def test_threshold_is_relative_to_the_level():
    from diagnose.model import LogLine
    from diagnose.normalize.loss_series import LossPoint, LossSeries

    def series(level: float, spread: float) -> LossSeries:
        pts = [LossPoint(level + spread * ((-1) ** i) * (i % 3) / 2, "x.xxxx", LogLine("f", i, "", ""))
               for i in range(12)]
        return LossSeries("f", "train", pts)

    assert flat_series([series(10.0, 10.0 * MAX_TRAIN_RANGE * 0.4)])
    assert not flat_series([series(10.0, 10.0 * MAX_TRAIN_RANGE * 1.5)])
    assert math.isclose(MAX_TRAIN_RANGE, 0.005)


def test_explains_is_only_for_context_log_rules():
    raw = {"code": "U001", "slug": "u", "title": "t", "category": "fsdp_config", "role": "root",
           "explanation": "e", "explains": ["NU020"],
           "patterns": [{"anchor": "abc", "regex": "abc"}]}
    try:
        parse_rule(raw, "x.toml")
    except ValueError as e:
        assert "explains" in str(e)
    else:
        raise AssertionError("a root rule with 'explains' was accepted")


def _hf(values: list[float]) -> list[str]:
    """The Hugging Face Trainer's logged dicts for ``values``."""
    return [f"{{'loss': {v}, 'learning_rate': {5e-5 * 0.999 ** i:.5e}, 'epoch': {0.015 * (i + 1):.2f}}}"
            for i, v in enumerate(values)]


def test_a_loss_that_fell_to_exactly_zero_and_stayed_is_a_collapse_not_learning():
    # a falling series is left alone by the flat readings (it learned); exactly 0 to the end is no measurement
    f = _root(_hf([2.9914, 3.0112] + [0.0] * 12))
    assert f is not None and f.rule == "NU021" and f.category == "numerics" and f.phase == "training"
    assert [e.text.split(",")[0] for e in f.evidence] == ["{'loss': 3.0112", "{'loss': 0.0", "{'loss': 0.0"]
    assert "exactly 0 at each of the last 12 of 14 logged steps" in f.explanation


def test_zero_losses_that_did_not_follow_a_measured_one_or_did_not_last_are_no_collapse():
    assert _root(_hf([0.0] * 14)).rule == "NU024"  # 0 from the start is no collapse: its own reading (below)
    assert _root(_hf([2.99] + [0.0] * 5)) is None  # too few logged steps at 0
    assert _root(_hf([2.99] + [0.0] * 10 + [0.41])) is None  # it came back: a print, not a collapse
    assert _root(_hf([2.99 * 0.9 ** i for i in range(14)])) is None


_CTRL_C = ["^CTraceback (most recent call last):", '  File "/w/train.py", line 88, in <module>', "    main()",
           "KeyboardInterrupt"]


def test_a_run_stopped_by_hand_after_its_loss_fell_to_zero_was_stopped_for_it():
    # the person stopped it: four zeros after a loss that fell through small values say why (without the stop, the
    # same series is no collapse: too few zeros, and the values before them fell below the measured level)
    falling = [1.3322, 0.8161, 0.1077, 0.0112, 0.0008] + [0.0] * 4
    assert _root(_hf(falling)) is None
    f = _root(_hf(falling) + _CTRL_C)
    assert f is not None and f.rule == "NU021" and f.category == "numerics"
    assert _root(_hf([0.0008, 0.0003] + [0.0] * 4) + _CTRL_C) is None  # never measured above zero: no collapse
    assert _root(_hf(falling[:5] + [0.0] * 3) + _CTRL_C) is None  # three zeros are not enough even then
    assert _root(_hf([2.9914, 1.21, 0.82, 0.55, 0.41, 0.33]) + _CTRL_C) is None  # a healthy run stopped: no failure


def test_a_long_collapsed_series_is_summarised_in_one_pass():
    # the first zero of the tail was found by slicing the rest of the series at every point (quadratic: ~75 s for
    # 200k steps). A hang guard, not a speed measurement: SIGALRM fails the test long before a quadratic pass ends.
    import signal
    from types import SimpleNamespace

    from diagnose.match import flat_loss
    from diagnose.normalize.loss_series import LossSeries

    line = SimpleNamespace(path="train.log", lineno=1, raw="{'loss': 0.0}")
    values = [2.5] * 100_000 + [0.0] * 100_000
    series = LossSeries("train.log", "train", [SimpleNamespace(value=v, text=str(v), line=line) for v in values])

    def _hang(_sig, _frame):
        raise AssertionError("reading a 200k-step series took over 20 s")

    previous = signal.signal(signal.SIGALRM, _hang)
    signal.alarm(20)
    try:
        assert flat_loss.collapsed_to_zero(series) and len(flat_loss._evidence(series, flat_loss.COLLAPSE_RULE)) == 3
        assert "the last 100000 of 200000 logged steps" in flat_loss._summary(series, flat_loss.COLLAPSE_RULE)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)



DIVERGING = [10.12, 8.95, 8.41, 8.13, 8.02, 7.98, 8.06, 7.97, 8.21, 8.09, 8.44, 8.17, 8.73, 8.58, 9.12, 9.46, 9.81]


def test_a_loss_that_fell_then_climbed_back_above_its_best_level_diverged():
    f = _root(_hf(DIVERGING))
    assert f is not None and f.rule == "NU022" and f.category == "numerics" and f.phase == "training"
    # the first step, the lowest before the last block, the last step
    assert [e.text.split(",")[0] for e in f.evidence] == ["{'loss': 10.12", "{'loss': 7.97", "{'loss': 9.81"]
    assert "the last value is 9.81" in f.explanation


def test_noise_a_low_objective_or_a_rise_that_came_back_is_no_divergence():
    # as noisy as a per-batch loss can be: the last block's steps are not all above the best block's
    noisy = [5.97, 3.90, 3.17, 4.01, 3.00, 4.52, 5.82, 4.83, 4.77, 4.56, 3.75, 3.87, 3.85, 2.40, 4.01, 4.45, 2.06, 3.62,
             4.93, 4.53, 4.58, 5.00]
    assert _root(_hf(noisy)) is None
    assert _root(_hf([v / 20 for v in DIVERGING])) is None  # best level 0.4: an objective near 0 has no scale
    assert _root(_hf(DIVERGING[:-4] + [8.1, 8.0, 7.9, 7.95])) is None  # it rose, then fell back: a spike
    assert _root(_hf(DIVERGING[:11])) is None  # too few steps for blocks of two


def test_the_trainers_end_of_run_mean_loss_is_not_a_step():
    # the Hugging Face Trainer ends with the MEAN loss of the run (its summary dict and its metrics table), above the
    # last steps' loss of any run that learned: read as steps, a clean run's curve would climb back at its end
    learned = [1.4817, 1.1204, 0.9935, 0.8812, 0.8207, 0.7931, 0.7412, 0.7044, 0.6938, 0.6871]
    summary = ["{'train_runtime': 1042.9, 'train_samples_per_second': 3.1, 'train_steps_per_second': 0.1, "
               "'train_loss': 0.8917, 'epoch': 3.0}", "  train_loss               =     0.8917"]
    assert _root(_hf(learned) + summary) is None
    from diagnose.normalize.loss_series import losses_of
    assert losses_of(summary[0]) == [] and losses_of(summary[1]) == []
    assert losses_of("{'loss': 0.6871, 'learning_rate': 3.6e-06, 'epoch': 2.94}") == [("train", 0.6871, "0.6871")]


def test_the_same_loss_for_every_epoch_to_four_digits_is_a_run_that_learned_nothing():
    # an epoch's loss is a mean over the whole data: five epochs printing 0.6931 is a model whose weights never moved
    epochs = [f"epoch {i}: train_loss 0.6931 eval {{'accuracy': 0.6838235294117647}}" for i in range(5)]
    f = _root(epochs)
    assert f is not None and f.rule == "NU020" and f.category == "numerics"
    # a step's dict carries a fractional epoch: identical steps may be a template, they say nothing on their own
    assert _root([f"{{'loss': 0.6931, 'learning_rate': 5e-05, 'epoch': {0.01 * (i + 1):.2f}}}" for i in range(5)]) is None
    assert _root([f"epoch {i}: train_loss 0.69" for i in range(5)]) is None  # two digits repeat by rounding
    assert _root([f"epoch {i}: train_loss 0.6931" for i in range(2)]) is None  # two epochs are too few


def test_a_loss_of_exactly_zero_from_the_first_step_is_no_measurement():
    f = _root([f"steps: {10 * (i + 1)} loss: 0.0000 iter time (s): 0.630 samples/sec: 26.500" for i in range(12)])
    assert f is not None and (f.rule, f.category, f.phase) == ("NU024", "numerics", "training")
    assert f.confidence < 0.5 and "exactly 0 at each of its 12 logged steps, from the first" in f.explanation


def test_zeros_beside_a_reward_or_too_few_are_not_read_as_no_measurement():
    # an RL objective can sit at 0 (GRPO without a KL term): its trainer logs the reward on the same line
    rl = [f"{{'loss': 0.0, 'grad_norm': 0.0, 'reward': {0.2 + 0.01 * i:.2f}, 'epoch': {0.01 * (i + 1):.2f}}}"
          for i in range(14)]
    assert _root(rl) is None
    assert _root(_hf([0.0] * 5)) is None  # too few logged steps to say
    assert _root(_hf([0.0] * 10 + [0.41])) is None  # a measured loss came: not 0 throughout


def test_a_loss_printed_identically_until_someone_stopped_the_run_did_not_move():
    # the same loss at every logged step is a template when the run goes on; at an untrained model's level in a run
    # someone stopped, it is why they stopped it (tuner r31)
    stuck = _hf([10.79] * 12)
    assert _root(stuck) is None
    f = _root(stuck + _CTRL_C)
    assert f is not None and f.rule == "NU020" and f.category == "numerics" and f.phase == "training"
    assert "printed as 10.79 at every one of its 12 logged steps" in f.explanation
    assert _root(_hf([2.31] * 12) + _CTRL_C) is None  # a trained model's level: no reading
    assert _root(_hf([10.79] * 6) + _CTRL_C) is None  # too few logged steps


def _megatron(values: list[float]) -> list[str]:
    return [f" iteration {i + 1:>8}/    2140 | learning rate: 3.000E-03 | lm loss: {v:.6E} | grad norm: {1.5 + i % 3:.3f} |"
            for i, v in enumerate(values)]


def test_a_loss_that_jumped_to_an_untrained_level_after_the_first_update_destroyed_the_loaded_weights():
    f = _root(_megatron([1.930013, 11.41752, 10.73315, 10.0226, 8.913904, 7.811126]))
    assert f is not None and f.rule == "NU028" and f.category == "numerics" and f.phase == "training"
    assert f.confidence <= 0.3
    assert "1.930013E+00 at its first logged step and 1.141752E+01 at the next" in f.explanation
    assert _root(_megatron([1.93, 11.4, 2.05, 1.97, 1.95, 1.91])) is None  # a spike that came back
    assert _root(_megatron([10.93, 11.4, 10.7, 10.0, 8.9])) is None  # from random weights: no trained level first
    assert _root(_megatron([1.93, 11.4, 10.7])) is None  # too few logged steps
    assert _root(_megatron([1.93, 2.4, 2.1, 2.0, 1.9])) is None  # a resumed run
