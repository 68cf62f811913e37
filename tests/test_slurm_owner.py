"""A job's output is read only when it is the job user's own (qa-report-4 L13; diagnose/ingest/slurm/owner.py).

Run as root (the fleet Epilog's case): files are chowned to another uid to stand for the job's user. Without root
these tests are skipped (chown needs it); the check itself is plain stat/open and runs on every cluster.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from diagnose.fleet.epilog import run_epilog
from diagnose.ingest.slurm.commands import CommandResult
from diagnose.ingest.slurm.job import lookup_job
from diagnose.ingest.slurm.jobid import parse_job_id
from diagnose.ingest.slurm.owner import JobOwner, owner_from_name, owner_from_scontrol, pinned, refusal

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another uid")

USER = 65534  # the job's user in these tests (nobody): not us
SECRET = "ValueError: the root-only secret 7f3a"
LOG = f"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n{SECRET}\n"


@pytest.fixture
def work():
    """A folder the job's user can reach (pytest's own tmp folders are root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="diagnose-owner-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _root_only(work: Path) -> Path:
    secret = work / "secret"
    secret.write_text(LOG)
    secret.chmod(0o600)
    return secret


def _users_own(work: Path, name: str = "mine.log") -> Path:
    own = work / name
    own.write_text(LOG)
    os.chown(own, USER, USER)
    own.chmod(0o600)
    return own


def _users_link(work: Path, target: Path, name: str = "slurm-12.out") -> Path:
    link = work / name
    link.symlink_to(target)
    os.lchown(link, USER, USER)
    return link


def test_job_owner_from_slurm_words():
    assert owner_from_scontrol("alice(1001)") == JobOwner("alice", 1001)
    assert owner_from_scontrol("root") == JobOwner("root", 0)  # a bare name: the password database
    assert owner_from_scontrol("") == JobOwner() and owner_from_scontrol(None).uid is None
    assert owner_from_name("no-such-user-here") == JobOwner("no-such-user-here", None)
    assert owner_from_name("1234") == JobOwner("1234", 1234)  # sacct prints the uid when the name is unknown


def test_a_symlink_to_a_root_only_file_is_refused(work):
    link = _users_link(work, _root_only(work))
    why = refusal(str(link), JobOwner("nobody", USER))
    assert why is not None and "owned by uid 0" in why and "nobody (uid 65534)" in why
    assert SECRET not in why


def test_the_users_own_file_is_read_directly_and_through_their_own_symlink(work):
    own = _users_own(work)
    owner = JobOwner("nobody", USER)
    assert refusal(str(own), owner) is None
    assert refusal(str(_users_link(work, own)), owner) is None


def test_a_symlink_someone_else_made_is_not_followed(work):
    link = work / "planted.out"
    link.symlink_to(_users_own(work))  # made by root, not by the job's user
    why = refusal(str(link), JobOwner("nobody", USER))
    assert why is not None and "symbolic link not made by the job's user" in why


def test_a_fifo_or_a_device_is_refused_without_waiting(work):
    fifo = work / "slurm-12.out"
    os.mkfifo(fifo)
    os.chown(fifo, USER, USER)
    owner = JobOwner("nobody", USER)
    assert refusal(str(fifo), owner) == "not read: not a regular file"  # no writer: an open would block
    assert refusal(str(_users_link(work, Path("/dev/zero"), "dev.out")), owner) == "not read: not a regular file"


def test_as_root_an_unknown_owner_means_nothing_is_read(work):
    why = refusal(str(_users_own(work)), JobOwner("ghost", None))
    assert why is not None and "did not say which user owns the job" in why


def test_a_pinned_input_is_the_checked_file_even_if_the_link_is_swapped_after(work):
    """Between the check and the analysis the user re-points the symlink at a root-only file: what is read is
    still the descriptor that passed the check."""
    own, secret = _users_own(work), _root_only(work)
    own.write_text("my own log\n")
    link = _users_link(work, own)
    with pinned([str(link)], JobOwner("nobody", USER)) as (names, refused):
        link.unlink()
        link.symlink_to(secret)
        os.lchown(link, USER, USER)
        assert refused == [] and list(names.values()) == [str(link)]
        (opened,) = names
        assert opened.startswith("/proc/self/fd/") and Path(opened).read_text() == "my own log\n"
    with pinned([str(link)], JobOwner("nobody", USER)) as (names, refused):  # checked again: now refused
        assert names == {} and "owned by uid 0" in refused[0]


def _fake_slurm(work: Path, user_id: str = f"nobody({USER})"):
    """scontrol knows the job (ours to name), sacct has nothing; ``scontrol update`` calls are recorded."""
    record = (f"JobId=12 JobName=train UserId={user_id} JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 "
              f"BatchFlag=1 WorkDir={work} StdOut={work}/slurm-12.out NodeList=vm BatchHost=vm")
    updates: list[list[str]] = []

    def runner(argv: list[str]) -> CommandResult:
        if argv[:2] == ["scontrol", "update"]:
            updates.append(argv)
            return CommandResult(argv, 0, "", "")
        if argv[:3] == ["scontrol", "-d", "show"] and argv[3] == "job":
            return CommandResult(argv, 0, record + "\n", "")
        if argv[0] == "sacct":
            return CommandResult(argv, 1, "", "sacct: error: Slurm accounting storage is disabled")
        return CommandResult(argv, 1, "", "error: not in this fake")

    runner.updates = updates  # type: ignore[attr-defined]
    return runner


def _epilog(work: Path, runner):
    env = {"SLURM_JOB_ID": "12", "SLURM_CLUSTER_NAME": "test"}
    return run_epilog(str(work / "fleet.db"), env, comment=True, runner=runner)


def test_epilog_skips_a_symlinked_root_file_and_comments_nothing_from_it(work):
    _users_link(work, _root_only(work))
    runner = _fake_slurm(work)
    job = lookup_job(parse_job_id("12"), runner=runner, settle_s=0)
    assert job.analysis_inputs == [] and any("owned by uid 0" in n for n in job.notes)
    result = _epilog(work, runner)
    assert len(result.skipped) == 1 and "slurm-12.out: not read: owned by uid 0" in result.skipped[0]
    assert SECRET not in result.verdict and "7f3a" not in repr(runner.updates)


def test_epilog_reads_the_users_own_output_and_comments_its_verdict(work):
    _users_link(work, _users_own(work))
    runner = _fake_slurm(work)
    result = _epilog(work, runner)
    assert result.skipped == [] and result.verdict.startswith("diagnose: [PY")
    assert len(runner.updates) == 1 and result.comment_set
    from diagnose.pipeline import AnalyzeOptions
    from diagnose.slurm_diagnosis import diagnose_job

    report = diagnose_job(parse_job_id("12"), AnalyzeOptions(replay=False), runner=runner).report
    assert [i.path for i in report.inputs] == [str(work / "slurm-12.out")]  # not the /proc/self/fd name it was read by


def test_epilog_as_root_reads_nothing_of_a_job_whose_user_slurm_does_not_name(work):
    _users_link(work, _users_own(work))
    result = _epilog(work, _fake_slurm(work, user_id=""))
    assert result.verdict == "diagnose: no failure found" or "PY" not in result.verdict
    assert len(result.skipped) == 1 and "did not say which user" in result.skipped[0]
