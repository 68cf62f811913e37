#!/usr/bin/env bash
# The long fuzz run: every target in tests/fuzz/ at once, each for SECONDS (default 1800), niced so the machine stays
# usable. Coverage-guided with atheris when installed (pip install -e ".[fuzz]"), else each target's plain mutation
# loop. Per target, OUT/<target>/ gets stats.json (inputs tried, wall time, crashes), one file per distinct crash
# (the input, and .txt: its traceback) and, with atheris, the grown corpus; OUT/<target>.out is its console.
# Usage: bash scripts/fuzz.sh [SECONDS] [OUT]      (a short try: bash scripts/fuzz.sh 60 /tmp/fuzz-try)
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-1800}
out=${2:-fuzz-out}
mkdir -p "$out"
export DIAGNOSE_SKIP_SLURM=1
pids=()
for target in ingest cli tui_text tui_pilot; do
  script=tests/fuzz/fuzz_${target}.py
  [ -f "$script" ] || continue
  extra=()
  [ "$target" = tui_pilot ] && extra=(--max-len 4096)
  nice -n 19 python3 "$script" --seconds "$seconds" --crash-dir "$out/$target" "${extra[@]}" \
    >"$out/$target.out" 2>&1 &
  pids+=($!)
  echo "fuzz.sh: $target started (pid $!), output in $out/$target/"
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
for stats in "$out"/*/stats.json; do
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"{s['target']:10} {s['engine']:8} \
{s['iterations']:>8} inputs {s['wall_s']:>7.0f} s  {len(s['crashes'])} crashes\")" "$stats"
done
exit $status
