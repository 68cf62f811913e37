"""An exception re-raised by torch's ExceptionWrapper reads as the exception it wraps (qa-report-9 L3).

torch/_utils.py's ``ExceptionWrapper.reraise`` re-raises an exception caught in a DataLoader worker, the pin memory
thread, a DataParallel replica or any other background site as one of the same class whose message is::

    Caught {exc_type.__name__} {where}.
    Original Traceback (most recent call last):
      File ...
    {the wrapped exception's own line}

so a log shows ``RuntimeError: Caught RuntimeError in DataLoader worker process 1.`` (the main process's line, which
says only where it happened) and, at the end of the ``Original Traceback`` block, the real exception. When a hit on
the wrapped exception's line follows the wrapper's in the same process stream, the wrapper's hit is dropped: the
wrapped line is the evidence and the finding's exception, its ``wrapped_in`` fact keeps the site
(``in DataLoader worker process 1``) and its phase is the wrapper's (the main process's). A wrapper whose block
has no hit of its own stays as it is.
"""

from __future__ import annotations

import re

from diagnose.match.engine import Hit

WRAPPER = re.compile(r"\bCaught (?P<exc>[A-Za-z_]\w*) (?P<where>in .+?)\.\s*$")
# the wrapped block's last line is read within this many lines of the wrapper (a traceback's frames)
MAX_BLOCK_LINES = 400
# an exception line of any class (by Python's naming): the search for the wrapped line stops at one of another class
_EXC_LINE = re.compile(r"\s*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Iteration)(?::|\s*$)")


def _exc_name(text: str) -> str:
    """The class name an exception line starts with (``pkg.mod.RuntimeError: ...`` -> ``RuntimeError``)."""
    m = re.match(r"\s*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?::|\s*$)", text)
    return m.group(1).rsplit(".", 1)[-1] if m else ""


def unwrap(hits: list[Hit]) -> list[Hit]:
    """``hits`` without each ExceptionWrapper line whose wrapped exception has a hit of its own.

    The wrapped line is the first exception line hit after the wrapper's in the same process stream (the end of its
    ``Original Traceback`` block): a hit of another process, or a later traceback's exception of the same class (a
    chained "During handling of the above exception" one, when the wrapped line had no hit), is never taken, because
    the search stops at the first exception line of any class."""
    by_stream: dict[tuple, list[Hit]] = {}
    for hit in hits:
        by_stream.setdefault((hit.source_index, hit.line.stream), []).append(hit)
    dropped: set[int] = set()
    for stream_hits in by_stream.values():
        stream_hits.sort(key=lambda h: h.line.lineno)
        for i, hit in enumerate(stream_hits):
            m = WRAPPER.search(hit.line.text)
            if m is None:
                continue
            inner = _wrapped_line(stream_hits, i, m.group("exc"))
            if inner is None:
                continue
            dropped.add(id(hit))
            inner.facts.setdefault("wrapped_in", m.group("where"))
            # the phase is the main process's, where the wrapper was raised: the worker's frames (a dataset's
            # __getitem__ called from its own loop) read as set-up on 2 of dev's 14 wrapped logs
            inner.phase = hit.phase
    return [h for h in hits if id(h) not in dropped] if dropped else hits


def _wrapped_line(stream_hits: list[Hit], i: int, exc: str) -> Hit | None:
    """The hit on the wrapped exception's line after ``stream_hits[i]`` (the wrapper's), else None."""
    limit = stream_hits[i].line.lineno + MAX_BLOCK_LINES
    for h in stream_hits[i + 1:]:
        if h.line.lineno > limit:
            return None
        if WRAPPER.search(h.line.text):  # a wrapper nested in the block (a replica's, in a worker's): read past it
            continue
        if _exc_name(h.line.text) == exc:
            return h
        if _EXC_LINE.match(h.line.text):  # another exception ended first: the wrapped line had no hit
            return None
    return None
