#!/usr/bin/env bash
# Run measure.py once per (size, strategy), each in a fresh process (Megatron FSDP leaves memory allocated after
# its objects are gone, which would inflate the next measurement), then merge the records.
#   measure_all.sh NPROC OUTDIR SIZE... [-- TORCHRUN]
# Needs megatron-core on PYTHONPATH and NPROC GPUs (DP = NPROC).
set -u
nproc=$1 outdir=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
T=${TORCHRUN:-torchrun}
mkdir -p "$outdir"
for size in "$@"; do
  for index in ${INDICES:-0 1 2 3 4 5 6 7}; do
    out=$outdir/${size}_s${index}_dp${nproc}.json
    timeout 120 $T --standalone --nproc_per_node="$nproc" "$here/measure.py" --sizes "$size" --index "$index" \
      --out "$out" >"$outdir/${size}_s${index}_dp${nproc}.out" 2>&1 || echo "measure $size $index dp$nproc failed"
    grep -h "after_\|Error" "$outdir/${size}_s${index}_dp${nproc}.out" | grep -v Warning | tail -2
  done
done
