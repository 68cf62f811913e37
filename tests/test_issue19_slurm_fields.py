"""Issue 19: ``slurm --failed`` with sacct's ``--parsable`` / ``--noheader`` / ``-o`` (here ``--fields``, since
``-o`` is ``--output`` in every diagnose command) and seff's figures (nodes, GPUs, MaxRSS, CPU efficiency,
GPU-hours lost) in the list and in the job view.

Through the real command line against a fake ``sacct``/``scontrol`` on PATH (rows in the format of Slurm 22.05's
``--parsable2``), and, when the local Slurm cluster can run (root, Slurm installed), against real jobs submitted
here.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_hostile_cli import ROOT

from diagnose.ingest.slurm.parse import parse_seconds
from diagnose.ingest.slurm.usage import gpus_from_tres, parse_rss

SCHEMAS = ROOT / "schemas"
FAKE_SACCT = """\
#!{python}
import json, sys
args = sys.argv[1:]
rows = json.load(open({rows!r}))
if "--helpformat" in args:
    print("JobID JobName State ExitCode")  # no StdOut: the default slurm-%j.out in WorkDir is looked up
    sys.exit(0)
if "--batch-script" in args or "--env-vars" in args:
    print("NONE")
    sys.exit(0)
fields = next(a.split("=", 1)[1] for a in args if a.startswith("--format=")).split(",")
job = args[args.index("-j") + 1] if "-j" in args else None
print("|".join(fields))
for r in rows:
    if job is None or r["JobID"] == job or r["JobID"].startswith(job + "."):
        print("|".join(r.get(f, "") for f in fields))
