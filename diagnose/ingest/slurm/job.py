"""What Slurm knows about one job, gathered from ``scontrol`` (while slurmctld remembers it) and ``sacct``.

``lookup_job(ref)`` returns a ``SlurmJob``: state, exit code and signal, DerivedExitCode, steps, nodes, elapsed
against the limit, requeues, and the job's output files with the route that found them. The evidence lines
(``scontrol:ID`` / ``sacct:ID`` with the record's line number) let findings point at what Slurm said.
"""

from __future__ import annotations

import os
import pwd
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from diagnose.coerce import as_int
from diagnose.ingest.slurm.commands import CommandResult, run_slurm
from diagnose.ingest.slurm.hostlist import expand_hostlist
from diagnose.ingest.slurm.jobid import JobRef
from diagnose.ingest.slurm.nodes import NodeLookup
from diagnose.ingest.slurm.output_path import (
    OutputOptions,
    PatternFields,
    default_output,
    expand_pattern,
    first_node,
    parse_batch_script_options,
    parse_sbatch_options,
    resolve,
)
from diagnose.ingest.slurm.owner import JobOwner, owner_from_name, owner_from_scontrol, refusal
from diagnose.ingest.slurm.parse import (
    ExitStatus,
    SacctRow,
    ScontrolRecord,
    parse_duration,
    parse_env_outputs,
    parse_exit_code,
    parse_sacct,
    parse_scontrol_jobs,
    split_state,
)
from diagnose.ingest.slurm.srun_script import SrunCall, find_srun_calls, job_variables
from diagnose.ingest.slurm.task_outputs import DEFAULT_MAX_TASK_FILES, StepShape, TaskFile, collect, summary
from diagnose.ingest.slurm.usage import USAGE_FIELDS, Usage, usage_from_rows
from diagnose.model import DiagnoseError, Evidence, SlurmOutputFacts

Runner = Callable[[list[str]], CommandResult]

# States in which a job has ended; anything else is still pending/running
ENDED_STATES = {
    "COMPLETED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "CANCELLED", "BOOT_FAIL",
    "DEADLINE", "REVOKED", "SPECIAL_EXIT",
}  # fmt: skip
SACCT_FIELDS = [
    "JobID", "JobIDRaw", "JobName", "User", "State", "ExitCode", "DerivedExitCode", "Reason", "Elapsed",
    "Timelimit", "NodeList", "NTasks", "Start", "End", "WorkDir", *USAGE_FIELDS,
]  # fmt: skip

