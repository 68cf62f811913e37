"""Print diagnose's activation model against the H200 activation records, as a markdown table (docs/memory.md).

Usage: python3 benchmarks/memory_calibration/activations_vs_measured.py [h200_activations.json ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from predict_activations import compare  # this folder's

HERE = Path(__file__).resolve().parent
GIB = 2**30


def load(paths: list[str]) -> list[dict]:
    records: list[dict] = []
    for p in paths or [str(HERE / "h200_activations.json")]:
        with open(p, encoding="utf-8") as fh:
            data = json.load(fh)
        records.extend(data if isinstance(data, list) else data.get("records", []))
    return records


def main(argv: list[str]) -> int:
    rows = compare(load(argv))
    ok = [r for r in rows if r["outcome"] == "ok"]
    ooms = [r for r in rows if r["outcome"] == "oom"]
    if not ok:
        print("no usable records")
        return 1
    print("| record | measured GiB | model GiB | error |")
    print("|---|---:|---:|---:|")
    for r in rows:
        if r["outcome"] == "ok":
            print(f"| {r['name']} | {r['measured'] / GIB:.2f} | {r['predicted'] / GIB:.2f} | "
                  f"{100 * r['error']:+.1f} % |")
        else:
            verdict = "fits (wrong)" if r["fits"] else "does not fit"
            print(f"| {r['name']} | OOM | {r['predicted'] / GIB:.2f} (+ state: {r['predicted_peak'] / GIB:.1f} of "
                  f"{r['capacity'] / GIB:.1f}) | {verdict} |")
    errors = [abs(r["error"]) for r in ok]
    wrong = sum(1 for r in ooms if r["fits"])
    worst, median = 100 * max(errors), 100 * statistics.median(errors)
    print(f"\n{len(ok)} measured peaks: worst error {worst:.1f} %, median {median:.1f} %; "
          f"{len(ooms)} measured OOMs, {wrong} predicted to fit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
