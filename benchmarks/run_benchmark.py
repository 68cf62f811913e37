"""Speed and memory of diagnose, both installs and ripgrep in the same run (issue 15).

Two virtual environments (created under ``--venvs``, default /work/venvs, outside the repository):

* ``plain``: ``pip install <tree>``: what ``pipx install diagnose`` gives (Hyperscan where it has wheels);
* ``full``: ``pip install "torch==2.13.0" "<tree>[fast,megatron]"`` (google-re2, numpy, torch, megatron-core).

Each run reinstalls the tree into both (``--no-deps``, so the code measured is this checkout's) unless
``--no-install``. Then:

1. big logs: for each size, the generated 512-rank log (seeded, cached under benchmarks/out/, dated back so ingest
   maps it instead of copying a live file), page cache warmed, then in turn ``rg -c -F -f anchors.txt`` (the
   catalogue's anchor literals), the plain install, the full install, and the plain install's pure-Python scanner
   (``DIAGNOSE_SCANNER=python``, the path of platforms without wheels) and the full install forced to RE2 (the
   engine not chosen), for sizes up to ``--python-max``. With ``--repeat N``, the run of lowest CPU time is kept
   and the best wall time of the N is recorded beside it (``wall_best_s``). Each child's
   wall time, CPU time (user + system, from wait4) and peak RSS; the 1-minute load average before each;
2. small logs: ``analyze`` of every sample log with the full install, twice (a fresh cache, then warm): wall
   p50 / p95 / max, CPU, peak RSS;
3. ``check`` of a full Bridge config (benchmarks/data/full_bridge_config.yaml, 334 lines) with the full
   install: cold (empty cache: megatron-core imported, the meta-device count built) and warm.

CPU time is the figure that holds on a shared machine; wall time depends on the other load, which is recorded.

    python3 benchmarks/run_benchmark.py --sizes 100MiB 1GiB 5GiB --json benchmarks/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from gen_log import _size, generate  # noqa: E402

LOG_AGE_S = 600
TORCH = "torch==2.13.0"
FULL_CONFIG = HERE / "data" / "full_bridge_config.yaml"


def measure_one(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    """wall s, CPU s, peak RSS bytes, exit code, stdout of one command, measured in a fresh helper process so that
    RUSAGE_CHILDREN holds only this command."""
    code = (
        "import json,resource,subprocess,sys,time;"
        "t=time.perf_counter();p=subprocess.run(sys.argv[1:],stdout=subprocess.PIPE,stderr=subprocess.PIPE);"
        "s=time.perf_counter()-t;r=resource.getrusage(resource.RUSAGE_CHILDREN);"
        "print(json.dumps({'s':s,'cpu':r.ru_utime+r.ru_stime,'rss':r.ru_maxrss*1024,"
        "'rc':p.returncode,'out':p.stdout[-2000000:].decode(errors='replace'),"
        "'err':p.stderr[-2000:].decode(errors='replace')}))"
    )
    load = os.getloadavg()[0]
    res = subprocess.run([sys.executable, "-c", code, *cmd], stdout=subprocess.PIPE, check=True, env=env)
    d = json.loads(res.stdout)
    d["load"] = load
    return d


def venv_python(venvs: Path, name: str) -> Path:
    return venvs / name / "bin" / "python"


def ensure_venvs(venvs: Path, install: bool) -> None:
    """Create the two environments when missing; put this tree's code into both."""
    for name, extras in (("plain", ""), ("full", "[fast,megatron]")):
        py = venv_python(venvs, name)
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venvs / name)], check=True)
            pkgs = [f"{ROOT}{extras}"] + ([TORCH] if name == "full" else [])
            subprocess.run([str(py), "-m", "pip", "install", "-q", *pkgs], check=True)
        elif install:
            subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(ROOT)],
                           check=True, stdout=subprocess.DEVNULL)
            if name == "plain":  # a dependency added since the venv was made (Hyperscan)
                subprocess.run([str(py), "-m", "pip", "install", "-q", str(ROOT)], check=True,
                               stdout=subprocess.DEVNULL)


