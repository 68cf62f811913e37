"""Capture specs without per-line cost: phase markers and blocks (config dumps...) found by byte search per window.

Capture anchors are in the phase-1 database, so the scan knows which of them occur in each window; a window where
an anchor does not occur costs nothing. Where it occurs, only the occurrences a keep policy needs are verified
(normalised, anchor and regex checked): the first one from the front, the last one from the back. A marker line
repeated on every rank every iteration is therefore never processed line by line.

Known limit: an anchor split by an ANSI escape in the raw line is not seen by a capture (rules do see it).
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from diagnose.match.anchors import capture_locator
from diagnose.match.compiled import CompiledCapture
from diagnose.model import Block, LogLine
from diagnose.normalize import decode, normalize_line

CHECKPOINT_BYTES = 1 << 20


class LineIndex:
    """Line number of any byte offset of one source, from newline counts recorded every ~1 MiB during the scan.

    The last offset counted is remembered too, so offsets asked in ascending order (a capture's kept lines) count
    only the bytes between them, not each from its checkpoint again."""

    def __init__(self, buffer):
        self.buffer = buffer
        self.offsets = array("q", [0])
        self.newlines = array("q", [0])  # newlines before offsets[i]
        self.counted = (0, 0)  # (offset, newlines before it) of the last count

    def add(self, offset: int, newlines_before: int) -> None:
        if offset > self.offsets[-1]:
            self.offsets.append(offset)
            self.newlines.append(newlines_before)

    def lineno(self, offset: int) -> int:
        i = bisect.bisect_right(self.offsets, offset) - 1
        base, before = self.offsets[i], self.newlines[i]
        last, last_before = self.counted
        if base < last <= offset:  # nearer than the checkpoint
            base, before = last, last_before
        before += bytes(self.buffer[base:offset]).count(b"\n")
        self.counted = (offset, before)
        return before + 1


VERIFIED_LINES_KEPT = 4096  # per window: lines whose normalised form later captures reuse (memory stays bounded)


@dataclass(slots=True)
class Occurrence:
    source_index: int
    start: int  # byte offset of the line in its source
    _line: LogLine
    index: LineIndex | None = None  # set while the line number is still to be counted

    @property
    def line(self) -> LogLine:
        """The line, its number counted on first use (most occurrences are replaced before anyone asks)."""
        if self.index is not None:
            self._line.lineno = self.index.lineno(self.start)
            self.index = None
        return self._line

    def count_line(self) -> Occurrence:
        """Count the line number now: for an occurrence that is kept for good, while its window is still in memory.
        Counted later (``materialise``, after the scan released the window's mapped pages), every kept line's count
        maps its stretch of the file back in: 256 loss lines spread over the first 28 MiB of a log kept 28 MiB of
        it resident to the end."""
        _ = self.line
        return self


class WindowView:
    """One window ``[offset, offset + length)`` of one source's buffer, for verifying capture occurrences in it.

    Positions given to and returned by the methods are relative to the window; the bytes are read from the
    source's buffer (an mmap or bytes) in place, so the window is never copied again.
    """

    # noted by the hundred
    __slots__ = ("_lines", "ascii_only", "buffer", "index", "length", "offset", "path", "source_index")

    def __init__(self, source_index: int, path: str, buffer, offset: int, length: int, index: LineIndex,
                 ascii_only: bool = False):
        self.ascii_only = ascii_only  # the window is pure ASCII: byte regexes agree with text regexes on it
        self.source_index = source_index
        self.path = path
        self.buffer = buffer
        self.offset = offset
        self.length = length
        self.index = index
        # line start -> [raw text, normalised line or None]: the captures whose anchors a line holds each verify it
        # (a tqdm bar is a candidate of every bar marker), and normalising it is most of a verification's cost
        self._lines: dict[int, list] = {}

    def forget_lines(self) -> None:
        """Drop the lines kept for the captures' verifications: done with this window for now (a deferred capture's
        windows are kept to the end of the scan; their lines must not be)."""
        self._lines = {}

    def _bounds(self, pos: int) -> tuple[int, int]:
        base, buf = self.offset, self.buffer
        start = buf.rfind(b"\n", base, base + pos) + 1
        start = max(start, base)
        end = buf.find(b"\n", base + pos, base + self.length)
        return start - base, (end if end != -1 else base + self.length) - base

    def verify(self, cc: CompiledCapture, pos: int) -> tuple[int, int, Occurrence | None]:
        """(line start, line end, the occurrence if the line at ``pos`` qualifies), relative to the window."""
        s, e = self._bounds(pos)
        seen = self._lines.get(s)
        if seen is None:
            seen = [decode(self.buffer[self.offset + s : self.offset + e]), None]
            if len(self._lines) < VERIFIED_LINES_KEPT:
                self._lines[s] = seen
        raw = seen[0]
        if not cc.may_accept_raw(raw):
            return s, e, None
        ll = seen[1]
        if ll is None:
            ll = seen[1] = normalize_line(raw, self.path, 0)
        if not cc.accepts(ll.text):
            return s, e, None
        return s, e, Occurrence(self.source_index, self.offset + s, ll, self.index)

    def _positions(self, cc: CompiledCapture, lo: int, hi: int):
        """Start offsets (relative) of the lines in ``[lo, hi)`` holding the anchor, minus those whose bytes fail
        the capture's single-line byte regex (only in an ASCII window, where bytes and text agree)."""
        base, buf = self.offset, self.buffer
        if self.ascii_only and cc.spec.regex:
            locator = capture_locator(cc.literal, cc.spec.regex)
            if locator is not None:  # Hyperscan: lines where anchor and regex can match, at C speed
                starts: set[int] = set()
                locator.lines(bytes(buf[base + lo : base + hi]), True, starts)
                for s in sorted(starts):
                    yield lo + s
                return
        rx = cc.window_rx if self.ascii_only else None
        lit = cc.literal
        end = base + hi
        pos = buf.find(lit, base + lo, end)
        while pos != -1:
            ls = max(buf.rfind(b"\n", base, pos) + 1, base)
            nl = buf.find(b"\n", pos, base + self.length)
            le = nl if nl != -1 else base + self.length
            if rx is None or rx.search(buf, ls, le) is not None:
                yield pos - base
            if nl == -1:
                return
            if rx is None and self.ascii_only:
                rx = cc.window_rx  # compiled once the capture has checked enough lines (CompiledCapture)
            pos = buf.find(lit, nl, end)

    def first(self, cc: CompiledCapture, lo: int = 0, hi: int | None = None) -> tuple[int, Occurrence] | None:
        """The first qualifying line whose anchor lies in ``[lo, hi)``, as (end of its line, occurrence)."""
        hi = self.length if hi is None else hi
        done_to = -1
        for pos in self._positions(cc, lo, hi):
            if pos < done_to:
                continue
            _s, e, occ = self.verify(cc, pos)
            if occ is not None:
                return e, occ
            done_to = e
        return None

    def each(self, cc: CompiledCapture):
        """Every qualifying line of the window, in order, from one pass over it (``first`` called again and again
        from each found line's end re-read the rest of the window each time: with a frequent anchor, hundreds of
        copies of the window and of its set of candidate lines)."""
        done_to = -1
        for pos in self._positions(cc, 0, self.length):
            if pos < done_to:
                continue
            _s, e, occ = self.verify(cc, pos)
            done_to = e
            if occ is not None:
                yield occ

    def last(self, cc: CompiledCapture, lo: int = 0, hi: int | None = None) -> Occurrence | None:
        """The last qualifying line whose anchor lies in ``[lo, hi)``."""
        base, buf = self.offset, self.buffer
        hi = self.length if hi is None else hi
        pos = buf.rfind(cc.literal, base + lo, base + hi)
        while pos != -1:
            s, _e, occ = self.verify(cc, pos - base)
            if occ is not None:
                return occ
            if s <= lo:
                return None
            pos = buf.rfind(cc.literal, base + lo, base + s)
        return None


class BlockCollector:
    """Keeps the occurrences each capture's keep policy asks for, across all windows of all sources.

    A deferred capture (``CaptureSpec.deferred``) is not verified during the scan: the windows where its anchor
    occurs are noted, and ``read_deferred`` verifies them when asked, forwards for the earliest occurrences and
    backwards for the last: the same windows, so the same occurrences as verifying them during the scan."""

    def __init__(self, captures: list[CompiledCapture]):
        self.captures = captures
        self.kept: list[list[Occurrence]] = [[] for _ in captures]
        self.last: list[Occurrence | None] = [None] * len(captures)
        self.noted: list[list[WindowView]] = [[] for _ in captures]  # deferred captures: windows holding the anchor

    def window(self, view: WindowView, present: list[int]) -> None:
        for ci in present:
            cc = self.captures[ci]
            if cc.spec.deferred:
                self.noted[ci].append(view)
                continue
            if cc.spec.keep in ("last", "first_last"):
                occ = view.last(cc)
                if occ is not None:
                    self.last[ci] = occ
            if cc.spec.keep != "last":
                self._earliest(ci, view)
        view.forget_lines()

    def _earliest(self, ci: int, view: WindowView) -> bool:
        """Keep the window's occurrences that the earliest ones still lack; True once no more are wanted."""
        cc, kept = self.captures[ci], self.kept[ci]
        if cc.spec.keep == "all":
            if len(kept) < cc.spec.max_blocks:
                for occ in view.each(cc):
                    kept.append(occ.count_line())
                    if len(kept) >= cc.spec.max_blocks:
                        break
            return len(kept) >= cc.spec.max_blocks
        if not kept:  # first, first_last (and anything unknown: first)
            found = view.first(cc)
            if found is not None:
                kept.append(found[1].count_line())
        return bool(kept)

    def read_deferred(self, done_with: Callable[[WindowView], None]) -> None:
        """Verify the deferred captures on the windows noted for them, calling ``done_with`` on each window read
        (the scan released its mapped pages; they are released again)."""
        for ci, views in enumerate(self.noted):
            cc = self.captures[ci]
            if cc.spec.keep in ("last", "first_last"):
                for view in reversed(views):
                    occ = view.last(cc)
                    if occ is not None:
                        self.last[ci] = occ.count_line()
                    view.forget_lines()
                    done_with(view)
                    if occ is not None:
                        break
            if cc.spec.keep != "last":
                for view in views:
                    enough = self._earliest(ci, view)
                    view.forget_lines()
                    done_with(view)
                    if enough:
                        break
            self.noted[ci] = []

    def occurrences(self, ci: int) -> list[Occurrence]:
        kept = list(self.kept[ci])
        last = self.last[ci]
        keep = self.captures[ci].spec.keep
        if keep == "last":
            return [last] if last is not None else []
        if keep == "first_last" and last is not None and (
            not kept or (kept[0].source_index, kept[0].start) != (last.source_index, last.start)
        ):
            kept.append(last)
        return kept


class MarkerTracker:
    """The latest phase marker of each kind before a position, for ``phase = "auto"`` rules.

    Within a window, each query searches only the bytes between the previous query and this one, backwards, so a
    window is searched at most once per marker anchor that occurs in it.
    """

    def __init__(self, captures: list[CompiledCapture], phase_ids: list[int]):
        self.captures = captures
        self.phase_ids = phase_ids
        self.latest: dict[tuple[int, int], Occurrence] = {}  # (source, capture) -> latest marker seen
        self.view: WindowView | None = None
        self.present: list[int] = []
        self.searched = 0

    def begin(self, view: WindowView, present: list[int]) -> None:
        self.view = view
        self.present = [ci for ci in present if ci in self.phase_ids]
        self.searched = 0

    def _advance(self, upto: int) -> None:
        view = self.view
        if view is None or upto <= self.searched:
            return
        for ci in self.present:
            occ = view.last(self.captures[ci], self.searched, upto)
            if occ is not None:
                self.latest[(view.source_index, ci)] = occ
        self.searched = upto

    def markers_before(self, pos_in_window: int) -> list[tuple[str, LogLine]]:
        self._advance(pos_in_window)
        view = self.view
        si = view.source_index if view is not None else -1
        latest = sorted(self.latest.items(), key=lambda kv: kv[1].start)
        return [(self.captures[ci].spec.name, occ.line) for (s, ci), occ in latest if s == si]

    def end(self) -> None:
        if self.view is not None:
            self._advance(self.view.length)
        self.view = None


def materialise(collector: BlockCollector, readers: list, deferred: bool = False) -> dict[str, list[Block]]:
    """Blocks from the kept occurrences: the anchor line plus following lines of the same stream (of the captures
    read during the scan, or with ``deferred`` of the deferred ones)."""
    blocks: dict[str, list[Block]] = {}
    for ci, cc in enumerate(collector.captures):
        spec = cc.spec
        if spec.deferred != deferred:
            continue
        out = blocks.setdefault(spec.name, [])
        for occ in collector.occurrences(ci):
            reader = readers[occ.source_index]
            lines = [occ.line]
            if spec.lines_after > 0:
                stream = occ.line.stream
                budget = max(spec.lines_after * 64, 1024)
                for _s, nxt in reader.forwards(occ.start, occ.line.lineno, budget, 16 << 20):
                    if nxt.stream != stream:
                        continue
                    lines.append(nxt)
                    if (spec.until and spec.until in nxt.text) or len(lines) > spec.lines_after:
                        break
            out.append(Block(spec.name, reader.path, occ.line.lineno, lines))
    return blocks
