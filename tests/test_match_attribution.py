"""Ranks and hosts that the evidence line does not carry come from srun task lists and torchrun's summary."""

from diagnose.match import load_catalogue, match_text

CAT = load_catalogue()

SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
pretrain_gpt.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_15:25:31
  host      : node17.cluster
  rank      : 137 (local_rank: 1)
  exitcode  : -9 (pid: 12345)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 12345
============================================================
"""


def test_srun_task_list_gives_ranks_and_host():
    report = match_text("srun: error: node07: tasks 8-11: Killed\n", CAT)
    f = next(f for f in report.findings if f.facts.get("tasks"))
    assert f.ranks == [8, 9, 10, 11]
    assert f.hosts == ["node07"]


def test_torchrun_summary_names_the_rank_of_an_unprefixed_root_cause():
    report = match_text(SUMMARY, CAT)
    assert report.root is not None
    assert report.root.ranks == [137]
    assert report.root.hosts == ["node17.cluster"]


def test_a_prefixed_rank_is_never_overwritten_by_the_summary():
    text = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n" + SUMMARY
    report = match_text(text, CAT)
    assert report.root is not None and report.root.category == "cuda_oom"
    assert report.root.ranks == [3]
