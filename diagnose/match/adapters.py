"""Calls into the normalize stage (tracebacks, fact parsers, phases), tolerant of what is not there yet.

The matcher needs three things from ``diagnose.normalize``: the Python traceback that ends at a line (for
``frames_any``/``frames_none`` and the phase), a rule's fact parser, and the phase a line belongs to. They are
imported lazily, once; when a module or name is missing the matcher falls back to a small built-in reading (frames
are the ``File "..."`` / ``frame #N`` lines of the same stream above the line) so matching never breaks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from diagnose.model import LogLine

_HEADER = "Traceback (most recent call last)"


def _module(name: str):
    """The module, or None when it cannot be imported (a failure is not remembered: it may be fixed later)."""
    try:
        return importlib.import_module(name)  # cached by Python after the first success
    except Exception:  # noqa: BLE001 - a stage still being written, or broken: fall back
        return None


def _attr(module: str, name: str):
    mod = _module(module)
    return getattr(mod, name, None) if mod is not None else None


def is_frame_text(text: str) -> bool:
    s = text.lstrip()
    return s.startswith('File "') or s.startswith("frame #")


def traceback_frames(lines: list[LogLine]) -> list[LogLine]:
    """The frame lines of the traceback that ends at ``lines[-1]`` (``lines``: one stream, oldest first)."""
    ending_at = _attr("diagnose.normalize.tracebacks", "traceback_ending_at")
    if ending_at is not None:
        try:
            tb = ending_at(lines, len(lines) - 1)
        except Exception:  # noqa: BLE001
            tb = None
        if tb is None:
            return []  # the line is not part of a traceback
        frames = _frames_of(tb, lines)
        if frames is not None:
            return frames
    return _fallback_frames(lines)


def _frames_of(tb: Any, lines: list[LogLine]) -> list[LogLine] | None:
    """Frame lines of a normalize Traceback (and of its enclosing exception groups and chained causes), oldest first.

    Python frames keep their log line (so a matched frame can be shown as evidence with its line number); C++
    frames are plain text (line number 0).
    """
    if getattr(tb, "frames", None) is None:
        return None
    # the exception groups it was raised inside (their frames say where it surfaced), then its own chain
    chain = list(getattr(tb, "groups", []) or []) + list(getattr(tb, "chain", []) or []) + [tb]
    path = lines[-1].path
    out: list[LogLine] = []
    for t in chain:
        for fr in getattr(t, "frames", []) or []:
            log_line = getattr(fr, "log_line", None)
            text = getattr(fr, "text", None) or str(fr)
            if isinstance(log_line, LogLine):
                out.append(LogLine(path=log_line.path, lineno=log_line.lineno, raw=log_line.raw, text=text))
            else:
                out.append(LogLine(path=path, lineno=0, raw=text, text=text))
        for cpp in getattr(t, "cpp_frames", []) or []:
            out.append(LogLine(path=path, lineno=0, raw=str(cpp), text=str(cpp)))
    return out


def _fallback_frames(lines: list[LogLine]) -> list[LogLine]:
    frames: list[LogLine] = []
    for ln in reversed(lines[:-1]):
        t = ln.text
        if is_frame_text(t):
            frames.append(ln)
        elif t.startswith(_HEADER):
            break
    frames.reverse()
    return frames


def parser(name: str) -> Callable[..., Any] | None:
    parsers = _attr("diagnose.normalize.facts", "PARSERS")
    if isinstance(parsers, dict):
        return parsers.get(name)
    return None


def run_parser(name: str, line: LogLine, context: list[LogLine] | None = None) -> dict[str, Any]:
    """Facts from a rule's parser: ``parser(line, context)`` where context is the same stream's following lines."""
    fn = parser(name)
    if fn is None:
        return {}
    try:
        out = fn(line, list(context or []))
    except Exception:  # noqa: BLE001 - a parser must never break matching
        return {}
    return dict(out) if isinstance(out, dict) else {}


def phase_of(line: LogLine, frames: list[LogLine], markers: list[tuple[str, LogLine]]) -> str:
    """The phase of an error line: from its frames first, else from the last phase marker seen before it."""
    fn = _attr("diagnose.normalize.phases", "phase_of")
    if fn is not None:
        try:
            phase = fn(line=line, frames=[f.text for f in frames], markers=markers)
        except TypeError:
            phase = None
        except Exception:  # noqa: BLE001
            phase = None
        if isinstance(phase, str) and phase:
            return phase
    return "unknown"


def phase_capture_names() -> set[str]:
    captures = _attr("diagnose.normalize.phases", "CAPTURES") or []
    return {getattr(c, "name", "") for c in captures}