"""
FAKE_SCONTROL = """\
#!/bin/sh
echo "slurm_load_jobs error: Invalid job id specified" >&2
exit 1
"""


def install_fake_slurm(tmp_path: Path, rows: list[dict[str, str]]) -> Path:
    """A bin folder with a fake ``sacct`` printing ``rows`` (as ``--parsable2`` would) and a fake ``scontrol``."""
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text(FAKE_SACCT.format(python=sys.executable, rows=str(tmp_path / "rows.json")))
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    for tool in ("sacct", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    return bin_dir


@pytest.fixture
def fake_slurm(tmp_path: Path) -> dict[str, str]:
    work = tmp_path / "work"
    work.mkdir()
    (work / "slurm-501.out").write_text((ROOT / "sample_logs" / "ddp_wrap_oom.log").read_text())
    (work / "slurm-502.out").write_text("step 10 loss 2.1\nslurmstepd: error: *** JOB 502 ON gpu-node-03 CANCELLED "
                                        "AT 2026-12-01T09:00:00 DUE TO TIME LIMIT ***\n")
    common = {"User": pwd.getpwuid(os.geteuid()).pw_name,  # the job is ours: its files are read (owner.py)
              "WorkDir": str(work), "Start": "2026-12-01T07:30:00", "JobIDRaw": ""}
    rows = [
        {**common, "JobID": "501", "JobName": "pretrain", "State": "FAILED", "ExitCode": "1:0",
         "DerivedExitCode": "1:0", "End": "2026-12-01T09:00:00", "Elapsed": "01:30:00", "Timelimit": "04:00:00",
         "NodeList": "gpu-node-[01-02]", "NNodes": "2", "AllocCPUS": "32",
         "AllocTRES": "billing=32,cpu=32,gres/gpu=16,gres/gpu:h200=16,mem=512G,node=2", "TotalCPU": "12:00:00"},
        {"JobID": "501.batch", "JobName": "batch", "State": "FAILED", "ExitCode": "1:0", "MaxRSS": "1024K"},
        {"JobID": "501.0", "JobName": "python", "State": "FAILED", "ExitCode": "1:0", "MaxRSS": "12.50G"},
        {**common, "JobID": "502", "JobName": "sweep", "State": "TIMEOUT", "ExitCode": "0:15",
         "DerivedExitCode": "0:0", "End": "2026-12-01T08:00:00", "Elapsed": "00:30:00", "Timelimit": "00:30:00",
         "NodeList": "gpu-node-03", "NNodes": "1", "AllocCPUS": "8", "AllocTRES": "cpu=8,mem=64G,node=1"},
    ]
    bin_dir = install_fake_slurm(tmp_path, rows)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NO_COLOR": "1", "PYTHONPATH": str(ROOT),
            "COLUMNS": "200"}


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagnose", "slurm", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_failed_fields_parsable_noheader(fake_slurm) -> None:
    res = _run(fake_slurm, "--failed", "--fields", "jobid,State,ExitCode,Elapsed,NNodes,GPUs,MaxRSS,CPUEff,"
               "GPUHoursLost,RootCause,Category,Log", "--parsable")
    assert res.returncode == 1, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "JobID|State|ExitCode|Elapsed|NNodes|GPUs|MaxRSS|CPUEff|GPUHoursLost|RootCause|Category|Log"
    first = lines[1].split("|")
    assert first[:9] == ["501", "FAILED exit 1", "1:0", "01:30:00", "2", "16", "12.50 GiB", "25.0%", "24.00"]
    assert first[9] == "OOM102" and first[10] == "cuda_oom" and first[11].endswith("slurm-501.out")
    second = lines[2].split("|")
    assert second[:3] == ["502", "TIMEOUT (SIGTERM)", "0:15"] and second[5] == "0" and second[6] == ""
    # --noheader: no header line; padded columns; %WIDTH cuts, as sacct does
    res = _run(fake_slurm, "--failed", "--fields", "JobID,JobName%4,GPUHoursLost", "-n")
    assert res.stdout.splitlines() == ["501    pret  24.00", "502    swee  0.00"]


def test_failed_fields_are_validated_with_a_did_you_mean(fake_slurm) -> None:
    res = _run(fake_slurm, "--failed", "--fields", "JobID,MaxRSSS")
    assert res.returncode == 2 and "did you mean MaxRSS?" in res.stderr and len(res.stderr.splitlines()) == 1
    res = _run(fake_slurm, "--failed", "--fields", "JobID,Nonsense")
    assert res.returncode == 2 and "unknown field 'Nonsense'" in res.stderr and "JobID,JobName" in res.stderr
    res = _run(fake_slurm, "501", "--fields", "JobID")
    assert res.returncode == 2 and "--fields goes with --failed" in res.stderr


def test_failed_json_and_markdown_carry_the_seff_figures(fake_slurm) -> None:
    import jsonschema

    res = _run(fake_slurm, "--failed", "--format", "json")
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, json.loads((SCHEMAS / "failed-1.schema.json").read_text()))
    job = doc["jobs"][0]
    assert (job["nnodes"], job["gpus"], job["max_rss_bytes"], job["cpu_efficiency"], job["gpu_hours_lost"]) == (
        2, 16, int(12.5 * 2**30), 0.25, 24.0)
    assert job["root_cause"] == "OOM102" and job["elapsed"] == "01:30:00"
    md = _run(fake_slurm, "--failed", "--format", "markdown", "--fields", "JobID,GPUHoursLost,RootCause").stdout
    assert md.splitlines()[:3] == ["| JobID | GPUHoursLost | RootCause |", "| --- | --- | --- |",
                                   "| 501 | 24.00 | OOM102 |"]


def test_job_view_shows_seff_figures(fake_slurm) -> None:
    import jsonschema

    res = _run(fake_slurm, "501", "--color", "never")
    assert res.returncode == 1, res.stderr
    assert ("usage: 2 nodes, 16 GPUs, MaxRSS 12.50 GiB, CPU efficiency 25.0 %, 24.00 GPU-hours lost"
            in res.stdout), res.stdout[:1500]
    doc = json.loads(_run(fake_slurm, "501", "--format", "json").stdout)
    jsonschema.validate(doc, json.loads((SCHEMAS / "report-1.schema.json").read_text()))
    s = doc["slurm"]
    assert (s["nnodes"], s["gpus"], s["max_rss_bytes"], s["cpu_efficiency"], s["gpu_hours"]) == (
        2, 16, int(12.5 * 2**30), 0.25, 24.0)


def test_sacct_value_readers() -> None:
    assert parse_rss("123456K") == 123456 * 1024 and parse_rss("0") == 0 and parse_rss("") is None
    assert parse_rss("1.5G") == 3 * 2**29 and parse_rss("junk") is None
    assert parse_seconds("00:00.003") == pytest.approx(0.003) and parse_seconds("1-02:00:00") == 93600
    assert gpus_from_tres("billing=8,cpu=8,gres/gpu=8,gres/gpu:h100=8,node=1") == 8
    assert gpus_from_tres("cpu=8,gres/gpu:a100=4,gres/gpu:h100=2") == 6
    assert gpus_from_tres("cpu=8,mem=1G,node=1") == 0 and gpus_from_tres("") is None


# ------------------------------------------------------------------------------- the real local cluster

MEMORY_JOB = """\
#!/bin/bash
#SBATCH --job-name=diag-seff
#SBATCH --output=%x-%j.out
# holds about 200 MiB for longer than the accounting sample period (JobAcctGatherFrequency=task=5), then fails
{python} -c "import time; b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(7)"
cat {log}
exit 1
"""


@pytest.mark.slurm
def test_real_cluster_failed_fields_and_job_view(tmp_path: Path) -> None:
    from test_slurm_cluster import sbatch, wait_ended

    if os.environ.get("DIAGNOSE_SKIP_SLURM") == "1":
        pytest.skip("DIAGNOSE_SKIP_SLURM=1")
    if os.geteuid() != 0 or shutil.which("sbatch") is None:
        pytest.skip("the local Slurm cluster needs root and Slurm installed")
    env = dict(os.environ, SLURM_LOCAL_MIN_JOB_AGE="60")
    up = subprocess.run(["bash", str(ROOT / "scripts" / "slurm-local.sh"), "up"], env=env, capture_output=True,
                        text=True, timeout=600)
    if up.returncode != 0:
        pytest.skip(f"slurm-local.sh up failed: {up.stderr.strip().splitlines()[-1:]}")
    env["SLURM_CONF"] = "/tmp/slurm-local/etc/slurm.conf"
    tmp_path.chmod(0o755)
    script = tmp_path / "seff.sh"
    script.write_text(MEMORY_JOB.format(python=sys.executable, log=ROOT / "tests" / "slurm_jobs" / "ddp_wrap_oom.log"))
    # the list from just before this job: one of minutes would hold (and diagnose) the earlier Slurm tests' jobs
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))
    job = sbatch(env, "-D", str(tmp_path), str(script), cwd=tmp_path)
    wait_ended(env, job, limit=120)
    deadline = time.monotonic() + 30  # sacct's record (MaxRSS of the steps) lands a moment after the end
    while time.monotonic() < deadline:
        out = subprocess.run(["sacct", "-n", "-P", "-j", job, "-o", "JobID,MaxRSS"], env=env, capture_output=True,
                             text=True).stdout
        if any(line.split("|")[1] for line in out.splitlines() if "|" in line):
            break
        time.sleep(1)
    env = {**env, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    res = _run(env, "--failed", "--since", since, "--fields", "JobID,JobName,State,NNodes,GPUs,MaxRSS,RootCause",
               "-p", "-n")
    assert res.returncode == 1, res.stderr
    row = next(line.split("|") for line in res.stdout.splitlines() if line.startswith(job + "|"))
    assert row[1:5] == ["diag-seff", "FAILED exit 1", "1", "0"]  # no GPU on this cluster: 0, not unknown
    assert row[5].endswith("MiB") and 150 <= float(row[5].split()[0]) <= 400, row  # the 200 MiB it held
    assert row[6] == "OOM102"
    view = _run(env, job, "--color", "never")
    assert "usage: 1 node, 0 GPUs, MaxRSS " in view.stdout, view.stdout[:1200]


def test_tui_job_list_has_a_diagnosis_column(fake_slurm, monkeypatch) -> None:
    """Issue 19 item 21 (left by the first pass): `diagnose tui --slurm` lists the jobs with their one-line
    diagnosis, filled in by a worker as `slurm --failed` writes it (fake sacct on PATH, Textual's Pilot)."""
    from test_tui_reports import run_async
    from textual.widgets import DataTable

    from diagnose.present.tui.app import DiagnoseApp
    from diagnose.present.tui.slurmjobs import JobsScreen

    monkeypatch.setenv("PATH", fake_slurm["PATH"])

    @run_async
    async def drive() -> None:
        app = DiagnoseApp([], slurm=("1d", None))
        async with app.run_test(size=(200, 30)) as pilot:
            jobs = app.screen
            assert isinstance(jobs, JobsScreen)
            for _ in range(300):
                await pilot.pause(0.1)
                if len(jobs.summaries) == 2 or jobs.error:
                    break
            assert jobs.error is None, jobs.error
            table = jobs.query_one(DataTable)
            assert [str(c.label) for c in table.columns.values()][-1] == "diagnosis"
            rows = {jobs.job_ids[i]: [str(getattr(c, "plain", c)) for c in table.get_row_at(i)] for i in range(2)}
            assert rows["501"][-1].startswith("[OOM102] CUDA OOM while wrapping the model")
            assert rows["502"][-1] == "[SL003] Slurm time limit reached"  # the slurmstepd line in its log

    drive()


def test_sacct_style_dash_o_is_not_taken_as_a_file_name(fake_slurm, tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "diagnose", "slurm", "--failed", "-o", "JobID,State%20"],
                         env=fake_slurm, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "use --fields JobID,State%20" in res.stderr
    assert not (tmp_path / "JobID,State%20").exists()
    res = subprocess.run([sys.executable, "-m", "diagnose", "slurm", "--failed", "-o", "failed.txt"],
                         env=fake_slurm, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and (tmp_path / "failed.txt").read_text().startswith("JOBID")
