"""The rank facet of the log view: the lines one rank wrote, found in a background thread.

A line's rank is what ``normalize_line`` reads from its prefixes (``[rank3]:``, ``[host:3]:``, srun ``3: ``), or
the local rank of a ``[default3]:`` prefix when no global rank is given (one node). Lines without a rank prefix
are not part of any rank's facet. No Textual import.
"""

from __future__ import annotations

import threading
from array import array

from diagnose.normalize import decode, normalize_line
from diagnose.present.tui.logindex import LogIndex

PREFIX_BYTES = 256  # a rank prefix is at the start of a line: decode only this much


def rank_of_line(raw: str) -> int | None:
    line = normalize_line(raw)
    return line.rank if line.rank is not None else line.local_rank


class RankFacet:
    """Rows (0-based line numbers) of ``index`` written by ``rank``; grows while ``done`` is not set."""

    def __init__(self, index: LogIndex, rank: int) -> None:
        self.index = index
        self.rank = rank
        self.rows = array("q")
        self.scanned = 0
        self.done = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._scan, name=f"rank-facet:{rank}", daemon=True)

    def start(self) -> RankFacet:
        self._thread.start()
        return self

    def _scan(self) -> None:
        index = self.index
        try:
            while not self._stop:
                available = index.line_count
                finished = index.done.is_set()
                batch = array("q")
                for row in range(self.scanned, available):
                    if rank_of_line(decode(index.line_bytes(row, PREFIX_BYTES))) == self.rank:
                        batch.append(row)
                    if len(batch) >= 4096:
                        self.rows.extend(batch)
                        batch = array("q")
                    if self._stop:
                        return
                self.rows.extend(batch)
                self.scanned = available
                if finished and available == index.line_count:
                    return
                index.done.wait(0.05)
        finally:
            self.done.set()

    def row_of_line(self, line: int) -> int:
        """Row in the facet at or just before 0-based ``line`` (0 if none)."""
        import bisect

        return max(0, bisect.bisect_right(self.rows, line) - 1)

    def stop(self) -> None:
        self._stop = True
