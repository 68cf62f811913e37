"""The epilog entry: diagnose one job as it ends, append it to the store, optionally put the verdict in its comment.

Run by ``diagnose/fleet/epilog.sh`` (``EpilogSlurmctld`` on the controller, or a per-node ``Epilog``), which bounds
it with ``timeout``. Slurm's environment names the job: ``SLURM_JOB_ID`` (for an array task also
``SLURM_ARRAY_JOB_ID`` and ``SLURM_ARRAY_TASK_ID``), ``SLURM_CLUSTER_NAME``. slurmctld still holds the job's record
while its epilog runs, so the job is read through scontrol (the same lookup as ``diagnose slurm``). The row's key
(``slurm:<cluster>:<job id>``) is the one ``fleet scan --sacct`` uses: a job seen by both is stored once.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from diagnose.fleet.record import JobFacts, build_record
from diagnose.fleet.scan import log_hosts
from diagnose.fleet.slurm_source import epoch
from diagnose.fleet.store import FleetStore
from diagnose.ingest.slurm.commands import run_slurm
from diagnose.ingest.slurm.hostlist import expand_hostlist
from diagnose.ingest.slurm.job import Runner, SlurmJob
from diagnose.ingest.slurm.jobid import JobRef, parse_job_id
from diagnose.ingest.slurm.owner import REFUSED
from diagnose.ingest.slurm.parse import parse_exit_code
from diagnose.model import DiagnoseError, Report

COMMENT_LIMIT = 200
_UNSAFE = re.compile(r"[^A-Za-z0-9 _.,:;()\[\]/+=-]")


@dataclass(slots=True)
class EpilogResult:
    job_id: str
    added: bool
    verdict: str
    comment_set: bool
    comment_problem: str | None = None
    skipped: list[str] = field(default_factory=list)  # output files refused as not the job user's own (owner.py)


def job_ref_from_env(env: Mapping[str, str]) -> JobRef:
    """The ending job, from the variables Slurm sets for prologs and epilogs."""
    array_job, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    text = f"{array_job}_{task}" if array_job and task else env.get("SLURM_JOB_ID", "")
    if not text:
        raise DiagnoseError("fleet epilog: SLURM_JOB_ID is not set (run it as Slurm's epilog, or set it by hand)")
    return parse_job_id(text)


def verdict(report: Report) -> str:
    root = report.root
    if root is None:
        return "diagnose: no failure found"
    return f"diagnose: [{root.rule}] {root.title}"


def safe_comment(text: str) -> str:
    """What goes into the job's comment: plain printable ASCII, bounded."""
    return _UNSAFE.sub("?", " ".join(text.split()))[:COMMENT_LIMIT]


def _gpus(job: SlurmJob, nodes: list[str], gpus_per_node: int) -> int | None:
    """The job's GPUs as sacct's TRES tell them (``slurm --failed`` and the fleet's sacct source read the same:
    0 for a job whose TRES name no GPU), else its node count x ``gpus_per_node``."""
    if job.usage is not None and job.usage.gpus is not None:
        return job.usage.gpus
    return len(nodes) * gpus_per_node if nodes else None


def run_epilog(store_path: str, env: Mapping[str, str], comment: bool = False, gpus_per_node: int = 8,
               runner: Runner = run_slurm) -> EpilogResult:
    from diagnose.ingest.slurm import lookup_job
    from diagnose.pipeline import AnalyzeOptions
    from diagnose.slurm_diagnosis import diagnose_job

    ref = job_ref_from_env(env)
    job = lookup_job(ref, runner=runner, settle_s=2.0, max_task_files=16)
    settle_state(job, env)
    report = diagnose_job(ref, AnalyzeOptions(replay=False), runner=runner, job=job).report
    nodes = expand_hostlist(job.nodes, limit=10_000) if job.nodes else []
    facts = JobFacts(
        job_key=f"slurm:{env.get('SLURM_CLUSTER_NAME') or 'cluster'}:{job.job_id}", via="epilog",
        cluster=env.get("SLURM_CLUSTER_NAME", ""), job_id=job.job_id, name=job.name, user=job.user, state=job.state,
        exit_code=job.exit.code, derived_exit_code=job.derived_exit.code, nodes=nodes,
        gpus=_gpus(job, nodes, gpus_per_node), elapsed_s=job.elapsed_s, start_ts=epoch(job.start),
        end_ts=epoch(job.end) or time.time(), source="\n".join(p for p, _ in job.analysis_inputs),
    )
    inputs = job.analysis_inputs
    record = build_record(report, facts, log_hosts(inputs[0][0]) if inputs else [],
                          status="diagnosed" if inputs else "unreadable",
                          problem=None if inputs else ("; ".join(job.notes) or "no readable output file"))
    with FleetStore(store_path) as store:
        added = store.add([record]) == 1
    line = verdict(report)
    comment_problem = None
    commenting = comment and report.root is not None
    if commenting:
        done = runner(["scontrol", "update", f"job={job.job_id}", f"comment={safe_comment(line)}"])
        comment_problem = None if done.ok else done.first_error_line()
    skipped = [n for n in job.notes if f": {REFUSED} " in n]
    return EpilogResult(job.job_id, added, line, commenting and comment_problem is None, comment_problem, skipped)


# While EpilogSlurmctld runs, slurmctld shows the job as COMPLETING: its final state is not recorded yet. Slurm's
# own rule for a batch job that ended by itself: a non-zero exit code or a signal is FAILED, else COMPLETED; the
# reason names the time limit (TIMEOUT) and the others that end a job from outside.
_REASON_STATE = {"TimeLimit": "TIMEOUT", "NodeDown": "NODE_FAIL", "OutOfMemory": "OUT_OF_MEMORY",
                 "Preempted": "PREEMPTED", "DeadLine": "DEADLINE"}


def settle_state(job: SlurmJob, env: Mapping[str, str]) -> None:
    """Give a job still COMPLETING (as every job is during its EpilogSlurmctld) the state it is ending in."""
    if job.state not in ("COMPLETING", "RUNNING", "CONFIGURING", ""):
        return
    final = _REASON_STATE.get(job.reason)
    if final is None:
        failed = parse_exit_code(env.get("SLURM_JOB_EXIT_CODE2")).failed or job.exit.failed  # code:signal
        final = "FAILED" if failed else "COMPLETED"
    job.notes.append(f"slurmctld still showed the job {job.state} in its epilog: taken as {final}")
    job.state = final
