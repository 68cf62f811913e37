"""Slurm's own facts about a job as findings: rule codes ``SJ001``-``SJ0xx`` (reserved for this module, not in the
TOML catalogue because they come from scontrol/sacct, not from log lines), category ``slurm``.

Evidence points at Slurm's output: path ``scontrol:JOBID`` or ``sacct:JOBID`` and the line of the record there.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.ingest.slurm.job import SlurmJob, SlurmRecordLine
from diagnose.ingest.slurm.parse import format_duration
from diagnose.model import Evidence, Finding, Fix


@dataclass(frozen=True, slots=True)
class SlurmRule:
    code: str
    slug: str
    explanation: str
    fix_summary: str = ""
    steps: tuple[str, ...] = ()


RULES: dict[str, SlurmRule] = {
    "TIMEOUT": SlurmRule(
        "SJ001", "slurm-time-limit",
        "Slurm ended the job because it reached its time limit (--time): the batch step got SIGTERM, then SIGKILL "
        "after KillWait. If the log shows no progress near the end, the job was hung (often a collective waiting "
        "on a dead or stuck rank) rather than merely slow.",
        "Resume from the last checkpoint with a longer --time, or checkpoint more often",
        ("Check the last iteration the log reached against the expected run length",
         "Raise #SBATCH --time (partition MaxTime allowing), or lower checkpoint.save_interval so less work is lost"),
    ),
    "OUT_OF_MEMORY": SlurmRule(
        "SJ002", "slurm-host-oom",
        "Slurm ended the job because a process exceeded the job's host (CPU) memory limit: the cgroup OOM killer "
        "fired. This is host RAM, not GPU memory: data loader workers, pinned buffers, checkpoint loading into "
        "CPU memory.",
        "Give the job more host memory or use less of it",
        ("Ask for more memory (--mem / --mem-per-gpu) or whole nodes (--exclusive --mem=0)",
         "Lower dataloader num_workers; load checkpoints sharded rather than onto one rank's CPU"),
    ),
    "NODE_FAIL": SlurmRule(
        "SJ003", "slurm-node-failure",
        "A node of the allocation failed (stopped answering slurmctld, rebooted, or was set DOWN); Slurm ended the "
        "job. Errors in the log after that (NCCL timeouts, lost connections) are consequences.",
        "Resubmit excluding the failed node and report it to the admins",
        ("sinfo -R shows why the node is down; resubmit with --exclude=<node>",
         "Consider --requeue so Slurm resubmits on node failure"),
    ),
    "PREEMPTED": SlurmRule(
        "SJ004", "slurm-preempted",
        "A higher-priority job preempted this one; Slurm cancelled or requeued it. Errors in the log after the "
        "preemption signal are consequences.",
        "Resume from the last checkpoint; use a non-preemptible QOS/partition if this repeats",
        ("Make the job save a checkpoint on SIGTERM (Megatron: --exit-signal-handler) so preemption loses less",),
    ),
    "CANCELLED": SlurmRule(
        "SJ005", "slurm-cancelled",
        "The job was cancelled (scancel) by a user or an administrator, or by Slurm on a dependency failure.",
        "", ("If the job was cancelled because it looked stuck, the log's last errors say why it stalled",),
    ),
    "FAILED": SlurmRule(
        "SJ006", "slurm-nonzero-exit",
        "The batch script exited with a non-zero status. The log's errors tell why; Slurm only records the status.",
    ),
    "SIGNALED": SlurmRule(
        "SJ007", "slurm-killed-by-signal",
        "The batch script was ended by a signal (ExitCode code:signal with a non-zero signal).",
        "", ("SIGKILL without an OOM or time-limit state often means the kernel OOM killer or an admin kill",),
    ),
    "STEP_FAILED": SlurmRule(
        "SJ008", "slurm-step-failed",
        "The job itself ended COMPLETED (its batch script exited 0) but a step inside it failed: DerivedExitCode "
        "is the worst exit code of the job's steps. A script that ignores srun's exit status hides such failures.",
        "", ("Add `set -e` (or check srun's exit status) in the batch script so the job fails when a step fails",),
    ),
    "BOOT_FAIL": SlurmRule(
        "SJ009", "slurm-boot-fail",
        "The job ended before it started because a node failed to boot or to be configured.",
        "Resubmit; report the node to the admins",
    ),
    "DEADLINE": SlurmRule("SJ010", "slurm-deadline", "The job reached its --deadline before it could finish."),
    "REQUEUED": SlurmRule(
        "SJ011", "slurm-requeued",
        "Slurm requeued the job (node failure, preemption, or scontrol requeue) before this run; the log may hold "
        "several runs one after another.",
    ),
}


def slurm_findings(job: SlurmJob) -> list[Finding]:
    """Findings for what Slurm says about ``job``; empty for a job that completed cleanly (and is not requeued)."""
    out: list[Finding] = []
    primary = _primary(job)
    if primary is not None:
        out.append(primary)
    if job.restarts > 0:
        rule = RULES["REQUEUED"]
        out.append(_finding(job, rule, f"Slurm requeued the job {job.restarts} time(s)", "info", "context", 1.0))
    return out


def _primary(job: SlurmJob) -> Finding | None:
    state = job.state
    exit_text = _exit_text(job)
    elapsed = f"after {format_duration(job.elapsed_s)}" if job.elapsed_s is not None else ""
    if state == "TIMEOUT":
        limit = format_duration(job.time_limit_s) if job.time_limit_s is not None else job.time_limit_text or "?"
        title = f"Slurm job state TIMEOUT: killed at its time limit ({format_duration(job.elapsed_s)} of {limit})"
        return _finding(job, RULES[state], title, "error", "root", 0.9)
    if state in ("OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"):
        words = {
            "OUT_OF_MEMORY": "killed for exceeding its host memory limit",
            "NODE_FAIL": f"a node failed ({job.nodes or 'node unknown'})",
            "PREEMPTED": "preempted by another job",
            "BOOT_FAIL": "a node failed to boot",
            "DEADLINE": "reached its deadline",
        }[state]
        return _finding(job, RULES[state], f"Slurm job state {state}: {words} {elapsed}".strip(), "error", "root", 0.9)
    if state == "CANCELLED":
        who = f" by {job.cancelled_by}" if job.cancelled_by else ""
        return _finding(job, RULES[state], f"Slurm job state CANCELLED{who} {elapsed}".strip(), "error", "root", 0.8)
    if state == "FAILED" or (state not in ("COMPLETED", "RUNNING", "PENDING", "") and job.exit.failed):
        rule = RULES["SIGNALED"] if job.exit.signal and not job.exit.code else RULES["FAILED"]
        return _finding(job, rule, f"Slurm job state {state}: {exit_text} {elapsed}".strip(), "error", "root", 0.7)
    if state == "COMPLETED" and job.derived_exit.failed:
        step = job.failed_step
        where = f"step {step.short_id} ({step.name}) {step.state} {step.exit}" if step else f"DerivedExitCode {job.derived_exit}"
        title = f"Slurm job COMPLETED but a step failed: {where}"
        return _finding(job, RULES["STEP_FAILED"], title, "error", "root", 0.7)
    return None


def _exit_text(job: SlurmJob) -> str:
    if job.exit.signal:
        return f"killed by {job.exit.signal_name} (ExitCode {job.exit})"
    if job.exit.code:
        return f"exit code {job.exit.code} (ExitCode {job.exit})"
    return f"ExitCode {job.exit}"


def _finding(job: SlurmJob, rule: SlurmRule, title: str, severity: str, role: str, confidence: float) -> Finding:
    records: list[SlurmRecordLine] = [r for r in (job.record, job.state_record) if r is not None]
    step = job.failed_step
    if step is not None and step.record not in records:
        records.append(step.record)
    seen: set[tuple[str, int]] = set()
    evidence = []
    for r in records:
        if (r.source, r.line) not in seen:
            seen.add((r.source, r.line))
            evidence.append(Evidence(path=r.source, line=r.line, text=r.text))
    facts = {
        "job_id": job.job_id,
        "state": job.state,
        "reason": job.reason,
        "exit_code": job.exit.code,
        "signal": job.exit.signal_name,
        "derived_exit_code": str(job.derived_exit),
        "elapsed_s": job.elapsed_s,
        "time_limit_s": job.time_limit_s,
        "nodes": job.nodes,
        "restarts": job.restarts,
    }
    if job.cancelled_by:
        facts["cancelled_by"] = job.cancelled_by
    if step is not None:
        facts["failed_step"] = step.step_id
    return Finding(
        rule=rule.code,
        name=rule.slug,
        title=title,
        category="slurm",
        phase="unknown",
        severity=severity,  # type: ignore[arg-type]
        role=role,  # type: ignore[arg-type]
        confidence=confidence,
        hosts=[job.nodes] if job.nodes else [],
        first_line=evidence[0].line if evidence else 0,
        evidence=evidence,
        explanation=rule.explanation,
        fix=Fix(summary=rule.fix_summary, safety="manual", steps=list(rule.steps)),
        facts=facts,
    )
