"""`diagnose fleet` on the REAL local Slurm cluster (scripts/slurm-local.sh): 320 real jobs with a known mix of
failures, found through the epilog, through sacct, and through a `fleet submit` array of 4 tasks.

The jobs are one array (tests/slurm_jobs/fleet_job.sh): task i prints the log named on line i of a plan and exits
with its code. The logs are sample logs with a pdsh-style host prefix (``gpu05: ...``) on every line: the local
cluster runs ONE slurmd (node ``vm``), so the fleet's node names come from the logs' hosts (the same way a real
multi-node job's launcher prefixes name them). While the array runs, the partition is oversubscribed
(``OverSubscribe=FORCE:8``, restored afterwards) so that 320 jobs take ~20 s instead of ~2 minutes on 2 cores.

The epilog is run by hand (``diagnose/fleet/epilog.sh`` with the variables Slurm sets for ``EpilogSlurmctld``:
SLURM_JOB_ID, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID, SLURM_CLUSTER_NAME, SLURM_SCRIPT_CONTEXT) on every 13th of the
jobs right after they end: slurm-local.sh writes no EpilogSlurmctld line, and changing the shared cluster's
slurm.conf for one test would change it under every other test that runs `up`. (A private second cluster with
EpilogSlurmctld set, tried by hand, ran the script with exactly these variables; see docs/fleet.md.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from conftest import local_slurm_env

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_logs"
JOB = REPO / "tests" / "slurm_jobs" / "fleet_job.sh"
EPILOG = REPO / "diagnose" / "fleet" / "epilog.sh"
# The array's own name: every sacct scan below lists jobs by it, so only this run's jobs are counted. The cluster's
# accounting keeps every earlier run's arrays, and a pid alone repeats (pid_max 32768 wraps within the hour here).
NAME = f"fleet-mix-{os.getpid()}-{uuid.uuid4().hex[:8]}"
HOSTS = [f"gpu{i:02d}" for i in range(1, 9)]
BAD = "gpu05"
EPILOG_EVERY = 13  # the epilog is run (by hand) on tasks 0, 13, 26, ...: healthy and failed ones

# (kind, sample log or None for an empty log, exit code, how many, hosts); the root rule each sample is known for
# is read from its sample_logs/<name>.expected.json, not from this file
MIX = [
    ("clean", "clean_run", 0, 240, None),
    ("oom", "ddp_wrap_oom", 1, 20, [h for h in HOSTS if h != BAD]),
    ("data", "dataset_idx_missing", 1, 12, [h for h in HOSTS if h != BAD]),
    ("nccl", "nccl_timeout_before_training", 1, 12, [h for h in HOSTS if h != BAD]),
    ("ecc", "gpu_ecc_error", 1, 30, [BAD]),
    ("exit3", None, 3, 3, None),
    ("deleted", "ddp_wrap_oom", 1, 3, None),  # its output file is deleted before any scan: unreadable
]


def _run(argv: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw)


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return local_slurm_env()


def _expected_rule(sample: str | None, code: int) -> str | None:
    if sample is None:
        return "SJ006"  # an empty log and exit 3: Slurm's FAILED state is the root cause
    rule = (json.loads((SAMPLES / f"{sample}.expected.json").read_text())["root_cause"] or {}).get("rule")
    return rule if rule or code == 0 else "SJ006"


def _plan(workdir: Path) -> list[dict]:
    """320 jobs: kind, log, exit code, host, the expected root rule; the host logs written into workdir/logs."""
    (workdir / "logs").mkdir()
    (workdir / "out").mkdir()
    jobs: list[dict] = []
    for kind, sample, code, count, hosts in MIX:
        for i in range(count):
            host = (hosts or HOSTS)[i % len(hosts or HOSTS)]
            if kind == "clean" and host == BAD and i >= 10 * len(HOSTS):
                host = HOSTS[0]  # the bad node ran few healthy jobs: 10 of its 40
            log = workdir / "logs" / f"{sample or 'empty'}-{host}.log"
            if not log.exists():
                lines = (SAMPLES / f"{sample}.log").read_text().splitlines() if sample else []
                log.write_text("".join(f"{host}: {line}\n" for line in lines))
            # a deleted output leaves only Slurm's facts: its FAILED state is the root cause
            rule = "SJ006" if kind == "deleted" else _expected_rule(sample, code)
            jobs.append({"kind": kind, "log": str(log), "code": code, "host": host, "rule": rule})
    assert len(jobs) >= 300
    return jobs


def _wait_gone(env: dict[str, str], job: str, limit: float = 240) -> None:
    end = time.monotonic() + limit
    while _run(["squeue", "-h", "-j", job], env).stdout.strip():
        assert time.monotonic() < end, f"job {job} still queued after {limit} s"
        time.sleep(0.5)


def _wait_accounted(env: dict[str, str], job: str, count: int, limit: float = 120) -> None:
    """Until sacct has every task's final row (WorkDir and End filled in)."""
    end = time.monotonic() + limit
    while True:
        rows = _run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,WorkDir,End"], env).stdout.split("\n")
        done = [r for r in rows if r and r.split("|")[1] and r.split("|")[2] not in ("", "Unknown")]
        if len(done) >= count:
            return
        assert time.monotonic() < end, f"sacct has {len(done)} of {count} finished rows of {job}"
        time.sleep(1)


