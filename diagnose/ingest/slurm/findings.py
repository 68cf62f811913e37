"""Slurm's own facts about a job as findings, category ``slurm``: this module decides the job's outcome from its
record (scontrol/sacct, not log lines); the rule for each outcome (code, explanation, fix, severity, role) is the
catalogue's ``input = "slurm_job"`` rule that names it (``rules/75_slurm_job.toml``, codes ``SJ0xx``).

Evidence points at Slurm's output: path ``scontrol:JOBID`` or ``sacct:JOBID`` and the line of the record there.
"""

from __future__ import annotations

import copy
import functools
import shlex
from typing import TYPE_CHECKING

from diagnose.ingest.slurm.job import SlurmJob, fill_from_scontrol
from diagnose.ingest.slurm.jobid import JobRef
from diagnose.ingest.slurm.parse import format_duration, parse_scontrol_jobs
from diagnose.model import DiagnoseError, Evidence, Finding

if TYPE_CHECKING:  # the catalogue is read at run time (match.rules): ingest names no later stage at import
    from diagnose.match.rules import Rule


@functools.lru_cache(maxsize=1)
def _rules_by_outcome() -> dict[str, Rule]:
    """The built-in catalogue's ``input = "slurm_job"`` rules, by the ``slurm_outcome`` each one names."""
    from diagnose.match.rules import load_catalogue

    return {r.slurm_outcome: r for r in load_catalogue().rules if r.input == "slurm_job"}


def _rule(outcome: str) -> Rule:
    rule = _rules_by_outcome().get(outcome)
    if rule is None:  # the catalogue ships one rule per outcome; `rules lint` and the tests hold it to that
        raise DiagnoseError(f"the rules catalogue has no slurm_job rule for {outcome} (reinstall diagnose)")
    return rule


def findings_of_scontrol(text: str) -> list[Finding]:
    """The findings of the first job in ``scontrol show job`` output: how the SJ rules' examples are run."""
    records = parse_scontrol_jobs(text)
    if not records:
        return []
    job_id = records[0].fields.get("JobId", "")
    job = SlurmJob(ref=JobRef(int(job_id) if job_id.isdigit() else 0), job_id=job_id)
    fill_from_scontrol(job, records[0])
    return slurm_findings(job)


def slurm_findings(job: SlurmJob) -> list[Finding]:
    """Findings for what Slurm says about ``job``; empty for a job that completed cleanly (and is not requeued)."""
    out: list[Finding] = []
    if (primary := _primary(job)) is not None:
        out.append(primary)
    if job.restarts > 0:
        out.append(_finding(job, _rule("REQUEUED"), f"Slurm requeued the job {job.restarts} time(s)"))
    return out


def _primary(job: SlurmJob) -> Finding | None:
    state = job.state
    exit_text = _exit_text(job)
    elapsed = f"after {format_duration(job.elapsed_s)}" if job.elapsed_s is not None else ""
    if state == "TIMEOUT":
        limit = format_duration(job.time_limit_s) if job.time_limit_s is not None else job.time_limit_text or "?"
        title = f"Slurm job state TIMEOUT: killed at its time limit ({format_duration(job.elapsed_s)} of {limit})"
        return _finding(job, _rule(state), title)
    if state in ("OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"):
        words = {
            "OUT_OF_MEMORY": "killed for exceeding its host memory limit",
            "NODE_FAIL": f"a node failed ({job.nodes or 'node unknown'})",
            "PREEMPTED": "preempted by another job",
            "BOOT_FAIL": "a node failed to boot",
            "DEADLINE": "reached its deadline",
        }[state]
        return _finding(job, _rule(state), f"Slurm job state {state}: {words} {elapsed}".strip())
    if state == "CANCELLED":
        who = f" by {job.cancelled_by}" if job.cancelled_by else ""
        return _finding(job, _rule(state), f"Slurm job state CANCELLED{who} {elapsed}".strip())
    if job.launch_failed:  # scontrol's Reason=JobLaunchFailure, or sacct's record and a missing output folder
        # the batch step never started (its output file could not be opened, the working directory is missing, the
        # script could not be run on the node): the exit code Slurm records then is not the program's
        rule = _rule("LAUNCH_FAILED")
        if (missing := job.missing_output_folder) is not None:  # slurmd: "Could not open stdout file ..."
            path, folder = missing
            f = _finding(job, rule, f"Slurm could not open the job's output file {path}: its folder {folder} does "
                                    f"not exist, so the batch step failed to launch (JobLaunchFailure, ExitCode "
                                    f"{job.exit}: not the program's)")
            f.facts["output_folder_missing"] = folder
            f.fix.steps.insert(0, f"mkdir -p {shlex.quote(folder)} before submitting (Slurm does not create it)")
            return f
        return _finding(job, rule, f"{rule.title}, ExitCode {job.exit}")  # the words are the rule's (SJ012)
    if state == "FAILED" or (state not in ("COMPLETED", "RUNNING", "PENDING", "") and job.exit.failed):
        rule = _rule("SIGNALED" if job.exit.signal and not job.exit.code else "FAILED")
        return _finding(job, rule, f"Slurm job state {state}: {exit_text} {elapsed}".strip())
    if state == "COMPLETED" and job.derived_exit.failed:
        step = job.failed_step
        where = (f"step {step.short_id} ({step.name}) {step.state} {step.exit}" if step is not None
                 else f"DerivedExitCode {job.derived_exit}")
        return _finding(job, _rule("STEP_FAILED"), f"Slurm job COMPLETED but a step failed: {where}")
    return None


def _exit_text(job: SlurmJob) -> str:
    if job.exit.signal:
        return f"killed by {job.exit.signal_name} (ExitCode {job.exit})"
    if job.exit.code:
        return f"exit code {job.exit.code} (ExitCode {job.exit})"
    return f"ExitCode {job.exit}"


def _finding(job: SlurmJob, rule: Rule, title: str) -> Finding:
    step = job.failed_step
    unique: dict[tuple[str, int], Evidence] = {}  # a copy of each record line: the finding's evidence is its own
    for r in (job.record, job.state_record, step.record if step else None):
        if r is not None:
            unique.setdefault((r.path, r.line), Evidence(r.path, r.line, r.text))
    evidence = list(unique.values())
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
        phase=rule.phase if rule.phase != "auto" else "unknown",  # the rule's (SJ012: init); Slurm's record has none
        severity=rule.severity,  # type: ignore[arg-type]
        role=rule.role,  # type: ignore[arg-type]
        confidence=rule.confidence,
        hosts=[job.nodes] if job.nodes else [],
        first_line=evidence[0].line if evidence else 0,
        evidence=evidence,
        explanation=rule.explanation,
        fix=copy.deepcopy(rule.fix),
        facts=facts,
    )