def installed(py: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m,json;out={}\n"
            "for d in ('hyperscan','google-re2','numpy','torch','megatron-core'):\n"
            "    try: out[d]=m.version(d)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    return json.loads(subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True).stdout)


def anchors_file(path: Path) -> Path:
    from diagnose.match import load_catalogue

    anchors = sorted({p.anchor for r in load_catalogue().rules for p in r.patterns})
    path.write_text("\n".join(anchors) + "\n")
    return path


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def _root(out: str) -> str | None:
    try:
        rep = json.loads(out)
        if rep.get("root_cause") is not None:
            return rep["findings"][rep["root_cause"]]["rule"]
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    return None


def _row(d: dict, nbytes: int, rg: dict | None) -> dict:
    row = {"wall_s": round(d["s"], 2), "cpu_s": round(d["cpu"], 2), "MBps": round(nbytes / d["s"] / 1e6),
           "wall_best_s": round(d["wall_best"], 2), "MBps_best_wall": round(nbytes / d["wall_best"] / 1e6),
           "cpu_MBps": round(nbytes / max(d["cpu"], 1e-9) / 1e6), "peak_rss_MiB": round(d["rss"] / 2**20),
           "load_avg_1m": round(d["load"], 1), "exit": d["rc"], "root_cause": _root(d["out"])}
    if rg is not None:
        row["ratio_vs_rg_wall"] = round(d["s"] / rg["s"], 2)
        row["ratio_vs_rg_cpu"] = round(d["cpu"] / max(rg["cpu"], 1e-9), 2)
    return row


def big_logs(a, venvs: Path, env: dict[str, str]) -> list[dict]:
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    anchors = anchors_file(out / "anchors.txt")
    rg = shutil.which("rg")
    rows = []
    for s in a.sizes:
        size = _size(s)
        log = out / f"bench-{s}-{a.ranks}r.log"
        if not log.exists() or abs(log.stat().st_size - size) > 1 << 20:
            generate(str(log), size, a.ranks)
        if time.time() - log.stat().st_mtime < LOG_AGE_S:
            old = time.time() - LOG_AGE_S
            os.utime(log, (old, old))
        nbytes = log.stat().st_size
        row: dict = {"size": s, "bytes": nbytes}
        runs = [("plain", venv_python(venvs, "plain"), {}), ("full", venv_python(venvs, "full"), {})]
        if size <= _size(a.python_max):
            runs.append(("plain_pure_python", venv_python(venvs, "plain"), {"DIAGNOSE_SCANNER": "python"}))
            runs.append(("full_re2", venv_python(venvs, "full"), {"DIAGNOSE_SCANNER": "re2"}))  # the engine not chosen
        best: dict[str, dict] = {}
        for _ in range(a.repeat):
            if rg:
                warm(log)
                r = measure_one([rg, "-c", "-F", "-f", str(anchors), str(log)])
                r["wall_best"] = min(r["s"], best["rg"]["wall_best"]) if "rg" in best else r["s"]
                if "rg" not in best or r["cpu"] < best["rg"]["cpu"]:
                    best["rg"] = r
                else:
                    best["rg"]["wall_best"] = r["wall_best"]
            for name, py, extra in runs:
                warm(log)
                cmd = [str(py), "-m", "diagnose", "analyze", "--format", "json", "--no-progress", str(log)]
                if name not in best:
                    measure_one(cmd, dict(env, **extra))  # untimed: compiled databases and rule files cached
                d = measure_one(cmd, dict(env, **extra))
                d["wall_best"] = min(d["s"], best[name]["wall_best"]) if name in best else d["s"]
                if name not in best or d["cpu"] < best[name]["cpu"]:
                    best[name] = d
                else:
                    best[name]["wall_best"] = d["wall_best"]
        rgd = best.get("rg")
        if rgd is not None:
            row["rg"] = {"wall_s": round(rgd["s"], 2), "cpu_s": round(rgd["cpu"], 2),
                         "wall_best_s": round(rgd["wall_best"], 2),
                         "MBps": round(nbytes / rgd["s"] / 1e6),
                         "cpu_MBps": round(nbytes / max(rgd["cpu"], 1e-9) / 1e6),
                         "peak_rss_MiB": round(rgd["rss"] / 2**20), "load_avg_1m": round(rgd["load"], 1)}
        for name, _py, _extra in runs:
            row[name] = _row(best[name], nbytes, rgd)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not a.keep:
            log.unlink()
    return rows


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(q * (len(values) - 1))))
    return values[k]


def small_logs(venvs: Path, env: dict[str, str]) -> dict:
    py = venv_python(venvs, "full")
    logs = sorted(p for p in (ROOT / "sample_logs").rglob("*.log") if "reproduce" not in p.parts)
    out: dict = {"logs": len(logs)}
    for label in ("first_run", "warm"):
        walls, cpus, rss, slowest = [], [], [], []
        for log in logs:
            d = measure_one([str(py), "-m", "diagnose", "analyze", "--format", "json", "--no-progress", str(log)],
                            env)
            walls.append(d["s"])
            cpus.append(d["cpu"])
            rss.append(d["rss"])
            slowest.append((d["s"], log.name))
        slowest.sort(reverse=True)
        out[label] = {"wall_p50_s": round(_pct(walls, 0.5), 2), "wall_p95_s": round(_pct(walls, 0.95), 2),
                      "wall_max_s": round(max(walls), 2), "cpu_p95_s": round(_pct(cpus, 0.95), 2),
                      "peak_rss_max_MiB": round(max(rss) / 2**20),
                      "slowest": [f"{n} {s:.2f}s" for s, n in slowest[:3]],
                      "load_avg_1m": round(os.getloadavg()[0], 1)}
        print(label, json.dumps(out[label]), flush=True)
        if label == "first_run":
            time.sleep(20)  # let the background megatron-core workers of the first pass finish
    return out


