"""Jobs from Slurm accounting over a time window: ONE ``sacct`` call lists them all (allocations only, every user
with ``--all-users``), and each job's output file is rebuilt from that row (its SubmitLine's ``-o/-e``, else the
``slurm-%j.out`` default in WorkDir). Only when that finds no readable file does the worker ask Slurm about the one
job with the full routes of ``diagnose slurm`` (``lookup_job``: #SBATCH lines, --env-vars, per-task files).

So a scan of 10,000 jobs costs one sacct call plus a few per job whose output the bulk row cannot place.
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from diagnose.coerce import as_int
from diagnose.ingest.slurm.commands import CommandResult, run_slurm
from diagnose.ingest.slurm.hostlist import expand_hostlist
from diagnose.ingest.slurm.job import SlurmJob, fill_shared, pattern_fields, probe_outputs, user_name
from diagnose.ingest.slurm.jobid import parse_job_id
from diagnose.ingest.slurm.listing import sacct_since
from diagnose.ingest.slurm.output_path import default_output, expand_pattern, parse_sbatch_options, resolve
from diagnose.ingest.slurm.owner import owner_from_name
from diagnose.ingest.slurm.parse import not_ended, parse_sacct, split_state
from diagnose.ingest.slurm.usage import gpus_from_fields
from diagnose.model import DiagnoseError

ENDED = "CD,CA,F,TO,OOM,NF,PR,BF,DL"  # every state a job can end in: successes are the rates' denominator
# SubmitLine last: it may contain '|' (parse_sacct joins the surplus back into it)
FIELDS = (
    "JobID,JobIDRaw,Cluster,JobName,User,State,ExitCode,DerivedExitCode,Start,End,ElapsedRaw,NNodes,NodeList,"
    "AllocTRES,ReqTRES,WorkDir,SubmitLine"
)


@dataclass(frozen=True, slots=True)
class SlurmRow:
    """One ended job (or array task) as the bulk sacct call listed it; picklable for the worker processes."""

    fields: tuple[tuple[str, str], ...]
    line: int
    text: str

    def get(self, name: str) -> str:
        return dict(self.fields).get(name, "")

    @property
    def job_id(self) -> str:
        return self.get("JobID")

    @property
    def key(self) -> str:
        return f"slurm:{self.get('Cluster') or 'cluster'}:{self.job_id}"


def window(since: str, until: str | None = None) -> tuple[str, str]:
    """Absolute sacct -S/-E values, fixed once so that every array task of ``fleet submit`` sees the same jobs."""
    start = sacct_since(since)
    m = re.fullmatch(r"now-(\d+)(\w+)", start)
    if m:
        seconds = int(m.group(1)) * {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400, "weeks": 604800}[
            m.group(2)
        ]
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - seconds))
    end = sacct_since(until) if until else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
    if end.startswith("now-"):
        raise DiagnoseError("--until takes a date like 2026-11-29T12:00, not an age")
    return start, end


def list_ended_jobs(start: str, end: str, user: str | None = None, name: str | None = None,
                    runner: Callable[..., CommandResult] = run_slurm) -> list[SlurmRow]:
    """Every job that ended between ``start`` and ``end`` (all users unless ``user``; only jobs called ``name``
    when given), array tasks one by one."""
    argv = ["sacct", "--parsable2", "-X", "-S", start, "-E", end, f"--state={ENDED}", f"--format={FIELDS}"]
    if name:
        if not re.fullmatch(r"[A-Za-z0-9_.:+-][A-Za-z0-9_.:+,-]{0,199}", name):
            raise DiagnoseError(f"--name {name[:30]!r}: expected job names like train-7b (comma-separated)")
        argv.append(f"--name={name}")
    if user:
        if not re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}", user):
            raise DiagnoseError(f"--user {user[:30]!r}: not a user name")
        argv += ["-u", user]
    else:
        argv.append("--allusers")
    result = runner(argv, timeout=300)
    if not result.ok:
        raise result.failure("sacct")
    rows = []
    for row in parse_sacct(result.stdout):
        job_id = row.fields.get("JobID", "")
        if "[" in job_id or not_ended(row.fields.get("State")):
            continue  # a pending array's placeholder row, or not ended yet
        rows.append(SlurmRow(tuple(row.fields.items()), row.line, row.text))
    return rows


def in_shard(key: str, shard: tuple[int, int] | None) -> bool:
    """``shard`` = (index, count): a stable split by the key's CRC32, the same in every process and machine."""
    return shard is None or zlib.crc32(key.encode()) % shard[1] == shard[0]


def gpus_of(row: SlurmRow, gpus_per_node: int) -> int | None:
    """The job's GPUs as ``slurm --failed`` counts them (AllocTRES, else ReqTRES; 0 when they name no GPU); NNodes x
    ``gpus_per_node`` only when sacct gave no TRES list at all."""
    gpus = gpus_from_fields(row.get)
    if gpus is not None:
        return gpus
    nodes = as_int(row.get("NNodes"))
    return nodes * gpus_per_node if nodes else None


def epoch(text: str) -> float | None:
    """sacct's local ISO time to epoch seconds (None for Unknown/None)."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def job_from_row(row: SlurmRow) -> SlurmJob:
    """A SlurmJob built from the bulk row alone: state, exit codes, nodes, elapsed, outputs via SubmitLine or the
    default name. ``output_route`` says which."""
    ref = parse_job_id(row.job_id)
    state, cancelled_by = split_state(row.get("State"))
    job = SlurmJob(ref=ref, job_id=ref.slurm_id, source="sacct")
    fill_shared(job, dict(row.fields), sacct=True)  # name, exit codes, nodes, start, end
    job.raw_id = as_int(row.get("JobIDRaw"))
    job.array_job_id = ref.job if ref.array_task is not None else None
    job.array_task_id = ref.array_task
    # sacct says "CANCELLED by 0": the name, as 'diagnose slurm' and '--failed' show it ("by root")
    job.user, job.state, job.cancelled_by = row.get("User"), state, user_name(cancelled_by) if cancelled_by else None
    job.owner = owner_from_name(job.user)
    job.elapsed_s = as_int(row.get("ElapsedRaw"))
    job.work_dir = row.get("WorkDir")
    options = parse_sbatch_options(row.get("SubmitLine"))
    if options.output or options.error:
        job.output_route = "sacct SubmitLine (fleet bulk)"
    elif job.work_dir:
        job.output_route = "default (fleet bulk)"
    fields = pattern_fields(job)
    if job.work_dir:
        out = resolve(expand_pattern(options.output or default_output(ref.array_task is not None), fields),
                      job.work_dir)
        err = resolve(expand_pattern(options.error, fields), job.work_dir) if options.error else None
        job.outputs = probe_outputs(out, err, job.owner)
    return job


def placed(job: SlurmJob) -> bool:
    """The bulk row settled where the output is: a readable file, or the path of sbatch's own ``-o/-e`` (the
    command line beats ``#SBATCH`` lines and the environment, so a missing file there is gone, not elsewhere).
    Otherwise the worker asks Slurm about this job alone."""
    from_command_line = bool(job.outputs) and job.output_route.startswith("sacct SubmitLine")
    return from_command_line or any(o.readable for o in job.outputs)


def nodes_of(row: SlurmRow) -> list[str]:
    return expand_hostlist(row.get("NodeList"), limit=10_000)

