#!/usr/bin/env bash
# The activation sweep (measure_activations.py): the dense model, its config variants and the MoE groups, one
# process per family, each resumed once if it died (the records written so far are kept), then merged into
# OUTDIR/h200_activations.json.
#   measure_activations_all.sh OUTDIR [DENSE_SECONDS MOE_SECONDS]
# Needs megatron-core on PYTHONPATH and one GPU.
set -u
outdir=$1 dense_s=${2:-300} moe_s=${3:-120}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$outdir"
export PYTHONUNBUFFERED=1
for family in dense extra moe1 moe2 moe3 moe4; do
  limit=$dense_s; [ "${family#moe}" != "$family" ] && limit=$moe_s
  end=$((SECONDS + limit))
  for try in 1 2; do
    left=$((end - SECONDS)); [ "$left" -le 10 ] && break
    timeout "$left" python3 "$here/measure_activations.py" --family "$family" --out "$outdir/$family.json" \
      >>"$outdir/$family.log" 2>>"$outdir/$family.err" && break
    echo "$family: try $try ended with $?" | tee -a "$outdir/$family.log"
  done
  grep -v "^  warnings.warn\|UserWarning" "$outdir/$family.log" | tail -80
done
python3 - "$outdir" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
records = []
for family in ("dense", "extra", "moe1", "moe2", "moe3", "moe4"):
    p = out / f"{family}.json"
    if p.exists():
        records += json.loads(p.read_text())
(out / "h200_activations.json").write_text(json.dumps(records, indent=1))
print(len(records), "records ->", out / "h200_activations.json")
PY
