"""Print README's speed tables from benchmarks/results.json (``python3 benchmarks/readme_table.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(path: str = str(HERE / "results.json")) -> int:
    d = json.loads(Path(path).read_text())
    best = any("wall_best_s" in r.get("plain", {}) for r in d.get("rows", []))
    w = "best wall" if best else "wall"
    print(f"| log | install | {w} | CPU | MB/s ({w} / CPU) | x rg CPU | peak RSS | load | root cause |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in d.get("rows", []):
        rg = r.get("rg", {})
        rgw = rg.get("wall_best_s", rg.get("wall_s"))
        print(f"| {r['size']} | ripgrep | {rgw} s | {rg.get('cpu_s')} s | {round(r['bytes'] / rgw / 1e6)} / "
              f"{rg.get('cpu_MBps')} | 1 | {rg.get('peak_rss_MiB')} MiB | {rg.get('load_avg_1m')} | |")
        for name, label in (("plain", "plain"), ("full", "full"), ("plain_pure_python", "pure Python"),
                            ("full_re2", "RE2 (not chosen)")):
            x = r.get(name)
            if x:
                print(f"| {r['size']} | {label} | {x.get('wall_best_s', x['wall_s'])} s | {x['cpu_s']} s | "
                      f"{x.get('MBps_best_wall', x['MBps'])} / {x['cpu_MBps']} | "
                      f"{x.get('ratio_vs_rg_cpu')} | {x['peak_rss_MiB']} MiB | {x['load_avg_1m']} | "
                      f"{x['root_cause']} |")
    s = d.get("small_logs_full_install")
    if s:
        print()
        print(f"| {s['logs']} sample logs, full install | wall p50 | p95 | max | CPU p95 | peak RSS | load |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label in ("first_run", "warm"):
            x = s[label]
            print(f"| {label.replace('_', ' ')} | {x['wall_p50_s']} s | {x['wall_p95_s']} s | {x['wall_max_s']} s | "
                  f"{x['cpu_p95_s']} s | {x['peak_rss_max_MiB']} MiB | {x['load_avg_1m']} |")
    c = d.get("check_full_install")
    if c:
        print()
        print(f"| `check` ({c['config_lines']}-line Bridge config, full install) | wall | CPU | peak RSS | load |")
        print("|---|---:|---:|---:|---:|")
        for label in ("cold", "warm"):
            x = c[label]
            print(f"| {label} | {x['wall_s']} s | {x['cpu_s']} s | {x['peak_rss_MiB']} MiB | {x['load_avg_1m']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
