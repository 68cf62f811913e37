"""The rank facet of the log view: the lines one rank wrote, found in a background thread.

A line's rank is what ``normalize_line`` reads from its prefixes (``[rank3]:``, ``[host:3]:``, srun ``3: ``), or
the local rank of a ``[default3]:`` prefix when no global rank is given (one node). Lines without a rank prefix
are not part of any rank's facet. No Textual import.

On a 1 GiB log (11.5 M lines) the scan takes a while, so it starts a little above the line the user is on and
runs to the end, then does the lines above: the user's place fills first. Rows found are published to the view
by ``publish()`` on the UI thread only, so the view never reads an array another thread is changing.
"""

from __future__ import annotations

import bisect
import re
import threading
import time
from array import array

from diagnose.normalize import decode, normalize_line
from diagnose.present.tui.logindex import FOLLOW_POLL_S, YIELD_S, LogIndex

PREFIX_BYTES = 256  # a rank prefix is at the start of a line: decode only this much
LEAD_LINES = 2000  # the scan starts this many lines above the user's place: the screen above it fills too
FIRST_BATCH_LINES = 1024  # the first batches are small (the user's screen comes first), then grow to BATCH_LINES
BATCH_LINES = 16384
BATCH_BYTES = 8 << 20

# torch's "[rank3]: " prefix, the common case on a big log, read from the bytes when nothing after it can change
# the rank: after it, ``_peel_prefixes`` only goes on to a layer that sets a rank through one starting with "[",
# "(" (Ray), a digit (a timestamp) or I/W/E/F (glog); spaces lead only to srun's label (ignored after a rank) or
# to "[" (logging). A \r or an escape sequence can rewrite the line first: those lines take the slow path.
_TORCH_RANK = re.compile(rb"\[rank(\d{1,9})\]: ")
_MAY_GO_ON = frozenset(b"[(0123456789IWEF")
_MAX_LAYERS = 7  # one fewer than normalize's: an eighth "[rankN]: " goes to normalize, which stops peeling there


def rank_of_line(raw: str) -> int | None:
    line = normalize_line(raw)
    return line.rank if line.rank is not None else line.local_rank


def rank_of_bytes(raw: bytes) -> int | None:
    """``rank_of_line`` of a line's bytes (its first ``PREFIX_BYTES``, a trailing ``\\r`` dropped): the same
    answer, faster on ``[rankN]: `` lines (one or several: the last one wins, as in ``normalize_line``)."""
    head = raw[:PREFIX_BYTES]
    if head.endswith(b"\r"):
        head = head[:-1]
    rank = None
    end = 0
    for _ in range(_MAX_LAYERS):
        m = _TORCH_RANK.match(head, end)
        if m is None:
            break
        rank, end = m.group(1), m.end()
    else:
        rank = None  # as many layers as normalize peels at most: let it decide
    if rank is not None and b"\r" not in head and b"\x1b" not in head and b"\x9b" not in head:
        if end >= len(head):
            return int(rank)
        if head[end] == 0x20:  # spaces: only a "[" after them goes on
            rest = head[end:].lstrip(b" ")
            if not rest or rest[0] != 0x5B:
                return int(rank)
        elif head[end] not in _MAY_GO_ON:
            return int(rank)
    return rank_of_line(decode(head))


