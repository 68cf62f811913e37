#!/bin/bash
# One job of the fleet test's array: line $SLURM_ARRAY_TASK_ID of the plan file ($1) names a log and an exit code;
# the job prints the log (a sample log, host-prefixed) and exits with that code.
read -r log code < <(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$1")
cat "$log"
exit "$code"