# States a job ends in when something went wrong: a task still COMPLETING or CONFIGURING is not "the failed one".
BAD_END_STATES = frozenset(
    {"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "CANCELLED", "BOOT_FAIL", "DEADLINE", "REVOKED"}
)


LAUNCH_ATTEMPT_S = 5  # the longest run time sacct records for a batch step that never started (launch_failed)


@dataclass(slots=True)
class SlurmStep:
    step_id: str  # "123.batch", "123.0", "123_7.0"
    name: str
    state: str
    exit: ExitStatus
    nodes: str
    record: Evidence
    ntasks: int | None = None  # sacct NTasks: the %t range of the step's output files
    submit_line: str = ""  # the srun command line (sacct SubmitLine of a step, Slurm 23.02+)

    @property
    def short_id(self) -> str:
        return self.step_id.rsplit(".", 1)[-1]


@dataclass(slots=True)
class SlurmJob:
    ref: JobRef
    job_id: str  # as Slurm shows it: "123", "123_7", "123+1"
    raw_id: int | None = None  # the numeric id of this job or task (%j)
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_offset: int | None = None
    name: str = ""
    user: str = ""
    state: str = ""
    reason: str = ""
    cancelled_by: str | None = None  # a user name (or uid) when sacct says "CANCELLED by N"
    exit: ExitStatus = field(default_factory=lambda: ExitStatus(None, None))
    derived_exit: ExitStatus = field(default_factory=lambda: ExitStatus(None, None))
    nodes: str = ""
    batch_host: str = ""
    elapsed_s: int | None = None
    time_limit_s: int | None = None
    time_limit_text: str = ""
    restarts: int = 0
    work_dir: str = ""
    start: str = ""
    end: str = ""
    batch: bool = True  # False for srun/salloc jobs: their output went to a terminal
    steps: list[SlurmStep] = field(default_factory=list)
    outputs: list[SlurmOutputFacts] = field(default_factory=list)
    output_route: str = ""  # "scontrol", "sacct StdOut", "sacct SubmitLine", "sacct --env-vars", ...
    source: str = ""  # "scontrol" or "sacct": where the job's state came from
    record: Evidence | None = None  # the job's own line, for evidence
    state_record: Evidence | None = None  # the sacct job line (CANCELLED by ...), when it was read
    notes: list[str] = field(default_factory=list)  # what the user should know (file gone, record incomplete)
    num_tasks: int | None = None  # scontrol NumTasks: what srun runs when not told -n
    task_outputs: list[TaskFile] = field(default_factory=list)  # srun -o per-task/node files (capped)
    task_outputs_found: int = 0  # before the cap
    task_patterns: list[str] = field(default_factory=list)  # the srun patterns looked up, with their step
    task_route: str = ""  # where the srun patterns came from
    usage: Usage | None = None  # seff's figures from sacct (nodes, GPUs, MaxRSS, CPU time); None without sacct
    node_states: NodeLookup | None = None  # scontrol show node for its nodes, read by diagnose_job; None: not read
    owner: JobOwner = field(default_factory=JobOwner)  # whose files the outputs must be (owner.py) when we are root

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def failed_step(self) -> SlurmStep | None:
        """The step that failed: a numbered (srun) step first, then batch; None if no step failed."""
        ok_states = ("COMPLETED", "RUNNING", "PENDING", "")
        bad = [s for s in self.steps if s.short_id != "extern" and (s.exit.failed or s.state not in ok_states)]
        numbered = [s for s in bad if s.short_id.isdigit()]
        chosen = numbered or bad
        return chosen[0] if chosen else None

    @property
    def missing_output_folder(self) -> tuple[str, str] | None:
        """(output path, its folder) for the first of the job's --output/--error files whose folder does not exist
        here: slurmstepd cannot open such a file ("Could not open stdout file ...: No such file or directory") and
        the batch step fails to launch. None when every folder exists (or the job's outputs are unknown)."""
        for o in self.outputs:
            folder = os.path.dirname(o.path)
            if not o.exists and folder and os.path.isabs(folder) and not os.path.isdir(folder):
                return o.path, folder
        return None

    @property
    def launch_failed(self) -> bool:
        """The batch step never started: scontrol's Reason=JobLaunchFailure, or (sacct records Reason=None for
        it) a FAILED job that ran for no time while the folder of its output file is missing. "No time" is up to
        LAUNCH_ATTEMPT_S: a launch attempt on a busy node is recorded as a second or two (a CI run's sacct route
        read one as 'killed by signal 53'); an unknown run time is no evidence."""
        return self.state == "FAILED" and (self.reason == "JobLaunchFailure" or (
            self.elapsed_s is not None and self.elapsed_s <= LAUNCH_ATTEMPT_S
            and self.missing_output_folder is not None))

    @property
    def readable_outputs(self) -> list[str]:
        return list(dict.fromkeys(o.path for o in self.outputs if o.readable))

    @property
    def analysis_inputs(self) -> list[tuple[str, int | None]]:
        """What the analysis reads: the batch output(s), then the per-task files with their rank (%t)."""
        inputs: dict[str, int | None] = dict.fromkeys(self.readable_outputs)
        for t in self.task_outputs:
            inputs.setdefault(t.path, t.rank)
        return list(inputs.items())


def lookup_job(
    ref: JobRef,
    runner: Runner = run_slurm,
    settle_s: float = 8.0,
    sleep: Callable[[float], None] = time.sleep,
    max_task_files: int = DEFAULT_MAX_TASK_FILES,
) -> SlurmJob:
    """Ask scontrol, then sacct, about ``ref``; raise DiagnoseError if neither knows the job.

    ``settle_s`` bounds the wait for sacct's record to complete: for a few seconds after a job ends, sacct shows
    JobName "allocation" and no WorkDir/SubmitLine.
    """
    records = _scontrol_records(ref, runner)
    deadline = time.monotonic() + settle_s
    while _array_still_ending(records) and time.monotonic() < deadline:
        sleep(0.5)  # an array asked by its id right as it ends: wait for its tasks to settle before choosing one
        records = _scontrol_records(ref, runner)
    record = _pick_record(records)
    sacct_rows, sacct_fields = _sacct_rows(ref, runner)
    if record is None:
        deadline = time.monotonic() + settle_s
        while sacct_rows and _incomplete(sacct_rows) and time.monotonic() < deadline:
            sleep(0.5)
            sacct_rows, sacct_fields = _sacct_rows(ref, runner)
    if record is None and not sacct_rows:
        raise DiagnoseError(f"Slurm does not know job {ref.slurm_id} (not in scontrol, not in sacct)")
    job = SlurmJob(ref=ref, job_id=ref.slurm_id)
    if record is not None:
        fill_from_scontrol(job, record)
    job_rows = [r for r in sacct_rows if "." not in r.fields.get("JobID", "")]
    chosen_row = None
    if job_rows:
        chosen_row = _fill_from_sacct(job, ref, job_rows, sacct_rows, scontrol_known=record is not None)
        if chosen_row is not None:
            steps = [r.fields for r in sacct_rows if r.fields.get("JobID", "").startswith(job.job_id + ".")]
            job.usage = usage_from_rows(chosen_row.fields, steps)
    if record is None and _incomplete(sacct_rows):
        job.notes.append(
            "sacct's record of the job is still incomplete (no WorkDir yet); output location may be a guess"
        )
    if ref.array_task is None:  # an array asked by its id: say so when more tasks than the one reported failed
        listed = ([(_record_id(r), split_state(r.fields.get("JobState"))[0]) for r in records] if len(records) > 1
                  else [(r.fields.get("JobID", ""), split_state(r.fields.get("State"))[0]) for r in job_rows])
        note = array_note(job.job_id, list(dict(listed).items()))
        if note:
            job.notes.append(note)
    script_cache: dict[str, str | None] = {}
    _find_outputs(job, record, chosen_row, sacct_fields, runner, script_cache)
    _find_task_outputs(job, record, chosen_row, runner, script_cache, max_task_files)
    if ref.step is not None:
        chosen = [s for s in job.steps if s.short_id == ref.step]
        if not chosen and job.steps:  # sacct lists the job's steps and this is not one: say so, do not guess
            raise DiagnoseError(f"job {job.job_id} has no step {ref.step} (its steps: "
                                f"{', '.join(s.short_id for s in job.steps)})")
        if not chosen:
            job.notes.append(f"step {ref.step} not found in sacct's record of job {job.job_id}")
        job.steps = chosen
        # a step asked for: its own per-task files only (and those no step could be tied to)
        job.task_outputs = [t for t in job.task_outputs if t.step in (ref.step, None)]
    return job


# ------------------------------------------------------------------------------------------- scontrol


def scontrol_state(ref: JobRef, runner: Runner = run_slurm) -> str | None:
    """The job's state from scontrol alone (cheap enough to poll), or None once slurmctld has forgotten it."""
    record = _pick_record(_scontrol_records(ref, runner))
    return None if record is None else split_state(record.fields.get("JobState"))[0]


def _array_still_ending(records: list[ScontrolRecord]) -> bool:
    """Several records (an array asked by its id), none ended badly, and some not ended yet."""
    if len(records) < 2:
        return False
    states = [split_state(r.fields.get("JobState"))[0] for r in records]
    return not any(st in BAD_END_STATES for st in states) and any(st not in ENDED_STATES for st in states)


def _record_id(rec: ScontrolRecord) -> str:
    """A scontrol record's id as Slurm prints it (``7_2`` for an array task)."""
    f = rec.fields
    if f.get("ArrayJobId") and as_int(f.get("ArrayTaskId")) is not None:
        return f"{f['ArrayJobId']}_{f['ArrayTaskId']}"
    return f.get("JobId", "")


_TASK_NOT_FOUND = re.compile(r"\bJob \S+ not found\b")


def _scontrol_records(ref: JobRef, runner: Runner) -> list[ScontrolRecord]:
    """scontrol's records for the job (one per task for an array asked by its id); [] once it is forgotten."""
    result = runner(["scontrol", "-d", "show", "job", "-o", ref.slurm_id])
    if not result.ok:
        message = result.first_error_line()
        # "Invalid job id specified" for a plain job slurmctld has forgotten; "Job 7_2 not found" (22.05) for an
        # array task past MinJobAge while other tasks of its array are still in memory: sacct has it
        if "Invalid job id" in message or _TASK_NOT_FOUND.search(message):
            return []
        raise result.failure(f"scontrol show job {ref.slurm_id}")
    return parse_scontrol_jobs(result.stdout)


def _pick_record(records: list[ScontrolRecord]) -> ScontrolRecord | None:
    """The job's record; for an array asked by its array id, the task that ended badly first (scontrol lists
    the tasks newest first: the earliest EndTime, then the lowest task id)."""
    if not records:
        return None
    failing = [r for r in records if split_state(r.fields.get("JobState"))[0] in BAD_END_STATES]
    if not failing:
        return records[0]
    return min(failing, key=lambda r: _first_ended_key(r.fields.get("EndTime"), r.fields.get("ArrayTaskId")))


def _first_ended_key(end: str | None, task: str | None) -> tuple[str, int]:
    """Sort key of a task that ended badly: its end time (ISO text; unknown last), then its task id."""
    stamp = end if end and end[:1].isdigit() else "~"
    number = as_int(task)
    return stamp, number if number is not None else 1 << 62


def array_note(chosen: str, tasks: list[tuple[str, str]]) -> str | None:
    """For an array asked by its array id: which other tasks ended badly, when more than the one reported did.

    ``tasks`` is (task id as Slurm prints it, state) for each task Slurm listed."""
    bad = sorted({t for t, st in tasks if st in BAD_END_STATES and "_" in t},
                 key=lambda t: as_int(t.split("_", 1)[1]) or 0)
    if len(bad) < 2:
        return None
    others = [t for t in bad if t != chosen]
    shown = ", ".join(others[:8]) + (f" and {len(others) - 8} more" if len(others) > 8 else "")
    return (f"{len(bad)} of the array's {len(tasks)} tasks ended badly: this report is {chosen}'s; the others "
            f"({shown}) may have failed differently: 'diagnose slurm {others[0]}' reports one, "
            f"'diagnose slurm --failed' lists them all")


def fill_from_scontrol(job: SlurmJob, rec: ScontrolRecord) -> None:
    f = rec.fields
    job.source = "scontrol"
    job.raw_id = as_int(f.get("JobId"))
    job.array_job_id = as_int(f.get("ArrayJobId"))
    job.array_task_id = as_int(f.get("ArrayTaskId"))
    job.het_job_id = as_int(f.get("HetJobId"))
    job.het_offset = as_int(f.get("HetJobOffset"))
    if job.array_job_id is not None and job.array_task_id is not None:
        job.job_id = f"{job.array_job_id}_{job.array_task_id}"
    elif job.het_job_id is not None and job.het_offset is not None:
        job.job_id = f"{job.het_job_id}+{job.het_offset}"
    fill_shared(job, f, sacct=False)
    job.user = f.get("UserId", "").split("(", 1)[0]
    job.owner = owner_from_scontrol(f.get("UserId"))
    job.state, _ = split_state(f.get("JobState"))
    job.batch_host = _none_to_empty(f.get("BatchHost"))
    job.restarts = as_int(f.get("Restarts")) or 0
    job.work_dir = _none_to_empty(f.get("WorkDir"))
    job.batch = f.get("BatchFlag", "1") != "0"
    job.num_tasks = as_int(f.get("NumTasks"))
    keys = ("JobState", "Reason", "ExitCode", "DerivedExitCode", "RunTime", "TimeLimit", "Restarts", "NodeList")
    text = " ".join(f"JobId={f.get('JobId', '')}".split() + [f"{k}={f[k]}" for k in keys if k in f])
    job.record = Evidence(f"scontrol:{job.job_id}", rec.line, text)


# ---------------------------------------------------------------------------------------------- sacct


_SACCT_HAS_STDOUT: bool | None = None


def sacct_has_stdout(runner: Runner = run_slurm) -> bool:
    """Slurm 24.05+ has StdOut/StdErr in sacct; asking 22.05 for them fails the whole command, so probe first."""
    global _SACCT_HAS_STDOUT
    if _SACCT_HAS_STDOUT is None:
        result = runner(["sacct", "--helpformat"])
        _SACCT_HAS_STDOUT = result.ok and "StdOut" in result.stdout.split()
    return _SACCT_HAS_STDOUT


def _sacct_rows(ref: JobRef, runner: Runner) -> tuple[list[SacctRow], list[str]]:
    """The job's rows (the job line(s), with -D earlier runs of a requeued job, and its steps)."""
    fields = list(SACCT_FIELDS)
    if sacct_has_stdout(runner):
        fields += ["StdOut", "StdErr"]
    fields.append("SubmitLine")  # last: it may contain "|" itself
    result = runner(["sacct", "-j", ref.slurm_id, "-D", "--parsable2", "--format=" + ",".join(fields)])
    if not result.ok:
        message = result.first_error_line()
        if "accounting storage is disabled" in message or "Problem talking to" in message:
            return [], fields  # no accounting: scontrol is all we have
        raise result.failure(f"sacct -j {ref.slurm_id}")
    return parse_sacct(result.stdout), fields


def _incomplete(rows: list[SacctRow]) -> bool:
    job_rows = [r for r in rows if "." not in r.fields.get("JobID", "")]
    return bool(job_rows) and not job_rows[-1].fields.get("WorkDir")


def _fill_from_sacct(
    job: SlurmJob, ref: JobRef, job_rows: list[SacctRow], rows: list[SacctRow], scontrol_known: bool
) -> SacctRow | None:
    """Fill ``job`` from sacct (everything when scontrol did not know it; else the extras); return the job row, or
    None when scontrol chose a task that sacct does not list yet."""
    # an array asked by its array id lists every task: keep the one scontrol chose, else the first failed task
    ids = list(dict.fromkeys(r.fields["JobID"] for r in job_rows))
    if job.source == "scontrol":
        if job.job_id not in ids:  # sacct lags the job's end: never let another task's row replace scontrol's choice
            return None
        chosen = job.job_id
    else:
        failing = [r for r in job_rows if split_state(r.fields.get("State"))[0] in BAD_END_STATES]
        first = min(failing, key=lambda r: _first_ended_key(r.fields.get("End"), r.fields["JobID"].partition("_")[2]),
                    default=None)
        chosen = ref.slurm_id if ref.slurm_id in ids else (first.fields["JobID"] if first is not None else ids[0])
    runs = [r for r in job_rows if r.fields["JobID"] == chosen]
    row = runs[-1]  # with -D, earlier (requeued) runs come first
    f = row.fields
    job.job_id = chosen
    state, by = split_state(f.get("State"))
    job.state_record = Evidence(f"sacct:{chosen}", row.line, row.text)
    if by is not None:
        job.cancelled_by = user_name(by)
    if not scontrol_known:
        job.source = "sacct"
        job.raw_id = as_int(f.get("JobIDRaw"))
        if "_" in chosen:
            a, t = chosen.split("_", 1)
            job.array_job_id, job.array_task_id = as_int(a), as_int(t)
        if "+" in chosen:
            h, o = chosen.split("+", 1)
            job.het_job_id, job.het_offset = as_int(h), as_int(o)
        fill_shared(job, f, sacct=True)
        job.user = f.get("User", "")
        job.owner = owner_from_name(job.user)
        job.state = state
        job.restarts = len(runs) - 1
        job.work_dir = f.get("WorkDir", "")
        job.record = job.state_record
    elif job.derived_exit.code is None:
        job.derived_exit = parse_exit_code(f.get("DerivedExitCode"))
    # with -D a requeued job lists each run (job row, then its steps): keep the steps of the last run only
    start = next(i for i, r in enumerate(rows) if r is row)
    for r in rows[start + 1 :]:
        step_id = r.fields.get("JobID", "")
        if step_id.startswith(chosen + "."):
            step_state, _ = split_state(r.fields.get("State"))
            job.steps.append(
                SlurmStep(
                    step_id=step_id,
                    name=r.fields.get("JobName", ""),
                    state=step_state,
                    exit=parse_exit_code(r.fields.get("ExitCode")),
                    nodes=_none_to_empty(r.fields.get("NodeList")),
                    record=Evidence(f"sacct:{chosen}", r.line, r.text),
                    ntasks=as_int(r.fields.get("NTasks")),
                    submit_line=r.fields.get("SubmitLine", ""),
                )
            )
    # DerivedExitCode is the worst exit of the job's steps, but 22.05's accounting sometimes stores 0:0 although
    # an srun step failed (seen on the local cluster): derive it from the steps then
    if not job.derived_exit.failed and (worst := worst_step_exit(job.steps)) is not None:
        job.derived_exit = worst
    # a TIMEOUT job line says 0:0; the signal that ended it is on the batch step
    if job.source == "sacct" and not job.exit.failed:
        batch = next((s for s in job.steps if s.short_id == "batch"), None)
        if batch is not None and batch.exit.failed:
            job.exit = batch.exit
    return row


def worst_step_exit(steps: list[SlurmStep]) -> ExitStatus | None:
    """The highest exit code among the numbered (srun) steps, as Slurm's DerivedExitCode is meant to be."""
    failed = [s.exit for s in steps if s.short_id.isdigit() and s.exit.failed]
    if not failed:
        return None
    return max(failed, key=lambda e: (e.code or 0, e.signal or 0))


# -------------------------------------------------------------------------------------------- outputs


def _find_outputs(
    job: SlurmJob, record: ScontrolRecord | None, row: SacctRow | None, fields: list[str], runner: Runner,
    script_cache: dict[str, str | None],
) -> None:
    if not job.batch:
        job.notes.append("not a batch job (srun/salloc): its output went to the terminal that started it")
        return
    fields_for_patterns = pattern_fields(job)
    options: OutputOptions | None = None
    if record is not None and record.fields.get("StdOut"):
        options = OutputOptions(record.fields.get("StdOut"), record.fields.get("StdErr") or None)
        job.output_route = "scontrol"
    elif row is not None:
        options = _outputs_from_sacct(job, row, fields, runner, script_cache)
    if options is None or not options.output:
        if not job.work_dir:
            job.notes.append("Slurm has no record of the job's output location or working directory")
            return
        options = OutputOptions(default_output(job.array_task_id is not None), options.error if options else None)
        job.output_route = f"{job.output_route} + default" if job.output_route else "default"
    out_path = _expanded(options.output or "", fields_for_patterns, job.work_dir)
    err_path = _expanded(options.error, fields_for_patterns, job.work_dir) if options.error else None
    job.outputs += probe_outputs(out_path, err_path, job.owner)
    for o in job.outputs:
        if not o.exists and job.state and not job.ended:
            o.problem = f"not written yet (the job is {job.state})"
        elif not o.exists and job.ended and not job.nodes and not job.batch_host:
            # no node was ever allocated (cancelled while pending, a dependency never satisfied): Slurm never
            # opened the file, so it was not deleted
            o.problem = f"never written: the job ended ({job.state}) before it ran on any node"
        if o.problem:
            job.notes.append(f"{o.stream} file {o.path}: {o.problem}")


def _outputs_from_sacct(
    job: SlurmJob, row: SacctRow, fields: list[str], runner: Runner, script_cache: dict[str, str | None]
) -> OutputOptions | None:
    """Rebuild --output/--error from sacct: StdOut (24.05+), SubmitLine, --env-vars, --batch-script, in that order
    of Slurm's own precedence; record the route that gave the answer."""
    f = row.fields
    if "StdOut" in fields and f.get("StdOut"):
        job.output_route = "sacct StdOut"
        return OutputOptions(f.get("StdOut"), f.get("StdErr") or None)
    routes = [("sacct SubmitLine", parse_sbatch_options(f.get("SubmitLine", "")))]
    env = runner(["sacct", "-j", job.job_id, "--env-vars"])
    if env.ok:
        values = parse_env_outputs(env.stdout)
        routes.append(("sacct --env-vars", OutputOptions(values.get("SBATCH_OUTPUT"), values.get("SBATCH_ERROR"))))
    script = _batch_script(job, runner, script_cache, "sacct")
    if script is not None:
        routes.append(("sacct --batch-script", parse_batch_script_options(script)))
    output = next(((name, o.output) for name, o in routes if o.output), None)
    error = next(((name, o.error) for name, o in routes if o.error), None)
    if output is None and error is None:
        return None
    used = list(dict.fromkeys(found[0] for found in (output, error) if found is not None))
    job.output_route = " + ".join(used)
    return OutputOptions(output[1] if output else None, error[1] if error else None)


def _batch_script(job: SlurmJob, runner: Runner, cache: dict[str, str | None], source: str) -> str | None:
    """The job's batch script, asked at most once per lookup from each ``source``: ``scontrol`` (``write
    batch_script ID -``, while slurmctld remembers the job) or ``sacct`` (``--batch-script``, which needs
    AccountingStoreFlags=job_script and says NONE without it)."""
    if source not in cache:
        argv = (["scontrol", "write", "batch_script", job.job_id, "-"] if source == "scontrol"
                else ["sacct", "-j", job.job_id, "--batch-script"])
        result = runner(argv)
        cache[source] = result.stdout if result.ok and result.stdout.strip() not in ("", "NONE") else None
    return cache[source]


def pattern_fields(job: SlurmJob) -> PatternFields:
    return PatternFields(
        job_id=job.raw_id or job.ref.job,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        job_name=job.name,
        user=job.user,
        first_node=first_node(job.batch_host or job.nodes),
        restarts=job.restarts,
    )


def _srun_calls(
    job: SlurmJob, record: ScontrolRecord | None, row: SacctRow | None, runner: Runner, cache: dict[str, str | None]
) -> tuple[list[SrunCall], list[StepShape]]:
    """The srun calls that may have written per-task files, with the steps they ran as (aligned when known).

    Sources, best first: each step's own SubmitLine (sacct, Slurm 23.02+), the job's SubmitLine when the job
    itself is an srun, the batch script (scontrol while the job is remembered, else sacct --batch-script).
    """
    numbered = sorted((s for s in job.steps if s.short_id.isdigit()), key=lambda s: int(s.short_id))
    shapes = [StepShape(s.short_id, s.ntasks, expand_hostlist(s.nodes or job.nodes)) for s in numbered]
    variables = job_variables(
        job.raw_id or job.ref.job, job.name, job.user, job.array_job_id, job.array_task_id, job.work_dir
    )
    # a step's SubmitLine is srun's argv joined without quoting: only its first (leading) srun is the step's
    own = [find_srun_calls(s.submit_line, variables)[:1] if _is_srun_line(s.submit_line) else [] for s in numbered]
    if numbered and all(own):
        job.task_route = "sacct step SubmitLine"
        return [c[0] for c in own], shapes
    submit = row.fields.get("SubmitLine", "") if row is not None else ""
    if not job.batch and _is_srun_line(submit):
        job.task_route = "sacct SubmitLine"
        return find_srun_calls(submit, variables)[:1], shapes
    if not job.batch or (job.steps and not numbered):
        return [], shapes  # no srun step ran: nothing to look for
    script = _batch_script(job, runner, cache, "scontrol") if record is not None else None
    job.task_route = "scontrol write batch_script"
    if script is None:
        script = _batch_script(job, runner, cache, "sacct")
        job.task_route = "sacct --batch-script"
    if script is None:
        job.task_route = ""
        return [], shapes
    return find_srun_calls(script, variables), shapes


def _is_srun_line(line: str) -> bool:
    words = line.split(None, 1)
    return bool(words) and words[0].rsplit("/", 1)[-1] == "srun"


def _find_task_outputs(
    job: SlurmJob, record: ScontrolRecord | None, row: SacctRow | None, runner: Runner,
    cache: dict[str, str | None], cap: int,
) -> None:
    """srun's per-task/per-node files (``srun -o logs/%j-%t.out``): found, capped, and explained in the notes."""
    if not job.work_dir:
        return
    calls, shapes = _srun_calls(job, record, row, runner, cache)
    if not any(c.writes_files or c.unresolved for c in calls):
        job.task_route = ""
        return
    default = StepShape(None, job.num_tasks, expand_hostlist(job.nodes))
    found = collect(calls, shapes, pattern_fields(job), job.work_dir, default, cap=cap,
                    exclude={o.path for o in job.outputs})
    job.task_outputs = _owned(found.files, job)
    job.task_outputs_found = found.found
    job.task_patterns = found.patterns
    if found.files:  # the header lists the batch output only; say where the other inputs came from
        job.notes.append(summary(found, job.task_route, cap))
    job.notes.extend(found.notes)
    if not found.files and not found.patterns:
        job.task_route = ""
    if found.files and not job.batch:  # an srun job with -o: its output did not go to a terminal after all
        job.notes = [n for n in job.notes if not n.startswith("not a batch job")]


def _expanded(pattern: str, f: PatternFields, work_dir: str) -> str:
    """Expand a pattern; scontrol has already expanded most of it but leaves padded forms like %4j."""
    if pattern and os.path.exists(resolve(pattern, work_dir)):
        return resolve(pattern, work_dir)
    return resolve(expand_pattern(pattern, f), work_dir)


def _owned(files: list[TaskFile], job: SlurmJob) -> list[TaskFile]:
    """The per-task files that may be read for this job (owner.py); a note for each one refused."""
    kept = []
    for t in files:
        if (why := refusal(t.path, job.owner)) is None:
            kept.append(t)
        else:
            job.notes.append(f"{t.stream} file {t.path}: {why}")
    return kept


def probe_outputs(out: str, err: str | None, owner: JobOwner | None = None) -> list[SlurmOutputFacts]:
    """The job's output file(s): one for both streams unless stderr goes to a file of its own."""
    if err is None or err == out:
        return [probe(out, "stdout+stderr", owner)]
    return [probe(out, "stdout", owner), probe(err, "stderr", owner)]


def probe(path: str, stream: str, owner: JobOwner | None = None) -> SlurmOutputFacts:
    """What is known of one output file; with ``owner``, a file that is not the job user's own is not readable."""
    out = SlurmOutputFacts(path=path, stream=stream)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        folder = os.path.dirname(path)
        out.problem = (f"does not exist, nor does its folder {folder} (Slurm does not create it: a job whose output "
                       "file cannot be opened fails to launch)" if folder and not os.path.isdir(folder)
                       else "does not exist (deleted, or on a file system this machine does not mount)")
        return out
    except OSError as e:
        out.problem = f"cannot be read ({e.strerror})"
        return out
    out.exists, out.size = True, st.st_size
    if not os.path.isfile(path):
        out.problem = "is not a regular file"
    elif not os.access(path, os.R_OK):
        out.problem = "exists but is not readable by you (permission denied)"
    elif owner is not None and (why := refusal(path, owner)) is not None:
        out.problem = why
    else:
        out.readable = True
    return out


# -------------------------------------------------------------------------------------------- helpers


def _none_to_empty(text: str | None) -> str:
    return "" if text in (None, "(null)", "None", "None assigned") else text


def user_name(uid_text: str) -> str:
    """The user name of a uid as Slurm prints it ("CANCELLED by 0" -> "root"); the text itself when it is no uid
    this host knows (already a name, or a uid of another host)."""
    try:
        return pwd.getpwuid(int(uid_text)).pw_name
    except (ValueError, KeyError):
        return uid_text


# What scontrol and sacct both say, each under its own name: (SlurmJob attribute, scontrol's, sacct's, reader)
_SHARED_FIELDS: tuple[tuple[str, str, str, Callable[[str], object]], ...] = (
    ("name", "JobName", "JobName", str),
    ("reason", "Reason", "Reason", str),
    ("exit", "ExitCode", "ExitCode", parse_exit_code),
    ("derived_exit", "DerivedExitCode", "DerivedExitCode", parse_exit_code),
    ("nodes", "NodeList", "NodeList", _none_to_empty),
    ("elapsed_s", "RunTime", "Elapsed", parse_duration),
    ("time_limit_text", "TimeLimit", "Timelimit", str),
    ("start", "StartTime", "Start", str),
    ("end", "EndTime", "End", str),
)


def fill_shared(job: SlurmJob, f: dict[str, str], sacct: bool) -> None:
    for attr, scontrol_key, sacct_key, read in _SHARED_FIELDS:
        setattr(job, attr, read(f.get(sacct_key if sacct else scontrol_key, "")))
    job.time_limit_s = parse_duration(job.time_limit_text)
