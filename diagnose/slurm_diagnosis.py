"""A Slurm job, end to end: find it, diagnose its output with the pipeline, add Slurm's facts, fill Report.slurm."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diagnose.explain.words import fill_job_id
from diagnose.ingest.slurm.commands import run_slurm
from diagnose.ingest.slurm.findings import slurm_findings
from diagnose.ingest.slurm.job import Runner, SlurmJob, lookup_job
from diagnose.ingest.slurm.jobid import JobRef
from diagnose.ingest.slurm.merge import merge_slurm_findings
from diagnose.ingest.slurm.nodes import lookup_nodes
from diagnose.ingest.slurm.owner import pinned
from diagnose.ingest.slurm.parse import format_duration
from diagnose.match.slurm_nodes import merge_node_findings, node_findings
from diagnose.model import Report, SlurmFacts, SlurmStepFacts, SlurmTaskFacts

if TYPE_CHECKING:  # the pipeline imports the stages this module wires; it is imported when a job is diagnosed
    from diagnose.pipeline import AnalyzeOptions


@dataclass
class SlurmDiagnosis:
    job: SlurmJob
    report: Report


def diagnose_job(
    ref: JobRef,
    options: AnalyzeOptions | None = None,
    runner: Runner = run_slurm,
    job: SlurmJob | None = None,
) -> SlurmDiagnosis:
    """Diagnose a Slurm job with ``options`` (None: the defaults).

    When the output file is gone or unreadable the report still carries what Slurm knows, with a warning saying
    why the log could not be read. The state of the job's nodes is read here, not in ``lookup_job`` (whose other
    callers have no use for it), unless ``job.node_states`` is already filled.
    """
    from diagnose.pipeline import AnalyzeOptions, analyze

    job = job or lookup_job(ref, runner=runner)
    inputs = job.analysis_inputs
    paths = [path for path, _ in inputs]
    report = Report()
    if paths:
        # as root (or for another user's job) each file is read through the descriptor that passed the owner check
        with pinned(paths, job.owner) as (names, refused):
            job.notes.extend(refused)  # swapped since lookup_job probed it
            paths = list(names)
            if paths:
                opts = dataclasses.replace(_with_ranks(options or AnalyzeOptions(), inputs), shown_as=names)
                report = analyze(paths, opts)
    if not paths:
        report.warnings.append(f"no readable output file for job {job.job_id}: reporting what Slurm knows only")
    report.warnings.extend(job.notes)
    merge_slurm_findings(report, slurm_findings(job), job.state)
    # the nodes' state now (a health check's DRAIN, slurmd's "Kill task failed"): a node that went bad during the
    # job may be the root cause of the NCCL errors and rank deaths in its log
    if job.node_states is None:
        job.node_states = lookup_nodes(job.nodes, runner)
    if job.node_states.note:
        report.warnings.append(job.node_states.note)
    merge_node_findings(report, node_findings(job.node_states.records, job.start, job.end))
    report.slurm = slurm_section(job)
    fill_job_id(report, job.job_id)
    return SlurmDiagnosis(job, report)


def _with_ranks(options: AnalyzeOptions, inputs: list[tuple[str, int | None]]) -> AnalyzeOptions:
    """The options with each per-task file's rank (srun's %t), which the file name alone may not say."""
    ranks = {path: rank for path, rank in inputs if rank is not None}
    # one Slurm job by definition: its outputs are never split into jobs (a requeued job's restarts stay one)
    return dataclasses.replace(options, rank_hints={**options.rank_hints, **ranks}, split_jobs=False)


# SlurmFacts fields that SlurmJob has under the same name (lists copied); "" in SlurmJob is null in the JSON for the
# second set; the rest are derived below
_AS_IS = ("job_id", "raw_id", "array_job_id", "array_task_id", "het_job_id", "het_offset", "name", "user", "state",
          "reason", "cancelled_by", "launch_failed", "nodes", "elapsed_s", "time_limit_s", "restarts", "source",
          "task_patterns", "task_outputs_found", "notes")
_EMPTY_IS_NONE = ("start", "end", "work_dir", "output_route", "task_route")


def slurm_section(job: SlurmJob) -> SlurmFacts:
    """The report's ``"slurm"`` section."""
    step, usage = job.failed_step, job.usage
    same: dict[str, Any] = {name: copy.copy(getattr(job, name)) for name in _AS_IS}
    same.update({name: getattr(job, name) or None for name in _EMPTY_IS_NONE})
    return SlurmFacts(
        **same,
        exit_code=job.exit.code,
        signal=job.exit.signal_name,
        derived_exit_code=job.derived_exit.code,
        derived_signal=job.derived_exit.signal_name,
        failed_step=step.step_id if step else None,
        steps=[SlurmStepFacts(s.step_id, s.name, s.state, s.exit.code, s.exit.signal_name) for s in job.steps],
        elapsed=format_duration(job.elapsed_s) if job.elapsed_s is not None else None,
        time_limit=job.time_limit_text or None,
        outputs=[dataclasses.replace(o) for o in job.outputs],  # the job's outputs are SlurmOutputFacts already
        task_outputs=[SlurmTaskFacts(t.path, t.stream, t.step, t.rank, t.node, t.size) for t in job.task_outputs],
        nnodes=usage.nnodes if usage else None,
        gpus=usage.gpus if usage else None,
        max_rss_bytes=usage.max_rss_bytes if usage else None,
        cpu_efficiency=_rounded(usage.cpu_efficiency(job.elapsed_s) if usage else None, 4),
        gpu_hours=_rounded(usage.gpu_hours(job.elapsed_s) if usage else None, 3),
    )


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
