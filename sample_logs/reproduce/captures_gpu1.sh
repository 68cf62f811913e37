#!/usr/bin/env bash
# Batch 1 on a machine with two H200s: single-GPU captures in two lanes (one per GPU), then the DP=1 memory
# calibration. Needs setup_sites.sh first. Raw logs go to $RAW (default ./raw); pack.sh tars them.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cap=$here/run_capture.sh
old=/tmp/site_old new=/tmp/site_new
T=${TORCHRUN:-torchrun}
one="$T --standalone --nproc_per_node=1 bridge_run.py"
big="--size 36b checkpoint.save=null"
fsdp="ddp.use_megatron_fsdp=true checkpoint.ckpt_format=fsdp_dtensor checkpoint.save=null"
nodistopt="optimizer.use_distributed_optimizer=false ddp.use_distributed_optimizer=false"

lane_a() {  # GPU 0
  export CUDA_VISIBLE_DEVICES=0
  # Torch FSDP2 through Bridge 0.4.2's own setup -> _ddp_wrap: the pg_collection TypeError.
  $cap b042_fsdp2_pg_collection $old 120 $one --size tiny dist.use_torch_fsdp2=true checkpoint.save=null
  # 36.3B parameters on one GPU: plain DDP (fp32 grad buffer), at wrap time.
  $cap b042_ddp_wrap_oom $old 150 $one $big $nodistopt
  # Megatron FSDP optim_grads_params at DP=1: its buffers for 36.3B parameters.
  $cap b042_mfsdp_ogp_wrap_oom $old 150 $one $big $fsdp ddp.data_parallel_sharding_strategy=optim_grads_params
  # Distributed optimizer (bf16 param buffer + fp32 grad buffer) on the current release.
  $cap b062_distopt_wrap_oom $new 150 $one $big
  cd "$here/../../benchmarks/memory_calibration" &&
    PYTHONPATH=/tmp/site_m16 timeout 200 $T --standalone --nproc_per_node=1 measure.py --sizes s3b \
      --out "$RAW/h200_dp1_s3b.json" >"$RAW/measure_dp1_s3b.out" 2>&1
}

lane_b() {  # GPU 1
  export CUDA_VISIBLE_DEVICES=1
  # Megatron FSDP optim strategy, current release.
  $cap b062_mfsdp_optim_wrap_oom $new 150 $one $big $fsdp ddp.data_parallel_sharding_strategy=optim
  # 8B model, 8192 tokens, unfused attention: activations of the first forward do not fit.
  $cap b062_first_iter_activation_oom $new 180 $one --size 8b --seq 8192 --mbs 1 checkpoint.save=null
  # 9.8B model with the distributed optimizer at DP=1: fits until Adam's moments appear at the first step.
  $cap b062_adam_step_oom $new 180 $one --size 10b --seq 1024 --mbs 1 checkpoint.save=null
  # Caching allocator left fragmented, then a 24 GiB request.
  FAULT=fragment@0:2 $cap b062_fragmentation_oom $new 150 $one --size tiny --iters 4 checkpoint.save=null
  # Trains, then the checkpoint save hits a full file system (1 MiB tmpfs).
  mkdir -p /tmp/ckfull && { mount -t tmpfs -o size=1m tmpfs /tmp/ckfull || echo "tmpfs mount failed" >"$RAW/ckfull.note"; }
  $cap b062_ckpt_save_enospc $new 180 $one --size tiny --iters 6 checkpoint.save=/tmp/ckfull checkpoint.save_interval=3
  cd "$here/../../benchmarks/memory_calibration" &&
    PYTHONPATH=/tmp/site_m16 timeout 200 $T --standalone --nproc_per_node=1 measure.py --sizes s400m s1b \
      --out "$RAW/h200_dp1_small.json" >"$RAW/measure_dp1_small.out" 2>&1
}

export RAW=${RAW:-$here/raw}
mkdir -p "$RAW"
(timeout 530 bash -c "$(declare -f lane_a); $(declare -p cap old new T one big fsdp nodistopt here RAW); lane_a") &
(timeout 530 bash -c "$(declare -f lane_b); $(declare -p cap old new T one big fsdp nodistopt here RAW); lane_b") &
wait
echo "batch 1 done"
