"""Pure unit tests of the Slurm side: job id validation, scontrol/sacct parsing, output patterns, sbatch options,
the SJ findings and the merge with a log's report. No cluster needed (see test_slurm_cluster.py for that).

The scontrol/sacct texts below are real output of Slurm 22.05.8 captured on the local cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diagnose.ingest.slurm.commands import SlurmUnavailable, run_slurm
from diagnose.ingest.slurm.findings import slurm_findings
from diagnose.ingest.slurm.job import SlurmJob, SlurmStep
from diagnose.ingest.slurm.jobid import JobRef, parse_job_id
from diagnose.ingest.slurm.listing import sacct_since
from diagnose.ingest.slurm.merge import merge_slurm_findings
from diagnose.ingest.slurm.output_path import (
    PatternFields,
    expand_pattern,
    first_node,
    parse_batch_script_options,
    parse_sbatch_options,
    resolve,
)
from diagnose.ingest.slurm.parse import (
    ExitStatus,
    format_duration,
    parse_duration,
    parse_env_outputs,
    parse_exit_code,
    parse_sacct,
    parse_scontrol_jobs,
    split_state,
)
from diagnose.model import DiagnoseError, Evidence, Finding, Report, SlurmFacts, SlurmOutputFacts, SlurmTaskFacts

REPO = Path(__file__).resolve().parents[1]

SCONTROL_O = (
    "JobId=6 ArrayJobId=3 ArrayTaskId=1 JobName=arr UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
    "Nice=0 Account=root QOS=normal JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=2 "
    "BatchFlag=1 Reboot=0 ExitCode=1:0 DerivedExitCode=0:0 RunTime=00:01:05 TimeLimit=01:00:00 TimeMin=N/A "
    "SubmitTime=2026-11-29T15:35:45 StartTime=2026-11-29T15:35:48 EndTime=2026-11-29T15:36:53 Partition=debug "
    "AllocNode:Sid=localhost:3809 ReqNodeList=(null) NodeList=gpu[01-02] BatchHost=gpu01 NumNodes=2 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* Command=/home/a b/train.sh --x=1 WorkDir=/home/a b Comment=my long comment  "
    "StdErr=/home/a b/arr-3_1.out StdIn=/dev/null StdOut=/home/a b/arr-3_1.out Power="
)

SACCT = """JobID|JobIDRaw|JobName|User|State|ExitCode|DerivedExitCode|SubmitLine
4|4|srunlbl|root|COMPLETED|0:0|1:0|sbatch --parsable srunlabel.sh
4.batch|4.batch|batch||COMPLETED|0:0||
4.0|4.0|bash||FAILED|1:0||
7|7|wrap|root|CANCELLED by 0|0:15|0:0|sbatch --wrap=echo a | tee b -o x-%j.out
"""


# ---------------------------------------------------------------------------------------------- job ids


@pytest.mark.parametrize(
    "text, ref",
    [
        ("123456", JobRef(123456)),
        ("123456_7", JobRef(123456, array_task=7)),
        ("123456+1", JobRef(123456, het_offset=1)),
        ("123.batch", JobRef(123, step="batch")),
        ("123_4.0", JobRef(123, array_task=4, step="0")),
        (" 42 ", JobRef(42)),
    ],
)
def test_job_ids_accepted(text, ref):
    assert parse_job_id(text) == ref


@pytest.mark.parametrize(
    "text",
    ["", "abc", "123;ls", "$(id)", "123 456", "123_[1-3]", "-1", "123_", "123+", "1.2.3", "12\n3", "`id`", "12345678901"],
)
def test_job_ids_refused(text):
    with pytest.raises(DiagnoseError, match="not a Slurm job id"):
        parse_job_id(text)


def test_step_option():
    assert parse_job_id("5", step="batch") == JobRef(5, step="batch")
    assert str(parse_job_id("5_2", step="0")) == "5_2.0"
    with pytest.raises(DiagnoseError, match="not a Slurm step"):
        parse_job_id("5", step="0;rm")
    with pytest.raises(DiagnoseError, match="two different steps"):
        parse_job_id("5.1", step="2")


@given(st.text(max_size=30))
def test_any_text_is_a_valid_id_or_a_one_line_error(text):
    try:
        ref = parse_job_id(text)
    except DiagnoseError as e:
        assert "\n" not in str(e)
    else:  # what reaches a Slurm command is digits, "_", "+", "." and a step word only
        assert set(str(ref)) <= set("0123456789_+.batchextrnilvy")


def test_bad_id_on_the_command_line_exits_2_with_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "diagnose", "slurm", "123;touch /tmp/x"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "not a Slurm job id" in done.stderr


def test_missing_slurm_commands_is_a_clear_message(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # nothing on PATH: no scontrol
    done = subprocess.run(
        [sys.executable, "-m", "diagnose", "slurm", "123"], cwd=REPO, capture_output=True, text=True, env=env
    )
    assert done.returncode == 2
    assert "scontrol not found on PATH" in done.stderr and done.stderr.count("\n") == 1
    with pytest.raises(SlurmUnavailable, match="sacct not found"):
        old = os.environ["PATH"]
        os.environ["PATH"] = str(tmp_path)
        try:
            run_slurm(["sacct", "-j", "1"])
        finally:
            os.environ["PATH"] = old


# ------------------------------------------------------------------------------------- scontrol, sacct


def test_scontrol_one_line_record():
    (rec,) = parse_scontrol_jobs(SCONTROL_O)
    f = rec.fields
    assert f["JobId"] == "6" and f["ArrayJobId"] == "3" and f["ArrayTaskId"] == "1"
    assert f["JobState"] == "FAILED" and f["ExitCode"] == "1:0" and f["Restarts"] == "2"
    assert f["WorkDir"] == "/home/a b"  # values with spaces stay whole
    assert f["Command"] == "/home/a b/train.sh --x=1"
    assert f["Comment"] == "my long comment"
    assert f["StdOut"] == "/home/a b/arr-3_1.out" and f["Power"] == ""
    assert f["AllocNode:Sid"] == "localhost:3809" and f["CPUs/Task"] == "1"


def test_scontrol_multi_line_and_several_records():
    text = (
        "JobId=1 JobName=a\n   JobState=FAILED Reason=NonZeroExitCode\n   ExitCode=2:0\n\n"
        "JobId=2 JobName=b\n   JobState=TIMEOUT Reason=TimeLimit\n"
    )
    a, b = parse_scontrol_jobs(text)
    assert a.fields["ExitCode"] == "2:0" and a.line == 1
    assert b.fields["JobState"] == "TIMEOUT" and b.line == 5


def test_sacct_rows_steps_and_bars_in_submit_line():
    rows = parse_sacct(SACCT)
    assert [r.fields["JobID"] for r in rows] == ["4", "4.batch", "4.0", "7"]
    assert rows[0].line == 2 and rows[2].fields["State"] == "FAILED"
    assert rows[3].fields["SubmitLine"] == "sbatch --wrap=echo a | tee b -o x-%j.out"
    assert split_state(rows[3].fields["State"]) == ("CANCELLED", "0")


def test_exit_codes_and_signals():
    assert parse_exit_code("1:0") == ExitStatus(1, 0)
    timeout = parse_exit_code("0:15")
    assert timeout.signal_name == "SIGTERM" and timeout.failed
    assert not parse_exit_code("0:0").failed
    assert parse_exit_code("") == ExitStatus(None, None) and str(parse_exit_code("junk")) == "unknown"


@pytest.mark.parametrize(
    "text, seconds",
    [("00:01:25", 85), ("1-02:03:04", 93784), ("03:04", 184), ("2-12", 216000), ("UNLIMITED", None),
     ("Partition_Limit", None), ("", None)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_format_duration_round_trips():
    for s in (0, 59, 3600, 93784):
        assert parse_duration(format_duration(s)) == s


def test_env_vars_keep_only_output_names():
    text = "Environment used for 5\n---\nSECRET_TOKEN=abc\nSBATCH_OUTPUT=./out-%j.log\nSBATCH_ERROR=e.log\nPWD=/x\n"
    assert parse_env_outputs(text) == {"SBATCH_OUTPUT": "./out-%j.log", "SBATCH_ERROR": "e.log"}


def test_since():
    assert sacct_since("6h") == "now-6hours" and sacct_since("2d") == "now-2days" and sacct_since("90") == "now-90seconds"
    assert sacct_since("2026-11-29T10:00") == "2026-11-29T10:00"
    with pytest.raises(DiagnoseError):
        sacct_since("yesterday; rm")


# --------------------------------------------------------------------------------------- output paths


def test_pattern_expansion():
    f = PatternFields(job_id=6, array_job_id=3, array_task_id=1, job_name="train", user="alice", first_node="gpu01")
    assert expand_pattern("%x-%A_%a.out", f) == "train-3_1.out"
    assert expand_pattern("%4j-%3a-%%j-%u-%N", f) == "0006-001-%j-alice-gpu01"
    assert expand_pattern("log-%J-%s-%t-%b.txt", f) == "log-6.batch-batch-0-1.txt"
    assert expand_pattern("%12j", f) == "0000000006"  # padding stops at 10
    assert expand_pattern("no-pattern %q", f) == "no-pattern %q"
    plain = PatternFields(job_id=9)
    assert expand_pattern("slurm-%A_%a.out", plain) == "slurm-9_4294967294.out"


def test_sbatch_command_line_options():
    assert parse_sbatch_options("sbatch --parsable -o out-%j.txt train.sh").output == "out-%j.txt"
    assert parse_sbatch_options("sbatch -oout.txt -e err.txt job.sh").error == "err.txt"
    assert parse_sbatch_options("sbatch --output=o.txt --error e.txt -J n job.sh").output == "o.txt"
    # options after the script are the script's own arguments
    assert parse_sbatch_options("sbatch -J x job.sh -o not-mine.txt").output is None
    assert parse_sbatch_options("sbatch --hold -N 2 job.sh --output x").output is None
    # --wrap: no script; the wrapped words are stored unquoted, later options still count
    assert parse_sbatch_options("sbatch --parsable --wrap=echo default; exit 3 -o w-%j.out").output == "w-%j.out"
    assert parse_sbatch_options('sbatch -o "a b.txt" job.sh').output == "a b.txt"
    assert parse_sbatch_options("sbatch -o 'unbalanced job.sh").output == "'unbalanced"


def test_batch_script_options_until_first_command():
    script = (
        "#!/bin/bash\n# comment\n#SBATCH --job-name=x\n#SBATCH -o first.out\n#SBATCH --output=second.out # c\n"
        "\n#SBATCH -e err.out\necho go\n#SBATCH --output=ignored.out\n"
    )
    opts = parse_batch_script_options(script)
    assert opts.output == "second.out" and opts.error == "err.out"
    assert parse_batch_script_options("#!/bin/sh\n# This script was created by sbatch --wrap.\n\nexit 3\n").output is None


def test_node_lists_and_resolution():
    assert first_node("gpu[01-04,07]") == "gpu01" and first_node("a,b") == "a" and first_node("None assigned") == ""
    assert resolve("out.txt", "/w") == "/w/out.txt" and resolve("/abs.txt", "/w") == "/abs.txt"


# ---------------------------------------------------------------------------------- findings and merge


def _job(state: str, exit_text: str = "0:0", derived: str = "0:0", **kw) -> SlurmJob:
    job = SlurmJob(ref=JobRef(77), job_id="77", state=state, exit=parse_exit_code(exit_text),
                   derived_exit=parse_exit_code(derived), nodes="gpu01", elapsed_s=3600, time_limit_s=3600, **kw)
    job.record = Evidence("scontrol:77", 1, f"JobId=77 JobState={state} ExitCode={exit_text}")
    return job


def _log_finding(category: str, severity: str = "error") -> Finding:
    return Finding(rule="NC001", name="n", title="NCCL watchdog timeout", category=category, phase="training",
                   severity=severity, role="root", confidence=0.9, evidence=[Evidence("job.log", 10, "Watchdog")])


def test_slurm_finding_codes_per_state():
    assert slurm_findings(_job("TIMEOUT", "0:15"))[0].rule == "SJ001"
    assert slurm_findings(_job("OUT_OF_MEMORY", "0:125"))[0].rule == "SJ002"
    assert slurm_findings(_job("NODE_FAIL"))[0].rule == "SJ003"
    assert slurm_findings(_job("PREEMPTED"))[0].rule == "SJ004"
    cancelled = slurm_findings(_job("CANCELLED", cancelled_by="alice"))[0]
    assert cancelled.rule == "SJ005" and "by alice" in cancelled.title
    assert slurm_findings(_job("FAILED", "1:0"))[0].rule == "SJ006"
    assert slurm_findings(_job("FAILED", "0:9"))[0].rule == "SJ007"
    assert slurm_findings(_job("COMPLETED")) == []
    requeued = slurm_findings(_job("COMPLETED", restarts=2))
    assert [f.rule for f in requeued] == ["SJ011"] and requeued[0].severity == "info"


def test_launch_failure_is_sj012_in_the_phase_its_rule_names():
    # a FAILED job whose batch step never launched: its ExitCode (0:53) is not a signal the program got
    f = slurm_findings(_job("FAILED", "0:53", reason="JobLaunchFailure"))[0]
    assert f.rule == "SJ012" and f.phase == "init"
    assert "failed to launch" in f.title and "0:53" in f.title
    assert slurm_findings(_job("TIMEOUT", "0:15"))[0].phase == "unknown"  # Slurm's record does not say when


def test_step_failure_names_the_step():
    job = _job("COMPLETED", derived="1:0")
    job.steps = [
        SlurmStep("77.batch", "batch", "COMPLETED", ExitStatus(0, 0), "gpu01", Evidence("sacct:77", 3, "b")),
        SlurmStep("77.0", "python", "FAILED", ExitStatus(1, 0), "gpu01", Evidence("sacct:77", 4, "s")),
    ]
    (f,) = slurm_findings(job)
    assert f.rule == "SJ008" and f.facts["failed_step"] == "77.0" and "step 0 (python)" in f.title
    assert [e.line for e in f.evidence] == [1, 4]
    assert f.category == "slurm" and f.evidence[0].path == "scontrol:77"


def test_timeout_title_has_elapsed_and_limit():
    f = slurm_findings(_job("TIMEOUT", "0:15"))[0]
    assert "01:00:00 of 01:00:00" in f.title and f.facts["signal"] == "SIGTERM"


def test_log_root_explains_timeout_stays_root():
    report = Report(findings=[_log_finding("nccl_timeout")], root_cause=0)
    merge_slurm_findings(report, slurm_findings(_job("TIMEOUT", "0:15")), "TIMEOUT")
    assert report.root_cause == 0 and report.root.rule == "NC001"
    sj = report.findings[1]
    assert sj.rule == "SJ001" and sj.role == "cascade" and sj.cause_of == 0


def test_empty_log_makes_slurm_state_the_root():
    report = Report()
    merge_slurm_findings(report, slurm_findings(_job("TIMEOUT", "0:15")), "TIMEOUT")
    assert report.root_cause == 0 and report.root.rule == "SJ001" and report.root.role == "root"
    warn_only = Report(findings=[_log_finding("numerics", severity="warning")], root_cause=None)
    merge_slurm_findings(warn_only, slurm_findings(_job("FAILED", "1:0")), "FAILED")
    assert warn_only.root.rule == "SJ006"


def test_preemption_is_root_over_its_consequences():
    cascade = _log_finding("other")
    cascade.cause_of = 0
    report = Report(findings=[_log_finding("nccl_error"), cascade], root_cause=0)
    merge_slurm_findings(report, slurm_findings(_job("PREEMPTED")), "PREEMPTED")
    assert report.root.rule == "SJ004" and report.root_cause == 0
    assert report.findings[1].role == "cascade" and report.findings[1].cause_of == 0
    assert report.findings[2].cause_of == 1  # indices shifted with the insertion


def test_host_oom_log_explains_out_of_memory_but_cuda_oom_does_not():
    report = Report(findings=[_log_finding("host_oom")], root_cause=0)
    merge_slurm_findings(report, slurm_findings(_job("OUT_OF_MEMORY")), "OUT_OF_MEMORY")
    assert report.root.category == "host_oom"
    report = Report(findings=[_log_finding("cuda_oom")], root_cause=0)
    merge_slurm_findings(report, slurm_findings(_job("OUT_OF_MEMORY")), "OUT_OF_MEMORY")
    assert report.root.rule == "SJ002"


@given(st.text(max_size=300))
def test_parsers_never_raise_on_any_text(text):
    for rec in parse_scontrol_jobs("JobId=1 " + text):
        assert rec.fields["JobId"].startswith("1") or rec.fields["JobId"] == ""
    parse_sacct("JobID|State\n" + text)
    parse_sbatch_options(text)
    parse_batch_script_options(text)
    parse_exit_code(text)
    parse_duration(text)
    split_state(text)


_TOKEN = st.one_of(
    st.text(alphabet="abc-_./0123456789", min_size=1, max_size=4),
    st.builds(lambda w, c: f"%{w}{c}", st.sampled_from(["", "1", "4", "10"]), st.sampled_from(list("AabJjNnstuxr"))),
    st.just("%%"),
)


@given(st.lists(_TOKEN, max_size=12))
def test_every_known_specifier_is_expanded(tokens):
    f = PatternFields(job_id=12, array_job_id=10, array_task_id=2, job_name="n", user="u", first_node="h")
    out = expand_pattern("".join(tokens), f)
    assert out.count("%") == tokens.count("%%")  # only escaped percents remain, as single "%"


def test_slurm_header_makes_job_fields_inert():
    import io

    from diagnose.present.commands.slurm import slurm_header
    from diagnose.present.text import make_console

    section = SlurmFacts(job_id="5", name="evil\x1b]52;c;AAAA\x07[bold]x", user="u", state="FAILED", exit_code=1,
                         nodes="n1", source="sacct", output_route="default",
                         outputs=[SlurmOutputFacts(path="/w/\x1b[2Jout", stream="stdout+stderr", problem=None)])
    buf = io.StringIO()
    console = make_console(buf, "never")
    for line in slurm_header(section, failed=True):
        console.print(line, soft_wrap=True)
    text = buf.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]52;c;AAAA\\x07[bold]x" in text and "/w/\\x1b[2Jout" in text


def test_follow_reads_appended_text_and_restarts_after_truncation(tmp_path):
    from diagnose.slurm_follow import _read_new

    log = tmp_path / "job.out"
    seen: list[str] = []
    assert _read_new(str(log), 0, seen.append) == (0, False)  # not created yet
    log.write_text("iteration 1\n")
    offset, grew = _read_new(str(log), 0, seen.append)
    assert grew and offset == 12
    with log.open("a") as fh:
        fh.write("iteration 2\n")
    offset, _ = _read_new(str(log), offset, seen.append)
    assert seen == ["iteration 1\n", "iteration 2\n"]
    log.write_text("new\n")  # truncated and rewritten (a requeued run)
    offset, grew = _read_new(str(log), offset, seen.append)
    assert grew and seen[-1] == "new\n" and offset == 4


def test_follow_shows_the_failure_the_match_found_even_when_written_after_the_polls_read(tmp_path, monkeypatch):
    """The job wrote its failure between a poll's read of the files and the match of them (seen on the real cluster:
    the OOM went to the separate stderr file and following stopped without showing it): the rest is shown first."""
    from types import SimpleNamespace

    import diagnose.pipeline as pipeline
    from diagnose import slurm_follow as follow
    from diagnose.ingest.slurm.jobid import parse_job_id

    out, err = tmp_path / "job.out", tmp_path / "job.err"
    out.write_text("iteration 1\n")
    err.write_text("")
    failure = (REPO / "sample_logs" / "ddp_wrap_oom.log").read_text()
    job = SimpleNamespace(state="RUNNING", outputs=[SimpleNamespace(path=str(out)), SimpleNamespace(path=str(err))],
                          ended=False, batch=True)
    monkeypatch.setattr(follow, "lookup_job", lambda *a, **k: job)
    monkeypatch.setattr(follow, "scontrol_state", lambda *a, **k: "RUNNING")
    monkeypatch.setattr(follow, "diagnose_job", lambda *a, **k: SimpleNamespace(report=None))
    real_analyze = pipeline.analyze

    def analyze_after_the_job_wrote(paths, options=None):
        if not err.read_text():
            err.write_text(failure)  # the job's failure lands after the read, before the match
        return real_analyze(paths, options)

    monkeypatch.setattr(pipeline, "analyze", analyze_after_the_job_wrote)
    shown: list[str] = []
    result = follow.follow_job(parse_job_id("5"), on_text=shown.append, sleep=lambda s: None, max_s=60)
    assert result.stopped_because == "failure"
    assert "Tried to allocate" in "".join(shown)


def test_array_id_picks_the_failed_task_not_one_still_completing():
    """scontrol lists every task of an array asked by its id; a task still COMPLETING is not the failed one."""
    from diagnose.ingest.slurm.commands import CommandResult
    from diagnose.ingest.slurm.job import scontrol_state
    from diagnose.ingest.slurm.jobid import parse_job_id

    out = "\n".join(
        f"JobId={raw} JobName=arr ArrayJobId=7 ArrayTaskId={task} JobState={state} ExitCode={code}"
        for raw, task, state, code in [(9, 2, "COMPLETING", "0:0"), (8, 1, "FAILED", "1:0"), (7, 0, "COMPLETED", "0:0")]
    )

    def runner(argv):
        return CommandResult(argv, 0, out + "\n", "")

    assert scontrol_state(parse_job_id("7"), runner) == "FAILED"


def test_array_asked_as_it_ends_waits_for_its_tasks_to_settle():
    from diagnose.ingest.slurm.commands import CommandResult
    from diagnose.ingest.slurm.job import lookup_job
    from diagnose.ingest.slurm.jobid import parse_job_id

    calls = {"n": 0}
    running = "JobId=8 JobName=arr ArrayJobId=7 ArrayTaskId=1 JobState=COMPLETING ExitCode=0:0"
    failed = "JobId=8 JobName=arr ArrayJobId=7 ArrayTaskId=1 JobState=FAILED ExitCode=1:0"
    done = "JobId=7 JobName=arr ArrayJobId=7 ArrayTaskId=2 JobState=COMPLETED ExitCode=0:0"

    def runner(argv):
        if argv[0] == "scontrol":
            calls["n"] += 1
            task1 = running if calls["n"] <= 2 else failed
            return CommandResult(argv, 0, f"{done}\n{task1}\n", "")
        return CommandResult(argv, 1, "", "sacct: error: accounting storage is disabled")

    job = lookup_job(parse_job_id("7"), runner, settle_s=5, sleep=lambda s: None)
    assert job.job_id == "7_1"


def test_sacct_lagging_behind_never_replaces_the_task_scontrol_chose():
    """Right after an array ends, sacct may list only some tasks: scontrol's choice (the failed task) stays."""
    from diagnose.ingest.slurm.commands import CommandResult
    from diagnose.ingest.slurm.job import SACCT_FIELDS, lookup_job
    from diagnose.ingest.slurm.jobid import parse_job_id

    scontrol = (
        "JobId=7 JobName=arr ArrayJobId=7 ArrayTaskId=2 JobState=COMPLETED ExitCode=0:0\n"
        "JobId=8 JobName=arr ArrayJobId=7 ArrayTaskId=1 JobState=FAILED ExitCode=1:0\n"
    )
    header = "|".join([*SACCT_FIELDS, "SubmitLine"])
    row = {"JobID": "7_2", "JobIDRaw": "7", "JobName": "arr", "State": "COMPLETED", "ExitCode": "0:0"}
    sacct = header + "\n" + "|".join(row.get(f, "") for f in [*SACCT_FIELDS, "SubmitLine"]) + "\n"

    def runner(argv):
        if argv[0] == "scontrol":
            return CommandResult(argv, 0, scontrol, "")
        if "--helpformat" in argv:
            return CommandResult(argv, 0, "JobID JobName State", "")
        return CommandResult(argv, 0, sacct, "")

    job = lookup_job(parse_job_id("7"), runner, settle_s=0, sleep=lambda s: None)
    assert job.job_id == "7_1" and job.array_task_id == 1


