"""Scan sources for rule matches and capture blocks: phase 1 (anchors in raw bytes), phase 2 (candidate lines).

Phase 2 runs only on the lines phase 1 found. For each: decode, ``normalize_line``, the anchors present in the
normalised text, then the regexes of the rules hanging off those anchors in REVERSE catalogue order: the first rule
whose regex and context both pass wins (last match wins). Regex results depend only on the text, so they are
memoised by text: a line repeated on 512 ranks is matched once and counted 512 times. Context (frames, earlier
lines) depends on the position and is checked per line, reading backwards from the buffer with a small cache of
normalised lines.
"""

from __future__ import annotations

import bisect
import mmap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import regex

from diagnose.coerce import as_int
from diagnose.ingest.sources import release_pages
from diagnose.match import parallel
from diagnose.match.anchors import MAX_LINE_BYTES, Phase1, phase1_for, resolve_backend, text_presence, windows
from diagnose.match.captures import CHECKPOINT_BYTES, BlockCollector, LineIndex, MarkerTracker, WindowView, materialise
from diagnose.match.command_line import config_hidden_by_launcher, options_not_typed, pinned_release
from diagnose.match.compiled import REGEX_TIMEOUT_S, Compiled, CompiledPattern, CompiledRule
from diagnose.match.frames import (
    GDB_BACKTRACE_LINES,
    GDB_SIGNAL,
    PYTEST_ERROR,
    PYTEST_REPORT_LINES,
    UCX_BACKTRACE_LINES,
    UCX_SIGNAL,
    caused_frames,
    faulthandler_frames,
    gdb_backtrace_frames,
    ipython_frames,
    pytest_frames,
    traceback_reading,
    ucx_backtrace_frames,
)
from diagnose.match.inference import MAX_FRAMES, raising_package, refused_unlike_listed, release_named_before
from diagnose.match.stack import stack_of_frames
from diagnose.model import Block, InputInfo, LogLine
from diagnose.normalize import decode, normalize_line
from diagnose.normalize.facts import PARSERS
from diagnose.normalize.learned import FATAL, FOLLOWING_LINES, HEADER, LearnedPrefixes
from diagnose.normalize.phases import AFTER_SETUP, phase_reading, progress_before
from diagnose.normalize.phases import CAPTURES as PHASE_CAPTURES

MEMO_MAX = 8192  # distinct normalised texts remembered
LINE_CACHE_MAX = 65536  # normalised lines kept for backward reads
# walks back over one stream (_LineReader.stream_backwards) read the input in blocks indexed by stream: 16 KiB is a
# hundred-odd lines (a walk normalises at most one block past what it needs), 256 blocks cover 4 MiB (the 1 MiB
# look-back and then some) in a few MiB of memory; when full they are dropped (read again: slower, same answer)
STREAM_BLOCK_BYTES = 16 << 10
STREAM_BLOCKS_MAX = 256
TRACEBACK_LOOKBACK_LINES = 4000
TRACEBACK_LOOKBACK_BYTES = 1 << 20
CHAIN_GAP_LINES = 64  # stray lines of the same stream tolerated between a chain phrase and the next header
CHAINED_AFTER_LINES = 800  # lines read after an exception that caused others, for the outer exceptions' frames
TRACEBACK_MARKER_LINES = 2000  # marker lines of other streams examined before walking back anyway
PARSER_CONTEXT_LINES = 30
FOLLOWING_KEPT = 2  # evidence.following: lines after the matched one shown in its evidence
PRECEDING_KEPT = 2  # evidence.preceding: lines before the matched one shown in its evidence (the nearest)
# a line is read, normalised and matched up to MAX_LINE_BYTES (anchors.py): a 300 MB line (a tensor dump, a binary
# blob) took a minute and 620 MiB; no message a rule matches is that long
PARSED_HITS_PER_GROUP = 3  # fact parsers run on the first hits of a group; later hits only count
WINDOW_BYTES = 2 << 20  # measured: 1 MiB 3.3 s, 2 MiB 2.9 s, 4 MiB 2.8 s CPU per GiB; small enough to stay in cache
PARALLEL_MIN_BYTES = 64 << 20
NUMPY_MIN_BYTES = 128 << 20  # from here on newlines are counted with numpy when importable (its import: ~0.07 s)
# phases a failure can be in once the job trained: a "before training" rule yields to the file's own reading of them
_AFTER_TRAINING_STARTED = frozenset({"training", "eval", "checkpoint_save", "optimizer_step", "shutdown"})
TEXT_PRESENCE_MIN_BYTES = 16 << 20  # from here on phase 2 asks a Hyperscan literal database which anchors a text has
PARSER_CONTEXT_BYTES = 256 << 10
BEFORE_STEP_BYTES = 16 << 10  # first chunk read back by a before_any check (doubles up to 4 MiB)
NEAR_END_LINE_BYTES = 4096  # [rule.context] near_end: bytes per line counted at most (see Matcher._near_end)
BEFORE_INCREMENTAL_BYTES = 4 << 20  # a before_any check this close after the previous one searches only the gap

_HEADER = "Traceback (most recent call last)"
MAX_TRACEBACK_ENDS = 20000  # traceback headers of one scan read forwards to their end line (each: a few dozen lines)
TRACEBACK_END_LINES = 4000  # lines of the input read after a header for its end (other streams interleave)
TRACEBACK_END_GAP = 2  # blank lines of the header's stream tolerated inside a traceback
QUOTED_SOURCE_LINES = 8  # lines read back from an indented line that a rule matched, for the frame above it
_FATAL_PYTHON = "Fatal Python error: "
FAULT_DUMP_LINES = 120  # faulthandler prints at most 100 frames per thread
_GROUP_HEADER = "Exception Group Traceback (most recent call last)"
_CHAIN_PHRASES = ("During handling of the above exception", "The above exception was the direct cause")
_CHAIN_BYTES = tuple(p.encode() for p in _CHAIN_PHRASES)
_MASK = regex.compile(r"0x[0-9a-fA-F]+|\d+")


def group_key(code: str, facts: dict[str, str]) -> str:
    """Hits of one rule with the same named groups (numbers and hex masked) are one finding across ranks."""
    parts = [f"{k}={_MASK.sub('#', str(v))[:120]}" for k, v in sorted(facts.items())]
    return code + "|" + "|".join(parts)


@dataclass(slots=True)
class Hit:
    """One line that a rule matched, with what the finding needs from it."""

    rule: CompiledRule
    line: LogLine
    source_index: int
    rank: int | None
    facts: dict[str, Any]
    phase: str
    key: str  # grouping key: rule code + its named groups with numbers masked
    extra_evidence: list[LogLine] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)  # generic and catch-all rules: traceback frames, innermost last
    pattern: int = 1  # which of the rule's patterns matched (1-based)
    release: str = ""  # generic rules: a release of the raising package the log named before the line
    # generic rules: how many of ``frames`` (at their start) belong to the exceptions this one caused (a chain printed
    # after it): the category is read from its own frames first, from all of them when those tell none (findings.py)
    outer_frames: int = 0
    stack: str = ""  # the software stack the frames of the traceback this line ends name (match/stack.py)
    details: list[LogLine] = field(default_factory=list)  # [rule.evidence]: shown under this line
    phase_by_frames: bool = False  # the phase was read from the traceback's frames (rules of phase "auto")


