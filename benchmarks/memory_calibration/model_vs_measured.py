"""Print diagnose's memory model against the H200 measurements, as a markdown table (docs/memory.md).

Usage: python3 benchmarks/memory_calibration/model_vs_measured.py [h200_measurements.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from predict_state import compare  # this folder's

HERE = Path(__file__).resolve().parent
GIB = 2**30


def load(paths: list[str]) -> list[dict]:
    records: list[dict] = []
    for p in paths or [str(HERE / "h200_measurements.json")]:
        with open(p, encoding="utf-8") as fh:
            data = json.load(fh)
        records.extend(data if isinstance(data, list) else data.get("records", []))
    return records


def main(argv: list[str]) -> int:
    rows = compare(load(argv))
    if not rows:
        print("no usable records")
        return 1
    print("| record | phase | measured GiB | model GiB | error | measured peak GiB | model peak GiB | error |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {r['phase']} | {r['measured'] / GIB:.2f} | {r['predicted'] / GIB:.2f} | "
              f"{100 * r['error']:+.1f} % | {r['measured_max'] / GIB:.2f} | {r['predicted_max'] / GIB:.2f} | "
              f"{100 * r['error_max']:+.1f} % |")
    worst = max(abs(r["error"]) for r in rows)
    worst_max = max(abs(r["error_max"]) for r in rows)
    print(f"\n{len(rows)} records; worst error {100 * worst:.1f} % (allocated), {100 * worst_max:.1f} % (peak)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