@pytest.fixture(scope="module")
def fleet(slurm_env, tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("fleet")
    workdir.chmod(0o755)
    jobs = _plan(workdir)
    plan = workdir / "plan.txt"
    plan.write_text("".join(f"{j['log']} {j['code']}\n" for j in jobs))
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))
    part = _run(["scontrol", "show", "partition", "debug", "-o"], slurm_env).stdout
    old = next((w.split("=", 1)[1] for w in part.split() if w.startswith("OverSubscribe=")), "NO")
    nodes = _run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], slurm_env).stdout.splitlines()
    # the epilog verdicts read the nodes' Reasons: one left on by another test would be read into them
    assert all(line.endswith("|none") for line in nodes), f"a node is out of service before the fleet runs: {nodes}"
    _run(["scontrol", "update", "PartitionName=debug", "OverSubscribe=FORCE:8"], slurm_env)
    try:
        done = _run(["sbatch", "--parsable", "-J", NAME, "-D", str(workdir), "-o", f"{workdir}/out/%x-%A_%a.out",
                     f"--array=0-{len(jobs) - 1}", str(JOB), str(plan)], slurm_env)
        assert done.returncode == 0, done.stderr
        array = done.stdout.strip().split(";")[0]
        _wait_gone(slurm_env, array)
    finally:
        _run(["scontrol", "update", "PartitionName=debug", f"OverSubscribe={old}"], slurm_env)  # as found
    for i, j in enumerate(jobs):
        if j["kind"] == "deleted":
            (workdir / "out" / f"{NAME}-{array}_{i}.out").unlink()
    # the epilog, by hand, on a spread of the jobs right after they ended (as EpilogSlurmctld would run)
    epilog_store = workdir / "fleet.db"
    epilog_log = workdir / "epilog.log"
    for i in range(0, len(jobs), EPILOG_EVERY):
        env = dict(slurm_env, SLURM_JOB_ID=str(int(array) + i), SLURM_ARRAY_JOB_ID=array, SLURM_ARRAY_TASK_ID=str(i),
                   SLURM_CLUSTER_NAME="localcluster", SLURM_SCRIPT_CONTEXT="epilog_slurmctld",
                   DIAGNOSE_FLEET_STORE=str(epilog_store), DIAGNOSE_FLEET_LOG=str(epilog_log),
                   DIAGNOSE_FLEET_COMMENT="1", DIAGNOSE_PYTHON=sys.executable, DIAGNOSE_FLEET_CONF="/nonexistent")
        assert _run(["bash", str(EPILOG)], env).returncode == 0
    _wait_accounted(slurm_env, array, len(jobs))
    return {"array": array, "jobs": jobs, "workdir": workdir, "start": start, "store": epilog_store,
            "epilog_log": epilog_log}


