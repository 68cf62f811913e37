"""Failures told by a program other than the training process's NCCL: another library's InfiniBand transport,
slurmstepd's TaskProlog, srun's report of a task's signal after the job had trained.

Synthetic logs in each program's own message templates (TensorPipe's and UCX's ibverbs errors, slurmstepd's and
slurmd's TaskProlog failure, srun's task signal line); hosts, job ids, paths and numbers invented.
"""

from __future__ import annotations

from conftest import analyzed, root_finding

TENSORPIPE = ("worker-1: RuntimeError: ibv_poll_cq: transport retry counter exceeded (this error originated at "
              "tensorpipe/transport/ibv/connection_impl.cc:478)")
UCX = "[cn031:40112:0:40112] ib_mlx5_log.c:177  Transport retry count exceeded on mlx5_1:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)"
PROGRESS = ["epoch 2 step 800 loss 0.4121", "epoch 2 step 900 loss 0.4087"]
SEGV = "srun: error: cn042: task 3: Segmentation fault (core dumped)"


def test_tensorpipe_retry_exceeded_is_the_fabric(builtin_catalogue):
    lines = [
        "worker-1: Traceback (most recent call last):",
        '  File "/work/train_pipe.py", line 98, in forward',
        "    return torch.futures.wait_all(out_futures)",
        TENSORPIPE,
    ]
    f = root_finding(builtin_catalogue, lines)
    assert (f.rule, f.category) == ("HW241", "hardware")


def test_ucx_retry_exceeded_names_the_port(builtin_catalogue):
    f = root_finding(builtin_catalogue, [UCX])
    assert (f.rule, f.category) == ("HW241", "hardware")
    assert "mlx5_1:1/IB" in str(f.facts)


def test_an_nccl_error_printed_before_the_link_failure_stays_the_root(builtin_catalogue):
    # a link failure is no device fault: it does not lead an NCCL error of the node's own that came first
    lines = [
        "gn-201:811:902 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-Xa1 to 9637892 bytes",
        UCX,
    ]
    assert root_finding(builtin_catalogue, lines).category == "nccl_error"


def test_rnr_retry_is_not_the_link(builtin_catalogue):
    # receiver-not-ready: the peer had posted no receive (a software pace), not a lost acknowledgement
    line = TENSORPIPE.replace("transport retry", "RNR retry")
    assert root_finding(builtin_catalogue, [line]).rule != "HW241"


def test_task_prolog_failure_leads_the_tasks_exits(tmp_path):
    text = "\n".join([
        "pyxis: imported docker image: /lustre/images/trainer.sqsh",
        "slurmstepd: error: TaskProlog failed status=127",
        "slurmstepd: error: TaskProlog failed status=127",
        "srun: error: gpu-b11: tasks 0-1: Exited with exit code 1",
    ]) + "\n"
    root = analyzed(tmp_path, text).root
    assert (root.rule, root.category, root.phase) == ("SL202", "slurm", "init")


def test_task_prolog_failure_in_slurmds_own_log(tmp_path):
    text = "\n".join([
        "[2026-02-11T03:10:07.114] [88123.0] SCRIPT: run_command:script=/etc/slurm/task_prolog, resp:",
        "[2026-02-11T03:10:07.116] [88123.0] error: TaskProlog failed status=127",
        "[2026-02-11T03:10:07.117] [88123.0] task 0 (40551) exited with exit code 1.",
    ]) + "\n"
    root = analyzed(tmp_path, text).root
    assert (root.rule, root.category) == ("SL202", "slurm")


def test_segfault_after_training_with_nothing_else_suspects_the_node(tmp_path):
    root = analyzed(tmp_path, "\n".join(PROGRESS + [SEGV]) + "\n").root
    assert (root.rule, root.category, root.phase) == ("HW242", "hardware", "training")


def test_segfault_before_any_progress_stays_sruns_report(builtin_catalogue):
    assert root_finding(builtin_catalogue, ["starting training", SEGV]).rule == "SL011"


def test_segfault_with_the_programs_own_report_cites_that(builtin_catalogue):
    lines = PROGRESS + [
        "Fatal Python error: Segmentation fault",
        "",
        "Current thread 0x00007f3e9a7fc740 (most recent call first):",
        '  File "/opt/lib/python3.10/site-packages/fastops/kernels.py", line 41 in launch',
        SEGV,
    ]
    assert root_finding(builtin_catalogue, lines).rule != "HW242"


def test_a_task_killed_after_training_is_not_read_as_the_node(builtin_catalogue):
    lines = PROGRESS + ["srun: error: cn042: task 3: Killed"]
    assert root_finding(builtin_catalogue, lines).rule != "HW242"
