"""Signals in the worker processes of a ``multiprocessing.Pool`` (the fleet's scan, the parallel phase 1).

A pool's workers are forked from the command's process, whose SIGTERM handler (present/supervise.py) raises
``Terminated`` so that the command cleans up as for ^C. Inherited by a worker, that handler turned the pool's own
shutdown (``Pool.terminate``, which SIGTERMs its workers; a ``with Pool`` block ends with it) into an exception in
the middle of whatever the worker was doing: a stray ``diagnose.present.supervise.Terminated`` line, and a worker
stopped inside a pipe write can leave the pool's result thread waiting for the rest of a message (a fleet scan hung
in CI until its 300 s timeout). Workers take SIGTERM's default (die at once, as the pool expects) and ignore SIGINT
(a terminal's ^C reaches the whole process group: the parent stops the pool).
"""

from __future__ import annotations

import contextlib
import signal


def quiet_worker_signals() -> None:
    """A pool's ``initializer``: SIGTERM ends the worker at once, SIGINT is the parent's to handle."""
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
