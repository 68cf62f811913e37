"""A training loop that stops itself on a non-finite loss: the stop line, not torchrun's summary after it, is the
root cause (checked both ways: without the line the launcher's summary stays the answer)."""

from __future__ import annotations

import pytest

from diagnose.match import load_catalogue, match_text

# MAE/DeiT-family epoch lines, the loop's stop check, then torchrun tearing the job down (values made up)
EPOCH = "[10:02:11.401233] Epoch: [3]  [ 120/1800]  eta: 1:10:02  lr: 0.000010  loss: 0.3121 (0.3170)  time: 2.4120"
TORCHRUN = [
    "W0301 10:02:30.118000 140011 torch/distributed/elastic/multiprocessing/api.py:858] Sending process 4102 closing "
    "signal SIGTERM",
    "E0301 10:02:30.420000 140011 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: 1) "
    "local_rank: 0 (pid: 4101) of binary: /opt/conda/bin/python3.10",
    "Traceback (most recent call last):",
    '  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/launcher/api.py", line 264, in launch_agent',
    "    raise ChildFailedError(",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
]


@pytest.fixture(scope="module")
def catalogue():
    return load_catalogue()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_the_loops_nan_stop_leads_torchruns_summary(catalogue, value):
    text = "\n".join([EPOCH, f"[10:02:12.008113] Loss is {value}, stopping training", *TORCHRUN])
    report = match_text(text, catalogue)
    root = report.root
    assert root is not None and root.rule == "NU005" and root.category == "numerics"
    assert root.phase == "training" and root.facts.get("loss") == value
    launcher = [f for f in report.findings if f.category == "launcher"]
    assert launcher and all(f.role == "cascade" and f.cause_of == 0 for f in launcher)


def test_without_the_stop_line_the_launcher_summary_stays_the_answer(catalogue):
    report = match_text("\n".join([EPOCH, *TORCHRUN]), catalogue)
    assert report.root is not None and report.root.category == "launcher"
    assert not any(f.category == "numerics" for f in report.findings)


def test_a_finite_loss_or_a_step_budget_stop_is_no_nan(catalogue):
    for line in ("Loss is 0.2713, stopping training", "Max number of steps has been reached, stopping training early"):
        report = match_text("\n".join([EPOCH, line]), catalogue)
        assert not any(f.category == "numerics" for f in report.findings), line
