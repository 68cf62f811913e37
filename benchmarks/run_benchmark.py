"""Speed and memory of `diagnose analyze` on big generated logs, against ripgrep on the same file in the same run.

For each size: generate the log (seeded, cached under benchmarks/out/), warm the page cache, then time
`diagnose analyze --format json` and `rg -c -F -f anchors.txt` (the catalogue's anchor literals) and read each
child's peak resident memory and CPU time (user + system) from wait4(). Prints a table; `--json FILE` also writes
the figures. On a shared machine wall time depends on the other load (the load average is recorded); CPU time
does not, so both are reported.

The generated logs are dated back LOG_AGE_S: ingest copies a file modified in the last two minutes before mapping
it (it may still be written); the benchmark measures a finished job's log, not that copy.

    python benchmarks/run_benchmark.py --sizes 100MiB 1GiB 5GiB
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from gen_log import _size, generate  # noqa: E402

LOG_AGE_S = 600


def measure_one(cmd: list[str]) -> tuple[float, float, int, int, bytes]:
    """(wall s, CPU s, peak RSS bytes, exit code, stdout), measured in a fresh helper process so that
    RUSAGE_CHILDREN holds only this command."""
    code = (
        "import json,resource,subprocess,sys,time;"
        "t=time.perf_counter();p=subprocess.run(sys.argv[1:],stdout=subprocess.PIPE,stderr=subprocess.PIPE);"
        "s=time.perf_counter()-t;r=resource.getrusage(resource.RUSAGE_CHILDREN);"
        "print(json.dumps({'s':s,'cpu':r.ru_utime+r.ru_stime,'rss':r.ru_maxrss*1024,"
        "'rc':p.returncode,'out':p.stdout[-2000000:].decode(errors='replace'),'err':p.stderr[-2000:].decode(errors='replace')}))"
    )
    res = subprocess.run([sys.executable, "-c", code, *cmd], stdout=subprocess.PIPE, check=True)
    d = json.loads(res.stdout)
    return d["s"], d["cpu"], d["rss"], d["rc"], d["out"].encode()


def anchors_file(path: Path) -> Path:
    from diagnose.match import load_catalogue

    anchors = sorted({p.anchor for r in load_catalogue().rules for p in r.patterns})
    path.write_text("\n".join(anchors) + "\n")
    return path


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["100MiB", "1GiB", "5GiB"])
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--out-dir", default=str(HERE / "out"))
    ap.add_argument("--keep", action="store_true", help="keep the generated logs")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="no untimed first run (then the first size also pays compiling the Hyperscan database)")
    a = ap.parse_args(argv)

    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    anchors = anchors_file(out / "anchors.txt")
    rg = shutil.which("rg")
    rows = []
    helps = [measure_one([sys.executable, "-m", "diagnose", "--help"]) for _ in range(3)]
    help_s = min(h[0] for h in helps)
    help_cpu = min(h[1] for h in helps)
    for s in a.sizes:
        size = _size(s)
        log = out / f"bench-{s}-{a.ranks}r.log"
        if not log.exists() or abs(log.stat().st_size - size) > 1 << 20:
            generate(str(log), size, a.ranks)
        if time.time() - log.stat().st_mtime < LOG_AGE_S:
            old = time.time() - LOG_AGE_S
            os.utime(log, (old, old))
        nbytes = log.stat().st_size
        warm(log)
        load = os.getloadavg()[0]
        cmd = [sys.executable, "-m", "diagnose", "analyze", "--format", "json", "--no-progress", str(log)]
        if not rows and a.warmup:
            measure_one(cmd)  # untimed: fills the compiled-database cache (a cold cache costs ~0.16 s once)
        secs, cpu, rss, rc, outp = measure_one(cmd)
        root = None
        try:
            rep = json.loads(outp)
            if rep.get("root_cause") is not None:
                root = rep["findings"][rep["root_cause"]]["rule"]
        except ValueError:
            pass
        row = {"size": s, "bytes": nbytes, "load_avg_1m": round(load, 1),
               "diagnose_s": round(secs, 2), "diagnose_cpu_s": round(cpu, 2),
               "diagnose_MBps": round(nbytes / secs / 1e6), "diagnose_cpu_MBps": round(nbytes / max(cpu, 1e-9) / 1e6),
               "diagnose_peak_rss_MiB": round(rss / 2**20), "exit": rc, "root_cause": root}
        if rg:
            warm(log)
            rsecs, rcpu, _rrss, _, _ = measure_one([rg, "-c", "-F", "-f", str(anchors), str(log)])
            row.update({"rg_s": round(rsecs, 2), "rg_cpu_s": round(rcpu, 2), "rg_MBps": round(nbytes / rsecs / 1e6),
                        "ratio_vs_rg": round(secs / rsecs, 2), "cpu_ratio_vs_rg": round(cpu / max(rcpu, 1e-9), 2)})
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not a.keep:
            log.unlink()
    info = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "help_s": round(help_s, 3), "help_cpu_s": round(help_cpu, 3), "warmup_run": a.warmup, "rows": rows}
    try:
        import hyperscan  # noqa: F401

        info["scanner"] = "hyperscan"
    except ImportError:
        info["scanner"] = "re2 or pure Python"
    print()
    print(f"machine: {info['machine']}; phase-1 scanner available: {info['scanner']}; "
          f"diagnose --help: {info['help_s']} s wall, {info['help_cpu_s']} s CPU")
    print(f"{'size':>8} {'load':>5} {'wall':>7} {'CPU':>7} {'MB/s':>6} {'CPU MB/s':>8} {'peak RSS':>9} "
          f"{'rg wall':>8} {'rg CPU':>7} {'ratio':>6} {'CPU ratio':>9}  root cause")
    for r in rows:
        print(f"{r['size']:>8} {r['load_avg_1m']:>5} {r['diagnose_s']:>6}s {r['diagnose_cpu_s']:>6}s "
              f"{r['diagnose_MBps']:>6} {r['diagnose_cpu_MBps']:>8} {r['diagnose_peak_rss_MiB']:>6}MiB "
              f"{r.get('rg_s', '-'):>7}s {r.get('rg_cpu_s', '-'):>6}s {r.get('ratio_vs_rg', '-'):>6} "
              f"{r.get('cpu_ratio_vs_rg', '-'):>9}  {r['root_cause']}")
    if a.json:
        Path(a.json).write_text(json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