# ------------------------------------------------------------------- srun per-task / per-node output files

from diagnose.ingest.slurm.commands import CommandResult  # noqa: E402
from diagnose.ingest.slurm.hostlist import expand_hostlist  # noqa: E402
from diagnose.ingest.slurm.srun_script import SrunCall, find_srun_calls  # noqa: E402
from diagnose.ingest.slurm.task_outputs import StepShape, as_regex, collect, find_files  # noqa: E402

TRAIN_SCRIPT = r"""#!/bin/bash
#SBATCH --ntasks=4
#SBATCH -o batch-%j.out
# srun -o commented-%t.log is not a call
LOGDIR=logs/$SLURM_JOB_ID
mkdir -p "$LOGDIR" && srun --label -o "$LOGDIR/%j-%t.out" python -c 'print("srun -o quoted-%t.log")'
echo srun -o echoed-%t.log
srun -lun2 --error=${LOGDIR}/err_%2t.log \
     --output=run_%j_%2t.log \
     python train.py -o not-srun.log
srun -o $(date +%s)/%t.log hostname
"""


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a,b[8-10]", ["a", "b8", "b9", "b10"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("vm", ["vm"]),
        ("None assigned", []),
        ("odd[x-y]", ["odd[x-y]"]),
    ],
)
def test_hostlists_expand_in_slurms_order(text, hosts):
    assert expand_hostlist(text) == hosts