def line_bytes(buf, start: int, end: int) -> bytes:
    """The bytes of the line ``buf[start:end]`` that are read: all of it, or of a line over MAX_LINE_BYTES its head
    and its tail (where a ``\\r``-rewritten progress line ends), joined by `` … ``."""
    if end - start <= MAX_LINE_BYTES:
        return buf[start:end]
    half = MAX_LINE_BYTES // 2
    return buf[start:start + half] + " … ".encode() + buf[end - half:end]


class _LineReader:
    """Reads and normalises lines of one source around a byte offset, with a bounded cache."""

    def __init__(self, buffer, path: str, floor: int = 0):
        self.buffer = buffer
        self.path = path
        self.floor = floor  # the input's head before this is a hole of NULs (Source.head_hole): never searched
        self.cache: dict[int, LogLine] = {}
        # before_any look-backs: (needles, window) -> (line start, its number, number of the line holding the
        # latest needle occurrence before it, or None when there is none within ``window`` lines)
        self.before: dict[tuple, tuple[int, int, int | None]] = {}
        self.releases: dict[str, tuple[int, int, str]] = {}  # inference.release_named_before's per-package memo
        # traceback markers: (bytes searched up to, last occurrence of each marker below that)
        self.markers: tuple[int, list[int]] | None = None
        # not_on_command_line answers: (program, refused options) -> answer (every rank prints the same error)
        self.command_lines: dict[tuple[str, str], bool] = {}
        # pinned_on_command_line answers: option -> (offset asked at, the command line that typed it, or None)
        self.pinned_commands: dict[str, tuple[int, tuple[int, str] | None]] = {}
        # config_hidden_by_launcher answers: (kind, program) -> (offset asked at, the launcher's argv record or None)
        self.launcher_argv: dict[tuple[str, str], tuple[int, tuple[int, str] | None]] = {}
        # after_none / none_anywhere look-ups: needles -> offset of the last occurrence of any of them in the input
        # (-1: none)
        self.after: dict[tuple[str, ...], int] = {}
        # prefixes this input taught (a traceback behind a tag no layer of normalize_line knows): see learn_prefix
        self.learned = LearnedPrefixes()
        # stream_backwards' index: block number -> the lines starting in it read so far (starts, ends, line indexes
        # per stream) and the next line start to read
        self.blocks: dict[int, tuple[list[int], list[int], dict[tuple, list[int]], int]] = {}
        self.block_bytes = STREAM_BLOCK_BYTES
        self.streams: dict[int, tuple] = {}  # stream_of: line start -> its stream

    def line_at(self, start: int, end: int, lineno: int) -> LogLine:
        ll = self.cache.get(start)
        if ll is None:
            if len(self.cache) >= LINE_CACHE_MAX:
                self.cache.clear()
            ll = normalize_line(decode(line_bytes(self.buffer, start, end)), self.path, lineno, self.learned)
            self.cache[start] = ll
        return ll

    def stream_of(self, start: int, end: int, limit: int, whole: bool) -> tuple:
        """The stream of the text from ``start`` to ``end`` (-1: to ``limit``); of a whole line (``whole``: ``start``
        begins a line) normalised once per reader: _stream_has_traceback_before asks it of the same marker lines of
        other ranks from hit after hit (a log dense with distinct failures normalised each again for every hit)."""
        cut = end == -1 or not whole
        if not cut:
            ll = self.cache.get(start)
            if ll is not None and end - start <= MAX_LINE_BYTES:  # read whole, as below
                return ll.stream
            stream = self.streams.get(start)
            if stream is not None:
                return stream
        stream = normalize_line(decode(self.buffer[start : limit if end == -1 else end]), self.path, 0,
                                self.learned).stream
        if not cut:
            if len(self.streams) >= LINE_CACHE_MAX:
                self.streams.clear()
            self.streams[start] = stream
        return stream

    def learn_prefix(self, start: int, ll: LogLine, raw: bytes) -> LogLine:
        """A traceback starts inside the line ``ll`` at ``start``, behind text no known layer peeled: learn that text
        as a prefix of this input when the next lines confirm it (diagnose.normalize.learned); the line as now read."""
        # lazy: the lines ahead are read only for a candidate within the budget (a quoted header, a shape refused
        # already or a spent budget reads none: a log that quotes tracebacks on every line stays a linear scan)
        following = (line.text for _, line in self.forwards(start, ll.lineno, FOLLOWING_LINES, 1 << 16))
        if not self.learned.learn(ll.text, following):
            return ll
        self.cache.clear()  # lines read before were normalised without the new prefix
        self.blocks.clear()  # and their streams with them
        self.streams.clear()
        return normalize_line(decode(raw), self.path, ll.lineno, self.learned)

    def backwards(self, start: int, lineno: int, max_lines: int, max_bytes: int):
        """Yield ``(start, LogLine)`` of the lines before the line at ``start``, nearest first."""
        buf = self.buffer
        floor = max(0, start - max_bytes)
        pos = start
        for _ in range(max_lines):
            if pos <= floor:
                return
            end = pos - 1  # the newline ending the previous line
            nl = buf.rfind(b"\n", floor, end)
            if nl == -1 and floor > 0:
                return
            s = nl + 1
            lineno -= 1
            yield s, self.line_at(s, end, lineno)
            pos = s

    def stream_backwards(self, start: int, lineno: int, stream: tuple, max_lines: int, max_bytes: int):
        """Yield ``(start, LogLine)`` of the lines of ``stream`` that ``backwards`` yields, nearest first.

        The same lines, with the same bounds (``max_lines`` lines of the input, ``max_bytes`` bytes), as filtering
        ``backwards`` by stream, but the lines of other streams are not stepped over one by one: the input is read
        in blocks of ``block_bytes`` whose lines are normalised once and indexed by stream (``_block``). A log
        dense with distinct failures (every dev log end to end) walked 4000 lines of other ranks back from each of
        its thousands of hits: 12 M lines stepped over for 20 MiB, most of the run's time."""
        floor = max(0, start - max_bytes)
        size = self.block_bytes
        j = start // size
        above = 0  # lines of the input between ``start`` and the block being read
        while j >= 0:
            starts, ends, by_stream = self._block(j, start, lineno, above)
            top = bisect.bisect_left(starts, start) if above == 0 else len(starts)  # lines before ``start``
            mine = by_stream.get(stream)
            if mine:
                for i in reversed(mine[:bisect.bisect_left(mine, top)]):
                    k = above + top - i
                    s = starts[i]
                    if k > max_lines or (s <= floor and floor > 0):
                        return
                    yield s, self.line_at(s, ends[i], lineno - k)
            above += top
            if above >= max_lines or (j * size <= floor and floor > 0):
                return
            j -= 1

    def _block(self, j: int, start: int, lineno: int, above: int
               ) -> tuple[list[int], list[int], dict[tuple, list[int]]]:
        """The lines starting in ``[j * block_bytes, (j + 1) * block_bytes)`` and up to ``start`` (the line, numbered
        ``lineno``, a walk starts from: no line after it is read yet; ``above``: lines between it and the block):
        their starts, ends and, per stream, the indexes of its lines, normalised once; a block read up to a walk's
        line is read on by a later walk."""
        size = self.block_bytes
        lo, hi = j * size, min((j + 1) * size, start + 1)
        blk = self.blocks.get(j)
        if blk is None:
            if len(self.blocks) >= STREAM_BLOCKS_MAX:
                self.blocks.clear()
            buf = self.buffer
            s = 0 if lo == 0 else buf.find(b"\n", lo - 1, (j + 1) * size - 1) + 1
            blk = self.blocks[j] = ([], [], {}, s if s > 0 or lo == 0 else (j + 1) * size)
        starts, ends, by_stream, nxt = blk
        if nxt < hi:  # read the lines from ``nxt`` (the next line start, not read yet) to ``hi``
            buf = self.buffer
            total = len(buf)
            first = len(starts)
            s = nxt
            while s < hi and s < total:
                e = buf.find(b"\n", s)
                if e == -1:
                    e = total
                starts.append(s)
                ends.append(e)
                s = e + 1
            # numbered back from the walk's line: ``above`` lines lie between it and the block
            top = bisect.bisect_left(starts, start) if above == 0 else len(starts)
            for i in range(first, len(starts)):
                by_stream.setdefault(self.line_at(starts[i], ends[i], lineno - above - top + i).stream, []).append(i)
            self.blocks[j] = (starts, ends, by_stream, s)
        return starts, ends, by_stream

    def forwards(self, start: int, lineno: int, max_lines: int, max_bytes: int):
        """Yield ``(start, LogLine)`` of the lines after the line at ``start``."""
        buf = self.buffer
        total = len(buf)
        limit = min(total, start + max_bytes)
        nl = buf.find(b"\n", start, limit)
        for _ in range(max_lines):
            if nl == -1 or nl + 1 >= limit:
                return
            s = nl + 1
            nl = buf.find(b"\n", s, limit)
            lineno += 1
            if nl == -1 and limit < total:
                # the line runs past the byte limit: read what is inside it, but do not cache that head under the
                # line's start (a later look-back at the whole line would get the cut one: a frame lost)
                yield s, normalize_line(decode(line_bytes(buf, s, limit)), self.path, lineno, self.learned)
                return
            yield s, self.line_at(s, nl if nl != -1 else limit, lineno)


