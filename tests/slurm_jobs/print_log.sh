#!/bin/bash
#SBATCH --job-name=diag-printlog
#SBATCH --output=%x-%j.out
# A training job whose torchrun failed: prints the log named by $1 (a real Megatron log) and exits 1.
cat "$1"
exit 1
