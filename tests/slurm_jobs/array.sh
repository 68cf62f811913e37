#!/bin/bash
#SBATCH --job-name=diag-arr
#SBATCH --array=0-2
#SBATCH --output=%x-%A_%a.out
# Task 1 of 3 fails with a Python exception; the others succeed.
echo "task $SLURM_ARRAY_TASK_ID of array $SLURM_ARRAY_JOB_ID (job $SLURM_JOB_ID)"
if [ "$SLURM_ARRAY_TASK_ID" = 1 ]; then
  python3 -c 'raise RuntimeError("task 1 exploded while loading shard 7")'
fi
