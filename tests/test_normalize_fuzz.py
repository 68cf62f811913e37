"""The fuzz target's invariants hold on its seeds, on real logs and on a short random-mutation run."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz import fuzz_normalize as fuzz  # tests/fuzz: the harness lives outside the package

REAL_LOGS = Path(__file__).resolve().parents[2] / "shared" / "real_logs"


@pytest.mark.parametrize("seed", fuzz.SEEDS)
def test_seeds_pass_the_target(seed):
    fuzz.check(seed)


def test_real_logs_pass_the_target():
    logs = sorted(REAL_LOGS.glob("*.log"))
    if not logs:
        pytest.skip("../shared/real_logs not present")
    for path in logs:
        fuzz.check(path.read_bytes()[:20000])


def test_target_catches_a_broken_invariant(monkeypatch):
    # The check must be able to fail: a normaliser that leaves an escape in the text is caught.
    from diagnose.model import LogLine

    monkeypatch.setattr(fuzz, "normalize_line", lambda raw, path, lineno: LogLine(path, lineno, raw, raw))
    with pytest.raises(AssertionError):
        fuzz.check(b"\x1b[31mred\n")


def test_short_mutation_run_finds_no_crash(capsys):
    assert fuzz._fallback(400, seed=1) == 0
    assert "400 inputs, no crash" in capsys.readouterr().out
