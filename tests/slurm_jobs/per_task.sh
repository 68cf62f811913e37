#!/bin/bash
#SBATCH --job-name=diag-pertask
#SBATCH --ntasks=2
#SBATCH --overcommit
#SBATCH --output=%x-%j.out
# One output file per task (srun -o with %t), the way jobs with thousands of ranks log: task 1 runs out of CUDA
# memory, task 0 then times out in NCCL waiting for it. $1: the folder holding the two logs the tasks print.
# --overcommit: both tasks fit on one CPU, so the job does not wait for a second free core.
echo "batch script starting"
srun -n 2 -o out-%j-%t.log bash -c 'if [ "$SLURM_PROCID" = 1 ]; then cat "$0/task_oom.log"; else cat "$0/task_nccl_timeout.log"; fi; exit 1' "$1"
echo "srun exit=$?"
exit 1
