#!/usr/bin/env bash
# Batch 5 (issue 21, `diagnose verify`) on a machine with two H200s: Megatron FSDP runs that finish, for verify's
# checks on real logs. Installs only the current-release site (Bridge 0.6.2 + core 0.19.2) from the carried wheels.
#   GPU 0: Megatron FSDP, DP=1, fsdp_dtensor saves at iterations 2 and 4 (a run every check should pass)
#   GPU 1: Megatron FSDP, DP=1, learning rate 1e4 with the NaN checks off: the loss goes non-finite, training goes on
#   then both GPUs: Megatron FSDP, DP=2, no checkpoint; and DP=2 with fsdp_dtensor saves (hung twice before: 90 s cap)
set -u
here=$(cd "$(dirname "$0")" && pwd)
cap=$here/run_capture.sh
new=/tmp/site_new
whl=${WHL:-$here/../../.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $new \
  "$whl"/common/*.whl "$whl"/new/*.whl || exit 3
printf 'all:\n' >"$new/megatron/core/datasets/Makefile"
export RAW=${RAW:-$here/raw}
mkdir -p "$RAW"
T=${TORCHRUN:-torchrun}
one="$T --standalone --nproc_per_node=1 bridge_run.py --size tiny"
two="$T --standalone --nproc_per_node=2 bridge_run.py --size tiny"
mfsdp="ddp.use_megatron_fsdp=true ddp.data_parallel_sharding_strategy=optim_grads_params checkpoint.ckpt_format=fsdp_dtensor"
rm -rf /tmp/ck1 /tmp/ck2
(export CUDA_VISIBLE_DEVICES=0
 $cap b062_mfsdp_dp1_dtensor_success $new 150 $one --iters 4 $mfsdp checkpoint.save=/tmp/ck1 checkpoint.save_interval=2) &
(export CUDA_VISIBLE_DEVICES=1
 $cap b062_mfsdp_nan_loss $new 150 $one --iters 6 $mfsdp checkpoint.save=null optimizer.lr=10000.0 \
   scheduler.lr_warmup_iters=0 ddp.check_for_nan_in_grad=false rerun_state_machine.check_for_nan_in_loss=false) &
wait
$cap b062_mfsdp_dp2_no_checkpoint $new 120 $two --iters 6 $mfsdp checkpoint.save=null
$cap b062_mfsdp_dp2_dtensor_save $new 90 $two --iters 4 $mfsdp checkpoint.save=/tmp/ck2 checkpoint.save_interval=2
ls /tmp/ck1 /tmp/ck2 2>&1 | head -20 >"$RAW/checkpoints.txt"
echo "batch 5 done"