_TRACEBACK_MARKERS = (b'File "', b"Traceback (most recent call last)")
_HEADER_BYTES = HEADER.encode()
_FATAL_BYTES = FATAL.encode()


def _text_is_part_of_bytes(decoded: str) -> bool:
    """Is the normalised text of this decoded line a part of its raw bytes? Yes unless ANSI escapes were stripped,
    ``\\r`` rewrites collapsed, or bytes shown as ``\\xNN`` (invalid UTF-8, NUL): then an anchor can appear in
    the text that is not in the bytes."""
    return not ("\x1b" in decoded or "\x9b" in decoded or "\\x" in decoded or "\r" in decoded.rstrip("\r"))


def _stream_has_traceback_before(reader: _LineReader, start: int, stream: tuple) -> bool:
    """Is there a frame or traceback header line of ``stream`` within the look-back window before ``start``?

    Found by byte search (C speed), only the marker lines are normalised: a line of a rank that printed no
    traceback (NCCL timeouts on 511 ranks after one rank's OOM) then costs a few searches, not a walk back over
    thousands of other ranks' lines.
    """
    buf = reader.buffer
    floor = max(0, start - TRACEBACK_LOOKBACK_BYTES)
    if buf.find(b"\x1b", floor, start) != -1:
        return True  # a colour escape can split a marker ('Fil\x1b[1me "'), which normalising removes: walk back
    # the latest occurrence of each marker below ``pos``; each is searched again only once it is consumed
    latest = [p if p >= floor else -1 for p in _latest_markers(reader, start)]
    for _ in range(TRACEBACK_MARKER_LINES):
        p = max(latest)
        if p == -1:
            return False
        nl = buf.rfind(b"\n", floor, p)
        ls = max(nl + 1, floor)
        if reader.stream_of(ls, buf.find(b"\n", p, start), start, nl != -1 or floor == 0) == stream:
            return True
        if ls <= floor:
            return False
        latest = [buf.rfind(m, floor, ls) if q >= ls else q for m, q in zip(_TRACEBACK_MARKERS, latest)]
    return True  # too many other ranks' tracebacks to tell cheaply: walk back


def _latest_markers(reader: _LineReader, start: int) -> list[int]:
    """The last occurrence of each traceback marker below ``start``. Calls come in increasing ``start`` order, so
    only the bytes since the previous call are searched: 200k matching lines with no traceback used to search
    1 MiB back each (66 s); now the whole file is searched at most once, and never more than the look-back window
    before ``start`` (an answer below it is one the caller discards)."""
    buf = reader.buffer
    state = reader.markers
    floor = max(0, start - TRACEBACK_LOOKBACK_BYTES)  # the caller looks no further back: neither do we (a
    # first search from byte 0 faulted a whole 1.5 GB log into memory when the first candidate was near its end)
    if state is None or start < state[0]:
        found = [buf.rfind(m, floor, start) for m in _TRACEBACK_MARKERS]
        if state is None:
            reader.markers = (start, found)
        return found
    frontier, latest = state
    if start > frontier:
        latest = [max(q, buf.rfind(m, max(floor, frontier - len(m) + 1), start))
                  for m, q in zip(_TRACEBACK_MARKERS, latest)]
        reader.markers = (start, latest)
    return latest


Match = tuple[CompiledRule, dict, str, int]  # a rule whose regex matched a line: (rule, facts, group key, pattern)


