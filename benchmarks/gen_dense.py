"""Build a log dense with distinct failures: every dev log end to end (sorted), repeated until the size.

A real job's log repeats its few errors across ranks; this one holds ~3,300 different failures (each a root-cause
candidate) per 21 MB pass, the worst case for the per-distinct-hit work of the matcher (reading each traceback back
to its header, its phase, its inference). Only ``corpus/dev`` is read, never the test set.

    python benchmarks/gen_dense.py /tmp/dense-20M.log --size 20MiB
    python benchmarks/gen_dense.py /tmp/dense-100M.log --size 100MiB --measure --json benchmarks/results-dense.json

``--measure`` runs ``python3 -m diagnose analyze OUT --format json`` under ``/usr/bin/time -v`` and prints (and with
``--json`` writes) its CPU time, wall time and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEV = HERE.parent / "corpus" / "dev"

sys.path.insert(0, str(HERE))
from gen_log import _size  # noqa: E402


def build(out: Path, size: int) -> int:
    logs = sorted(DEV.glob("*.log"))
    if not logs:
        raise SystemExit(f"no logs in {DEV}")
    written = 0
    with out.open("wb") as f:
        while written < size:
            for p in logs:
                data = p.read_bytes()
                if not data.endswith(b"\n"):
                    data += b"\n"
                f.write(data)
                written += len(data)
                if written >= size:
                    break
    return written


def measure(path: Path) -> dict:
    env = dict(os.environ, DIAGNOSE_SKIP_SLURM="1", PYTHONPATH=str(HERE.parent))
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "diagnose", "analyze", str(path), "--format", "json"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    err = r.stderr
    def field(name: str) -> str:
        m = re.search(rf"{re.escape(name)}: (.+)", err)
        return m.group(1).strip() if m else ""
    user, sys_ = float(field("User time (seconds)")), float(field("System time (seconds)"))
    wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)")
    parts = [float(x) for x in wall.split(":")]
    wall_s = sum(v * 60 ** i for i, v in enumerate(reversed(parts)))
    root = ""
    try:
        report = json.loads(r.stdout)
        root = report["findings"][report["root_cause"]]["rule"]  # root_cause: the index of its finding
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    return {"log": str(path), "bytes": path.stat().st_size, "exit": r.returncode, "cpu_s": round(user + sys_, 2),
            "wall_s": round(wall_s, 2), "peak_rss_mib": round(int(field("Maximum resident set size (kbytes)")) / 1024),
            "root_cause": root}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--size", default="100MiB")
    ap.add_argument("--measure", action="store_true", help="time the tool on it")
    ap.add_argument("--json", metavar="FILE", help="with --measure: add the figures to this JSON file")
    ap.add_argument("--label", default="", help="with --json: what the row measured (a tree, a load)")
    ap.add_argument("--reuse", action="store_true", help="measure OUT as it is when it exists")
    a = ap.parse_args()
    out = Path(a.out)
    n = out.stat().st_size if a.reuse and out.exists() else build(out, _size(a.size))
    print(f"{out}: {n} bytes")
    if a.measure:
        row = {"label": a.label, **measure(out)}
        print(json.dumps(row))
        if a.json:
            path = Path(a.json)
            rows = json.loads(path.read_text())["dense"] if path.exists() else []
            path.write_text(json.dumps({"dense": [*rows, row]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
