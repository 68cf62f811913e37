"""What the matcher reads from the normalize stage: the frames of the traceback that ends at a line.

Frames are matched by ``frames_any``/``frames_none`` and give a failure its phase. Python frames keep their log line
(a matched frame is shown as evidence with its line number); C++ frames are plain text (line number 0).
"""

from __future__ import annotations

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
        for fr in t.frames:
            text = fr.text
            if fr.log_line is not None:
                out.append(LogLine(path=fr.log_line.path, lineno=fr.log_line.lineno, raw=fr.log_line.raw, text=text))
            else:
                out.append(LogLine(path=path, lineno=0, raw=text, text=text))
        for cpp in t.cpp_frames:
            out.append(LogLine(path=path, lineno=0, raw=cpp, text=cpp))
    return out
