#!/usr/bin/env bash
# Batch 3 on a machine with two H200s: the runs of batch 2 that stopped at the first forward on the missing apex
# softmax kernel (now model.masked_softmax_fusion=false), the two-GPU captures it had no time for, and the rest of
# the DP=2 memory calibration. Needs setup_sites.sh first.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cap=$here/run_capture.sh
new=/tmp/site_new
T=${TORCHRUN:-torchrun}
export RAW=${RAW:-$here/raw}
mkdir -p "$RAW"
measure="$here/../../benchmarks/memory_calibration/measure_all.sh"
one="$T --standalone --nproc_per_node=1 bridge_run.py"
two="$T --standalone --nproc_per_node=2 bridge_run.py --size tiny"
mfsdp="ddp.use_megatron_fsdp=true ddp.data_parallel_sharding_strategy=optim_grads_params checkpoint.ckpt_format=fsdp_dtensor"
short="dist.distributed_timeout_minutes=1"

(export CUDA_VISIBLE_DEVICES=0
 $cap b062_adam_step_oom $new 120 $one --size 10b --seq 1024 --mbs 1 checkpoint.save=null) &
(export CUDA_VISIBLE_DEVICES=1
 FAULT=fragment@0:2 $cap b062_fragmentation_oom $new 100 $one --size tiny --iters 4 checkpoint.save=null
 mkdir -p /tmp/ckfull && { mountpoint -q /tmp/ckfull || mount -t tmpfs -o size=1m tmpfs /tmp/ckfull || echo "tmpfs mount failed" >"$RAW/ckfull.note"; }
 $cap b062_ckpt_save_enospc $new 100 $one --size tiny --iters 6 checkpoint.save=/tmp/ckfull checkpoint.save_interval=3) &
wait
(PYTHONPATH=/tmp/site_m16 INDICES="5 6 7" $measure 2 "$RAW/measure" s1b >"$RAW/measure_dp2.out" 2>&1
 PYTHONPATH=/tmp/site_m16 $measure 2 "$RAW/measure" s3b >>"$RAW/measure_dp2.out" 2>&1) &
rm -rf /tmp/ckok
$cap b062_mfsdp_dtensor_save $new 100 $two --iters 4 $mfsdp checkpoint.save=/tmp/ckok checkpoint.save_interval=2
$cap b062_mfsdp_dtensor_resume $new 100 $two --iters 6 $mfsdp checkpoint.save=/tmp/ckok checkpoint.load=/tmp/ckok checkpoint.save_interval=100
FAULT=kill@1:3 $cap b062_rank_killed $new 90 $two --iters 8 checkpoint.save=null
wait
FAULT=stall@1:3 $cap b062_rank_stall_watchdog $new 150 $two --iters 8 checkpoint.save=null $short
FAULT=oom@1:3 $cap b062_two_node_oom_cascade $new 150 bash -c "
  CUDA_VISIBLE_DEVICES=0 $T --nnodes=2 --node_rank=0 --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=29555 bridge_run.py --size tiny --iters 8 checkpoint.save=null $short &
  CUDA_VISIBLE_DEVICES=1 $T --nnodes=2 --node_rank=1 --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=29555 bridge_run.py --size tiny --iters 8 checkpoint.save=null $short &
  wait"
echo "batch 3 done"
