"""qa-report-4 L13 on the REAL local Slurm cluster: a job run as another user (``sbatch --uid=nobody``) turns its
output into a symlink to a root-only file; the fleet epilog, run as root the way EpilogSlurmctld runs it (by hand,
as in test_fleet_slurm.py), must not read it and must not put anything of it in the job's comment. A control job of
the same user whose output is its own is read and commented, so the check is not simply "read nothing".
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import local_slurm_env, slurm_unavailable

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
EPILOG = REPO / "diagnose" / "fleet" / "epilog.sh"
SECRET = "ValueError: root-only words 5e1c"
OWN = "ValueError: the job's own words"


def _run(argv: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        slurm_unavailable("no user 'nobody' to run the job as")
    return local_slurm_env()  # root: sbatch --uid too


@pytest.fixture
def work():
    path = Path(tempfile.mkdtemp(prefix="diagnose-owner-cluster-"))
    path.chmod(0o755)
    os.chown(path, pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)
    yield path
    shutil.rmtree(path)


def _job_as_nobody(env: dict[str, str], work: Path, script: str) -> str:
    done = _run(["sbatch", "--parsable", "--uid=nobody", f"--gid={pwd.getpwnam('nobody').pw_gid}", "-D", str(work),
                 "-o", str(work / "job.out"), "--wrap", script], env)
    if done.returncode != 0:
        slurm_unavailable(f"sbatch --uid=nobody refused: {done.stderr.strip()[:200]}")
    job = done.stdout.strip().split(";")[0]
    end = time.monotonic() + 120
    while _run(["squeue", "-h", "-j", job], env).stdout.strip():
        assert time.monotonic() < end, f"job {job} still queued"
        time.sleep(0.5)
    return job


def _epilog(env: dict[str, str], work: Path, job: str) -> tuple[str, str]:
    """Run epilog.sh as root for the job; return its log and the job's comment afterwards (slurmctld 22.05 refuses
    to set the comment of a job that has finished, so the log's verdict line is what would have gone there)."""
    log = work / "epilog.log"
    run_env = dict(env, SLURM_JOB_ID=job, SLURM_CLUSTER_NAME="localcluster", SLURM_SCRIPT_CONTEXT="epilog_slurmctld",
                   DIAGNOSE_FLEET_STORE=str(work / "fleet.db"), DIAGNOSE_FLEET_LOG=str(log),
                   DIAGNOSE_FLEET_COMMENT="1", DIAGNOSE_PYTHON=sys.executable, DIAGNOSE_FLEET_CONF="/nonexistent")
    assert _run(["bash", str(EPILOG)], run_env).returncode == 0
    shown = _run(["scontrol", "show", "job", "-o", job], env).stdout
    comment = next((w for w in shown.split() if w.startswith("Comment=")), "")
    return log.read_text(), comment


def _traceback(words: str) -> str:
    return f"Traceback (most recent call last):\n  File \"train.py\", line 7, in <module>\n    main()\n{words}\n"


def test_epilog_does_not_read_a_symlink_to_a_root_only_file(slurm_env, work):
    secret = work.parent / f"{work.name}-secret"
    secret.write_text(_traceback(SECRET))
    secret.chmod(0o600)
    try:
        job = _job_as_nobody(slurm_env, work, f"echo starting; ln -sf {secret} {work}/job.out; exit 1")
        assert (work / "job.out").is_symlink()
        log, comment = _epilog(slurm_env, work, job)
    finally:
        secret.unlink()
    skipped = f"job {job}: skipped stdout+stderr file {work}/job.out: not read: owned by uid 0, not by the job's user"
    assert skipped in log
    # the verdict offered for the comment (logged; slurmctld refuses comments on finished jobs here) is Slurm's own
    verdict = next(line for line in log.splitlines() if f"job {job}: diagnose: [" in line)
    assert "[SJ" in verdict and "[PY" not in verdict
    assert "5e1c" not in log and "5e1c" not in comment and "root-only" not in log


def test_epilog_reads_the_users_own_output(slurm_env, work):
    script = f"printf '%s' '{_traceback(OWN)}'; exit 1"
    job = _job_as_nobody(slurm_env, work, script)
    assert (work / "job.out").stat().st_uid == pwd.getpwnam("nobody").pw_uid
    log, comment = _epilog(slurm_env, work, job)
    assert "skipped" not in log and f"job {job}: diagnose: [PY" in log  # the verdict offered for the comment
    assert "own words" not in comment
