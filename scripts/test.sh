#!/usr/bin/env bash
# Run the whole test suite the way CI does: start the project's own single-node Slurm cluster (installing Debian's
# Slurm packages when missing), run pytest, stop the cluster by PID whatever happened.
# Usage: bash scripts/test.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."

slurm_up=0
if [ "$(id -u)" = 0 ] && [ "${DIAGNOSE_SKIP_SLURM:-0}" != 1 ]; then
  export SLURM_LOCAL_MIN_JOB_AGE=${SLURM_LOCAL_MIN_JOB_AGE:-60}
  if bash scripts/slurm-local.sh up; then
    slurm_up=1
    # shellcheck disable=SC1091
    source "${SLURM_LOCAL_DIR:-/tmp/slurm-local}/slurm.env"
  else
    echo "test.sh: the local Slurm cluster did not start; the slurm tests will fail" >&2
  fi
  export CI="${CI:-1}"   # as root with the cluster script run, Slurm tests must run (fail), never skip
fi
trap '[ "$slurm_up" = 1 ] && bash scripts/slurm-local.sh down' EXIT

# Lint and type-check the package first (both configured in pyproject.toml); a failure fails the run.
# DIAGNOSE_SKIP_LINT=1 skips them (a quick local run of a few tests).
lint_rc=0
if [ "${DIAGNOSE_SKIP_LINT:-0}" != 1 ]; then
  python3 -m ruff check diagnose || lint_rc=1
  python3 -m mypy || lint_rc=1
fi

# Two workers for everything but the TUI snapshots, which wait on the screen settling and are run alone after.
python3 -m pytest -n 2 --dist loadgroup -q --ignore=tests/test_tui_snapshots.py "$@"
rc=$?
python3 -m pytest -q -p no:xdist tests/test_tui_snapshots.py "$@"
rc2=$?
[ "$rc" = 0 ] && rc=$rc2
[ "$rc" = 0 ] && rc=$lint_rc
exit "$rc"
