"""A check that fails while wording its own refusal (round 14, tune-r14): the raising line the traceback prints is the
message it was about to give (``inference.message_being_worded``), and the tables IF293/IF294 read that message."""

from __future__ import annotations

import contextlib
import signal

import pytest

from diagnose.match import load_catalogue, match_text
from diagnose.match.inference import message_being_worded

CATALOGUE = load_catalogue()
HEAD = 'File "/env/lib/python3.11/site-packages/pkg/config.py", line 88, in __post_init__ '


@pytest.mark.parametrize(("code", "message"), [
    ('f"Invalid auto wrap policy: {self.auto_wrap_policy}. Must be one of {list(POLICIES.keys())}"',
     "Invalid auto wrap policy: {self.auto_wrap_policy}. Must be one of {list(POLICIES.keys())}"),
    ('raise ValueError(f"Unknown backend {cfg.backend.name}")', "Unknown backend {cfg.backend.name}"),
    ("msg = f'bad dtype {x.dtype}'", "bad dtype {x.dtype}"),
    ('raise ValueError("Invalid value {} for {}".format(v.name, k))', "Invalid value {} for {}"),
    ('raise TypeError("bad %s" % x.name)', "bad %s"),
    # the other quote is text inside the literal
    ("""raise ValueError(f"Invalid wrap policy '{cfg.policy.name}'")""", "Invalid wrap policy '{cfg.policy.name}'"),
    (""""Unknown sharding strategy '{}'".format(s.name)""", "Unknown sharding strategy '{}'"),
    # not a message being worded
    ('print(f"step {i}")', ""),
    ('for name in policies.keys():', ""),
    ('raise ValueError("a plain message")', ""),
    ("", ""),
])
def test_message_being_worded(code, message):
    assert message_being_worded([HEAD + code]) == message


def test_a_line_that_raises_the_exception_itself_delivered_its_message():
    code = 'raise KeyError(f"Unknown scheduler {name}")'
    assert message_being_worded([HEAD + code], "KeyError") == ""
    assert message_being_worded([HEAD + code], "builtins.KeyError") == ""
    assert message_being_worded([HEAD + code], "AttributeError") == "Unknown scheduler {name}"


_LOG = """\
Traceback (most recent call last):
  File "/home/u/train.py", line 131, in main
    accelerator = Accelerator(
  File "/env/lib/python3.11/site-packages/accelerate/accelerator.py", line 350, in __init__
    fsdp_plugin = FullyShardedDataParallelPlugin()
  File "/env/lib/python3.11/site-packages/accelerate/utils/dataclasses.py", line 1683, in __post_init__
    {code}
AttributeError: 'list' object has no attribute 'keys'
"""


def test_a_refusal_of_an_fsdp_setting_that_failed_in_its_wording_is_the_fsdp_setting():
    code = 'f"Invalid auto wrap policy: {self.auto_wrap_policy}. Must be one of {list(FSDP_AUTO_WRAP_POLICY.keys())}"'
    root = match_text(_LOG.replace("{code}", code), CATALOGUE).root
    assert root is not None and root.category == "fsdp_config" and "IF293" in root.basis_detail


def test_the_same_exception_outside_a_message_keeps_its_reading():
    root = match_text(_LOG.replace("{code}", "names = list(self.policies.keys())"), CATALOGUE).root
    assert root is not None and "IF293" not in root.basis_detail and "IF294" not in root.basis_detail


@pytest.mark.parametrize("code", [
    '"' + "{}" * 50_000,  # a literal never closed: one regex over it backtracked once per placeholder (200 s)
    '"' + "%s" * 50_000 + '" + x',
    "f'" + "{" * 100_000,
    "x" * 100_000,
    " " * 100_000,
])
def test_a_100_kb_source_line_is_read_in_one_pass(code):
    # a hang guard, not a speed measurement: the backtracking reading took 200 s on the first of these
    with _no_hang(seconds=20):
        message_being_worded([HEAD + code])


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _no_hang(seconds: int):
    """Fail instead of hanging: SIGALRM after ``seconds`` (far above the linear reading's milliseconds)."""
    def _alarm(_sig, _frame):
        raise _Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
