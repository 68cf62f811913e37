"""The hang analysis on small hand-made dumps: ring-buffer alignment, groups other than the default one, a
collective nobody completed, and when the log's own root cause stays root."""

from __future__ import annotations

from diagnose.match.hang import analyse_dumps, user_frame
from diagnose.match.hang_merge import merge_hang
from diagnose.model import Evidence, Finding, FrDump, FrEntry, FrFrame, FrGroup, Report


def _e(seq: int, group: str = "0", desc: str = "default_pg", op: str = "nccl:all_reduce", done: bool = True,
       sizes=((8,),), frames=None) -> FrEntry:
    return FrEntry(record_id=seq * 10 + int(group or 0), group=group, group_desc=desc, seq=seq, p2p_seq=0,
                   is_p2p=False, op=op, input_sizes=[list(s) for s in sizes],
                   state="completed" if done else "scheduled", completed=done, frames=frames or [])


def _dump(rank: int, entries: list[FrEntry], groups: dict | None = None) -> FrDump:
    return FrDump(path=f"/job/nccl_trace_rank_{rank}", rank=rank, format="pickle", version="2.10",
                  comm_lib_version="2.27.3", groups=groups or {}, entries=entries)


def test_ring_buffers_that_forgot_different_amounts_are_aligned():
    # rank 0 kept seq 5-10, rank 1 kept 3-9 (it is behind): only 5-9 are compared, then 10 is where 1 is missing
    dumps = [_dump(0, [_e(s) for s in range(5, 11)]), _dump(1, [_e(s) for s in range(3, 10)])]
    hang = analyse_dumps(dumps)
    assert hang.kind == "stalled" and hang.seq == 10 and [c.rank for c in hang.culprits] == [1]
    assert [col.seq for col in hang.grid][0] >= 5  # nothing before the aligned start is drawn as "absent"


def test_a_stall_in_a_sub_group_is_named_with_that_group_and_its_members():
    tp = {"7": FrGroup(name="7", desc="tp", ranks=[2, 3])}
    frames = [FrFrame("all_reduce", "/x/torch/distributed/distributed_c10d.py", 1),
              FrFrame("forward", "/opt/megatron/core/tensor_parallel/mappings.py", 42)]
    dumps = [_dump(r, [_e(1), _e(2)] + ([_e(1, "7", "tp"), _e(2, "7", "tp", frames=frames)] if r in (2, 3) else []),
                   tp if r in (2, 3) else None) for r in range(4)]
    dumps[3].entries.pop()  # rank 3 never entered tp collective #2
    hang = analyse_dumps(dumps)
    assert (hang.kind, hang.group, hang.group_desc, hang.seq) == ("stalled", "7", "tp", 2)
    assert hang.waiting_ranks == [2] and [c.rank for c in hang.culprits] == [3]
    assert [cell.rank for cell in hang.grid[0].cells] == [2, 3]  # the group's members, not the world
    assert user_frame(dumps[2].entries[-1]) == "/opt/megatron/core/tensor_parallel/mappings.py:42 in forward"


def test_every_rank_in_a_collective_none_completed():
    dumps = [_dump(r, [_e(1), _e(2, done=False)]) for r in range(3)]
    hang = analyse_dumps(dumps)
    assert hang.kind == "not_completed" and hang.seq == 2 and hang.waiting_ranks == [0, 1, 2]
    assert hang.summary.startswith("Every rank (ranks 0-2) entered all_reduce #2")


def _finding(rule: str, category: str, ranks: list[int]) -> Finding:
    return Finding(rule=rule, name=rule.lower(), title=rule, category=category, phase="training", severity="error",
                   role="root", confidence=0.9, ranks=ranks,
                   evidence=[Evidence(path=f"rank{ranks[0]}.log", line=3, text=f"{rule} line")])


def _stall_report(root: Finding, *others: Finding) -> Report:
    report = Report(findings=[root, *others], root_cause=0)
    dumps = [_dump(r, [_e(1), _e(2)] if r != 1 else [_e(1)]) for r in range(4)]
    merge_hang(report, analyse_dumps(dumps))
    return report


def test_the_hang_is_root_over_the_timeouts_with_evidence_from_both():
    timeout = _finding("NC001", "nccl_timeout", [0, 2, 3])
    report = _stall_report(timeout)
    assert report.root.rule == "FR001" and report.root_cause == 0
    assert timeout.role == "cascade" and timeout.cause_of == 0
    assert report.root.evidence[-1].text == "NC001 line" and report.root.facts["log_root"] == "NC001"


def test_the_stalled_ranks_own_error_stays_root():
    oom = _finding("OOM101", "cuda_oom", [1])
    report = _stall_report(oom)
    assert report.root is oom and report.findings[-1].rule == "FR001"
    assert report.findings[-1].role == "cascade" and report.findings[-1].cause_of == 0
    # a generic exception counts only when printed by the named rank alone
    assert _stall_report(_finding("PY001", "other", [1])).root.rule == "PY001"
    assert _stall_report(_finding("PY001", "other", [0, 1, 2, 3])).root.rule == "FR001"


def test_a_rank_whose_buffer_dropped_the_collective_is_not_called_stalled():
    # rank 1's ring buffer holds only the newer sub-group entries, but its pg_status says it enqueued default #2
    status = {"0": FrGroup(name="0", desc="default_pg", ranks=[0, 1], last_enqueued=2, last_completed=2)}
    dumps = [_dump(0, [_e(1), _e(2)], status), _dump(1, [_e(s, "5", "dp") for s in (1, 2, 3)], status)]
    dumps[0].entries += [_e(s, "5", "dp") for s in (1, 2, 3)]
    assert analyse_dumps(dumps).kind == "none"
    status1 = {"0": FrGroup(name="0", desc="default_pg", ranks=[0, 1], last_enqueued=1, last_completed=1)}
    dumps[1].groups = status1  # now it says it stopped at #1: stalled
    hang = analyse_dumps(dumps)
    assert hang.kind == "stalled" and [c.rank for c in hang.culprits] == [1] and hang.seq == 2
