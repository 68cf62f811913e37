#!/bin/bash
#SBATCH --job-name=diag-sleeper
#SBATCH --output=%x-%j.out
# Runs until Slurm stops it (the test lowers its time limit to 0 so Slurm's time-limit check kills it).
for i in $(seq 1 600); do echo "iteration $i"; sleep 1; done