def test_hostlist_expansion_is_bounded():
    assert len(expand_hostlist("n[0-99999999]", limit=50)) == 50


def test_srun_calls_and_their_output_patterns_in_a_batch_script():
    calls = find_srun_calls(TRAIN_SCRIPT, {"SLURM_JOB_ID": "77"})
    assert [c.line for c in calls] == [6, 8, 11]  # not the comment, the quoted text, echo's argument
    first, second, third = calls
    assert first.output == "logs/77/%j-%t.out" and first.error is None and first.ntasks is None
    assert second.output == "run_%j_%2t.log" and second.error == "logs/77/err_%2t.log" and second.ntasks == 2
    assert third.output is not None and not third.writes_files and third.unresolved  # $(...) is never run


def test_unknown_variable_in_a_pattern_is_reported_not_guessed():
    (call,) = find_srun_calls("srun -o $SCRATCH/%t.log -n 8 a.out\n", {})
    assert call.unresolved == ("SCRATCH",) and not call.writes_files and call.ntasks == 8


def test_rank_comes_back_from_a_padded_name():
    f = PatternFields(job_id=5, job_name="gpt")
    m = as_regex("/w/%x_%j_%3t.log", f, "0").fullmatch("/w/gpt_5_012.log")
    assert m is not None and int(m.group("t")) == 12
    assert as_regex("/w/%x_%j_%3t.log", f, "0").fullmatch("/w/gpt_6_012.log") is None


