"""Attach to a Slurm job: find its output, diagnose it, and add what Slurm itself knows.

Public API (for the CLI and the TUI):

- ``parse_job_id(text, step=None) -> JobRef``: strict validation of ``123``, ``123_7``, ``123+1``, ``.STEP``.
- ``lookup_job(ref) -> SlurmJob``: state, exit code/signal, DerivedExitCode, steps, nodes, elapsed vs limit,
  requeues, output files and the route that found them (scontrol, else sacct SubmitLine / --env-vars /
  --batch-script / the slurm-%j.out default), and the per-task/per-node files of its srun steps
  (``srun -o logs/%j-%t.out``; ``SlurmJob.task_outputs``, each with its rank).
- ``list_failed_jobs(since="1d", user=None) -> list[JobSummary]``: recent jobs that ended badly, newest first
  (``JobSummary`` is documented in ``listing.py``). For the TUI's job list (``diagnose tui --slurm``).
Diagnosing a job (``diagnose.slurm_diagnosis.diagnose_job``) and following one (``diagnose.slurm_follow``) run the
pipeline, so they are in the orchestration layer beside ``diagnose/pipeline.py``, not here.

Usage and the output-location routes: docs/slurm.md.

Slurm commands run with argument lists (never a shell) and timeouts; a missing scontrol/sacct raises
``SlurmUnavailable`` (a DiagnoseError) with a one-line message.
"""

from diagnose.ingest.slurm.commands import SlurmUnavailable
from diagnose.ingest.slurm.job import SlurmJob, SlurmStep, lookup_job
from diagnose.ingest.slurm.jobid import JobRef, parse_job_id
from diagnose.ingest.slurm.listing import JobSummary, list_failed_jobs

__all__ = [
    "JobRef",
    "JobSummary",
    "SlurmJob",
    "SlurmStep",
    "SlurmUnavailable",
    "list_failed_jobs",
    "lookup_job",
    "parse_job_id",
]
