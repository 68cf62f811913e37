"""A process that could not reach a c10d store (its own log line, printed before the peers' watchdog fired) is why
the ranks waiting for it timed out: it leads their NCCL timeouts; without it the timeout stays the answer."""

from __future__ import annotations

import pytest

from diagnose.match import load_catalogue, match_text

CONNECT = ("(InferenceWorker pid=5120, ip=10.8.1.22) [E socket.cpp:922] [c10d] The client socket has timed out after "
           "1800s while trying to connect to (172.17.0.4, 40117).")
WATCHDOG = [
    f"(TrainerActor pid=4410, ip=10.8.1.22) [E ProcessGroupNCCL.cpp:475] [Rank {r}] Watchdog caught collective "
    f"operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
    f"1800214 milliseconds before timing out." for r in range(4)
] + ["(TrainerActor pid=4410, ip=10.8.1.22) [E ProcessGroupNCCL.cpp:489] Some NCCL operations have failed or timed "
     "out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
     "data."]


@pytest.fixture(scope="module")
def catalogue():
    return load_catalogue()


def test_the_store_connect_timeout_leads_the_watchdog_timeouts(catalogue):
    report = match_text("\n".join([CONNECT, *WATCHDOG]), catalogue)
    root = report.root
    assert root is not None and root.rule == "LA250" and root.category == "launcher" and root.phase == "init"
    assert root.facts.get("host") == "172.17.0.4" and root.facts.get("port") == "40117"
    timeouts = [f for f in report.findings if f.category == "nccl_timeout"]
    assert timeouts and all(f.role == "cascade" and f.cause_of == 0 for f in timeouts)


def test_without_it_the_timeout_is_the_answer(catalogue):
    report = match_text("\n".join(WATCHDOG), catalogue)
    assert report.root is not None and report.root.category == "nccl_timeout"


def test_a_connect_attempt_that_is_retried_is_no_failure(catalogue):
    retry = "[W socket.cpp:663] [c10d] The client socket has failed to connect to [node-1]:29500 (errno: 110 - Connection timed out)."
    report = match_text("\n".join([retry, *WATCHDOG]), catalogue)
    assert report.root is not None and report.root.category == "nccl_timeout"
