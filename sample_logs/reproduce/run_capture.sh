#!/usr/bin/env bash
# Run one capture: a launcher command whose stdout+stderr (merged, as a Slurm output file has them) become a log.
#
#   run_capture.sh NAME SITE TIMEOUT_S COMMAND...
#
# NAME: the capture's name; SITE: folder with megatron-core/megatron-bridge installed (--target), put on PYTHONPATH
# (empty: none); TIMEOUT_S: wall-clock limit. Writes $RAW/NAME.log, NAME.rc (exit status), NAME.cmd (the command)
# and NAME.env (versions, GPU). RAW defaults to ./raw. Runs from this script's folder, so that tracebacks show the
# driver as a plain file name and the rewrite of path prefixes (finish.py) is one fixed prefix.
set -u
name=$1 site=$2 limit=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
raw=${RAW:-$here/raw}
mkdir -p "$raw"
cd "$here" || exit 2
export PYTHONPATH=${site}${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
# Keep NVLink multicast off (shared machines: see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
printf '%q ' "$@" >"$raw/$name.cmd"
{
  python3 -c 'import sys, torch; print("python", sys.version.split()[0]); print("torch", torch.__version__)'
  python3 - <<'EOF'
from importlib import metadata
for dist in ("megatron-core", "megatron-bridge", "transformers"):
    try:
        print(dist, metadata.version(dist))
    except metadata.PackageNotFoundError:
        print(dist, "absent")
EOF
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
  echo "visible ${CUDA_VISIBLE_DEVICES-all}"
  echo "cwd $here"
  echo "site $site"
  python3 -c 'import torch, os; print("torch_at", os.path.dirname(os.path.dirname(torch.__file__)))'
  echo "launcher $(command -v torchrun)"
} >"$raw/$name.env" 2>&1
start=$(date +%s)
timeout --signal=TERM --kill-after=20 "$limit" "$@" >"$raw/$name.log" 2>&1
rc=$?
echo "$rc $(( $(date +%s) - start ))" >"$raw/$name.rc"
echo "capture $name: rc=$rc in $(( $(date +%s) - start ))s"
