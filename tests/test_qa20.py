"""QA round 20 (docs/qa-report-20.md): each test failed on the tree before its fix; CLI output through cli_run.
The Slurm tests run on the REAL local cluster (scripts/slurm-local.sh), marked like tests/test_slurm_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_run import ROOT, run


def _words(text: str) -> str:
    return " ".join(text.split())


def test_tp_job_with_moe_a2a_overlap_is_not_told_by_the_note_it_must_export_one(tmp_path):
    """qa-report-19 L11: `check` of a TP 2 Megatron-LM list with --overlap-moe-expert-parallel-comm and no
    CUDA_DEVICE_MAX_CONNECTIONS given: the FSDP plans' note said the job "must export 1 on GPUs before Blackwell".
    Megatron-LM's `elif args.overlap_moe_expert_parallel_comm` only warns there (the validator already knew). The
    FSDP plans still need the variable unset or > 1, so they are still named; without the overlap the words stay."""
    args = (ROOT / "examples" / "mlm_args.txt").read_text(encoding="utf-8")
    moe = " --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall"
    path = tmp_path / "moe.txt"
    path.write_text(args.strip() + moe + " --overlap-moe-expert-parallel-comm\n", encoding="utf-8")
    out = _words(run("check", str(path), "--gpus", "8", "--gpu", "h100-80gb").stdout)
    assert "also need CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 (e.g. 32): Megatron-LM refuses 1 with FSDP" in out
    assert "must export 1" not in out
    assert "with --overlap-moe-expert-parallel-comm this TP/CP > 1 job does not need 1" in out
    plain = tmp_path / "plain.txt"
    plain.write_text(args.strip() + moe + "\n", encoding="utf-8")
    assert "must export 1 on GPUs before Blackwell" in _words(run("check", str(plain), "--gpus", "8", "--gpu",
                                                                  "h100-80gb").stdout)


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder this process cannot write: a read-only bind mount for root (who ignores modes), else mode 555.
    Yields (folder, make_read_only); the test fills the folder first, then calls make_read_only()."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = []

    def make_read_only() -> None:
        if os.geteuid() != 0:
            for p in folder.iterdir():
                p.chmod(0o444)
            folder.chmod(0o555)
            return
        for cmd in (["mount", "--bind", str(folder), str(folder)], ["mount", "-o", "remount,bind,ro", str(folder)]):
            if subprocess.run(cmd, capture_output=True).returncode != 0:
                if mounted:
                    subprocess.run(["umount", str(folder)], capture_output=True)
                pytest.skip("root here cannot make a read-only bind mount")
            mounted.append(cmd)

    yield folder, make_read_only
    if mounted:
        subprocess.run(["umount", str(folder)], capture_output=True)
    folder.chmod(0o755)


def test_fleet_report_reads_a_store_it_cannot_write_and_scan_says_why_it_cannot(read_only_folder):
    """A fleet store on a read-only mount (or root's epilog store read by a user): `fleet report` said "is not a
    usable fleet store: unable to open database file" (SQLite cannot create the -shm a WAL reader needs), and `fleet
    scan` said the same, not the words the store had for it ("cannot be written ... 'diagnose fleet report' can read
    it"). A store in a read-only folder that does not exist yet: "cannot create ...: folder ... is not writable"."""
    folder, make_read_only = read_only_folder
    log = folder.parent / "job.log"
    log.write_text((ROOT / "sample_logs" / "b042_first_iter_oom.log").read_text(encoding="utf-8"), encoding="utf-8")
    store = folder / "fleet.db"
    run("fleet", "scan", "--no-progress", "--jobs", "1", "--store", str(store), str(log))
    make_read_only()
    report = run("fleet", "report", "--store", str(store), "--format", "json")
    assert json.loads(report.stdout)["jobs"] == 1, report.stderr
    scan = run("fleet", "scan", "--no-progress", "--jobs", "1", "--store", str(store), str(log), code=(2,))
    assert "cannot be written (a read-only file, folder or mount)" in scan.stderr
    assert "unable to open database file" not in scan.stderr
    new = run("fleet", "scan", "--no-progress", "--store", str(folder / "new.db"), str(log), code=(2,))
    assert f"cannot create the fleet store {folder / 'new.db'}: folder {folder} is not writable" in new.stderr


def test_fleet_submit_into_a_read_only_run_folder_is_one_line_not_an_internal_error(read_only_folder, tmp_path):
    """`fleet submit ... --run-dir` on a read-only mount said "internal error: OSError: [Errno 30] Read-only file
    system" (a file where the folder should be: the same with Errno 17)."""
    folder, make_read_only = read_only_folder
    log = tmp_path / "job.log"
    log.write_text("hello\n", encoding="utf-8")
    make_read_only()
    for run_dir in (folder / "run", log):
        done = run("fleet", "submit", str(log), "--tasks", "2", "--store", str(tmp_path / "f.db"), "--run-dir",
                   str(run_dir), "--dry-run", code=(2,))
        assert done.stderr.startswith(f"diagnose: error: cannot write the run folder: {run_dir}: "), done.stderr
        assert "internal error" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_fleet_epilog_failure_line_names_the_job_not_a_python_class(tmp_path):
    """The epilog's log line for a job it could not store read `diagnose fleet epilog: DiagnoseError: ...`: a Python
    class name, and no job id when the message had none (a store it cannot write). An operator reads that log per
    job: the line now names the job (array task as A_T) and keeps a class name only for an unexpected error."""
    env = {"SLURM_JOB_ID": "18206", "SLURM_ARRAY_JOB_ID": "18205", "SLURM_ARRAY_TASK_ID": "1",
           "SLURM_CLUSTER_NAME": "localcluster", "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld"}
    done = run("fleet", "epilog", "--store", str(tmp_path / "no" / "such" / "fleet.db"), env=env, code=(0,))
    line = done.stderr.strip()
    assert line.startswith("diagnose fleet epilog: job 18205_1: "), line
    assert "DiagnoseError" not in line and len(line.splitlines()) == 1


@pytest.mark.slurm
def test_slurm_job_cancelled_before_it_ran_says_its_output_was_never_written(tmp_path):
    """A job cancelled while pending (here held by --begin) never had a node, so Slurm never opened its output:
    `diagnose slurm JOB` said the file "does not exist (deleted, or on a file system this machine does not mount)",
    sending an operator to look for who deleted it. Real cluster; job name qa20-*."""
    from conftest import local_slurm_env

    env = local_slurm_env(honour_skip=False)
    tmp_path.chmod(0o755)
    sub = subprocess.run(["sbatch", "--parsable", "--job-name=qa20-never-ran", "--begin=now+3600",
                          "-o", str(tmp_path / "never-%j.out"), "--wrap", "echo hi"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    subprocess.run(["scancel", job], env=env, capture_output=True, timeout=60)
    done = subprocess.run([sys.executable, "-m", "diagnose", "slurm", job], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    words = _words(done.stdout)
    assert "never written: the job ended (CANCELLED) before it ran on any node" in words, done.stdout[:800]
    assert "deleted, or on a file system" not in words


@pytest.mark.skipif(os.geteuid() != 0, reason="the guard is root's: another user cannot read the file anyway")
def test_fleet_file_scan_as_root_does_not_follow_a_users_symlink_to_roots_file(tmp_path):
    """`fleet scan /archive/logs` as root read `job.log -> /root/secret.log` that a user planted (the link owned by
    the user, the file by root, mode 600) and stored its matched line (the exception message) in the store's report,
    a file other users read (`fleet report`). Now such a link is an unreadable row that says why; a link to the
    user's own file, and a link root made, are still read."""
    logs = tmp_path / "logs"
    logs.mkdir()
    secret = tmp_path / "secret.log"
    secret.write_text('Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
                      "RuntimeError: secret-words-only-root-may-read\n", encoding="utf-8")
    secret.chmod(0o600)
    own = tmp_path / "own.log"
    own.write_text("RuntimeError: the user's own words\n", encoding="utf-8")
    os.chown(own, 65534, 65534)
    for name, target in (("planted.log", secret), ("mine.log", own)):
        (logs / name).symlink_to(target)
        os.lchown(logs / name, 65534, 65534)
    (logs / "roots.log").symlink_to(secret)  # root's own link: followed
    store = tmp_path / "fleet.db"
    run("fleet", "scan", "--no-progress", "--jobs", "1", "--store", str(store), str(logs))
    report = json.loads(run("fleet", "report", "--store", str(store), "--format", "json").stdout)
    unreadable = {u["source"]: u["problem"] for u in report["unreadable_jobs"]}
    assert list(unreadable) == [str(logs / "planted.log")], unreadable
    assert "not read: a symlink owned by uid 65534 to a file owned by uid 0" in unreadable[str(logs / "planted.log")]
    assert report["jobs"] == 3


@pytest.mark.slurm
def test_slurm_follow_says_what_it_follows_and_why_a_fifo_output_shows_nothing(tmp_path):
    """`diagnose slurm JOB --follow` on a job whose --output is a FIFO printed nothing at all until the job ended
    (days, for a job Slurm blocks opening the FIFO): a silent hang. It now says first, on stderr, which job and file
    it follows, and that this file is not a regular file, so nothing is shown until the report. The job is held
    (never started, so Slurm never opens the FIFO). Real cluster; job name qa20-*."""
    from conftest import local_slurm_env

    env = local_slurm_env(honour_skip=False)
    tmp_path.chmod(0o755)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    sub = subprocess.run(["sbatch", "--parsable", "--hold", "--job-name=qa20-follow-fifo", "-o", str(fifo), "--wrap",
                          "echo hi"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    try:
        done = subprocess.run([sys.executable, "-m", "diagnose", "slurm", job, "--follow", "--color", "never"],
                              env={**env, "DIAGNOSE_FOLLOW_MAX_S": "3"}, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"--- following job {job} (PENDING): {fifo} ---", done.stderr
    assert lines[1] == f"--- {fifo} is not a regular file: not shown; the report comes when the job ends ---"
    assert "stopped following: time bound" in done.stderr


def test_slurm_job_id_pasted_from_squeue_as_a_task_range_gets_a_hint():
    """squeue shows an array's pending tasks as `123_[2-3]` (also `123_[1,4-7%2]`): pasted into `diagnose slurm`, the
    answer was the generic "not a Slurm job id ... (expected e.g. 123456, 123456_7 ...)". It now says what the text
    is and which ids to give instead. Anything else in brackets keeps the generic words."""
    done = run("slurm", "123_[2-3]", code=(2,))
    assert done.stderr.strip() == ("diagnose: error: not a Slurm job id: '123_[2-3]' is a range of array tasks (as "
                                   "squeue shows them): name one task, e.g. 123_2, or the array, 123 (its first "
                                   "task that ended badly)")
    assert "name one task, e.g. 7_1," in run("slurm", "7_[1,4-7%2]", code=(2,)).stderr
    assert "not a Slurm job id: '7_[a]'" in run("slurm", "7_[a]", code=(2,)).stderr


def test_check_of_a_partial_yaml_says_the_micro_batch_it_assumed(tmp_path):
    """`check` of a recipe YAML cut before its `train:` section planned every row's activations for a micro batch of
    1 and said nothing ("As given: does NOT fit (peak 162.19 GiB ...)"), while analyze's memory model names that
    assumption. A micro batch of 4 is four times the activations. The note goes once the value is given."""
    lines = (ROOT / "examples" / "run_config.yaml").read_text(encoding="utf-8").splitlines()
    partial = tmp_path / "partial.yaml"
    partial.write_text("\n".join(lines[: lines.index("train:")]) + "\n", encoding="utf-8")
    said = "train.micro_batch_size is not in the config: every plan's activations assume a micro batch of 1 sample"
    assert said in _words(run("check", str(partial), "--gpus", "8", "--gpu", "h100-80gb").stdout)
    given = run("check", str(partial), "--gpus", "8", "--gpu", "h100-80gb", "--set", "train.micro_batch_size=4")
    assert "micro_batch_size is not in the config" not in given.stdout
    whole = run("check", str(ROOT / "examples" / "run_config.yaml"), "--gpus", "8", "--gpu", "h100-80gb")
    assert "micro_batch_size is not in the config" not in whole.stdout
