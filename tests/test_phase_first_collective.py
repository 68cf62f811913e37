"""A failure of NCCL's communicator set-up is in the phase of the call that issued the group's first collective.

NCCL creates a communicator lazily, at a process group's first collective. A socket, shm or transport error in that
set-up (NC012, NC016, a duplicate GPU NC010, ...) prints an NCCL ``WARN`` line with no frames; the rule says
``init``. The ``NCCL error in:`` exception that the collective raises next carries the traceback that names the call:
DDP's constructor (``distributed.py __init__``) is the DP wrap, a backward pass the first iteration. A barrier in
the user's own script names no phase, and neither do markers alone: the rule's ``init`` stays.
"""

from __future__ import annotations

import pytest
from conftest import analyzed_root

from diagnose.match.rules import parse_rule

WARN = ("node3:20417:20603 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.24.3.17<41521> "
        "failed : No route to host")
ERROR = ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, unhandled system "
         "error, NCCL version 2.18.1")
SITE = "/opt/conda/lib/python3.10/site-packages"


def _log(frames: list[str], before: list[str] | None = None) -> str:
    lines = [*(before or []), "Training on 2 nodes x 8 GPUs", WARN, "Traceback (most recent call last):",
             '  File "/work/train.py", line 210, in <module>', "    main()"]
    for frame in frames:
        lines += [f"  File \"{frame}\"", "    pass"]
    return "\n".join([*lines, ERROR, ""])


DDP_WRAP = [f'{SITE}/torch/nn/parallel/distributed.py", line 795, in __init__',
            f'{SITE}/torch/distributed/utils.py", line 284, in _verify_param_shape_across_processes']
BACKWARD = [f'{SITE}/torch/_tensor.py", line 521, in backward',
            f'{SITE}/torch/autograd/__init__.py", line 289, in backward']
BARRIER = ['/work/train.py", line 118, in main',
           f'{SITE}/torch/distributed/distributed_c10d.py", line 3685, in barrier']


@pytest.mark.parametrize(("frames", "phase"), [(DDP_WRAP, "dp_wrap"), (BACKWARD, "first_iteration"),
                                               (BARRIER, "init")])
def test_the_socket_failure_takes_the_phase_the_collectives_traceback_names(tmp_path, frames, phase):
    root = analyzed_root(tmp_path, _log(frames))
    assert (root.rule, root.category, root.phase) == ("NC012", "nccl_error", phase)


def test_a_marker_alone_does_not_move_it(tmp_path):
    """The wrapper's marker came before a barrier: the first collective was the barrier, not the wrap."""
    marker = " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 293082112"
    root = analyzed_root(tmp_path, _log(BARRIER, before=[marker]))
    assert (root.rule, root.phase) == ("NC012", "init")


def test_the_flag_needs_a_phase_of_its_own():
    raw = {"code": "XX001", "slug": "x", "title": "x", "category": "nccl_error", "phase": "auto",
           "phase_at_first_collective": True, "severity": "error", "explanation": "x",
           "patterns": [{"anchor": "x", "regex": "x"}], "fix": {"summary": "x", "steps": ["x"]}}
    with pytest.raises(ValueError, match="phase_at_first_collective"):
        parse_rule(raw, "t.toml")


BROADCAST_TIMEOUT = ("[rank1]:[E305 11:40:02.381144520 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
                     "operation timeout: WorkNCCL(SeqNum={seq}, OpType=BROADCAST, NumelIn={numel}, "
                     "NumelOut={numel}, Timeout(ms)=1800000) ran for 1800091 milliseconds before timing out.")
STEP_BAR = "{'loss': 1.8734, 'grad_norm': 0.91, 'learning_rate': 1.9e-05, 'epoch': 0.41}"


def test_a_timeout_in_the_first_parameter_sized_broadcast_is_the_dp_wrap(tmp_path):
    root = analyzed_root(tmp_path, BROADCAST_TIMEOUT.format(seq=1, numel=124647170) + "\n")
    assert (root.rule, root.category, root.phase) == ("NC523", "nccl_timeout", "dp_wrap")


@pytest.mark.parametrize(("seq", "numel"), [(1, 1), (57, 124647170)])
def test_a_one_element_or_later_broadcast_stays_a_set_up_timeout(tmp_path, seq, numel):
    root = analyzed_root(tmp_path, BROADCAST_TIMEOUT.format(seq=seq, numel=numel) + "\n")
    assert (root.rule, root.phase) == ("NC002", "init")


def test_the_same_broadcast_after_training_steps_is_a_training_timeout(tmp_path):
    """An RL job's first weight sync on a new group is also an early, large broadcast: after steps, not the wrap."""
    root = analyzed_root(tmp_path, STEP_BAR + "\n" + BROADCAST_TIMEOUT.format(seq=1, numel=544997376) + "\n")
    assert root.rule == "NC007" and root.phase != "dp_wrap"