class RankFacet:
    """Rows (0-based line numbers, in order) of ``index`` written by ``rank``; grows while ``done`` is not set.

    ``around``: the line the user is on; the scan starts ``LEAD_LINES`` above it (the *split*), reads to the
    end, then reads the lines above the split. ``rows`` holds what ``publish()`` moved in so far.
    """

    def __init__(self, index: LogIndex, rank: int, around: int = 0) -> None:
        self.index = index
        self.rank = rank
        self.split = max(0, min(around, index.line_count) - LEAD_LINES)
        self.rows = array("q")
        self._head_rows = 0  # rows of ``rows`` above the split (published)
        self._found_head = array("q")  # found by the scanner, not yet published (under ``_lock``)
        self._found_tail = array("q")
        self._lock = threading.Lock()
        self.tail_scanned = self.split  # lines [split, tail_scanned) are read
        self.head_scanned = 0  # lines [0, head_scanned) are read (after the tail is done)
        self.done = threading.Event()
        self._stop = False
        self._batch = FIRST_BATCH_LINES
        self._thread = threading.Thread(target=self._scan, name=f"rank-facet:{rank}", daemon=True)

    def start(self) -> RankFacet:
        self._thread.start()
        return self

    # ------------------------------------------------------------------------------------------- scan

    def _scan(self) -> None:
        index = self.index
        try:
            self._read_tail(until_done=True)  # from the split to the end, following the index while it builds
            while self.head_scanned < self.split and not self._stop:
                self.head_scanned = self._scan_batch(self.head_scanned, self.split, above=True)
            while index.following and not self._stop:  # a followed log: the lines appended, as they come
                self._read_tail(until_done=False)
                time.sleep(FOLLOW_POLL_S)
        finally:
            self.done.set()

    def _read_tail(self, until_done: bool) -> None:
        index = self.index
        while not self._stop:
            finished = index.done.is_set()
            available = index.line_count
            while self.tail_scanned < available and not self._stop:
                self.tail_scanned = self._scan_batch(self.tail_scanned, available, above=False)
            if not until_done or (finished and available == index.line_count):
                return
            index.done.wait(0.05)

    def _scan_batch(self, start: int, limit: int, above: bool) -> int:
        """Read lines from ``start`` (at most a batch, before ``limit``; ``above``: of the split); returns the
        next line to read."""
        index = self.index
        first = index.line_span(start)[0]
        end = min(limit, start + self._batch, max(start + 1, index.line_of_offset(first + BATCH_BYTES)))
        self._batch = min(BATCH_LINES, self._batch * 2)
        last = index.line_span(end - 1)[1] - 1  # the newline of the batch's last line (or the end of the file)
        hits = array("q")
        if last - first <= 2 * BATCH_BYTES:
            for n, raw in enumerate(index.read_span(first, last).split(b"\n"), start):
                if rank_of_bytes(raw) == self.rank:
                    hits.append(n)
        else:  # a line of many MB: only its first bytes
            for n in range(start, end):
                if rank_of_bytes(index.line_bytes(n, PREFIX_BYTES)) == self.rank:
                    hits.append(n)
        if hits:
            with self._lock:  # (the array is looked up under the lock: ``publish`` swaps it)
                (self._found_head if above else self._found_tail).extend(hits)
        time.sleep(YIELD_S)  # hand the GIL to the UI between batches: it stays responsive while this runs
        return end

    # -------------------------------------------------------------------------------------- UI thread

    def publish(self) -> int:
        """Move the rows found since the last call into ``rows`` (UI thread). Returns how many were put above
        the split: the rows below it moved down by that much."""
        with self._lock:
            head, tail = self._found_head, self._found_tail
            self._found_head, self._found_tail = array("q"), array("q")
        if tail:
            self.rows.extend(tail)
        if head:
            self.rows[self._head_rows:self._head_rows] = head
            self._head_rows += len(head)
        return len(head)

    @property
    def head_rows(self) -> int:
        """Rows of ``rows`` above the split."""
        return self._head_rows

    def covers(self, line: int) -> bool:
        """Has the scan read ``line`` (so ``rows`` around it are final once published)?"""
        if self.split <= line < self.tail_scanned:
            return True
        return line < self.head_scanned or self.done.is_set()

    @property
    def progress(self) -> float:
        total = max(1, self.index.line_count)
        return min(1.0, (self.tail_scanned - self.split + self.head_scanned) / total)

    def holds(self, line: int) -> bool:
        """Is ``line`` one of this rank's (read now, not from ``rows``: safe from any thread)?"""
        return rank_of_bytes(self.index.line_bytes(line, PREFIX_BYTES)) == self.rank

    def row_of_line(self, line: int) -> int:
        """Row in the facet at or just before 0-based ``line`` (0 if none)."""
        return max(0, bisect.bisect_right(self.rows, line) - 1)

    def stop(self) -> None:
        self._stop = True
