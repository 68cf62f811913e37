"""Python 3.11+ exception groups: margins peeled by normalize_line, the tree rebuilt by tracebacks.rebuild.

Most inputs are printed live by a Python >= 3.11 interpreter found on the machine (the tests skip when there is
none); GROUP_WIDTH_AND_NESTING is a copy of such a printout, so the structure is also checked under Python 3.10.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from diagnose.match import load_catalogue, match_text
from diagnose.normalize import normalize_line
from diagnose.normalize.tracebacks import rebuild, traceback_ending_at


def _python311() -> str | None:
    if sys.version_info >= (3, 11):
        return sys.executable
    for name in ("python3.13", "python3.12", "python3.11"):
        found = shutil.which(name)
        if found:
            probe = subprocess.run([found, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                                   capture_output=True, text=True, timeout=60)
            if probe.returncode == 0 and probe.stdout.strip() == "True":
                return found
    return None


PYTHON = _python311()
needs_311 = pytest.mark.skipif(PYTHON is None, reason="no Python >= 3.11 on this machine to print exception groups")


def _printed(program: str, *args: str) -> str:
    """What the interpreter writes to stderr for an uncaught exception of ``program`` (run isolated, no site).

    The program runs from a file so that the printout has its code lines, as a real job's has."""
    assert PYTHON is not None
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "async_ckpt_writer.py"
        script.write_text(program, encoding="utf-8")
        done = subprocess.run([PYTHON, "-I", "-S", str(script), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    return done.stderr


def _lines(text: str, path: str = "x.log"):
    return [normalize_line(raw, path, i + 1) for i, raw in enumerate(text.split("\n"))]


# The program behind sample_logs/exception_group_oom.log: a checkpoint writer staging shards in an asyncio TaskGroup,
# two shards run out of GPU memory. Without torch (here: -S) the exception class prints as torch.OutOfMemoryError too.
_ASYNC_WRITER = '''\
"""A checkpoint writer that stages shards on the GPU in an asyncio.TaskGroup (Python 3.11+)."""
import asyncio

try:
    from torch import OutOfMemoryError
except ImportError:  # the printed type name is what matters: torch.OutOfMemoryError
    class OutOfMemoryError(RuntimeError):
        pass
    OutOfMemoryError.__module__ = "torch"

OOM = (
    "CUDA out of memory. Tried to allocate {size}. GPU {gpu} has a total capacity of 79.11 GiB of which 1.19 GiB is "
    "free. Including non-PyTorch memory, this process has 77.90 GiB memory in use. Of the allocated memory 74.62 GiB "
    "is allocated by PyTorch, and 1.71 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
    "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


async def stage_shard(index, gpu):
    await asyncio.sleep(0)
    if index in (1, 3):
        raise OutOfMemoryError(OOM.format(size="3.00 GiB" if index == 1 else "1.50 GiB", gpu=gpu))


async def write_shards(count, gpu):
    async with asyncio.TaskGroup() as group:
        for index in range(count):
            group.create_task(stage_shard(index, gpu))


def save_checkpoint(iteration, gpu):
    asyncio.run(write_shards(4, gpu))


if __name__ == "__main__":
    import sys
    save_checkpoint(200, int(sys.argv[1]) if len(sys.argv) > 1 else 0)
'''

# Nested groups, a member with a chained cause, a member raised from a group, max_group_width ("and N more
# exceptions") and max_group_depth cuts, a group that is the context of a later exception, and an add_note line.
_TREE = '''
def deep(n):
    e = ValueError("leaf")
    for i in range(n):
        e = ExceptionGroup(f"level{i}", [e])
    return e

def sub():
    try:
        raise ExceptionGroup("ctx group", [RuntimeError("r1"), MemoryError()])
    except ExceptionGroup as g:
        raise KeyError("after group") from g

def main():
    errs = []
    try:
        sub()
    except KeyError as k:
        k.add_note("note: while writing shard 3")
        errs.append(k)
    errs.append(deep(12))
    errs.extend(OSError(28, f"No space left on device: shard {i}") for i in range(16))
    try:
        raise ExceptionGroup("outer", errs)
    except ExceptionGroup:
        raise SystemError("handler failed")

main()
'''

# Python 3.11.7's printout of: raise BaseExceptionGroup("outer", [ExceptionGroup("inner", [TypeError("t1"),
# OSError(28, ...)]), ValueError("v0") ... ValueError("v19"), KeyboardInterrupt()]) while handling a KeyError.
GROUP_WIDTH_AND_NESTING = """\
Traceback (most recent call last):
  File "/tmp/eg/g2.py", line 6, in f
    raise KeyError("k")
KeyError: 'k'

During handling of the above exception, another exception occurred:

  + Exception Group Traceback (most recent call last):
  |   File "/tmp/eg/g2.py", line 16, in <module>
  |     f()
  |   File "/tmp/eg/g2.py", line 15, in f
  |     raise BaseExceptionGroup("outer", excs + [KeyboardInterrupt()])
  | BaseExceptionGroup: outer (22 sub-exceptions)
  +-+---------------- 1 ----------------
    | Exception Group Traceback (most recent call last):
    |   File "/tmp/eg/g2.py", line 12, in f
    |     inner()
    |   File "/tmp/eg/g2.py", line 3, in inner
    |     raise ExceptionGroup("inner", [TypeError("t1"), OSError(28, "No space left on device")])
    | ExceptionGroup: inner (2 sub-exceptions)
    +-+---------------- 1 ----------------
      | TypeError: t1
      +---------------- 2 ----------------
      | OSError: [Errno 28] No space left on device
      +------------------------------------
""" + "".join(
    f"    +---------------- {i + 2} ----------------\n    | ValueError: v{i}\n" for i in range(14)
) + """\
    +---------------- ... ----------------
    | and 7 more exceptions
    +------------------------------------
"""


# ---------------------------------------------------------------------------------------------- normalize_line


def test_margin_is_peeled_and_its_depth_kept():
    header = normalize_line("[rank3]:   + Exception Group Traceback (most recent call last):")
    assert (header.text, header.group_depth, header.rank) == ("Exception Group Traceback (most recent call last):", 1, 3)
    member = normalize_line(" 7:     | torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert member.text.startswith("torch.OutOfMemoryError: CUDA") and member.group_depth == 2 and member.rank == 7
    frame = normalize_line('    |   File "w.py", line 8, in write_shard')
    assert frame.text == '  File "w.py", line 8, in write_shard' and frame.group_depth == 2
    for blank in ("    | ", "    |"):  # a blank line inside a member, with or without the trailing space
        assert (normalize_line(blank).text, normalize_line(blank).group_depth) == ("", 2)


def test_separators_and_lines_that_only_look_like_margins_are_left_alone():
    for text in ("  +-+---------------- 1 ----------------", "    +------------------------------------",
                 "   | odd indent", "| a | b |", "    + not a group header", "  File \"a.py\", line 1, in f"):
        line = normalize_line(text)
        assert line.group_depth == 0 and line.text == text


# ---------------------------------------------------------------------------------------------- rebuild


def _by_type(tbs):
    return {tb.exc_type + ":" + tb.message.split("\n")[0]: tb for tb in tbs}


def test_width_cut_nesting_and_context_chain_from_a_copied_printout():
    tbs = rebuild(_lines(GROUP_WIDTH_AND_NESTING))
    key = next(tb for tb in tbs if tb.exc_type == "KeyError")
    outer = next(tb for tb in tbs if tb.exc_type == "BaseExceptionGroup")
    inner = next(tb for tb in tbs if tb.exc_type == "ExceptionGroup")
    assert outer.is_group and outer.group is None and outer.message.endswith("(22 sub-exceptions)")
    assert outer.cause is key and outer.chain_kind == "context"  # the group was raised while handling the KeyError
    assert [f.function for f in outer.frames] == ["<module>", "f"]
    assert len(outer.exceptions) == 15 and outer.omitted == 7  # 14 ValueErrors printed after the inner group
    assert outer.exceptions[0] is inner and inner.group is outer and inner.group_index == 1
    assert [f.function for f in inner.frames] == ["f", "inner"]
    assert [(m.exc_type, m.message, m.group_index) for m in inner.exceptions] == [
        ("TypeError", "t1", 1), ("OSError", "[Errno 28] No space left on device", 2)]
    assert [m.message for m in outer.exceptions[1:]] == [f"v{i}" for i in range(14)]
    assert outer.exceptions[-1].group_index == 15
    assert inner.exceptions[1].groups == [outer, inner]
    owners = [id(ln) for tb in tbs for ln in tb.lines]
    assert len(owners) == len(set(owners))  # every line in at most one traceback


@needs_311
def test_task_group_members_are_ordinary_exceptions_with_frames():
    tbs = rebuild(_lines(_printed(_ASYNC_WRITER, "3")))
    group = next(tb for tb in tbs if tb.is_group)
    assert group.exc_type == "ExceptionGroup" and group.message.endswith("(2 sub-exceptions)")
    assert group.message.startswith("unhandled errors in a TaskGroup")
    functions = [f.function for f in group.frames]
    assert functions[0] == "<module>" and "save_checkpoint" in functions and functions[-1] == "__aexit__"
    members = group.exceptions
    assert [m.exc_type for m in members] == ["torch.OutOfMemoryError"] * 2
    assert [m.group_index for m in members] == [1, 2]
    assert "Tried to allocate 3.00 GiB. GPU 3 has" in members[0].message
    assert "Tried to allocate 1.50 GiB. GPU 3 has" in members[1].message
    for m in members:
        assert m.group is group and [f.function for f in m.frames] == ["stage_shard"]
        assert m.frames[0].code.startswith("raise OutOfMemoryError(")


@needs_311
def test_nested_chained_and_truncated_groups_printed_live():
    tbs = rebuild(_lines(_printed(_TREE)))
    found = _by_type(tbs)
    outer = found["ExceptionGroup:outer (18 sub-exceptions)"]
    ctx = found["ExceptionGroup:ctx group (2 sub-exceptions)"]
    key = found["KeyError:'after group'"]
    handler = found["SystemError:handler failed"]
    assert handler.cause is outer and handler.chain_kind == "context"  # the whole group, not one of its members
    assert key.cause is ctx and key.chain_kind == "cause"  # raise ... from a group, inside a member
    assert key.message.splitlines()[1] == "note: while writing shard 3"
    assert outer.exceptions[0] is key and key.group is outer and ctx.group is outer
    assert [m.exc_type for m in ctx.exceptions] == ["RuntimeError", "MemoryError"]
    assert outer.omitted == 3  # 18 members, 15 printed (max_group_width)
    assert [m.message for m in outer.exceptions[2:]] == [
        f"[Errno 28] No space left on device: shard {i}" for i in range(13)]
    level = outer.exceptions[1]
    depth = 0
    while level.exceptions:
        level, depth = level.exceptions[0], depth + 1
    assert level.is_group and level.omitted == 1  # "... (max_group_depth is 10)" stands for the rest
    assert depth >= 7


@needs_311
def test_interleaved_rank_prefixed_groups_are_rebuilt_per_rank():
    r3 = _printed(_ASYNC_WRITER, "3").splitlines()
    r5 = _printed(_ASYNC_WRITER, "5").splitlines()
    mixed = [f"[rank{rank}]: {line}" for pair in itertools.zip_longest(r3, r5)
             for rank, line in zip((3, 5), pair) if line is not None]
    tbs = rebuild(_lines("\n".join(mixed)))
    groups = [tb for tb in tbs if tb.is_group]
    assert [g.stream[1:] for g in groups] == [("rank", 3), ("rank", 5)]
    for g, gpu in zip(groups, (3, 5)):
        assert len(g.exceptions) == 2
        for m in g.exceptions:
            assert m.stream == g.stream and f"GPU {gpu} has" in m.message
            assert all(ln.rank == gpu for ln in m.lines)


@needs_311
def test_window_from_the_group_header_finds_the_member_and_its_group():
    lines = _lines(_printed(_ASYNC_WRITER, "0"))
    oom = next(i for i, ln in enumerate(lines) if "Tried to allocate 1.50 GiB" in ln.text)
    tb = traceback_ending_at(lines, oom)
    assert tb is not None and tb.exc_line is lines[oom] and tb.group is not None and tb.group_index == 2
    # a window cut at the member's own header (no group in sight) still gives the member with its frames
    start = max(i for i in range(oom) if lines[i].text.startswith("Traceback"))
    cut = traceback_ending_at(lines[start : oom + 1], oom - start)
    assert cut is not None and cut.exc_type == "torch.OutOfMemoryError" and cut.group is None
    assert [f.function for f in cut.frames] == ["stage_shard"]


@needs_311
def test_rules_find_the_oom_inside_a_group_with_the_groups_frames():
    text = "\n".join(f"[rank2]: {ln}" for ln in _printed(_ASYNC_WRITER, "2").splitlines())
    report = match_text(text, load_catalogue())
    assert report.root is not None and report.root.category == "cuda_oom"
    assert report.root.rule == "OOM107"  # save_checkpoint is in the group's frames, not the member's
    assert report.root.phase == "checkpoint_save" and report.root.ranks == [2]
    assert report.root.count == 2


def test_a_member_printed_without_a_stack_is_matched_by_the_generic_rule():
    text = ("  + Exception Group Traceback (most recent call last):\n"
            '  |   File "job.py", line 3, in <module>\n'
            '  |     raise ExceptionGroup("many", [ValueError(1), TypeError(2)])\n'
            "  | ExceptionGroup: many (2 sub-exceptions)\n"
            "  +-+---------------- 1 ----------------\n"
            "    | ValueError: 1\n"
            "    +---------------- 2 ----------------\n"
            "    | TypeError: 2\n"
            "    +------------------------------------\n")
    group = next(tb for tb in rebuild(_lines(text)) if tb.is_group)
    assert [(m.exc_type, m.message, m.frames) for m in group.exceptions] == [("ValueError", "1", []),
                                                                            ("TypeError", "2", [])]
    report = match_text(text, load_catalogue())
    generic = [f for f in report.findings if f.rule == "PY001"]
    assert sorted(f.facts.get("exc_type") for f in generic) == ["TypeError", "ValueError"]