class Matcher:
    """Matches candidate lines of one scan (one or more sources) and collects hits and capture occurrences."""

    def __init__(self, compiled: Compiled, warnings: list[str], markers: MarkerTracker,
                 presence: Callable[[bytes], list[int]] | None = None):
        self.c = compiled
        self.warnings = warnings
        self.presence = presence  # anchors present in UTF-8 text, by Hyperscan (large inputs: thousands of lines)
        self.memo: dict[str, list[tuple[CompiledRule, dict, str, int]]] = {}
        self.hits: list[Hit] = []
        self.markers = markers
        self.group_counts: dict[str, int] = {}
        self.by_code: dict[str, CompiledRule] | None = None  # built on first use (a "before training" rule's swap)
        self.traceback_ends_read = 0  # traceback headers read forwards to their end (traceback_ends_with rules)

    # ---------------------------------------------------------------------------------------- per text

    def classify(self, text: str, allowed: tuple[int, ...] | None = None) -> list[tuple[CompiledRule, dict, str, int]]:
        """Rules whose regex matches ``text``, latest in catalogue order first (memoised by text).

        ``allowed``: the only anchors that can occur in ``text`` (those phase 1 found in the line's window, the
        text being a part of the line's bytes); the answer is the same, only cheaper: the memo stays valid."""
        entry = self.memo.get(text)
        if entry is not None:
            return entry
        c = self.c
        if allowed is not None:
            present = [i for i in allowed if c.anchors[i] in text]
        elif self.presence is not None:
            present = self.presence(text.encode("utf-8", "surrogatepass"))
        else:
            present = [i for i, a in enumerate(c.anchors) if a in text]
        rule_ids = {ri for i in present for ri in c.rules_by_anchor[i]}
        matches: list[tuple[CompiledRule, dict, str, int]] = []
        for ri in sorted(rule_ids, reverse=True):
            cr = c.rules[ri]
            if cr.disabled:
                continue
            for number, p in enumerate(cr.patterns, 1):
                if p.anchor not in text:
                    continue
                m = self._search(cr, p, text)
                if m is not None:
                    facts = {k: v for k, v in m.groupdict().items() if v is not None}
                    matches.append((cr, facts, group_key(cr.rule.code, facts), number))
                    break
        if len(self.memo) >= MEMO_MAX:
            self.memo.clear()
        self.memo[text] = matches
        return matches

    def _search(self, cr: CompiledRule, p: CompiledPattern, text: str):
        try:
            return p.regex.search(text, timeout=REGEX_TIMEOUT_S)
        except (regex.error, TypeError, ValueError) as e:  # compiled lazily: a rule that bypassed the loader's check
            cr.disabled = True
            self.warnings.append(f"rule {cr.rule.code}: regex does not compile ({e}); rule skipped")
            return None
        except TimeoutError:
            cr.disabled = True
            self.warnings.append(
                f"rule {cr.rule.code} ({cr.rule.source}): regex took over {REGEX_TIMEOUT_S:g}s on one line "
                "(catastrophic backtracking?); rule switched off for this run"
            )
            return None

    # ---------------------------------------------------------------------------------------- per line

    def line(self, reader: _LineReader, source_index: int, rank_hint, start: int, raw: bytes, lineno: int,
             pos_in_window: int, window_anchors: tuple[int, ...] | None = None) -> None:
        ll = normalize_line(decode(raw), reader.path, lineno, reader.learned)
        if (_HEADER_BYTES in raw or _FATAL_BYTES in raw) and not ll.text.startswith((HEADER, FATAL)):
            ll = reader.learn_prefix(start, ll, raw)
        text_in_bytes = window_anchors is not None and _text_is_part_of_bytes(ll.raw)
        matches = self.classify(ll.text, window_anchors if text_in_bytes else None)
        if matches and ll.text[:1] in " \t":  # indented: perhaps a traceback's quoted source line
            matches = self._not_quoted_source(reader, start, ll, matches)
        if not matches:
            return
        ends = [m for m in matches if m[0].traceback_end is not None]
        if ends:  # a traceback's header: what its rule reads is the line that ends the traceback
            matches = [m for m in matches if m[0].traceback_end is None]
            if not matches:
                self._traceback_end(reader, source_index, rank_hint, start, ll, pos_in_window, ends[0][0])
                return
        self._apply(reader, source_index, rank_hint, start, ll, pos_in_window, matches)

    def _not_quoted_source(self, reader: _LineReader, start: int, ll: LogLine, matches: list[Match]) -> list[Match]:
        """``matches`` less the rules that also match the exception line below, when ``ll`` is the source line a
        traceback quotes under a frame (``raise RuntimeError(f"Missing key ...: {fqn}.")``): the message with its
        values is that exception line, which the rule matches on its own; the quoted code is not evidence."""
        before = _on_stream(reader.backwards(start, ll.lineno, QUOTED_SOURCE_LINES, 1 << 16), ll.stream)
        if not before or not before[0].text.lstrip().startswith('File "'):
            return matches
        end = quoted_source_end(reader, start, ll)
        if end is None:
            return matches
        codes = {cr.rule.code for cr, *_ in self.classify(end.text)}
        return [m for m in matches if m[0].rule.code not in codes]

    def _traceback_end(self, reader: _LineReader, source_index: int, rank_hint, start: int, header: LogLine,
                       pos_in_window: int, cr: CompiledRule) -> None:
        """The rule ``cr`` matched a traceback's header: its hit is the line that ends that traceback on the header's
        stream (traceback_end), when the rule's ``traceback_ends_with`` regex matches that line and no rule of the
        catalogue matches it (that rule's own hit, from the ordinary scan, speaks for the line)."""
        if cr.traceback_end is None or self.traceback_ends_read >= MAX_TRACEBACK_ENDS:
            return
        self.traceback_ends_read += 1
        found = traceback_end(reader, start, header)
        if found is None:
            return
        end_start, end = found
        if self.classify(end.text):
            return
        m = self._search(cr, cr.traceback_end, end.text)
        if m is None:
            return
        facts = {k: v for k, v in m.groupdict().items() if v is not None}
        self._apply(reader, source_index, rank_hint, end_start, end, pos_in_window,
                    [(cr, facts, group_key(cr.rule.code, facts), 1)])

    def _apply(self, reader: _LineReader, source_index: int, rank_hint, start: int, ll: LogLine, pos_in_window: int,
               matches: list[tuple[CompiledRule, dict, str, int]]) -> None:
        """The first of ``matches`` (rules whose regex matched ``ll``) whose context holds becomes the line's hit."""
        lineno = ll.lineno
        frames: list[LogLine] | None = None
        outer_n = 0  # how many of ``frames`` are those of the exceptions this one caused (_frames)
        raising: LogLine | None = None  # the source line under the innermost frame (_frames), from the same reading
        line_phase: str | None = None
        by_frames = False  # line_phase came from the frames (a frame of the phase table), not the markers

        def frames_here() -> list[LogLine]:
            nonlocal outer_n, raising
            found, outer_n, raising = self._frames(reader, start, ll)
            return found

        def phase_here() -> str:
            """The line's phase from its frames and the markers before it: one reading for all of its rules."""
            nonlocal frames, line_phase, by_frames
            if line_phase is None:
                if frames is None:
                    frames = frames_here()
                markers = self.markers.markers_before(pos_in_window)
                texts = [f.text for f in frames]
                read, by_frames = phase_reading(line=ll, frames=texts, markers=markers)
                line_phase = read or "unknown"
            return line_phase

        for cr, facts, key, number in matches:
            rule = cr.rule
            extra: list[LogLine] = []
            if cr.has_context:
                ctx = rule.context
                levels = rule.patterns[number - 1].levels_any or ctx.levels_any
                if levels and (ll.level or "").upper() not in levels:
                    continue
                if ctx.frames_any or ctx.frames_none:
                    if frames is None:
                        frames = frames_here()
                    if ctx.frames_none and any(n in f.text for f in frames for n in ctx.frames_none):
                        continue
                    if ctx.frames_any:
                        hit_frames = [f for f in frames if any(a in f.text for a in ctx.frames_any)]
                        if not hit_frames:
                            continue
                        extra.append(hit_frames[-1])
                if ctx.before_any and not self._before_any(reader, start, ctx.before_any, ctx.before_window,
                                                                lineno):
                    continue
                if ctx.also_before_any and not self._before_any(reader, start, ctx.also_before_any,
                                                                     ctx.before_window, lineno):
                    continue
                if ctx.after_none and self._after_any(reader, start, ctx.after_none):
                    continue
                if ctx.after_any and not self._after_any(reader, start, ctx.after_any):
                    continue
                if ctx.none_anywhere and self._last_of(reader, ctx.none_anywhere) != -1:
                    continue
                if ctx.near_end and not self._near_end(reader, start, ctx.near_end):
                    continue
                if ctx.after_progress and phase_here() != "training":  # "training": after progress
                    continue
                unlike = ctx.refused_unlike_listed
                if unlike is not None and refused_unlike_listed(ll.text) != unlike:
                    continue
                if ctx.pinned_on_command_line and not pinned_release(
                    reader.buffer, start, facts.get(ctx.pinned_on_command_line, ""), reader.pinned_commands
                ):
                    continue
                hidden = ctx.config_hidden_by_launcher
                if hidden is not None and config_hidden_by_launcher(
                    reader.buffer, start, facts.get("prog", ""), reader.launcher_argv
                ) != hidden:
                    continue
                if ctx.not_on_command_line and not options_not_typed(
                    reader.buffer, start, facts.get("prog", ""), facts.get(ctx.not_on_command_line, ""),
                    reader.command_lines,
                ):
                    continue
            phase_by_frames = False
            if rule.phase != "auto":
                phase = rule.phase
                if rule.phase_at_first_collective and (here := phase_here()) in AFTER_SETUP and by_frames:
                    # the collective's own traceback (torch's `NCCL error in: ..., invalid usage`) names the call
                    # that issued the communicator's first collective: the DDP wrap, the first step
                    phase, phase_by_frames = here, True
                if rule.during_training and progress_before(ll, self.markers.markers_before(pos_in_window)):
                    cr, rule, key, phase = self._in_training_here(cr, key, phase_here())
            else:
                phase = phase_here()
                phase_by_frames = by_frames
                if phase == "unknown" and rule.phase_when_unknown:
                    phase = rule.phase_when_unknown  # the rule knows when its failure usually happens
            all_facts = dict(facts)
            seen = self.group_counts.get(key, 0)
            self.group_counts[key] = seen + 1
            if rule.parser and seen < PARSED_HITS_PER_GROUP:
                following = self._following(reader, start, ll)
                parse = PARSERS.get(rule.parser)  # every parser is wrapped so that it never raises
                for k, v in ((parse(ll, following) if parse is not None else None) or {}).items():
                    all_facts.setdefault(k, v)
            rank = ll.rank if ll.rank is not None else rank_hint
            kept: list[str] = []
            outer_kept = 0
            if rule.tier != "specific" and seen < PARSED_HITS_PER_GROUP:
                if frames is None:
                    frames = frames_here()
                kept = [f.text for f in frames[-MAX_FRAMES:]]  # the category is inferred from them (inference.py)
                outer_kept = max(0, len(kept) - (len(frames) - outer_n))
            stack = ""
            if seen < PARSED_HITS_PER_GROUP:  # the job's stack, from this traceback's packages (match/stack.py)
                if frames is None:
                    frames = frames_here()
                stack = stack_of_frames(f.text for f in frames)
            details: list[LogLine] = []
            if seen < PARSED_HITS_PER_GROUP:
                # raising_code and following lines are shown under the line, which stays the first of them; the
                # preceding ones above it, in file order (one-line answers read Finding.headline_evidence)
                # frames were read above (the stack): the traceback they came from gave the line that raised
                code = _shown_raising_code(raising) if rule.evidence.raising_code else None
                if code is not None and all(e.lineno != code.lineno for e in extra):
                    details.append(code)
                details.extend(self._details(reader, start, ll, cr))
                for before in self._preceding_details(reader, start, ll, cr):  # nearest first: shown in file order
                    if all(e.lineno != before.lineno for e in extra):
                        extra.append(before)
            release = ""
            if kept and self.c.reads_releases:  # no [[infer]] table asks: no search back through the input
                release = release_named_before(reader.buffer, start, raising_package(kept), reader.releases)
            self.hits.append(Hit(cr, ll, source_index, rank, all_facts, phase, key, extra, frames=kept,
                                 pattern=number, release=release, outer_frames=outer_kept, stack=stack,
                                 details=details, phase_by_frames=phase_by_frames))
            return  # last match wins: one rule per line

    def _in_training_here(self, cr: CompiledRule, key: str, seen: str) -> tuple[CompiledRule, Any, str, str]:
        """A "before training" rule (NC002) on a line whose own file showed training progress before it: the rule
        it names in ``during_training``, with the phase the file's markers and frames tell (after progress: the
        training, eval or checkpoint save it was in; "training" when they name nothing later)."""
        if self.by_code is None:
            self.by_code = {c.rule.code: c for c in self.c.rules}
        new = self.by_code.get(cr.rule.during_training)
        if new is None:
            return cr, cr.rule, key, cr.rule.phase
        phase = seen if seen in _AFTER_TRAINING_STARTED else "training"
        return new, new.rule, new.rule.code + key[len(cr.rule.code):], phase

    def _details(self, reader: _LineReader, start: int, ll: LogLine, cr: CompiledRule) -> list[LogLine]:
        """The lines after ``ll`` on its stream that its rule's ``evidence.following`` matches (at most
        FOLLOWING_KEPT, within ``evidence.following_window`` lines): where the summary line's cause is spelt out."""
        if cr.following is None:
            return []
        out: list[LogLine] = []
        for nxt in self._following(reader, start, ll, cr.rule.evidence.following_window):
            if self._search(cr, cr.following, nxt.text) is not None:
                out.append(nxt)
                if len(out) >= FOLLOWING_KEPT:
                    break
        return out

    def _preceding_details(self, reader: _LineReader, start: int, ll: LogLine, cr: CompiledRule) -> list[LogLine]:
        """The lines before ``ll`` on its stream that its rule's ``evidence.preceding`` matches, nearest first (at
        most PRECEDING_KEPT, within ``evidence.preceding_window`` lines): a cause printed above its summary."""
        if cr.preceding is None:
            return []
        window = cr.rule.evidence.preceding_window
        before = _on_stream(reader.backwards(start, ll.lineno, window * 8, PARSER_CONTEXT_BYTES), ll.stream)
        return [prev for prev in before[:window] if self._search(cr, cr.preceding, prev.text) is not None][
            :PRECEDING_KEPT]

    def _frames(self, reader: _LineReader, start: int, ll: LogLine) -> tuple[list[LogLine], int, LogLine | None]:
        """Frames of the traceback ending at ``ll``, read back over the same stream (chained exceptions too), how
        many of them (at the start) are those of the exceptions it caused, printed after it (where the work that
        failed was done: frames.caused_frames), and the source line printed under its innermost frame (None: none
        printed, or not a Python traceback); for a ``Fatal Python error`` line, the Python stack
        faulthandler prints after it (when it printed one); for UCX's ``Caught signal`` line, the native backtrace
        it prints after it; for gdb's ``received signal`` line, the stack it printed; for a pytest ``E   `` line,
        the call locations of its failure report."""
        stream = ll.stream
        if ll.text.startswith(_FATAL_PYTHON):
            dumped = faulthandler_frames(_on_stream(reader.forwards(start, ll.lineno, FAULT_DUMP_LINES,
                                                                    PARSER_CONTEXT_BYTES), stream))
            if dumped:
                return dumped, 0, None
        if UCX_SIGNAL.match(ll.text):
            native = ucx_backtrace_frames(_on_stream(reader.forwards(start, ll.lineno, UCX_BACKTRACE_LINES,
                                                                     PARSER_CONTEXT_BYTES), stream))
            if native:
                return native, 0, None
        if GDB_SIGNAL.match(ll.text):
            stopped = gdb_backtrace_frames(_on_stream(reader.forwards(start, ll.lineno, GDB_BACKTRACE_LINES,
                                                                      PARSER_CONTEXT_BYTES), stream))
            if stopped:
                return stopped, 0, None
        if PYTEST_ERROR.match(ll.text):
            reported = pytest_frames(
                _on_stream(reader.backwards(start, ll.lineno, PYTEST_REPORT_LINES, PARSER_CONTEXT_BYTES), stream),
                _on_stream(reader.forwards(start, ll.lineno, PYTEST_REPORT_LINES, PARSER_CONTEXT_BYTES), stream),
            )
            if reported:
                return reported, 0, None
        if not _stream_has_traceback_before(reader, start, stream):
            return [], 0, None
        same: list[LogLine] = []
        header_at: int | None = None  # index in ``same`` of the last header passed
        gap = 0  # other lines passed since that header, looking for a chain phrase above it
        for _s, prev in reader.stream_backwards(start, ll.lineno, stream, TRACEBACK_LOOKBACK_LINES,
                                                TRACEBACK_LOOKBACK_BYTES):
            text = prev.text
            if header_at is not None:
                stripped = text.strip()
                if not stripped:
                    same.append(prev)
                    continue
                if not stripped.startswith(_CHAIN_PHRASES):
                    # The rebuild keeps a chain across stray output between the phrase and the next header (a
                    # progress line of the same rank); look a little further up for the phrase, then let the
                    # rebuild decide. A header or a frame means an earlier, separate traceback: stop.
                    gap += 1
                    if gap > CHAIN_GAP_LINES or stripped.startswith((_HEADER, _GROUP_HEADER, 'File "')):
                        break
                    same.append(prev)
                    continue
                header_at = None
                gap = 0
            same.append(prev)
            # Inside an exception group printout, walk up to the outermost group's header: its frames are where
            # the member's error surfaced (a TaskGroup in save_checkpoint, say).
            if (text.startswith(_HEADER) and not prev.group_depth) or (
                prev.group_depth == 1 and text.startswith(_GROUP_HEADER)
            ):
                header_at = len(same) - 1
        if header_at is not None:
            del same[header_at + 1 :]
        same.reverse()
        same.append(ll)
        own, code = traceback_reading(same)
        if not own:
            return ipython_frames(same), 0, None  # a notebook's traceback (IPython's format has no `File "` lines)
        outer = caused_frames(same, self._chained_after(reader, start, ll))
        return outer + own, len(outer), code

    @staticmethod
    def _chained_after(reader: _LineReader, start: int, ll: LogLine) -> list[LogLine]:
        """The stream's lines after ``ll`` when a chain phrase follows it within CHAIN_GAP_LINES of the stream
        (its exception caused another: the outer frames are printed there), up to CHAINED_AFTER_LINES; else []. The
        phrase is looked for over at most CHAIN_GAP_LINES * 4 lines of the input (other streams interleave)."""
        buf = reader.buffer
        limit = min(len(buf), start + PARSER_CONTEXT_BYTES)  # what forwards reads below
        if buf.find(b"\x1b", start, limit) == -1:  # no escape that could split a phrase: its bytes are in the line
            found = [p for p in (buf.find(c, start, limit) for c in _CHAIN_BYTES) if p != -1]
            # a phrase on none of the CHAIN_GAP_LINES * 4 lines read before giving up: no chain (the common case, a
            # forward read of 256 lines per traceback saved)
            if not found or bytes(buf[start:min(found)]).count(b"\n") > CHAIN_GAP_LINES * 4:
                return []
        out: list[LogLine] = []
        chained = False
        for read, (_s, nxt) in enumerate(reader.forwards(start, ll.lineno, CHAINED_AFTER_LINES * 4,
                                                         PARSER_CONTEXT_BYTES)):
            if not chained and read >= CHAIN_GAP_LINES * 4:
                return []
            if nxt.stream != ll.stream:
                continue
            out.append(nxt)
            if not chained:
                stripped = nxt.text.strip()
                if stripped.startswith(_CHAIN_PHRASES):
                    chained = True
                elif len(out) > CHAIN_GAP_LINES or stripped.startswith((_HEADER, _GROUP_HEADER)):
                    return []
            elif len(out) >= CHAINED_AFTER_LINES:
                break
        return out if chained else []

    @staticmethod
    def _following(reader: _LineReader, start: int, ll: LogLine, lines: int = PARSER_CONTEXT_LINES) -> list[LogLine]:
        """Up to ``lines`` lines of the same stream after ``ll`` (a summary block, an NCCL reason)."""
        stream = ll.stream
        out: list[LogLine] = []
        for _s, nxt in reader.forwards(start, ll.lineno, lines * 8, PARSER_CONTEXT_BYTES):
            if nxt.stream == stream:
                out.append(nxt)
                if len(out) >= lines:
                    break
        return out

    @staticmethod
    def _last_of(reader: _LineReader, needles: list[str]) -> int:
        """Offset of the last occurrence of any needle in the whole input (-1: none), searched once (from the end,
        C speed) and remembered: every later call is a look-up."""
        key = tuple(needles)
        last = reader.after.get(key)
        if last is None:
            last = max((reader.buffer.rfind(n.encode("utf-8"), reader.floor) for n in needles if "\n" not in n),
                       default=-1)
            reader.after[key] = last
        return last

    @staticmethod
    def _after_any(reader: _LineReader, start: int, needles: list[str]) -> bool:
        """Does a line after the one at ``start`` contain a needle? (the last occurrence in the whole input is
        after the line's end)"""
        last = Matcher._last_of(reader, needles)
        end = reader.buffer.find(b"\n", start)
        return end != -1 and last > end

    @staticmethod
    def _near_end(reader: _LineReader, start: int, lines: int) -> bool:
        """Do at most ``lines`` lines of the input follow the line at ``start``? Counted in C over at most
        ``lines * NEAR_END_LINE_BYTES`` bytes: a longer tail is taken as more lines (a line that long is a dump, not
        the retry a near_end rule reads), so each call costs one bounded count, however often the line repeats."""
        buf = reader.buffer
        end = buf.find(b"\n", start)
        if end == -1:
            return True
        rest = len(buf) - (end + 1)
        if rest > lines * NEAR_END_LINE_BYTES:
            return False
        tail = buf[end + 1 :]  # bytes, bounded above (a mapped input has no count method)
        after = tail.count(b"\n") + (1 if tail and not tail.endswith(b"\n") else 0)
        return after <= lines

    @staticmethod
    def _before_any(reader: _LineReader, start: int, needles: list[str], window: int,
                    lineno: int | None = None) -> bool:
        """Does one of the ``window`` lines before the line at ``start`` (line number ``lineno``) contain a needle?

        The latest occurrence of any needle before ``start`` is searched backwards in growing chunks (C speed); it
        counts when at most ``window`` newlines lie between it and ``start``. Walking back line by line instead
        cost 5000 Python steps per NCCL timeout line (511 ranks: a second per GiB). Calls come in increasing
        ``start`` order (one per candidate line), so the line of the latest occurrence is remembered and the next
        call searches only the bytes since the previous one: thousands of ranks' timeout lines cost one pass.
        A needle holding a newline can never be inside one line, so it is ignored.
        """
        if start <= 0 or window <= 0:
            return False
        buf = reader.buffer
        encoded = [n.encode("utf-8") for n in needles if "\n" not in n]
        if not encoded:
            return False
        key = (tuple(needles), window)
        state = reader.before.get(key) if lineno is not None else None
        near = state is not None and state[0] <= start and start - state[0] <= BEFORE_INCREMENTAL_BYTES
        if state is not None and lineno is not None and near:
            s0, _l0, latest = state
            best = -1
            for n in encoded:  # only occurrences ending after s0 (s0 is a line start: they lie in [s0, start))
                p = buf.rfind(n, max(0, s0 - len(n) + 1), start)
                if p > best:
                    best = p
            if best != -1:
                latest = lineno - buf[best:start].count(b"\n")
            reader.before[key] = (start, lineno, latest)
            return latest is not None and lineno - latest <= window
        newlines = 0  # newlines in [hi, start)
        hi = start
        step = BEFORE_STEP_BYTES
        k = None  # newlines between the latest occurrence and ``start``
        while hi > reader.floor:
            lo = max(reader.floor, hi - step)
            best = -1
            for n in encoded:
                p = buf.rfind(n, lo, min(start, hi + len(n) - 1))  # occurrences straddling ``hi`` too
                if p > best:
                    best = p
            chunk = buf[lo:hi]
            if best != -1:  # straddling hi, the newlines in [hi, best) are already counted in ``newlines``
                k = newlines - buf[hi:best].count(b"\n") if best >= hi else newlines + chunk.count(b"\n", best - lo)
                break
            newlines += chunk.count(b"\n")
            if newlines > window:
                break
            hi = lo
            step = min(step * 2, 4 << 20)
        if lineno is not None:
            reader.before[key] = (start, lineno, None if k is None else lineno - k)
        return k is not None and k <= window


