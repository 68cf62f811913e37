"""The memory model against real megatron-core measured on an H200 (benchmarks/memory_calibration/).

The table is data measured once by benchmarks/memory_calibration/measure.py; this compares the model with it.
Tolerance (docs/memory.md): allocated bytes after the wrap and after the first step, and the peaks, within 3 %.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from predict_state import compare

TABLE = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_calibration" / "h200_measurements.json"
TOL_ALLOCATED = 0.03
TOL_PEAK = 0.03


def _rows() -> list[dict]:
    if not TABLE.exists():
        pytest.skip(f"{TABLE.name} not measured yet (benchmarks/memory_calibration/measure.py on a GPU)")
    data = json.loads(TABLE.read_text())
    rows = compare(data if isinstance(data, list) else data.get("records", []))
    assert rows, "the measurement table has no usable records"
    return rows


def test_allocated_within_tolerance():
    bad = [(r["name"], r["phase"], round(100 * r["error"], 1)) for r in _rows() if abs(r["error"]) > TOL_ALLOCATED]
    assert not bad, f"model vs H200 beyond {TOL_ALLOCATED:.0%}: {bad}"


def test_peaks_within_tolerance():
    bad = [(r["name"], r["phase"], round(100 * r["error_max"], 1)) for r in _rows()
           if abs(r["error_max"]) > TOL_PEAK]
    assert not bad, f"model peak vs H200 beyond {TOL_PEAK:.0%}: {bad}"


def test_table_covers_every_strategy_and_both_phases():
    rows = _rows()
    assert {r["phase"] for r in rows} == {"after_wrap", "after_step"}
    assert {r["strategy"] for r in rows} >= {"ddp", "distributed_optimizer", "fsdp:optim_grads_params"}
