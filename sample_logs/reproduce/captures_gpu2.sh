#!/usr/bin/env bash
# Batch 2 on a machine with two H200s (after batch 1, whose megatron-bridge 0.6.2 runs stopped at import: the
# machine's tokenizers 0.23.2 is outside transformers 5.12.1's pin; tokenizers 0.22.2 now travels too):
#   1. single-GPU captures on the current release, one lane per GPU, then the DP=1 memory calibration;
#   2. two-GPU captures (Megatron FSDP save/resume, a rank killed, a rank stalled past the NCCL timeout, a rank OOM
#      on one of two "nodes"), with the DP=2 memory calibration running beside the first ones.
# Needs setup_sites.sh first. Raw logs go to $RAW (default ./raw); pack.sh tars them.
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
big="--size 36b checkpoint.save=null"
mfsdp="ddp.use_megatron_fsdp=true checkpoint.ckpt_format=fsdp_dtensor"
short="dist.distributed_timeout_minutes=1"

lane_a() {
  export CUDA_VISIBLE_DEVICES=0
  # Distributed optimizer (bf16 param buffer + fp32 grad buffer) for 36.3B parameters on one GPU.
  $cap b062_distopt_wrap_oom $new 150 $one $big
  # Megatron FSDP, optim strategy, same model.
  $cap b062_mfsdp_optim_wrap_oom $new 150 $one $big $mfsdp ddp.data_parallel_sharding_strategy=optim
  # 8B model, 8192 tokens, unfused attention: activations of the first forward do not fit.
  $cap b062_first_iter_activation_oom $new 150 $one --size 8b --seq 8192 --mbs 1 checkpoint.save=null
  # 9.8B model with the distributed optimizer at DP=1: fits until Adam's moments appear at the first step.
  $cap b062_adam_step_oom $new 150 $one --size 10b --seq 1024 --mbs 1 checkpoint.save=null
  PYTHONPATH=/tmp/site_m16 $measure 1 "$RAW/measure" s3b
}
lane_b() {
  export CUDA_VISIBLE_DEVICES=1
  # Caching allocator left fragmented by the harness, then a 24 GiB request.
  FAULT=fragment@0:2 $cap b062_fragmentation_oom $new 150 $one --size tiny --iters 4 checkpoint.save=null
  # Trains, then the checkpoint save hits a full file system (1 MiB tmpfs).
  mkdir -p /tmp/ckfull && { mountpoint -q /tmp/ckfull || mount -t tmpfs -o size=1m tmpfs /tmp/ckfull || echo "tmpfs mount failed" >"$RAW/ckfull.note"; }
  $cap b062_ckpt_save_enospc $new 150 $one --size tiny --iters 6 checkpoint.save=/tmp/ckfull checkpoint.save_interval=3
  PYTHONPATH=/tmp/site_m16 $measure 1 "$RAW/measure" s400m s1b
}
lane_a >"$RAW/lane_a.out" 2>&1 &
lane_b >"$RAW/lane_b.out" 2>&1 &
wait
echo "single-GPU part done"

(PYTHONPATH=/tmp/site_m16 $measure 2 "$RAW/measure" s1b s3b >"$RAW/measure_dp2.out" 2>&1) &
# Megatron FSDP on 2 GPUs: 4 iterations with fsdp_dtensor saves at 2 and 4, then a resume to 6 (success logs).
rm -rf /tmp/ckok
$cap b062_mfsdp_dtensor_save $new 150 $two --iters 4 $mfsdp ddp.data_parallel_sharding_strategy=optim_grads_params checkpoint.save=/tmp/ckok checkpoint.save_interval=2
$cap b062_mfsdp_dtensor_resume $new 150 $two --iters 6 $mfsdp ddp.data_parallel_sharding_strategy=optim_grads_params checkpoint.save=/tmp/ckok checkpoint.load=/tmp/ckok checkpoint.save_interval=100
# Rank 1 killed by SIGKILL at its 3rd iteration (torchrun's Failures block).
FAULT=kill@1:3 $cap b062_rank_killed $new 120 $two --iters 8 checkpoint.save=null
# Rank 1 stalls at its 3rd iteration; rank 0's collective passes the 1-minute timeout (NCCL watchdog).
FAULT=stall@1:3 $cap b062_rank_stall_watchdog $new 200 $two --iters 8 checkpoint.save=null $short
wait
# Two "nodes" (one torchrun agent each, one GPU each), output merged as in one Slurm job file; rank 1 OOMs at its
# 3rd iteration while rank 0 waits in the gradient all-reduce.
FAULT=oom@1:3 $cap b062_two_node_oom_cascade $new 200 bash -c "
  CUDA_VISIBLE_DEVICES=0 $T --nnodes=2 --node_rank=0 --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=29555 bridge_run.py --size tiny --iters 8 checkpoint.save=null $short &
  CUDA_VISIBLE_DEVICES=1 $T --nnodes=2 --node_rank=1 --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=29555 bridge_run.py --size tiny --iters 8 checkpoint.save=null $short &
  wait"
echo "batch 2 done"
