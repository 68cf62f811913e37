"""What the matcher reads from the normalize stage: the frames of the traceback that ends at a line.

Frames are matched by ``frames_any``/``frames_none`` and give a failure its phase. Python frames keep their log line
(a matched frame is shown as evidence with its line number); C++ frames are plain text (line number 0).
"""

from __future__ import annotations

import re

from diagnose.model import LogLine
from diagnose.normalize.tracebacks import Traceback, traceback_ending_at


def traceback_frames(lines: list[LogLine]) -> list[LogLine]:
    """The frame lines of the traceback that ends at ``lines[-1]`` (``lines``: one stream, oldest first), with those
    of the exception groups it was raised inside (where it surfaced) and of its chained causes; [] when the line is
    not part of a traceback."""
    tb = traceback_ending_at(lines, len(lines) - 1)
    return [] if tb is None else _frames_of(tb, lines[-1].path)


def _frames_of(tb: Traceback, path: str) -> list[LogLine]:
    out: list[LogLine] = []
    for t in [*tb.groups, *tb.chain, tb]:
        out.extend(LogLine(path=fr.log_line.path, lineno=fr.log_line.lineno, raw=fr.log_line.raw, text=fr.text)
                   for fr in t.frames)
        out.extend(LogLine(path=path, lineno=0, raw=cpp, text=cpp) for cpp in t.cpp_frames)
    return out


# faulthandler's dump after "Fatal Python error: Segmentation fault" (Python's own format, most recent call FIRST):
#     Current thread 0x00007f40... (most recent call first):
#       File "/usr/lib/python3.12/site-packages/torch/serialization.py", line 1268 in _save
_FAULT_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ (?:\[[^\]]*\] )?\(most recent call first\):\s*$")
_FAULT_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>\S+)\s*$')
FAULT_HEADER_LINES = 4  # blank lines / the thread header may follow the error line after a line or two


def faulthandler_frames(after: list[LogLine]) -> list[LogLine]:
    """The crashing thread's Python frames that faulthandler printed after a ``Fatal Python error`` line (``after``:
    the next lines of the same stream), innermost last and written like a traceback's frames (``File "x", line N,
    in f``) so that frame rules, the inferred category and the phase read them as they read a traceback; [] when no
    dump follows. Only the "Current thread" block (the one that crashed) is kept when several threads are dumped."""
    frames: list[LogLine] = []
    started = False
    for i, ll in enumerate(after):
        text = ll.text
        if not started:
            if _FAULT_THREAD.match(text.strip()) and text.strip().startswith("Current thread"):
                started = True
            elif text.strip() and i >= FAULT_HEADER_LINES:
                return []
            continue
        m = _FAULT_FRAME.match(text)
        if m is None:
            break
        shown = f'  File "{m.group("file")}", line {m.group("line")}, in {m.group("func")}'
        frames.append(LogLine(path=ll.path, lineno=ll.lineno, raw=ll.raw, text=shown))
    frames.reverse()
    return frames
