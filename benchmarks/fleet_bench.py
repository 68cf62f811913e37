"""Fleet scan speed: jobs per second per core over generated job logs, and the speed-up of `fleet submit` arrays.

1. Generate ``--count`` job logs (default 10,000) into ``--dir`` (default /tmp/fleet-bench, never the repo): each a
   unique first line, a body of NCCL INFO / warning / iteration noise (benchmarks/gen_log.py's generator) and the
   tail of a real sample log (one of several failure classes, or a clean end). Sizes are log-uniform between
   ``--min-size`` (100 KiB) and ``--max-size`` (10 MiB), but only ``--big-share`` (10%) of the logs above 1 MiB,
   so that the set fits this machine's disk and time (mean ~0.7 MiB a log instead of ~2.2 MiB; say so when quoting).
2. Scan all of them with ``diagnose fleet scan -j N`` (the local pool): wall time, CPU time of the scan and its
   workers (user + system from wait4 on the child, children included), jobs/s and jobs per CPU-second (= jobs/s per
   fully used core), checked: every log stored once.
3. With a Slurm cluster (``--slurm``; the local one: scripts/slurm-local.sh up), ``fleet submit`` the first
   ``--array-count`` logs as arrays of 1, 2 and 4 tasks plus the merge: wall from sbatch to the merge's end.

CPU time is the figure that holds on a shared machine; wall time depends on the other load (recorded: loadavg).

    python3 benchmarks/fleet_bench.py --json benchmarks/fleet_results.json --slurm
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from gen_log import body_block  # noqa: E402

TAILS = ["ddp_wrap_oom", "gpu_ecc_error", "nccl_timeout_before_training", "dataset_idx_missing", "clean_run",
         "optimizer_step_oom", "nan_loss_rerun_state_machine", "slurm_cgroup_oom_new"]
KIB, MIB = 1 << 10, 1 << 20


def sizes(count: int, lo: int, hi: int, big_share: float, rng: random.Random) -> list[int]:
    mid = min(max(MIB, lo), hi)
    out = []
    for _ in range(count):
        a, b = (mid, hi) if rng.random() < big_share else (lo, mid)
        out.append(int(math.exp(rng.uniform(math.log(a), math.log(b)))))
    return out


def generate(folder: Path, count: int, lo: int, hi: int, big_share: float, seed: int) -> tuple[int, float]:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    body = b"".join(body_block(rng, 512, i * 1000, 2 * MIB) for i in range(max(1, hi // (2 * MIB)) + 1))
    tails = [(REPO / "sample_logs" / f"{t}.log").read_bytes() for t in TAILS]
    total = 0
    started = time.monotonic()
    for i, size in enumerate(sizes(count, lo, hi, big_share, rng)):
        tail = tails[i % len(tails)]
        start = rng.randrange(0, max(1, len(body) - size))
        chunk = body[start : start + max(0, size - len(tail))]
        chunk = chunk[chunk.find(b"\n") + 1 : chunk.rfind(b"\n") + 1]
        data = f"job {i} of the fleet benchmark, seed {seed}\n".encode() + chunk + tail
        (folder / f"job-{i:05d}.log").write_bytes(data)
        total += len(data)
    return total, time.monotonic() - started


def timed(argv: list[str], env: dict[str, str] | None = None) -> dict:
    """Run a child to its end: wall time and the load before it."""
    load = os.getloadavg()[0]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:6]} failed: {err[-2000:]}")
    return {"wall_s": wall, "loadavg_before": load, "stderr_tail": err.strip().splitlines()[-1:]}


def scan_local(folder: Path, store: Path, jobs: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # the scan and its workers, once reaped
    result = timed([sys.executable, "-m", "diagnose", "fleet", "scan", str(folder), "--store", str(store),
                    "--jobs", str(jobs), "--no-progress"])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result["peak_rss_mib"] = after.ru_maxrss / 1024
    return result


def count_jobs(store: Path) -> tuple[int, int]:
    con = sqlite3.connect(store)
    try:
        return con.execute("SELECT count(*), count(DISTINCT job_key) FROM jobs").fetchone()
    finally:
        con.close()


def array_run(folder: Path, count: int, tasks: int, work: Path, env: dict[str, str]) -> dict:
    files = sorted(folder.glob("job-*.log"))[:count]
    subset = work / f"subset-{tasks}"
    shutil.rmtree(subset, ignore_errors=True)
    subset.mkdir(parents=True)
    for f in files:
        os.link(f, subset / f.name)
    store = work / f"array-{tasks}.db"
    for p in work.glob(f"array-{tasks}.db*"):
        p.unlink()
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "diagnose", "fleet", "submit", str(subset), "--tasks", str(tasks),
                           "--run-dir", str(work / f"run-{tasks}"), "--store", str(store)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    words = done.stdout.split()
    ids = [words[words.index("array") + 2].rstrip(";"), words[words.index("merge") + 2]]
    while subprocess.run(["squeue", "-h", "-j", ",".join(ids)], env=env, capture_output=True,
                         text=True).stdout.strip():
        time.sleep(0.5)
    wall = time.monotonic() - started
    stored, distinct = count_jobs(store)
    cpu = subprocess.run(["sacct", "-n", "-P", "-j", ids[0], "-o", "JobID,TotalCPU"], env=env, capture_output=True,
                         text=True).stdout
    return {"tasks": tasks, "jobs": count, "wall_s": wall, "stored": stored, "distinct": distinct,
            "jobs_per_s": count / wall, "sacct_totalcpu": [line for line in cpu.splitlines() if ".batch" in line]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/fleet-bench")
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--min-size", type=int, default=100 * KIB)
    ap.add_argument("--max-size", type=int, default=10 * MIB)
    ap.add_argument("--big-share", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--slurm", action="store_true", help="also time fleet submit arrays of 1, 2, 4 tasks")
    ap.add_argument("--array-count", type=int, default=2000)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    work = Path(a.dir)
    logs = work / "logs"
    results: dict = {"machine": {"cpus": os.cpu_count()}, "count": a.count}
    if not logs.exists() or len(list(logs.glob("job-*.log"))) != a.count:
        shutil.rmtree(logs, ignore_errors=True)
        total, secs = generate(logs, a.count, a.min_size, a.max_size, a.big_share, a.seed)
        results["generated"] = {"bytes": total, "seconds": secs}
    total = sum(f.stat().st_size for f in logs.glob("job-*.log"))
    results["bytes"] = total
    results["mean_mib"] = total / a.count / MIB
    store = work / "local.db"
    for p in work.glob("local.db*"):
        p.unlink()
    local = scan_local(logs, store, a.jobs)
    stored, distinct = count_jobs(store)
    local.update(jobs=a.count, workers=a.jobs, stored=stored, distinct=distinct, jobs_per_s=a.count / local["wall_s"],
                 jobs_per_cpu_s=a.count / local["cpu_s"], mib_per_cpu_s=total / MIB / local["cpu_s"])
    results["local_scan"] = local
    print(json.dumps(local, indent=2), file=sys.stderr)
    if a.slurm:
        env = dict(os.environ, SLURM_CONF=os.environ.get("SLURM_CONF", "/tmp/slurm-local/etc/slurm.conf"))
        results["arrays"] = [array_run(logs, min(a.array_count, a.count), t, work, env) for t in (1, 2, 4)]
        base = results["arrays"][0]["wall_s"]
        for r in results["arrays"]:
            r["speedup"] = base / r["wall_s"]
        print(json.dumps(results["arrays"], indent=2), file=sys.stderr)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
