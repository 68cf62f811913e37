"""``diagnose tui --slurm`` against the REAL local Slurm cluster (scripts/slurm-local.sh, up in CI).

A real job that prints a real Megatron failure log is submitted; the TUI's job list (sacct) shows it, enter
diagnoses it (its output file through the pipeline) and the findings appear with the job's output as the log.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from test_tui_reports import need_log, run_async

from diagnose.present.tui.app import DiagnoseApp, MainScreen
from diagnose.present.tui.slurmjobs import JobsScreen

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
LOCAL_DIR = Path(os.environ.get("SLURM_LOCAL_DIR", "/tmp/slurm-local"))


@pytest.fixture
def slurm_conf(monkeypatch: pytest.MonkeyPatch) -> str:
    conf = LOCAL_DIR / "etc" / "slurm.conf"
    up = subprocess.run(["bash", str(REPO / "scripts" / "slurm-local.sh"), "status"], capture_output=True)
    if up.returncode != 0 or not conf.is_file():
        if os.environ.get("CI"):
            pytest.fail("the local Slurm cluster is required in CI")
        pytest.skip("the local Slurm cluster is not up (scripts/slurm-local.sh up)")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    return str(conf)


def submit_failing_job(workdir: Path, log: Path) -> str:
    done = subprocess.run(
        ["sbatch", "--parsable", "-D", str(workdir), "-J", "diag-tui", "-o", "tui-%j.out",
         str(REPO / "tests" / "slurm_jobs" / "print_log.sh"), str(log)],
        capture_output=True, text=True, timeout=60, check=True,
    )
    job = done.stdout.strip().split(";")[0]
    end = time.monotonic() + 120
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < end, "job did not end"
        time.sleep(0.3)
    return job


@run_async
async def test_job_list_then_diagnosis(slurm_conf: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    source = need_log("fsdp2_pg_collection.log")
    workdir = tmp_path_factory.mktemp("tuijobs")
    workdir.chmod(0o755)
    log = workdir / "job.log"
    log.write_bytes(source.read_bytes())
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))  # this job's, not the earlier tests'
    job = submit_failing_job(workdir, log)

    app = DiagnoseApp([], slurm=(since, None))
    async with app.run_test(size=(140, 45)) as pilot:
        jobs = app.screen
        assert isinstance(jobs, JobsScreen)
        for _ in range(300):  # sacct can lag the end of a job by a moment: reload until it lists it
            await pilot.pause(0.1)
            if job in jobs.job_ids or jobs.error:
                break
            if _ % 20 == 19:
                jobs.load()
        assert jobs.error is None, jobs.error
        assert job in jobs.job_ids
        table = jobs.query_one("#jobs")
        table.move_cursor(row=jobs.job_ids.index(job))
        await pilot.press("enter")
        for _ in range(600):
            await pilot.pause(0.1)
            if app.report is not None or app.error:
                break
        assert app.error is None, app.error
        assert isinstance(app.screen, MainScreen)
        report = app.report
        assert report.root is not None and report.root.category == "fsdp_config"
        assert report.slurm and report.slurm.job_id == job
        assert app.inputs == [str(workdir / f"tui-{job}.out")]
        assert f"Slurm job {job}" in app.sub_title
        await pilot.press("j")
        assert isinstance(app.screen, JobsScreen)
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen) and app.report is report


def test_job_analyzer_gives_the_log_view_every_file_it_read(slurm_conf: str, tmp_path_factory) -> None:
    """A job whose srun writes one file per task (`-o out-%j-%t.log`): the TUI's log view gets the batch output and
    each task's file, so the root cause's evidence (in task 1's file) opens in it."""
    from diagnose.present.tui.slurmjobs import job_analyzer

    jobs_dir = REPO / "tests" / "slurm_jobs"
    workdir = tmp_path_factory.mktemp("tuipertask")
    workdir.chmod(0o755)
    done = subprocess.run(["sbatch", "--parsable", "-D", str(workdir), str(jobs_dir / "per_task.sh"), str(jobs_dir)],
                          capture_output=True, text=True, timeout=60, check=True)
    job = done.stdout.strip().split(";")[0]
    end = time.monotonic() + 120
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < end, "job did not end"
        time.sleep(0.3)
    outputs: list[str] = []
    report = job_analyzer(job, [], outputs)([], lambda done, total: None)
    assert outputs == [str(workdir / f"diag-pertask-{job}.out")] + [str(workdir / f"out-{job}-{t}.log") for t in (0, 1)]
    assert report.root is not None and report.root.category == "cuda_oom"
    assert report.root.evidence[0].path in outputs
