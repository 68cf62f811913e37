#!/bin/bash
#SBATCH --job-name=diag-follow
#SBATCH --output=%x-%j.out
# Prints progress, then a real failure log ($1) while the job keeps running: `diagnose slurm --follow` must
# report the failure as soon as it appears, not when the job ends.
for i in 1 2 3; do echo "iteration $i"; sleep 1; done
cat "$1" >&2   # the failure goes to stderr (its own file when sbatch -e is given)
sleep 300
