"""A time-limit kill after the job finished its work is a hang at exit (the kill its consequence); a job killed
mid-way, mid-save or right after its last step stays a time limit."""

from __future__ import annotations

import pytest

from diagnose.match import load_catalogue, match_text


def _iteration(n: int, total: int = 50, at: str = "15:58:41") -> str:
    return (f" [2026-03-26 {at}] iteration {n:>8}/{total:>8} | consumed samples: {n * 128:>12} | elapsed time per "
            f"iteration (ms): 809.9 | learning rate: 1.000000E-05 | global batch size:   128 | lm loss: 1.571052E-01 |"
            " loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |")


KILL = "slurmstepd: error: *** JOB 4411 ON node-a01 CANCELLED AT 2026-03-26T17:02:44 DUE TO TIME LIMIT ***"
VALIDATION = " validation loss at iteration 50 on test set | lm loss value: 1.585846E-01 | lm loss PPL: 1.171851E+00 | "
NCCL_DESTROY = "node-a01:1904410:1904410 [0] NCCL INFO comm 0x5a77c310 rank 0 nranks 8 cudaDev 0 busId 1b000 - Destroy COMPLETE"


@pytest.fixture(scope="module")
def catalogue():
    return load_catalogue()


def _root(catalogue, lines: list[str]):
    report = match_text("\n".join(lines), catalogue)
    assert report.root is not None
    return report.root


def test_killed_long_after_the_last_iteration_is_a_hang_at_exit(catalogue):
    root = _root(catalogue, [_iteration(49, at="15:58:40"), _iteration(50), VALIDATION, NCCL_DESTROY, KILL])
    assert root.rule == "SL003" and root.category == "nccl_timeout" and root.basis == "inferred"
    assert "iteration 50/50" in root.basis_detail and "line 2" in root.basis_detail
    assert root.confidence <= 0.6 and "hung" in root.explanation


@pytest.mark.parametrize("lines", [
    [_iteration(30), _iteration(31, at="15:58:42"), KILL],  # killed mid-way: it ran out of time
    [_iteration(49, at="16:59:40"), _iteration(50, at="17:00:41"), KILL],  # two minutes before the kill: not hung
    [_iteration(50), "saving checkpoint at iteration      50 to /ckpt in torch_dist format", KILL],  # mid-save
    [KILL, _iteration(50, at="17:40:00")],  # the work line after the kill: another attempt in the same file
])
def test_a_job_that_ran_out_of_time_stays_a_time_limit(catalogue, lines):
    root = _root(catalogue, lines)
    assert root.rule == "SL003" and root.category == "slurm" and root.basis == "rule"


def test_a_save_that_finished_before_the_kill_does_not_hold_it_back(catalogue):
    root = _root(catalogue, [
        _iteration(50), "saving checkpoint at iteration      50 to /ckpt in torch_dist format",
        "  successfully saved checkpoint from iteration      50 to /ckpt [ t 1/1, p 1/1 ]", KILL])
    assert root.category == "nccl_timeout"


def test_the_programs_own_end_of_work_line_tells_the_same(catalogue):
    done = "Training completed. Do not forget to share your model on huggingface.co/models =)"
    assert _root(catalogue, ["{'loss': 1.87, 'learning_rate': 1e-05, 'epoch': 2.0}", done, KILL]).category == \
        "nccl_timeout"
    assert _root(catalogue, ["{'loss': 1.87, 'learning_rate': 1e-05, 'epoch': 1.0}", KILL]).category == "slurm"


def test_an_error_before_the_kill_still_leads(catalogue):
    report = match_text("\n".join([_iteration(50), "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                   "2.00 GiB. GPU 0 has a total capacity of 79.10 GiB", KILL]), catalogue)
    assert report.root is not None and report.root.category == "cuda_oom"
    assert next(f for f in report.findings if f.rule == "SL003").category == "slurm"