@dataclass(slots=True)
class WindowResult:
    """What phase 1 found in one window (computed here or in a worker process)."""

    offset: int
    length: int
    newlines: int
    checkpoints: list[int]  # newlines before each CHECKPOINT_BYTES step of the window
    candidates: list[int]  # start offsets of candidate lines, relative to the window
    candidate_lines: list[int]  # newlines before each candidate, relative to the window
    captures: list[int]  # capture anchors present
    ascii_only: bool = False
    anchors: tuple[int, ...] = ()  # the anchors that can match on a plain line of the window (Phase1.present_anchors)


def _bytes_count(w: bytes, start: int, end: int) -> int:
    return w.count(b"\n", start, end)


def numpy_counter():
    """Newline counting with numpy (about 3x faster than ``bytes.count`` on 3.11), or None without numpy."""
    try:
        import numpy as np
    except Exception:  # noqa: BLE001 - optional: bytes.count gives the same numbers
        return None
    frombuffer, count_nonzero, u8 = np.frombuffer, np.count_nonzero, np.uint8

    def count(w: bytes, start: int, end: int) -> int:
        end = min(end, len(w))
        if end <= start:
            return 0
        return int(count_nonzero(frombuffer(w, u8, end - start, start) == 10))

    return count


COUNT_STEP = 128 << 10  # newlines are counted per step: a candidate's line number is counted from the step before it
assert CHECKPOINT_BYTES % COUNT_STEP == 0


