"""Ranks whose NCCL collective sequence disagrees are named: a desync (other SeqNum/OpType) or a straggler (behind)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import render_to_string
from test_tui_reports import run_async

from diagnose.match import TextSource, load_catalogue, match_text
from diagnose.match.collective_skew import (
    FACT,
    FACT_DESYNC,
    FACT_STRAGGLERS,
    MAX_TUPLES,
    CollectiveSummary,
    note_hit,
)
from diagnose.match.compiled import compile_catalogue
from diagnose.match.engine import scan
from diagnose.match.findings import group_hits
from diagnose.pipeline import AnalyzeOptions, analyze
from diagnose.present.json_report import render_json
from diagnose.present.markdown import render_markdown

# The line formats of torch's ProcessGroupNCCL (../shared/knowledge/megatron-core.md section 6).
PG = "[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
WATCHDOG = ("[E1129 10:10:00.000000000 ProcessGroupNCCL.cpp:632] {pg} Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran for "
            "600012 milliseconds before timing out.")
STATUS_NEW = ("[E1129 10:10:00.100000000 ProcessGroupNCCL.cpp:1664] {pg}  failure detected by watchdog at work "
              "sequence id: {seq} PG status: last enqueued work: {enq}, last completed work: {done}")
STATUS_OLD = ("[E1129 10:10:00.100000000 ProcessGroupNCCL.cpp:577] [Rank {r}] Timeout at NCCL work: {seq}, last "
              "enqueued NCCL work: {enq}, last completed NCCL work: {done}.")
DUMP = ("[E1129 10:10:02.000000000 ProcessGroupNCCL.cpp:1524] {pg} Received a dump signal due to a collective timeout "
        "from  rank 0 and we will try our best to dump the debug info. Last enqueued NCCL work: {enq}, last completed "
        "NCCL work: {done}.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used "
        "across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some "
        "reason, didn't run.")


def launcher(r: int, style: str = "torchrun") -> str:
    """The per-line rank prefix a launcher adds: torchrun's ``[rank5]:`` or ``srun --label``'s ``5: ``."""
    return f"{r}: " if style == "srun" else f"[rank{r}]:"


def watchdog(r: int, seq: int = 812, op: str = "ALLREDUCE", style: str = "torchrun", numel: int = 4096) -> str:
    return launcher(r, style) + WATCHDOG.format(pg=PG.format(r=r), seq=seq, op=op, numel=numel)


def status_new(r: int, seq: int, enq: int, done: int) -> str:
    return launcher(r) + STATUS_NEW.format(pg=PG.format(r=r), seq=seq, enq=enq, done=done)


def status_old(r: int, seq: int, enq: int, done: int) -> str:
    return launcher(r) + STATUS_OLD.format(r=r, seq=seq, enq=enq, done=done)


def dump(r: int, enq: int, done: int) -> str:
    return launcher(r) + DUMP.format(pg=PG.format(r=r), enq=enq, done=done)


def text(lines) -> str:
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def catalogue():
    return load_catalogue([])


def skew_facts(report) -> list[dict]:
    return [f.facts for f in report.findings if FACT in f.facts or FACT_DESYNC in f.facts or FACT_STRAGGLERS in f.facts]


def test_64_ranks_that_agree_say_nothing_new(catalogue):
    log = [watchdog(r) for r in range(64)] + [status_new(r, 812, 812, 811) for r in range(64)]
    report = match_text(text(log), catalogue, path="job.log")
    assert report.root is not None and report.root.category == "nccl_timeout"
    assert skew_facts(report) == []
    out = render_to_string(report)
    assert "desync" not in out and "straggler" not in out


def test_rank_17_on_another_seqnum_and_op_is_named_as_a_desync(catalogue):
    log = [watchdog(r, 813, "ALLGATHER") if r == 17 else watchdog(r) for r in range(64)]
    report = match_text(text(log), catalogue, path="job.log")
    root = report.root
    assert root is not None and root.category == "nccl_timeout"
    [d] = root.facts[FACT_DESYNC]
    assert d["ranks"] == [17] and (d["seq_num"], d["op_type"], d["majority"]) == (812, "ALLREDUCE", 63)
    sentence = ("Rank 17 timed out on SeqNum 813 (ALLGATHER) while 63 ranks waited on SeqNum 812 (ALLREDUCE): "
                "collectives were called in a different order (desync).")
    assert sentence in root.explanation
    assert FACT_STRAGGLERS not in root.facts
    groups = {(g["seq_num"], g["op_type"]): g for g in root.facts[FACT]}
    assert groups[(812, "ALLREDUCE")]["ranks"] == "0-16,18-63" and groups[(813, "ALLGATHER")]["ranks"] == "17"
    # shown once in the text report (in the explanation), and the facts stay out of the Facts block
    out = render_to_string(report, width=200)
    assert out.count("collectives were called in a different order (desync)") == 1
    assert "collective_groups" not in out
    json.loads(render_json(report))  # the new facts are plain JSON


def test_rank_40_behind_in_enqueued_work_is_named_as_a_straggler(catalogue):
    # torch ~2.3 words; rank 40 never enqueued 812, so its own watchdog fired on 811: a straggler, not a desync
    log = []
    for r in range(64):
        seq = 811 if r == 40 else 812
        log.append(watchdog(r, seq))
        log.append(status_old(r, seq, seq, seq - 1))
    report = match_text(text(log), catalogue, path="job.log")
    root = report.root
    [s] = root.facts[FACT_STRAGGLERS]
    assert s["ranks"] == [40] and s["seq_num"] == 812 and s["last_enqueued"] == 811
    assert FACT_DESYNC not in root.facts
    assert ("Rank 40 never enqueued SeqNum 812: it did not reach the collective (straggler)."
            in root.explanation)


def test_a_stuck_rank_is_found_from_its_flight_recorder_line(catalogue):
    # current torch: 63 ranks time out; rank 40, stuck in its data loader, only prints the dump-signal line
    log = [line for r in range(64) if r != 40 for line in (watchdog(r), status_new(r, 812, 812, 811))]
    log.insert(100, dump(40, 811, 811))
    report = match_text(text(log), catalogue, path="job.log")
    [facts] = skew_facts(report)
    assert [s["ranks"] for s in facts[FACT_STRAGGLERS]] == [[40]]


def test_interleaved_torchrun_and_srun_prefixes(catalogue):
    rng = random.Random(7)
    log = [watchdog(r, 813 if r == 5 else 812, "ALLGATHER" if r == 5 else "ALLREDUCE",
                    style="srun" if r % 2 else "torchrun") for r in range(32)]
    rng.shuffle(log)
    report = match_text(text(log), catalogue, path="job.log")
    [facts] = skew_facts(report)
    assert [d["ranks"] for d in facts[FACT_DESYNC]] == [[5]]


def test_bare_watchdog_prefix_gives_the_rank_only_in_the_default_group(catalogue):
    bare = [WATCHDOG.format(pg=f"[Rank {r}]", seq=813 if r == 3 else 812, op="ALLREDUCE", numel=8) for r in range(16)]
    report = match_text(text(bare), catalogue, path="job.log")
    [facts] = skew_facts(report)
    assert [d["ranks"] for d in facts[FACT_DESYNC]] == [[3]]
    # in another process group "Rank 3" is a group rank, not a global one: nothing is named
    other = [WATCHDOG.format(pg=f"[PG ID 2 PG GUID 5(dp) Rank {r}]", seq=813 if r == 3 else 812, op="ALLREDUCE",
                             numel=8) for r in range(16)]
    assert skew_facts(match_text(text(other), catalogue, path="job.log")) == []


def test_seqnums_are_compared_within_one_process_group(catalogue):
    # the data-parallel group (PG 1) counts its own SeqNums: ranks on another number there are no desync
    log = [watchdog(r) for r in range(16)]
    log += ["[rank%d]:" % r + WATCHDOG.format(pg=f"[PG ID 1 PG GUID 3(dp) Rank {r % 4}]", seq=45, op="ALLGATHER",
                                              numel=8) for r in range(2)]
    assert skew_facts(match_text(text(log), catalogue, path="job.log")) == []


def test_a_split_that_is_not_a_small_minority_names_nobody(catalogue):
    log = [watchdog(r, 813 if r % 2 else 812) for r in range(64)]
    assert skew_facts(match_text(text(log), catalogue, path="job.log")) == []


def test_on_a_cascade_the_sentence_shows_without_touching_the_root(catalogue):
    oom = ("[rank17]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
           "capacity of 79.10 GiB of which 1.06 GiB is free.")
    log = [oom] + [watchdog(r, 813, "ALLGATHER") if r == 9 else watchdog(r) for r in range(64) if r != 17]
    report = match_text(text(log), catalogue, path="job.log")
    assert report.root is not None and report.root.category == "cuda_oom"
    assert "desync" not in report.root.explanation
    [facts] = skew_facts(report)
    assert [d["ranks"] for d in facts[FACT_DESYNC]] == [[9]]
    expected = "rank 9 timed out on SeqNum 813 (ALLGATHER) while 62 ranks waited on SeqNum 812 (ALLREDUCE)"
    assert expected in " ".join(render_to_string(report, width=400).split())
    assert expected in render_markdown(report)


def test_4096_ranks_keep_a_summary_of_distinct_tuples_not_lines(catalogue):
    world = 4096
    log = []
    for r in range(world):
        seq = 811 if r == 40 else 812
        log += [watchdog(r, seq), watchdog(r, seq), status_new(r, seq, seq, seq - 1)]  # repeated lines
    source = TextSource("job.log", text(log).encode())
    hits, _blocks, _infos = scan([source], compile_catalogue(catalogue, []), [])
    groups = group_hits(hits)
    summaries = [g.collective for g in groups if g.collective is not None]
    assert sum(len(s.groups) for s in summaries) == 4  # (812, 811) x (watchdog, status): 3 * 4096 lines in all
    assert sum(len(ranks) for s in summaries for ranks in s.groups.values()) == 2 * world  # a rank once per tuple
    report = match_text(text(log), catalogue, path="job.log")
    [facts] = skew_facts(report)
    assert [s["ranks"] for s in facts[FACT_STRAGGLERS]] == [[40]]
    assert len(facts[FACT]) == 4


def test_distinct_tuples_are_capped():
    summary = CollectiveSummary()
    for seq in range(10 * MAX_TUPLES):
        note_hit(summary, {"seq_num": str(seq), "op_type": "ALLREDUCE"}, f"[Rank {seq % 8}] Watchdog caught", None)
    assert len(summary.groups) == MAX_TUPLES


def test_log_text_cannot_smuggle_words_into_the_sentence():
    summary = CollectiveSummary()
    note_hit(summary, {"seq_num": "7", "op_type": "[red]boom"}, "[Rank 1] Watchdog caught", None)
    note_hit(summary, {"seq_num": "x", "op_type": "ALLREDUCE"}, "[Rank 2] Watchdog caught", None)
    assert list(summary.groups) == [(None, 7, None, None, None, None)]


def test_sample_log_names_the_desynced_rank():
    log = Path(__file__).resolve().parent.parent / "sample_logs" / "nccl_desync_seqnum.log"
    report = analyze([str(log)], AnalyzeOptions(jobs=1))
    [d] = report.root.facts[FACT_DESYNC]
    assert d["ranks"] == [11] and d["calls"] == [{"seq_num": 2452, "op_type": "_ALLGATHER_BASE", "ranks": [11]}]
    assert "Rank 11 timed out on SeqNum 2452 (_ALLGATHER_BASE) while 15 ranks waited" in report.root.explanation


@run_async
async def test_tui_shows_the_sentence_on_a_cascade_finding(tmp_path: Path, catalogue) -> None:
    from diagnose.present.tui.app import DiagnoseApp
    from diagnose.present.tui.detail import FindingDetail

    oom = ("[rank17]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
           "capacity of 79.10 GiB of which 1.06 GiB is free.")
    log = tmp_path / "job.log"
    log.write_text(text([oom] + [watchdog(r, 813, "ALLGATHER") if r == 9 else watchdog(r) for r in range(64)
                                 if r != 17]))
    report = match_text(log.read_text(), catalogue, path=str(log))
    index = next(i for i, f in enumerate(report.findings) if FACT_DESYNC in f.facts)
    assert index != report.root_cause
    app = DiagnoseApp([str(log)], report=report, display_names={str(log): "job.log"})
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        app.screen.query_one(FindingDetail).show(report, index)
        await pilot.pause()
        widget = app.screen.query_one("#finding-explanation")
        content = widget.content
        shown = " ".join((content.plain if hasattr(content, "plain") else str(content)).split())
        assert "Rank 9 timed out on SeqNum 813 (ALLGATHER) while 62 ranks waited on SeqNum 812 (ALLREDUCE)" in shown


def test_a_rank_that_also_reported_the_majority_collective_is_in_step(catalogue):
    # torch <= 2.2 prints no process group: ranks 0-3 also time out in their data-parallel group's SeqNum 45
    log = [WATCHDOG.format(pg=f"[Rank {r}]", seq=45, op="ALLGATHER", numel=8) for r in range(4)]
    log += [WATCHDOG.format(pg=f"[Rank {r}]", seq=812, op="ALLREDUCE", numel=8) for r in range(16)]
    assert skew_facts(match_text(text(log), catalogue, path="job.log")) == []


def test_many_different_minority_collectives_are_summed_up(catalogue):
    odd = {3: (813, "ALLGATHER"), 7: (814, "BROADCAST"), 9: (815, "REDUCE_SCATTER"), 12: (816, "BARRIER"),
           20: (817, "ALLTOALL")}
    log = [watchdog(r, *odd.get(r, (812, "ALLREDUCE"))) for r in range(64)]
    report = match_text(text(log), catalogue, path="job.log")
    assert report.root.facts[FACT_DESYNC][0]["ranks"] == [3, 7, 9, 12, 20]
    assert ("Rank 3 timed out on SeqNum 813 (ALLGATHER), rank 7 timed out on SeqNum 814 (BROADCAST), rank 9 timed "
            "out on SeqNum 815 (REDUCE_SCATTER), 2 more rank groups on other collectives while 59 ranks waited on "
            "SeqNum 812 (ALLREDUCE)") in report.root.explanation


def _old_watchdog(r: int, seq: int, op: str) -> str:
    """torch <= 2.2: ``[Rank N]`` (rank in its process group), no process group named."""
    return launcher(r) + WATCHDOG.format(pg=f"[Rank {r % 8 if seq > 10000 else r}]", seq=seq, op=op, numel=4096)


@pytest.mark.parametrize("tp_seq", [88123, 2452])
def test_unprefixed_lines_of_another_group_are_no_desync(catalogue, tp_seq):
    """QA2 #5: with no process group in the lines, a TP group hanging at its own SeqNum 88123 while the data-parallel
    group waits at 2452 is two groups' counters, not "collectives called in a different order". The same SeqNum on
    another OpType is still a desync."""
    log = [_old_watchdog(r, tp_seq, "ALLREDUCE") for r in range(8)]
    log += [_old_watchdog(r, 2452, "_ALLGATHER_BASE") for r in range(8, 64)]
    report = match_text(text(log), catalogue)
    named = [f for f in report.findings if FACT_DESYNC in f.facts]
    if tp_seq == 2452:
        assert named and named[0].facts[FACT_DESYNC][0]["ranks"] == list(range(8))
    else:
        assert not named


def test_a_named_group_on_another_seqnum_is_still_a_desync(catalogue):
    log = [launcher(r) + WATCHDOG.format(pg=PG.format(r=r), seq=88123 if r < 2 else 2452, op="ALLREDUCE", numel=1)
           for r in range(16)]
    report = match_text(text(log), catalogue)
    assert [f.facts[FACT_DESYNC][0]["ranks"] for f in report.findings if FACT_DESYNC in f.facts] == [[0, 1]]
