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


def _exc_name(text: str) -> str:
    """The class name an exception line starts with (``pkg.mod.RuntimeError: ...`` -> ``RuntimeError``)."""
    m = re.match(r"\s*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?::|\s*$)", text)
    return m.group(1).rsplit(".", 1)[-1] if m else ""


def unwrap(hits: list[Hit]) -> list[Hit]:
    """``hits`` without each ExceptionWrapper line whose wrapped exception has a hit of its own."""
    dropped: set[int] = set()
    for i, hit in enumerate(hits):
        m = WRAPPER.search(hit.line.text)
        if m is None:
            continue
        stream, lineno = hit.line.stream, hit.line.lineno
        inner = next((h for h in hits[i + 1:] if h.source_index == hit.source_index and h.line.stream == stream
                      and lineno < h.line.lineno <= lineno + MAX_BLOCK_LINES
                      and _exc_name(h.line.text) == m.group("exc") and not WRAPPER.search(h.line.text)), None)
        if inner is None:
            continue
        dropped.add(id(hit))
        inner.facts.setdefault("wrapped_in", m.group("where"))
        # the phase is the main process's, where the wrapper was raised: the worker's frames (a dataset's
        # __getitem__ called from its own loop) read as set-up on 2 of dev's 14 wrapped logs
        inner.phase = hit.phase
    return [h for h in hits if id(h) not in dropped] if dropped else hits
