"""Phase 1 over several processes (``--jobs``): newline-aligned chunks of one mapped source, scanned by forked
workers, results yielded in input order so that phase 2 (in the parent) sees exactly what a serial scan sees."""

from __future__ import annotations

import mmap
import multiprocessing
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from diagnose.pool_worker import quiet_worker_signals

if TYPE_CHECKING:
    from diagnose.match.anchors import Phase1

CHUNK_BYTES = 32 << 20

# Set in the parent just before the pool forks; workers read them (a mapped file cannot be pickled, it is shared).
_BUFFER = None
_PHASE1 = None
_WINDOW = 1 << 20
_COUNT = None


def chunks(buf, size: int | None = None, first: int = 0) -> list[tuple[int, int]]:
    size = size or CHUNK_BYTES  # read when called: a test's smaller CHUNK_BYTES must reach results()
    total = len(buf)
    out, start = [], first
    while start < total:
        end = min(start + size, total)
        if end < total:
            nl = buf.find(b"\n", end)
            end = total if nl == -1 else nl + 1
        out.append((start, end))
        start = end
    return out


def _scan_chunk(bounds: tuple[int, int]):
    from diagnose.ingest.sources import release_pages
    from diagnose.match.anchors import windows
    from diagnose.match.engine import _bytes_count, scan_window

    start, end = bounds
    out = []
    released = start - start % mmap.PAGESIZE
    for offset, w in windows(_BUFFER, _WINDOW, start, end):
        out.append(scan_window(cast("Phase1", _PHASE1), offset, w, _COUNT or _bytes_count))  # set by the pool
        released = release_pages(_BUFFER, released, offset + len(w))
    return out


def results(buf, phase1, window_size: int, jobs: int, count=None, first: int = 0) -> Iterator:
    """WindowResults of ``buf`` from offset ``first`` (a line start, or the end of a hole at its head) in order,
    computed by ``jobs`` forked workers (serially if fork is unavailable)."""
    global _BUFFER, _PHASE1, _WINDOW, _COUNT
    parts = chunks(buf, first=first)
    try:
        ctx = multiprocessing.get_context("fork")
    except ValueError:  # pragma: no cover - no fork on this platform
        ctx = None
    _BUFFER, _PHASE1, _WINDOW, _COUNT = buf, phase1, window_size, count
    try:
        if ctx is None or len(parts) < 2:
            for p in parts:
                yield from _scan_chunk(p)
            return
        # -j 100000 forked 100,000 workers for 2 chunks
        with ctx.Pool(min(jobs, len(parts)), initializer=quiet_worker_signals) as pool:
            for chunk_results in pool.imap(_scan_chunk, parts):
                yield from chunk_results
            pool.close()  # every chunk is in: let the workers end, rather than the SIGTERM ``with`` ends with
            pool.join()
    finally:
        _BUFFER = _PHASE1 = _COUNT = None