def _touch(path: Path, text: str = "x\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_per_task_files_expanded_from_the_task_count_and_missing_ones_noted(tmp_path):
    f = PatternFields(job_id=42)
    for t in (0, 1, 3):
        _touch(tmp_path / "logs" / f"42-{t}.out")
    files, note = find_files("logs/%j-%t.out", "stdout", f, StepShape("0", 4), str(tmp_path))
    assert [(Path(t.path).name, t.rank) for t in files] == [("42-0.out", 0), ("42-1.out", 1), ("42-3.out", 3)]
    assert "1 of 4" in note and "tasks 2" in note


def test_glob_fallback_when_the_task_count_is_unknown(tmp_path):
    f = PatternFields(job_id=42)
    for t in (0, 7, 12):
        _touch(tmp_path / f"run_42_{t:02d}.log")
    _touch(tmp_path / "run_43_01.log")  # another job
    files, note = find_files("run_%j_%2t.log", "stdout", f, StepShape(None, None), str(tmp_path))
    assert [t.rank for t in files] == [0, 7, 12] and note == ""


def test_per_node_files_from_the_node_list(tmp_path):
    f = PatternFields(job_id=9, job_name="gpt")
    _touch(tmp_path / "gpt-gpu01-9.log")
    _touch(tmp_path / "gpt-gpu02-9.log")
    shape = StepShape("0", 16, expand_hostlist("gpu[01-03]"))
    files, note = find_files("%x-%N-%j.log", "stdout", f, shape, str(tmp_path))
    assert [t.node for t in files] == ["gpu01", "gpu02"] and all(t.rank is None for t in files)
    assert "nodes gpu03" in note


def test_no_file_at_all_is_a_note(tmp_path):
    files, note = find_files("gone-%j-%t.out", "stdout", PatternFields(job_id=3), StepShape("0", 2), str(tmp_path))
    assert files == [] and "gone-3-%t.out" in note


def test_thousands_of_ranks_are_capped_keeping_rank_0_and_the_largest(tmp_path):
    f = PatternFields(job_id=8)
    for t in range(300):
        _touch(tmp_path / f"o-{t}.log", "x" * (1000 if t == 217 else 10 + t % 7))
    calls, steps = [SrunCall(1, output="o-%t.log")], [StepShape("0", 300)]
    out = collect(calls, steps, f, str(tmp_path), StepShape(None, None), cap=10)
    ranks = [t.rank for t in out.files]
    assert out.found == 300 and len(ranks) == 10 and ranks == sorted(ranks)
    assert 0 in ranks and 217 in ranks


def _runner_for(scontrol: str, sacct_rows: list[dict[str, str]], script: str | None, sacct_script: str | None = None):
    """A fake Slurm: scontrol's record (or none), sacct's rows, and the batch script both tools would print."""
    from diagnose.ingest.slurm.job import SACCT_FIELDS

    header = [*SACCT_FIELDS, "SubmitLine"]
    sacct = "|".join(header) + "\n" + "".join("|".join(r.get(k, "") for k in header) + "\n" for r in sacct_rows)
    calls: list[list[str]] = []

    def runner(argv):
        calls.append(argv)
        if argv[:3] == ["scontrol", "write", "batch_script"]:
            if script is None:
                return CommandResult(argv, 1, "", "error: job script not found")
            return CommandResult(argv, 0, script, "")
        if argv[0] == "scontrol":
            if scontrol:
                return CommandResult(argv, 0, scontrol + "\n", "")
            return CommandResult(argv, 1, "", "slurm_load_jobs error: Invalid job id specified")
        if "--helpformat" in argv:
            return CommandResult(argv, 0, "JobID JobName State", "")
        if "--batch-script" in argv:
            return CommandResult(argv, 0, sacct_script or "NONE\n", "")
        if "--env-vars" in argv:
            return CommandResult(argv, 0, "", "")
        return CommandResult(argv, 0, sacct, "")

    runner.calls = calls  # type: ignore[attr-defined]
    return runner


def _train_job(tmp_path: Path, oom_rank: int = 1) -> tuple[str, list[dict[str, str]]]:
    """A two-task job: batch output plus logs/<job>-<rank>.out, the OOM in ``oom_rank``'s file (no rank prefix)."""
    oom = (REPO / "tests" / "slurm_jobs" / "task_oom.log").read_text()
    nccl = (REPO / "tests" / "slurm_jobs" / "task_nccl_timeout.log").read_text()
    _touch(tmp_path / "train-31.out", "batch script starting\n")
    for t in (0, 1):
        _touch(tmp_path / "logs" / f"31-{t}.out", oom if t == oom_rank else nccl)
    scontrol = (
        f"JobId=31 JobName=train UserId=root(0) JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 "
        f"DerivedExitCode=1:0 RunTime=00:00:05 TimeLimit=UNLIMITED NodeList=vm BatchHost=vm NumTasks=2 BatchFlag=1 "
        f"WorkDir={tmp_path} StdErr={tmp_path}/train-31.out StdOut={tmp_path}/train-31.out"
    )
    rows = [
        {"JobID": "31", "JobIDRaw": "31", "JobName": "train", "User": "root", "State": "FAILED", "ExitCode": "1:0",
         "NodeList": "vm", "WorkDir": str(tmp_path), "SubmitLine": "sbatch train.sh"},
        {"JobID": "31.batch", "JobIDRaw": "31.batch", "JobName": "batch", "State": "FAILED", "ExitCode": "1:0",
         "NodeList": "vm", "NTasks": "1"},
        {"JobID": "31.0", "JobIDRaw": "31.0", "JobName": "python", "State": "FAILED", "ExitCode": "1:0",
         "NodeList": "vm", "NTasks": "2"},
    ]  # fmt: skip
    return scontrol, rows


SCRIPT_31 = "#!/bin/bash\n#SBATCH -o %x-%j.out\nmkdir -p logs\nsrun -o logs/%j-%t.out python train.py\n"


def test_lookup_finds_per_task_files_through_the_batch_script_from_scontrol(tmp_path):
    from diagnose.ingest.slurm.job import lookup_job

    scontrol, rows = _train_job(tmp_path)
    job = lookup_job(parse_job_id("31"), _runner_for(scontrol, rows, SCRIPT_31), settle_s=0, sleep=lambda s: None)
    assert job.task_route == "scontrol write batch_script"
    found = [(Path(t.path).name, t.rank, t.step) for t in job.task_outputs]
    assert found == [("31-0.out", 0, "0"), ("31-1.out", 1, "0")]
    assert job.analysis_inputs[0] == (str(tmp_path / "train-31.out"), None)
    assert any("read 2 per-task output file(s)" in n and "step 0, 2 tasks" in n for n in job.notes)


def test_sacct_route_reads_the_stored_batch_script(tmp_path):
    from diagnose.ingest.slurm.job import lookup_job

    _, rows = _train_job(tmp_path)
    stored = "Batch Script for 31\n" + "-" * 80 + "\n" + SCRIPT_31
    job = lookup_job(parse_job_id("31"), _runner_for("", rows, None, stored), settle_s=0, sleep=lambda s: None)
    assert job.source == "sacct" and job.task_route == "sacct --batch-script"
    assert [t.rank for t in job.task_outputs] == [0, 1]


def test_a_steps_own_submit_line_wins_over_the_script(tmp_path):
    from diagnose.ingest.slurm.job import lookup_job

    scontrol, rows = _train_job(tmp_path)
    rows[2]["SubmitLine"] = "srun -n 2 -o logs/%j-%t.out bash -c if true; then srun -o x-%t; fi"  # stored unquoted
    runner = _runner_for(scontrol, rows, None)
    job = lookup_job(parse_job_id("31"), runner, settle_s=0, sleep=lambda s: None)
    assert job.task_route == "sacct step SubmitLine" and [t.rank for t in job.task_outputs] == [0, 1]
    assert not any(a[:2] == ["scontrol", "write"] for a in runner.calls)  # no need for the script


def test_no_script_and_no_step_line_means_no_task_files_and_no_error(tmp_path):
    from diagnose.ingest.slurm.job import lookup_job

    scontrol, rows = _train_job(tmp_path)
    job = lookup_job(parse_job_id("31"), _runner_for(scontrol, rows, None), settle_s=0, sleep=lambda s: None)
    assert job.task_outputs == [] and job.task_route == ""
    assert job.readable_outputs == [str(tmp_path / "train-31.out")]


def test_deleted_task_files_are_a_note(tmp_path):
    from diagnose.ingest.slurm.job import lookup_job

    scontrol, rows = _train_job(tmp_path)
    for t in (0, 1):
        (tmp_path / "logs" / f"31-{t}.out").unlink()
    job = lookup_job(parse_job_id("31"), _runner_for(scontrol, rows, SCRIPT_31), settle_s=0, sleep=lambda s: None)
    assert job.task_outputs == []
    assert any("no stdout+stderr file of step 0 matches" in n and "logs/31-%t.out" in n for n in job.notes)


@pytest.mark.parametrize("oom_rank", [0, 1])
def test_the_ranks_of_the_report_come_from_the_task_file_names(tmp_path, oom_rank):
    from diagnose.pipeline import AnalyzeOptions
    from diagnose.slurm_diagnosis import diagnose_job

    scontrol, rows = _train_job(tmp_path, oom_rank=oom_rank)
    runner = _runner_for(scontrol, rows, SCRIPT_31)
    report = diagnose_job(parse_job_id("31"), AnalyzeOptions(replay=False), runner=runner).report
    assert report.root is not None and report.root.category == "cuda_oom"
    assert report.root.ranks == [oom_rank]
    timeouts = [f for f in report.findings if f.category == "nccl_timeout"]
    assert timeouts and all(f.ranks == [1 - oom_rank] for f in timeouts)
    assert report.slurm is not None and [t.rank for t in report.slurm.task_outputs] == [0, 1]


@given(st.text(max_size=400))
def test_srun_scanning_never_raises_on_any_text(text):
    for call in find_srun_calls(text, {"SLURM_JOB_ID": "1"}):
        assert call.ntasks is None or call.ntasks >= 0


def test_per_node_and_per_task_glob_reads_back_both(tmp_path):
    f = PatternFields(job_id=4, job_name="gpt")
    for node, t in (("gpu01", 0), ("gpu01", 1), ("gpu02", 2)):
        _touch(tmp_path / f"gpt-{node}-{t}.log")
    files, _ = find_files("%x-%N-%t.log", "stdout", f, StepShape("0", 3, ["gpu01", "gpu02"]), str(tmp_path))
    assert [(t.node, t.rank) for t in files] == [("gpu01", 0), ("gpu01", 1), ("gpu02", 2)]


def test_asking_for_a_step_keeps_that_steps_task_files(tmp_path):
    from diagnose.ingest.slurm.job import lookup_job

    scontrol, rows = _train_job(tmp_path)
    script = SCRIPT_31 + "srun -o logs/%j-%t.out python eval.py\n"  # two srun calls: ...
    rows.append({"JobID": "31.1", "JobIDRaw": "31.1", "JobName": "python", "State": "COMPLETED", "ExitCode": "0:0",
                 "NodeList": "vm", "NTasks": "2"})  # ... and two steps, both writing the same names
    job = lookup_job(parse_job_id("31.1"), _runner_for(scontrol, rows, script), settle_s=0, sleep=lambda s: None)
    assert {t.step for t in job.task_outputs} == {"1"}


def test_a_working_directory_with_pattern_characters_is_taken_literally(tmp_path):
    base = tmp_path / "run[1]%j"
    for t in (0, 1):
        _touch(base / f"o-5-{t}.log")
    files, _ = find_files("o-%j-%t.log", "stdout", PatternFields(job_id=5), StepShape(None, None), str(base))
    assert [t.rank for t in files] == [0, 1]


_PART = st.one_of(
    st.text(alphabet="abcxyz._", min_size=1, max_size=4),
    st.builds(lambda w, c: f"%{w}{c}", st.sampled_from(["", "2", "4"]), st.sampled_from(list("AajJNnstux"))),
)


@given(st.lists(_PART, min_size=1, max_size=6), st.integers(0, 5000), st.integers(0, 63))
def test_a_tasks_file_name_reads_back_as_its_rank(parts, task, node_index):
    """What srun would name task ``task``'s file, the regex built from the same pattern matches, giving ``task``."""
    from diagnose.ingest.slurm.task_outputs import expand_for

    pattern = "-".join(parts)  # srun patterns separate their fields; adjacent %N%t could not be told apart
    f = PatternFields(job_id=77, array_job_id=70, array_task_id=7, job_name="gpt", user="u")
    name = expand_for(pattern, f, "3", task=task, node_index=node_index, node=f"gpu{node_index:02d}")
    m = as_regex(pattern, f, "3").fullmatch(name)
    assert m is not None
    if "%" in pattern and "t" in as_regex(pattern, f, "3").groupindex:
        assert int(m.group("t")) == task


def test_an_interactive_srun_job_with_per_task_files(tmp_path):
    """``srun -n 2 -o i-%j-%t.log`` typed at a login node: no batch script, the job's SubmitLine is srun's."""
    from diagnose.ingest.slurm.job import lookup_job

    for t in (0, 1):
        _touch(tmp_path / f"i-12-{t}.log")
    line = "srun -n 2 -o i-%j-%t.log bash -c echo hi; exit 0"
    rows = [
        {"JobID": "12", "JobIDRaw": "12", "JobName": "bash", "User": "u", "State": "COMPLETED", "ExitCode": "0:0",
         "NodeList": "vm", "WorkDir": str(tmp_path), "SubmitLine": line},
        {"JobID": "12.0", "JobIDRaw": "12.0", "JobName": "bash", "State": "COMPLETED", "ExitCode": "0:0",
         "NodeList": "vm", "NTasks": "2"},
    ]  # fmt: skip
    scontrol = (f"JobId=12 JobName=bash UserId=me({os.geteuid()}) JobState=COMPLETED ExitCode=0:0 BatchFlag=0 "
                f"WorkDir={tmp_path}")  # the job is ours: its files are read (owner.py)
    job = lookup_job(parse_job_id("12"), _runner_for(scontrol, rows, None), settle_s=0, sleep=lambda s: None)
    assert job.task_route == "sacct SubmitLine" and [t.rank for t in job.task_outputs] == [0, 1]
    assert not any(n.startswith("not a batch job") for n in job.notes)


def test_slurm_header_names_the_per_task_outputs_it_read():
    import io

    from diagnose.present.commands.slurm import slurm_header, slurm_markdown
    from diagnose.present.text import make_console

    section = SlurmFacts(job_id="7", name="train", user="u", state="FAILED", exit_code=1, nodes="n[1-2]",
                         source="sacct", outputs=[], task_route="step submit line",
                         task_patterns=["/w/out-7-%t.log"], task_outputs_found=300,
                         task_outputs=[SlurmTaskFacts(path=f"/w/out-7-{r}.log", stream="stdout", step="7.0", rank=r,
                                                      node="n1", size=10) for r in (0, 1, 2, 5)])
    buf = io.StringIO()
    console = make_console(buf, "never")
    for line in slurm_header(section, failed=True):
        console.print(line, soft_wrap=True)
    expected = "per-task outputs: 4 read of 300 found, ranks 0-2,5 (/w/out-7-%t.log, found via step submit line)"
    assert expected in buf.getvalue()
    assert f"- {expected}" in slurm_markdown(section)
    section.task_outputs = []
    assert "per-task" not in slurm_markdown(section)


def _timed(elapsed_s: int | None, **kw) -> SlurmJob:
    job = _job("FAILED", "0:53", **kw)
    job.elapsed_s = elapsed_s
    return job


def test_a_launch_failure_is_read_from_sacct_only_on_a_run_time_of_zero(tmp_path):
    # sacct records Reason=None for a batch step that failed to launch: a FAILED job that ran for no time and whose
    # output folder is missing is one; a run time Slurm did not give is no evidence of it
    out = [SlurmOutputFacts(str(tmp_path / "no-such-folder" / "out-77.txt"), "stdout")]
    assert _timed(0, outputs=out).launch_failed
    assert _timed(2, outputs=out).launch_failed  # a launch attempt on a busy node, recorded as two seconds
    assert not _timed(60, outputs=out).launch_failed  # it ran: the folder went away later
    assert not _timed(None, outputs=out).launch_failed
    assert not _job("FAILED", "1:0", outputs=out).launch_failed  # ran an hour: the program's own failure
    assert _timed(None, reason="JobLaunchFailure").launch_failed