def diagnose(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "diagnose", "fleet", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done


def stored(db: Path, array: str) -> list[tuple]:
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return [r for r in con.execute("SELECT job_key, job_id, signature, status, via, nodes FROM jobs")
                if r[1].startswith(f"{array}_")]
    finally:
        con.close()


def expected_counts(jobs: list[dict]) -> Counter:
    return Counter(j["rule"] for j in jobs if j["rule"] is not None)


def check_store(db: Path, fleet: dict) -> list[tuple]:
    """Every job exactly once, each with the root cause its log is known for, on the host of its log."""
    rows = stored(db, fleet["array"])
    jobs = fleet["jobs"]
    assert len(rows) == len(jobs) == len({r[0] for r in rows})
    assert sorted(r[1] for r in rows) == sorted(f"{fleet['array']}_{i}" for i in range(len(jobs)))
    by_task = {int(r[1].split("_")[1]): r for r in rows}
    for i, j in enumerate(jobs):
        _, _, sig, status, _, nodes = by_task[i]
        assert sig == j["rule"], (i, j, sig)
        if j["kind"] == "deleted":
            assert status == "unreadable"
        else:
            assert status == "diagnosed" and nodes == (j["host"] if j["kind"] != "exit3" else "vm"), (i, j, nodes)
    assert Counter(r[2] for r in rows if r[2]) == expected_counts(jobs)
    return rows


def epilog_tasks(fleet: dict) -> list[int]:
    return list(range(0, len(fleet["jobs"]), EPILOG_EVERY))


def test_epilog_then_sacct_scan_store_every_job_once(slurm_env, fleet):
    tasks = epilog_tasks(fleet)
    rows = stored(fleet["store"], fleet["array"])
    assert len(rows) == len(tasks), (sorted(r[1] for r in rows), fleet["epilog_log"].read_text())
    done = diagnose(slurm_env, "scan", "--sacct", "--name", NAME, "--start", fleet["start"], "--store",
                    str(fleet["store"]), "--jobs", "2")
    assert f"{len(fleet['jobs'])} jobs listed, {len(tasks)} already stored, " in done.stderr, done.stderr
    rows = check_store(fleet["store"], fleet)
    assert Counter(r[4] for r in rows) == {"epilog": len(tasks), "sacct": len(fleet["jobs"]) - len(tasks)}
    assert {int(r[1].split("_")[1]) for r in rows if r[4] == "epilog"} == set(tasks)
    again = diagnose(slurm_env, "scan", "--sacct", "--name", NAME, "--start", fleet["start"], "--store",
                     str(fleet["store"]), "--no-progress")
    assert f"{len(fleet['jobs'])} already stored, 0 added" in again.stderr


def test_epilog_verdicts_and_the_comment_attempt(slurm_env, fleet):
    """Each epilog run logs the job's verdict. With DIAGNOSE_FLEET_COMMENT=1 a failed job's verdict is offered to
    `scontrol update job=... comment=...`; Slurm 22.05 refuses to change a job that has finished ("Job has
    already finished"), and the log line says so instead of claiming it. Whatever Slurm answered, sacct agrees."""
    log = fleet["epilog_log"].read_text().splitlines()
    tasks = epilog_tasks(fleet)
    assert len(log) == len(tasks), log
    lines = {line.split("job ", 1)[1].split(":", 1)[0]: line for line in log}
    ids = ",".join(f"{fleet['array']}_{i}" for i in tasks)
    out = _run(["sacct", "-n", "-X", "-P", "-j", ids, "-o", "JobID,Comment"], slurm_env).stdout
    comments = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
    failed = 0
    for i in tasks:
        job, line = fleet["jobs"][i], lines[f"{fleet['array']}_{i}"]
        assert "(already stored)" not in line, line  # each task's one epilog run stored it
        comment = comments.get(f"{fleet['array']}_{i}", "")
        if job["rule"] is None:
            assert "diagnose: no failure found" in line and "comment" not in line and comment == "", line
            continue
        failed += 1
        assert f"diagnose: [{job['rule']}]" in line, line
        if "[comment set]" in line:
            assert comment.startswith(f"diagnose: [{job['rule']}]"), (line, comment)
        else:
            assert "[comment not set: " in line and "already finished" in line and comment == "", (line, comment)
    assert failed >= 5


def test_submit_array_of_four_tasks_and_merge(slurm_env, fleet):
    run_dir = fleet["workdir"] / "run"
    store = fleet["workdir"] / "merged.db"
    done = diagnose(slurm_env, "submit", "--sacct", "--name", NAME, "--start", fleet["start"], "--tasks", "4",
                    "--run-dir", str(run_dir), "--store", str(store))
    words = done.stdout.split()
    array = words[words.index("array") + 2].rstrip(";")
    merge = words[words.index("merge") + 2]
    _wait_gone(slurm_env, array)
    _wait_gone(slurm_env, merge)
    deadline = time.monotonic() + 60  # sacct's rows lag squeue's: wait for all five (4 tasks + the merge job)
    while True:
        states = _run(["sacct", "-n", "-X", "-P", "-j", f"{array},{merge}", "-o", "JobID,State"], slurm_env).stdout
        if states.count("COMPLETED") >= 5 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert states.count("COMPLETED") == 5, states + (run_dir / "merge.out").read_text()
    import sqlite3

    shard_counts = []  # the window could hold another session's jobs of that name too: count this array's
    for i in range(4):
        con = sqlite3.connect(run_dir / f"shard-{i}.db")
        ids = [r[0] for r in con.execute("SELECT job_id FROM jobs")]
        shard_counts.append(sum(1 for j in ids if j.startswith(f"{fleet['array']}_")))
        con.close()
    assert all(c > 0 for c in shard_counts) and sum(shard_counts) == len(fleet["jobs"]), shard_counts
    check_store(store, fleet)
    # merging the same shards again adds nothing
    again = diagnose(slurm_env, "merge", "--store", str(store), *[str(run_dir / f"shard-{i}.db") for i in range(4)])
    assert again.stdout.count(": 0 new jobs") == 4


def test_report_counts_and_flags_the_bad_node(slurm_env, fleet):
    import jsonschema

    diagnose(slurm_env, "scan", "--sacct", "--name", NAME, "--start", fleet["start"], "--store", str(fleet["store"]),
             "--no-progress")
    done = diagnose(slurm_env, "report", "--since", "1h", "--store", str(fleet["store"]), "--format", "json")
    report = json.loads(done.stdout)
    schema = json.loads((REPO / "schemas" / "fleet-1.schema.json").read_text())
    jsonschema.validate(report, schema)
    jobs = fleet["jobs"]
    assert report["jobs"] == len(jobs)
    assert report["failed"] == sum(1 for j in jobs if j["rule"])
    assert report["unreadable"] == sum(1 for j in jobs if j["kind"] == "deleted")
    assert {c["signature"]: c["jobs"] for c in report["classes"]} == dict(expected_counts(jobs))
    flagged = {n["node"]: n for n in report["nodes"] if n["flagged"]}
    # gpu05: 30 of its 40 jobs hit the ECC error. vm (the one real slurmd) is where the 6 jobs whose log names no
    # host are placed, from Slurm's NodeList, and all 6 failed (empty log + exit 3, deleted output): flagged too.
    assert sorted(flagged) == [BAD, "vm"], report["nodes"]
    assert flagged["vm"]["top_signature"] == "SJ006" and flagged["vm"]["failed"] == flagged["vm"]["jobs"] == 6
    assert flagged[BAD]["top_signature"] == "HW002" and (flagged[BAD]["failed"], flagged[BAD]["jobs"]) == (30, 40)
    assert flagged[BAD]["drain_command"].startswith(f"scontrol update nodename={BAD} state=drain reason='diagnose fleet:")
    text = diagnose(slurm_env, "report", "--since", "1h", "--store", str(fleet["store"])).stdout
    assert f"scontrol update nodename={BAD} state=drain" in text and "HW002" in text
