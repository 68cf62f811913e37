#!/bin/bash
#SBATCH --job-name=diag-srunlbl
#SBATCH --ntasks=2
#SBATCH --overcommit
#SBATCH --output=%x-%j.out
# --overcommit: both tasks fit on one CPU, so the job does not wait for a second free core.
# srun --label: task output prefixed "N: ", srun's own error line unprefixed and interleaved. The script ignores
# srun's exit status (exits 0), so only DerivedExitCode shows the failed step.
echo "batch script starting"
srun --label bash -c 'echo "hello from rank $SLURM_PROCID"; if [ "$SLURM_PROCID" = 1 ]; then python3 -c "import json; json.loads(\"{bad\")"; fi'
echo "srun exit=$?"
