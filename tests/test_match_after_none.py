"""A line whose meaning a later line of the same output overturns ([rule.context] after_none).

Slurm's "CANCELLED ... DUE TO PREEMPTION" ends a job unless it was requeued: with --requeue and --open-mode=append the
requeued run writes into the same file, and when it loaded its checkpoint the preemption was overcome (SL170,
context), not the failure (SL004). A load printed before the preemption is the run's own start and changes nothing."""

from __future__ import annotations

from diagnose.pipeline import AnalyzeOptions, analyze

PREEMPT = "slurmstepd: error: *** STEP 7730.0 ON gpu-a-031 CANCELLED AT 2026-07-13T02:14:40 DUE TO PREEMPTION ***"
STEP = " iteration {n:8d}/    2000 | consumed samples: {s:8d} | lm loss: 2.41E+00 | number of nan iterations:   0 |"
LOADED = " successfully loaded checkpoint from /ckpt/run7 [ t 1/1, p 1/1 ] at iteration {n}"


def _report(tmp_path, lines: list[str]):
    path = tmp_path / "slurm-7730.out"
    path.write_text("\n".join(lines) + "\n")
    return analyze([str(path)], AnalyzeOptions(replay=False))


def _root(report):
    return next((f for f in report.findings if f.role == "root"), None)


def test_preemption_that_ends_the_log_is_the_root_cause(tmp_path):
    root = _root(_report(tmp_path, [STEP.format(n=10, s=640), PREEMPT]))
    assert root is not None and (root.rule, root.category) == ("SL004", "slurm")


def test_a_checkpoint_loaded_before_the_preemption_does_not_hide_it(tmp_path):
    root = _root(_report(tmp_path, [LOADED.format(n=500), STEP.format(n=510, s=32640), PREEMPT]))
    assert root is not None and root.rule == "SL004"


def test_requeued_run_that_resumed_makes_the_preemption_context(tmp_path):
    report = _report(tmp_path, [STEP.format(n=10, s=640), PREEMPT, LOADED.format(n=10), STEP.format(n=20, s=1280)])
    assert _root(report) is None
    assert [f.rule for f in report.findings if f.rule in ("SL004", "SL170")] == ["SL170"]
    assert all(f.role == "context" for f in report.findings if f.rule == "SL170")


def test_requeued_run_that_failed_later_is_explained_by_its_own_error(tmp_path):
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.19 GiB of which 1.02 GiB is free.")
    report = _report(tmp_path, [STEP.format(n=10, s=640), PREEMPT, LOADED.format(n=10), STEP.format(n=20, s=1280), oom])
    root = _root(report)
    assert root is not None and root.category == "cuda_oom"


def test_a_graceful_stop_on_sigterm_is_no_crash(tmp_path):
    """CA004 reads crash signals only: a handler that caught SIGTERM and stops cleanly is not a crash."""
    graceful = "2026-07-13 02:14:40 | INFO | root | Received signal 15, initiating graceful stop"
    assert _root(_report(tmp_path, [STEP.format(n=10, s=640), graceful])) is None
    crash = "worker 3 received signal 11, exiting"
    root = _root(_report(tmp_path, [STEP.format(n=10, s=640), crash]))
    assert root is not None and root.rule == "CA004"


def test_a_link_that_came_back_is_not_the_root_cause(tmp_path):
    down = "[ 1234.567890] mlx5_core 0000:3b:00.0 ib0: Link down"
    up = "[ 1236.112233] mlx5_core 0000:3b:00.0 ib0: Link up"
    assert _root(_report(tmp_path, [STEP.format(n=10, s=640), down, up, STEP.format(n=20, s=1280)])) is None
    root = _root(_report(tmp_path, [STEP.format(n=10, s=640), down]))
    assert root is not None and (root.rule, root.category) == ("HW130", "hardware")


def test_an_error_line_that_says_it_carried_on_is_context(tmp_path):
    recovered = ("2026-03-01 10:00:01,456 - trainer - ERROR - Invalid value for optimizer.lr_scheduler 'cosin', "
                 "using default 'cosine'")
    report = _report(tmp_path, [recovered, STEP.format(n=10, s=640)])
    assert _root(report) is None and [f.rule for f in report.findings] == ["PY170"]
    refused = "2026-03-01 10:00:01,456 - trainer - ERROR - Invalid value for optimizer.lr_scheduler 'cosin'"
    root = _root(_report(tmp_path, [refused]))
    assert root is not None and (root.rule, root.category) == ("PY030", "config_validation")
