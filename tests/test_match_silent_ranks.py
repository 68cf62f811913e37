"""The ranks that did not report an NCCL watchdog timeout are named as the likely culprits (QA #13)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.match import load_catalogue, match_text
from diagnose.match.silent_ranks import FACT, mark_silent_ranks, silent_ranks, world_size
from diagnose.model import Finding

WATCHDOG = ("[node0{h}:{r}]: [rank{r}]:[E1129 15:24:33.203000000 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID "
            "0(default_pg) Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.")


def _log(ranks) -> str:
    return "\n".join(WATCHDOG.format(h=r // 4, r=r) for r in ranks) + "\n"


@pytest.fixture(scope="module")
def catalogue():
    return load_catalogue([])


def _f(category: str, ranks, **facts) -> Finding:
    return Finding(rule="X", name="x", title="t", category=category, phase="training", severity="error",
                   role="cascade", confidence=0.5, ranks=list(ranks), facts=dict(facts), explanation="Why.")


def test_barrier_timeout_on_ranks_0_7_and_9_names_rank_8(catalogue):
    report = match_text(_log([0, 1, 2, 3, 4, 5, 6, 7, 9]), catalogue, path="job.log")
    root = report.root
    assert root is not None and root.category == "nccl_timeout"
    assert root.facts[FACT] == [8]
    assert "Rank 8 did not report the timeout: it is the likely culprit" in root.explanation


def test_no_gap_no_silent_rank(catalogue):
    report = match_text(_log(range(8)), catalogue, path="job.log")
    assert all(FACT not in f.facts for f in report.findings)


def test_a_stated_world_size_finds_silent_ranks_above_the_highest_reporter():
    timeout = _f("nccl_timeout", range(15))
    findings = [timeout, _f("config_validation", [], world_size="16")]
    mark_silent_ranks(findings, 0)
    assert timeout.facts[FACT] == [15]
    assert "Rank 15 did not report" in timeout.explanation


def test_silent_rank_on_a_cascade_leaves_the_root_explanation_alone():
    oom = _f("cuda_oom", [211])
    timeout = _f("nccl_timeout", [r for r in range(512) if r != 211])
    mark_silent_ranks([oom, timeout], 0)
    assert timeout.facts[FACT] == [211]
    assert timeout.explanation == "Why." and FACT not in oom.facts


def test_ranks_pooled_over_both_watchdog_wordings():
    a, b = _f("nccl_timeout", range(8)), _f("nccl_timeout", [9])
    mark_silent_ranks([a, b], None)
    assert a.facts[FACT] == [8] and FACT not in b.facts


def test_only_a_small_minority_is_named():
    # only each node's first rank logged: ranks 1-7 and 9-15 are absent, not culprits
    assert silent_ranks({0, 8, 16}, 17) == []
    assert silent_ranks({0}, 2) == []  # one reporter says nothing about the others
    assert silent_ranks(set(range(4096)) - {7, 4000}, 4096) == [7, 4000]
    f = _f("nccl_timeout", [0, 8, 16])
    mark_silent_ranks([f], 0)
    assert FACT not in f.facts and f.explanation == "Why."


def test_world_size_sources_and_bounds():
    assert world_size([_f("other", [3, 9])]) == 10
    assert world_size([_f("other", [])]) is None
    assert world_size([_f("other", [3], world_size=8)]) == 8
    assert world_size([_f("other", [12], world_size=8)]) == 13  # a rank beyond the stated size wins
    assert world_size([_f("other", [3], world_size=10**12)]) == 4  # absurd stated size ignored


def test_finds_the_one_silent_rank_of_4096():
    findings = [_f("nccl_timeout", [r for r in range(4096) if r != 1234]) for _ in range(4)]
    mark_silent_ranks(findings, None)
    assert findings[0].facts[FACT] == [1234]


def test_qa_log_if_present(catalogue):
    p = Path("/tmp/qa/logs/host_prefix_barrier.log")
    if not p.exists():
        pytest.skip("QA scratch log not here")
    report = match_text(p.read_text(), catalogue, path=str(p))
    assert report.root.facts[FACT] == [8]
