#!/usr/bin/env bash
# Batch 4 on a machine with two H200s: the two watchdog captures batch 3 had no time for, side by side (tiny
# models: they share the GPUs without touching each other's memory). Needs setup_sites.sh first.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cap=$here/run_capture.sh
new=/tmp/site_new
T=${TORCHRUN:-torchrun}
export RAW=${RAW:-$here/raw}
mkdir -p "$RAW"
short="dist.distributed_timeout_minutes=1"
# Rank 1 stalls at its 3rd iteration; rank 0's collective passes the 1-minute timeout (NCCL watchdog).
FAULT=stall@1:3 $cap b062_rank_stall_watchdog $new 150 $T --standalone --nproc_per_node=2 bridge_run.py --size tiny --iters 8 checkpoint.save=null $short &
# Two "nodes" (one torchrun agent each, one GPU each), output merged as in one Slurm job file; rank 1 OOMs at its
# 3rd iteration while rank 0 waits in the gradient all-reduce.
FAULT=oom@1:3 $cap b062_two_node_oom_cascade $new 150 bash -c "
  CUDA_VISIBLE_DEVICES=0 $T --nnodes=2 --node_rank=0 --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=29555 bridge_run.py --size tiny --iters 8 checkpoint.save=null $short &
  CUDA_VISIBLE_DEVICES=1 $T --nnodes=2 --node_rank=1 --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=29555 bridge_run.py --size tiny --iters 8 checkpoint.save=null $short &
  wait" &
wait
echo "batch 4 done"
