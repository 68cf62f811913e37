"""`diagnose slurm` with a node that a health check drained, on the REAL local Slurm cluster (scripts/slurm-local.sh).

A job prints an NCCL watchdog timeout and exits 1; while it runs, the test drains its node the way NHC does
(``scontrol update nodename=N state=drain reason="NHC: ..."``); `diagnose slurm JOBID --format json` must then name
the node as the root cause, with the log's timeout and Slurm's FAILED as its consequences. A job on a healthy node
gets no node finding. The node is left as the test found it: the ``drain`` fixture resumes every node it drained in
its finalizer, whether the test passed or failed, and checks that the node is back in service with no Reason (the
other Slurm tests' jobs run on that node, and a Reason left on it is read into their verdicts: the fleet epilog's,
the owner test's).
Skipped without root or Slurm (failed in CI, as test_slurm_cluster.py does), and with DIAGNOSE_SKIP_SLURM=1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import local_slurm_env

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
REASON = "NHC: check_nv_healthmon: GPU 3 has uncorrectable ECC errors (diagnose test)"
# The job waits for the test to drain its node (a file appears), then fails as an NCCL job whose peer's GPU died.
JOB = """\
#!/bin/bash
#SBATCH --job-name=diag-node
for _ in $(seq 1 200); do [ -e {go} ] && break; sleep 0.1; done
echo "[rank3]:[E1205 10:14:02.123456789 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation \
timeout: WorkNCCL(SeqNum=4121, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for \
600042 milliseconds before timing out."
exit 1
"""


def run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return local_slurm_env()


def node_state(env: dict[str, str], node: str) -> tuple[str, str]:
    """(State, Reason) of the node as ``scontrol show node -o`` says them; Reason is '' when it has none."""
    shown = run(env, "scontrol", "show", "node", "-o", node).stdout
    state = next((w.split("=", 1)[1] for w in shown.split() if w.startswith("State=")), "")
    reason = shown.split(" Reason=", 1)[1].strip() if " Reason=" in shown else ""  # the line's last field
    return state, reason


def out_of_service(state: str) -> bool:
    return any(flag in state.split("+") for flag in ("DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"))


@pytest.fixture
def drain(slurm_env):
    """``drain(node)`` drains the node the way a health check does; after the test, passed or failed, every node it
    drained is resumed and must be back in service with no Reason, as the test found it."""
    drained: list[str] = []

    def drain_node(node: str) -> None:
        state, reason = node_state(slurm_env, node)
        assert not out_of_service(state) and not reason, f"node {node} was {state} ({reason}) before the test"
        drained.append(node)  # before the command: a drain that half-happened is undone too
        done = run(slurm_env, "scontrol", "update", f"nodename={node}", "state=drain", f"reason={REASON}")
        assert done.returncode == 0, done.stderr

    yield drain_node
    for node in drained:
        resumed = run(slurm_env, "scontrol", "update", f"nodename={node}", "state=resume")
        end = time.monotonic() + 30
        while True:
            state, reason = node_state(slurm_env, node)
            if not out_of_service(state) and not reason:
                break
            assert time.monotonic() < end, f"node {node} is {state} ({reason}) after resume: {resumed.stderr}"
            time.sleep(0.2)


def submit(env: dict[str, str], workdir: Path) -> tuple[str, Path]:
    go = workdir / "go"
    script = workdir / "job.sh"
    script.write_text(JOB.format(go=go))
    done = run(env, "sbatch", "--parsable", "-D", str(workdir), str(script))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0], go


def wait_state(env: dict[str, str], job: str, states: tuple[str, ...], limit: float = 60) -> str:
    end = time.monotonic() + limit
    while True:
        state = run(env, "squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
        if state in states:
            return state
        assert time.monotonic() < end, f"job {job} is {state or 'gone'}, never {states}"
        time.sleep(0.2)


def wait_ended(env: dict[str, str], job: str, limit: float = 60) -> None:
    end = time.monotonic() + limit
    while run(env, "squeue", "-h", "-j", job, "-t", "PD,R,CG,CF,S").stdout.strip():
        assert time.monotonic() < end, f"job {job} still running after {limit} s"
        time.sleep(0.2)


def node_of(env: dict[str, str], job: str) -> str:
    return run(env, "squeue", "-h", "-j", job, "-o", "%N").stdout.strip()


def diagnose(env: dict[str, str], job: str, fmt: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagnose", "slurm", job, "--format", fmt],
                          env={**env, "NO_COLOR": "1", "COLUMNS": "120"}, cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def node_findings(report: dict) -> list[dict]:
    return [f for f in report["findings"] if any(e["path"].startswith("scontrol-node:") for e in f["evidence"])]


def test_node_drained_by_a_health_check_during_the_job_is_the_root_cause(slurm_env, drain, tmp_path):
    tmp_path.chmod(0o755)
    job, go = submit(slurm_env, tmp_path)
    wait_state(slurm_env, job, ("RUNNING",))
    node = node_of(slurm_env, job)
    assert node
    try:
        drain(node)  # resumed by the fixture after the test, whatever happens here
        go.touch()
        wait_ended(slurm_env, job)
        with ThreadPoolExecutor(max_workers=2) as pool:  # both while the node is still drained
            as_json, as_text = pool.map(lambda fmt: diagnose(slurm_env, job, fmt), ("json", "text"))
    finally:
        go.touch()  # the job ends even when the drain failed
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    root = report["findings"][report["root_cause"]]
    assert (root["rule"], root["category"], root["role"]) == ("SN011", "hardware", "root"), root
    assert root["evidence"][0]["path"] == f"scontrol-node:{node}"
    assert REASON in root["evidence"][0]["text"] and root["hosts"] == [node]
    assert root["facts"]["timing"] == "during" and root["facts"]["reason_user"] == "root"
    assert f"--exclude={node}" in " ".join(root["fix"]["steps"])
    consequences = {f["rule"]: f for f in report["findings"] if f["role"] == "cascade"}
    assert {"NC001", "SJ006"} <= set(consequences), [f["rule"] for f in report["findings"]]
    assert len(node_findings(report)) == 1
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(report, json.loads((REPO / "schemas" / "report-1.schema.json").read_text()))
    assert as_text.returncode == 1, as_text.stderr
    assert f"ROOT CAUSE  SN011  Node {node} " in as_text.stdout and "during the job" in as_text.stdout


def test_a_job_on_a_healthy_node_gets_no_node_finding(slurm_env, tmp_path):
    tmp_path.chmod(0o755)
    job, go = submit(slurm_env, tmp_path)
    go.touch()
    wait_ended(slurm_env, job)
    done = diagnose(slurm_env, job, "json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert node_findings(report) == []
    assert {f["rule"] for f in report["findings"]} >= {"NC001", "SJ006"}
    assert not any("node" in w and "could not be read" in w for w in report.get("warnings", []))
