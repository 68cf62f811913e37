#!/bin/bash
#SBATCH --job-name=diag-exit3
# No --output anywhere: Slurm writes slurm-%j.out in the working directory.
echo "preparing data"
exit 3
