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


# QA item 11 (docs/qa-report.md): the log names the host of a rank on another line.
SRUN_OOM = """\
 3: Traceback (most recent call last):
 3:   File "/opt/Megatron-LM/megatron/training.py", line 400, in train_step
 3:     losses_reduced = forward_backward_func(
 3: RuntimeError: CUDA out of memory. Tried to allocate 8.00 GiB (GPU 3; 79.35 GiB total capacity; 70.11 GiB already \
allocated; 6.19 GiB free; 71.02 GiB reserved in total by PyTorch)
srun: error: node07: task 3: Exited with exit code 1
 0: [E ProcessGroupNCCL.cpp:475] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1234, \
OpType=ALLREDUCE, NumelIn=16777216, NumelOut=16777216, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.
"""


def test_srun_names_the_host_of_a_rank_reported_elsewhere():
    report = match_text(SRUN_OOM, CAT)
    assert report.root is not None and report.root.category == "cuda_oom"
    assert report.root.ranks == [3] and report.root.hosts == ["node07"]
    nccl = next(f for f in report.findings if f.category == "nccl_timeout")
    assert nccl.ranks == [0] and nccl.hosts == []  # srun said nothing about task 0


def test_every_srun_line_of_a_grouped_finding_gives_its_tasks_and_node():
    text = ("srun: error: node07: task 3: Exited with exit code 1\n"
            "srun: error: node12: task 9: Exited with exit code 1\n")
    f = next(f for f in match_text(text, CAT).findings if f.facts.get("tasks"))
    assert f.count == 2 and f.ranks == [3, 9] and f.hosts == ["node07", "node12"]


def test_with_torchrun_srun_tasks_are_not_ranks():
    # srun starts one torchrun per node: task 1 is the second node, not rank 1
    text = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n" \
           "srun: error: node07: task 1: Exited with exit code 1\n" + SUMMARY
    report = match_text(text, CAT)
    oom = next(f for f in report.findings if f.category == "cuda_oom")
    assert oom.ranks == [1] and oom.hosts == []
    srun = next(f for f in report.findings if f.facts.get("tasks"))
    assert srun.ranks == [] and srun.hosts == ["node07"]  # the node is known, the task id is no rank


def test_a_task_placeholder_host_becomes_the_node_srun_names():
    text = ("2: [default0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
            "srun: error: node05: task 2: Exited with exit code 1\n")
    oom = next(f for f in match_text(text, CAT).findings if f.category == "cuda_oom")
    assert oom.hosts == ["node05"]


def test_unprefixed_ooms_of_several_gpus_keep_their_devices_not_invented_ranks():
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU {} has a total capacity of "
           "79.11 GiB of which 2.06 GiB is free.\n")
    report = match_text(oom.format(1) + oom.format(0), CAT)
    assert report.root is not None and report.root.count == 2
    assert report.root.ranks == [] and report.root.facts["gpus"] == [0, 1]
    single = match_text(oom.format(1), CAT)
    assert "gpus" not in single.root.facts


def test_every_srun_line_counts_not_only_the_evidence_kept():
    # issue 17: six per-node lines grouped into one finding keep only three evidence lines; the ranks and hosts
    # come from every line (the hits' facts), not from re-parsing the evidence kept
    text = "".join(f"srun: error: node0{n}: tasks {4 * n}-{4 * n + 3}: Exited with exit code 1\n" for n in range(6))
    f = next(f for f in match_text(text, CAT).findings if f.facts.get("tasks"))
    assert f.count == 6 and len(f.evidence) < 6
    assert f.ranks == list(range(24))
    assert f.hosts == [f"node0{n}" for n in range(6)]


def test_srun_nodes_of_every_line_name_the_hosts_of_ranks_reported_elsewhere():
    oom = "[rank{}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    text = oom.format(21) + "".join(
        f"srun: error: node0{n}: tasks {4 * n}-{4 * n + 3}: Exited with exit code 1\n" for n in range(6))
    report = match_text(text, CAT)
    assert report.root is not None and report.root.category == "cuda_oom"
    assert report.root.ranks == [21] and report.root.hosts == ["node05"]