def scan_window(phase1: Phase1, offset: int, w: bytes, count: Callable[[bytes, int, int], int] = _bytes_count
                ) -> WindowResult:
    candidates, captures = phase1.scan(w)
    before = [0]  # newlines before each COUNT_STEP of the window
    n = 0
    for sub in range(0, len(w), COUNT_STEP):
        n += count(w, sub, sub + COUNT_STEP)
        before.append(n)
    per = CHECKPOINT_BYTES // COUNT_STEP
    checkpoints = before[:-1:per] if len(w) else []
    lines, cursor, ln = [], 0, 0
    for c in candidates:  # the newlines of the window are counted once, plus at most a step per candidate
        base = c - c % COUNT_STEP
        if base > cursor:
            cursor, ln = base, before[base // COUNT_STEP]
        ln += w.count(b"\n", cursor, c)
        cursor = c
        lines.append(ln)
    return WindowResult(offset, len(w), n, checkpoints, candidates, lines, captures,
                        bool(captures) and phase1.ascii, phase1.present_anchors)


def scan(
    sources: list,
    compiled: Compiled,
    warnings: list[str],
    progress: Callable[[int, int], None] | None = None,
    backend: str = "auto",
    window_size: int = WINDOW_BYTES,
    jobs: int = 1,
) -> tuple[list[Hit], dict[str, list[Block]], list[InputInfo]]:
    """Scan every source; return the hits (in input order), the captured blocks (deferred captures read too) and
    per-input sizes."""
    hits, blocks, infos, deferred = scan_deferring(sources, compiled, warnings, progress, backend, window_size, jobs)
    blocks.update(deferred.blocks())
    return hits, blocks, infos


class DeferredCaptures:
    """The captures a scan left for later (``CaptureSpec.deferred``): ``blocks()`` reads them from the windows it
    noted, while the sources are still open."""

    def __init__(self, collector: BlockCollector, readers: list):
        self.collector = collector
        self.readers = readers

    def blocks(self) -> dict[str, list[Block]]:
        def done_with(view: WindowView) -> None:
            release_pages(view.buffer, view.offset - view.offset % mmap.PAGESIZE, view.offset + view.length)

        self.collector.read_deferred(done_with)
        return materialise(self.collector, self.readers, deferred=True)


def scan_deferring(
    sources: list,
    compiled: Compiled,
    warnings: list[str],
    progress: Callable[[int, int], None] | None = None,
    backend: str = "auto",
    window_size: int = WINDOW_BYTES,
    jobs: int = 1,
) -> tuple[list[Hit], dict[str, list[Block]], list[InputInfo], DeferredCaptures]:
    """Scan every source; return the hits (in input order), the captured blocks, per-input sizes and the deferred
    captures, to read if a later step needs them.

    With ``jobs > 1`` and a large source, phase 1 runs in worker processes over newline-aligned chunks (forked,
    so they share the mapped file); phase 2 stays here, in input order, so answers do not depend on ``jobs``.
    """
    capture_literals = [cc.literal for cc in compiled.captures]
    total_bytes = sum(len(s.buffer) for s in sources)
    backend = resolve_backend(backend)
    big = total_bytes >= TEXT_PRESENCE_MIN_BYTES
    phase1 = phase1_for(compiled.literals, compiled.anchor_patterns, capture_literals, backend)
    phase_names = {spec.name for spec in PHASE_CAPTURES}
    phase_ids = [i for i, cc in enumerate(compiled.captures) if cc.spec.name in phase_names]
    markers = MarkerTracker(compiled.captures, phase_ids)
    collector = BlockCollector(compiled.captures)
    presence = text_presence(tuple(compiled.literals)) if big and backend in ("auto", "hyperscan") else None
    matcher = Matcher(compiled, warnings, markers, presence)
    count = (numpy_counter() if total_bytes >= NUMPY_MIN_BYTES else None) or _bytes_count
    done = 0
    infos: list[InputInfo] = []
    readers: list[_LineReader] = []
    for si, source in enumerate(sources):
        buf = source.buffer
        # a hole at the head (NULs, no newline) is part of line 1: the scan starts where the data does
        first = getattr(source, "head_hole", 0)
        reader = _LineReader(buf, source.path, first)
        readers.append(reader)
        index = LineIndex(buf)
        rank_hint = getattr(source, "rank_hint", None)
        lines_before = 0
        released = first - first % mmap.PAGESIZE
        done += first
        if jobs > 1 and len(buf) >= PARALLEL_MIN_BYTES:
            results = parallel.results(buf, phase1, window_size, jobs, count, first)
        else:
            results = (scan_window(phase1, offset, w, count) for offset, w in windows(buf, window_size, first))
        for r in results:
            offset = r.offset
            for k, before in enumerate(r.checkpoints):
                index.add(offset + k * CHECKPOINT_BYTES, lines_before + before)
            view = WindowView(si, source.path, buf, offset, r.length, index, r.ascii_only)
            markers.begin(view, r.captures)
            window_end = offset + r.length
            for s, ln in zip(r.candidates, r.candidate_lines):
                start = offset + s
                e = buf.find(b"\n", start, window_end)
                if e == -1:
                    e = window_end
                raw = line_bytes(buf, start, e)
                matcher.line(reader, si, rank_hint, start, raw, lines_before + ln + 1, s, r.anchors)
            markers.end()
            if r.captures:
                collector.window(view, r.captures)
            lines_before += r.newlines
            done += r.length
            released = release_pages(buf, released, window_end)
            if progress is not None:
                progress(done, total_bytes)
        size = len(buf)
        unterminated = size > 0 and buf[size - 1 : size] != b"\n"  # a last line without a newline counts too
        infos.append(InputInfo(source.path, size, lines_before + unterminated))
    blocks = materialise(collector, readers)
    _first_iteration_across_files(matcher.hits, markers, compiled, sources)
    return matcher.hits, blocks, infos, DeferredCaptures(collector, readers)


def _first_iteration_across_files(hits: list[Hit], markers: MarkerTracker, compiled: Compiled, sources: list) -> None:
    """A failure in "the first iteration" of one per-rank file is in training when another file of the run trained.

    Megatron prints iteration lines on one rank only (the last, or rank 0), so in a folder of per-rank files the
    failing rank's own file shows no progress although the job ran for hundreds of iterations; ranks step in
    lockstep, so another file's iteration lines (same torchrun attempt) date the failure. Within one file the
    order of lines decides, as before.
    """
    from diagnose.normalize.phases import BACKGROUND_PROGRESS, TRAINING_PROGRESS

    # a file trained when it printed progress of its own; a collective's sequence number (background progress, often
    # on the failing rank's watchdog line itself) does not make a per-rank file one that shows the run's iterations
    own_progress = TRAINING_PROGRESS - BACKGROUND_PROGRESS
    trained = {si for (si, ci) in markers.latest if compiled.captures[ci].spec.name in own_progress}
    if not trained:
        return
    attempts = {getattr(sources[si], "attempt", None) for si in trained}
    by_code = {cr.rule.code: cr for cr in compiled.rules}
    for hit in hits:
        if hit.source_index in trained or getattr(sources[hit.source_index], "attempt", None) not in attempts:
            continue
        # no marker or frame of its own said more than that: the ranks step in lockstep with the file that trained
        if hit.phase in ("first_iteration", "unknown") and hit.rule.rule.phase == "auto":
            hit.phase = "training"
        _in_training_rule(hit, by_code)


def _in_training_rule(hit: Hit, by_code: dict[str, CompiledRule]) -> None:
    """A rule that says "before training" from the line alone (NC002: a one-element collective timed out in a file
    with no iteration lines) names in ``during_training`` the rule for the same line once another file shows the
    job trained: a SeqNum of 100 or more is then a collective of training. Low SeqNums keep the first rule: those
    are the job's first collectives whatever the other files say."""
    old = hit.rule.rule.code
    new = by_code.get(hit.rule.rule.during_training) if hit.rule.rule.during_training else None
    seq = as_int(hit.facts.get("seq_num"))
    if new is None or seq is None or seq < 100:
        return
    hit.rule = new
    hit.phase = new.rule.phase if new.rule.phase != "auto" else "training"
    hit.key = new.rule.code + hit.key[len(old):]


def _past_frames(reader: _LineReader, start: int, line: LogLine) -> tuple[int, LogLine, int] | None:
    """The first line of ``line``'s stream below it (at ``start``) that starts at the margin past a traceback's
    frames (``File "..."`` lines and the indented source under them, Python 3.11's carets, ``[Previous line repeated
    ...]``), with its offset and the number of ``File "`` lines passed; None when a blank run or the bounds come
    first. The shared walk of ``traceback_end`` and ``quoted_source_end``."""
    frames = 0
    blanks = 0
    for s, nxt in reader.forwards(start, line.lineno, TRACEBACK_END_LINES, TRACEBACK_LOOKBACK_BYTES):
        if nxt.stream != line.stream:
            continue
        text = nxt.text
        if not text.strip():
            blanks += 1
            if blanks > TRACEBACK_END_GAP:
                return None
            continue
        if text[0] in " \t":
            if text.lstrip().startswith('File "'):
                frames += 1
            continue
        if text.startswith(("[Previous line repeated", "^", "~")):
            continue
        return s, nxt, frames
    return None


def traceback_end(reader: _LineReader, start: int, header: LogLine) -> tuple[int, LogLine] | None:
    """The line that ends the traceback whose header is at ``start``: the first line of the header's stream after its
    frames that starts at the margin (``_past_frames``), with its offset; None when the frames run past the bounds,
    another header or a blank run comes first, or no frame came at all (a header printed as text)."""
    found = _past_frames(reader, start, header)
    if found is None:
        return None
    s, nxt, frames = found
    return None if frames == 0 or nxt.text.startswith((_HEADER, _GROUP_HEADER)) else (s, nxt)


def quoted_source_end(reader: _LineReader, start: int, source: LogLine) -> LogLine | None:
    """The exception line that ends the traceback whose quoted source line ``source`` (at ``start``) is: the first
    line of its stream below it that starts at the margin after the remaining frames, their quoted lines and carets;
    None when another header, a blank run or the bounds come first."""
    found = _past_frames(reader, start, source)
    return None if found is None or found[1].text.startswith((_HEADER, _GROUP_HEADER)) else found[1]


def _shown_raising_code(code: LogLine | None) -> LogLine | None:
    """The raising code line as evidence: None for a ``raise`` statement, which only repeats the message the
    exception line prints."""
    return None if code is None or code.text.lstrip().startswith("raise ") else code


def _on_stream(neighbours, stream: tuple) -> list[LogLine]:
    """The lines of ``stream`` among a reader's (start, line) neighbours: another rank's interleaved lines aside."""
    return [line for _start, line in neighbours if line.stream == stream]