def check_bench(venvs: Path, env: dict[str, str]) -> dict:
    py = venv_python(venvs, "full")
    cmd = [str(py), "-m", "diagnose", "check", str(FULL_CONFIG), "--gpus", "64", "--format", "json"]
    cold = measure_one(cmd, env)
    warm_runs = [measure_one(cmd, env) for _ in range(3)]
    w = min(warm_runs, key=lambda d: d["s"])
    res = {"config": str(FULL_CONFIG.relative_to(ROOT)), "config_lines": len(FULL_CONFIG.read_text().splitlines()),
           "cold": {"wall_s": round(cold["s"], 2), "cpu_s": round(cold["cpu"], 2),
                    "peak_rss_MiB": round(cold["rss"] / 2**20), "load_avg_1m": round(cold["load"], 1)},
           "warm": {"wall_s": round(w["s"], 2), "wall_max_s": round(max(d["s"] for d in warm_runs), 2),
                    "cpu_s": round(w["cpu"], 2), "peak_rss_MiB": round(w["rss"] / 2**20),
                    "load_avg_1m": round(w["load"], 1)},
           "same_answer": cold["out"] == w["out"]}
    print("check", json.dumps(res), flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["100MiB", "1GiB", "5GiB"])
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--venvs", default="/work/venvs", help="where the plain and full environments live")
    ap.add_argument("--no-install", dest="install", action="store_false", help="use the venvs as they are")
    ap.add_argument("--python-max", default="1GiB", help="largest log for the pure-Python scanner row")
    ap.add_argument("--repeat", type=int, default=1, help="runs per size and tool (the lowest CPU time is kept)")
    ap.add_argument("--out-dir", default=str(HERE / "out"))
    ap.add_argument("--keep", action="store_true", help="keep the generated logs")
    ap.add_argument("--skip", nargs="*", default=[], choices=["big", "small", "check"])
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    a = ap.parse_args(argv)

    venvs = Path(a.venvs)
    ensure_venvs(venvs, a.install)
    cache = tempfile.mkdtemp(prefix="diagnose-bench-cache-")
    env = dict(os.environ, DIAGNOSE_CACHE_DIR=cache)
    env.pop("DIAGNOSE_SCANNER", None)
    env.pop("PYTHONPATH", None)
    rg = shutil.which("rg")
    rg_version = subprocess.run([rg, "--version"], capture_output=True, text=True).stdout.split("\n")[0] if rg else None
    info: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_avg_at_start": [round(x, 1) for x in os.getloadavg()],
        "ripgrep": rg_version,
        "installs": {name: installed(venv_python(venvs, name)) for name in ("plain", "full")},
    }
    help_runs = [measure_one([str(venv_python(venvs, "plain")), "-m", "diagnose", "--help"], env) for _ in range(3)]
    info["help_s"] = round(min(h["s"] for h in help_runs), 3)
    if "big" not in a.skip:
        info["rows"] = big_logs(a, venvs, env)
    if "small" not in a.skip:
        info["small_logs_full_install"] = small_logs(venvs, env)
    if "check" not in a.skip:
        # a cache of its own: "cold" means nothing cached, not even by the small-log pass
        info["check_full_install"] = check_bench(venvs, dict(env, DIAGNOSE_CACHE_DIR=tempfile.mkdtemp()))
    info["load_avg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    shutil.rmtree(cache, ignore_errors=True)
    print()
    print(f"machine: {info['machine']}; load at start {info['load_avg_at_start']}, at end {info['load_avg_at_end']}")
    for r in info.get("rows", []):
        rgd = r.get("rg", {})
        print(f"{r['size']:>7}: rg {rgd.get('wall_s')}s wall {rgd.get('cpu_s')}s CPU")
        for name in ("plain", "full", "plain_pure_python", "full_re2"):
            if name in r:
                x = r[name]
                print(f"   {name:>18}: {x['wall_s']}s wall {x['cpu_s']}s CPU ({x['MBps']} / {x['cpu_MBps']} MB/s), "
                      f"{x['peak_rss_MiB']} MiB, x{x.get('ratio_vs_rg_cpu')} rg CPU, load {x['load_avg_1m']}, "
                      f"{x['root_cause']}")
    if a.json:
        Path(a.json).write_text(json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
