"""The reliability table of benchmarks/accuracy.py: how often a root cause said at a confidence is right.

A user reads ``confidence 0.55`` as a coin toss and ``0.9`` as nearly sure; the table says whether that reading
holds on the corpus, band by band. These tests pin how outcomes fall into bands and what a band counts.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import accuracy  # noqa: E402


def _outcome(expected: str | None, got: str | None, confidence: float | None, failed: bool = True):
    return accuracy.Outcome(id="x", part="dev", thread="", failed=failed, expected_category=expected,
                            expected_phase=None, category=got, phase=None, rule=None, confidence=confidence,
                            findings=1 if got else 0, evidence_hit=None, seconds=0.0)


def test_bands_are_closed_below_and_the_last_holds_one() -> None:
    assert accuracy.confidence_band(0.0) == "0.0"
    assert accuracy.confidence_band(0.39) == "0.0"
    assert accuracy.confidence_band(0.4) == "0.4"
    assert accuracy.confidence_band(0.79) == "0.6"
    assert accuracy.confidence_band(0.8) == "0.8"
    assert accuracy.confidence_band(1.0) == "0.8"


def test_a_band_counts_failure_logs_right_and_the_confidence_said() -> None:
    outcomes = [
        _outcome("data", "data", 0.9),
        _outcome("data", "other", 0.85),
        _outcome("nccl_error", "nccl_error", 0.5),
        _outcome("nccl_error", None, None),  # silent: no confidence, in no band
        _outcome(None, None, None, failed=False),  # clean and right: not a failure
        _outcome(None, "data", 0.95, failed=False),  # a false alarm is not in the table of failure logs
    ]
    fig = accuracy.figures(outcomes, "dev")
    assert fig.reliability == {"0.4": [1, 1, 0.5], "0.8": [2, 1, 1.75]}
    assert list(fig.summary()["reliability"]) == ["0.4", "0.8"]


def test_the_table_is_printed_band_by_band(capsys) -> None:
    outcomes = [_outcome("data", "data", 0.9), _outcome("data", "other", 0.3)]
    fig = accuracy.figures(outcomes, "dev")
    accuracy.print_figures(fig, outcomes, verbose=False)
    out = capsys.readouterr().out
    assert "confidence 0.0-0.4      1 logs  mean said 0.30  right   0.0 %" in out
    assert "confidence 0.8-1.0      1 logs  mean said 0.90  right 100.0 %" in out
    assert "confidence 0.4-0.6" not in out  # an empty band is not printed


def test_a_parts_top1_comes_with_its_95_percent_interval(capsys) -> None:
    # reference values of the Wilson score interval (z = 1.96)
    assert accuracy.wilson_interval(46, 49) == (83.5, 97.9)
    assert accuracy.wilson_interval(0, 10) == (0.0, 27.8)
    assert accuracy.wilson_interval(5, 5) == (56.6, 100.0)
    assert accuracy.wilson_interval(0, 0) == (0.0, 0.0)
    fig = accuracy.Figures(part="test", failures=49, category_right=46)
    assert fig.summary()["top1_interval"] == [83.5, 97.9]
    accuracy.print_figures(fig, [], verbose=False)
    assert "(46/49; 95 % interval 83.5-97.9 %)" in capsys.readouterr().out
