#!/bin/bash
# Slurm epilog for `diagnose fleet`: diagnose each ending job into the fleet store (docs/fleet.md).
#
#   slurm.conf:  EpilogSlurmctld=/path/to/diagnose/fleet/epilog.sh     (preferred: once per job, on the controller)
#           or:  Epilog=/path/to/diagnose/fleet/epilog.sh              (per node: only the job's first node acts;
#                without SLURM_JOB_NODELIST every node tries, and the store keeps one row per job)
#
# Settings: environment variables, or the same names in /etc/diagnose/fleet-epilog.conf (DIAGNOSE_FLEET_CONF),
# a file this script sources (it must be owned by root and not writable by others, like the epilog itself):
#   DIAGNOSE_FLEET_STORE    the store (default /var/lib/diagnose/fleet.db; a local disk, or one controller's NFS)
#   DIAGNOSE_PYTHON         a Python with diagnose installed (default python3 on PATH)
#   DIAGNOSE_FLEET_TIMEOUT  seconds before the diagnosis is killed (default 60; SIGKILL 5 s after SIGTERM)
#   DIAGNOSE_FLEET_COMMENT  1: also write the one-line verdict into the job's comment (scontrol update job=...)
#   DIAGNOSE_FLEET_LOG      where messages go (default /var/log/diagnose-fleet-epilog.log)
# It always exits 0: a failing per-node Epilog would drain the node, and a slow one would hold it, hence `timeout`.
conf=${DIAGNOSE_FLEET_CONF:-/etc/diagnose/fleet-epilog.conf}
# shellcheck disable=SC1090
[ -r "$conf" ] && . "$conf"
export PATH=${PATH:+$PATH:}/usr/local/bin:/usr/bin:/bin  # Slurm starts epilogs without a search path
store=${DIAGNOSE_FLEET_STORE:-/var/lib/diagnose/fleet.db}
python=${DIAGNOSE_PYTHON:-python3}
limit=${DIAGNOSE_FLEET_TIMEOUT:-60}
log=${DIAGNOSE_FLEET_LOG:-/var/log/diagnose-fleet-epilog.log}
case "$limit" in ''|*[!0-9]*) limit=60 ;; esac

if [ "${SLURM_SCRIPT_CONTEXT:-}" = epilog_slurmd ] && [ -n "${SLURM_JOB_NODELIST:-}" ]; then
  # per-node epilog: every node of the job runs it; only the first one diagnoses
  first=$(timeout 10 scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1)
  [ -n "$first" ] && [ "$first" != "$(hostname -s)" ] && [ "$first" != "${SLURMD_NODENAME:-}" ] && exit 0
fi

args=(-m diagnose fleet epilog --store "$store")
[ "${DIAGNOSE_FLEET_COMMENT:-0}" = 1 ] && args+=(--comment)
timeout -k 5 "$limit" "$python" "${args[@]}" </dev/null >>"$log" 2>&1
rc=$?
[ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "diagnose fleet epilog: job ${SLURM_JOB_ID:-?}: killed after ${limit}s" >>"$log"
exit 0
