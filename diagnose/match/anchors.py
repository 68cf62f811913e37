"""Phase 1 of the scan: find the candidate lines of a window of raw bytes, as fast as the machine allows.

Every rule pattern has a literal anchor that occurs in each of its matches, so a line with no anchor cannot match
and is never decoded. Which anchors (and capture anchors) occur in a window is answered by one pass of a
multi-literal engine: Hyperscan (SINGLEMATCH), else an RE2 ``Set``, else ``bytes.find`` per literal. Then the
lines of the anchors that occur are located:

* with Hyperscan, by a per-anchor "locator" database of that anchor's rule regexes in PREFILTER mode (loosened:
  ``^``, ``$``, ``\\b`` dropped, so it can only over-approximate on the raw line), plus "anchor and a non-ASCII or
  NUL byte on the same line" (where byte and text semantics differ, e.g. ``\\w``). A noisy anchor (``loss: `` on
  every iteration line) then costs one C pass per window instead of one Python step per line;
* otherwise by a ``bytes.find`` loop per anchor, one step per hit line.

The literal pass comes first and locators run only for the anchors it found. Compiled databases (the literal pass,
each locator) are kept in a cache folder (``$DIAGNOSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/diagnose``, else
``~/.cache/diagnose``; ``DIAGNOSE_NO_CACHE=1`` switches it off), keyed by the hash of everything compiled into them,
checked by a content hash when read, and recompiled on any doubt. (One combined Hyperscan pass of every
anchor's loosened regexes, used for inputs of 16 MiB and more until stop 45, grew slower with the catalogue: at 508
rules it took 5.4-7.3 s of CPU on benchmarks/gen_log.py's 1 GiB log where the two passes take 3.7 s, and no less on
a dense log; it was removed.)

Lines with an ANSI escape (which can split an anchor) or a ``\\r`` rewrite (which can assemble one) are always
candidates. Phase 2 decides exactly on every candidate, so every backend gives IDENTICAL answers; only speed
differs.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import regex

from diagnose.cache import cache_dir
from diagnose.toml_cache import write_file

ESCAPE = b"\x1b"
_CR_REWRITE = re.compile(rb"\r[^\n]")
_CACHE: OrderedDict[tuple, Phase1] = OrderedDict()
_CACHE_SIZE = 8
_SHAPE = bytes.maketrans(b"0123456789abcdef", b"0" * 16)  # what varies between repeats of a line: numbers, ids
MAX_LINE_BYTES = 256 << 10  # what phase 1 scans of one line; the engine reads no more of it either
LOCATOR_MIN_BYTES = 1 << 20  # smaller windows locate lines without compiling a Hyperscan locator
COMBINE_AFTER = 3  # windows with the same set of anchors before their locators are merged into one database


# an assertion to drop (outside a class), else an escape or a whole character class (kept as they are)
_LOOSEN = re.compile(r"(?P<drop>\\[AZzbB]|[\^$])|\\.|\[\^?\]?(?:\\.?|[^\]\\])*(?:\]|\Z)", re.DOTALL)


def loosen(pattern: str) -> str | None:
    """A version of ``pattern`` that matches the raw line wherever the original matches the normalised text.

    The normalised text is the raw line minus a prefix (and ANSI/``\\r``, handled separately), so assertions about
    where the text starts or ends (``^ $ \\A \\Z \\z``) and word boundaries are dropped. Non-ASCII patterns are
    not loosened (None): byte and text semantics differ for them.
    """
    if not pattern.isascii():
        return None
    return _LOOSEN.sub(lambda m: "" if m.group("drop") else m.group(0), pattern)


_HEX_ESCAPES = [b"\\x%02x" % b for b in range(256)]


def _hs_literal(lit: bytes) -> bytes:
    """``lit`` as a Hyperscan expression: every byte escaped (``\\xNN``); ~1,000 literals at each start, so a table."""
    return b"".join(map(_HEX_ESCAPES.__getitem__, lit))


def _near_special(lit: bytes) -> list[bytes]:
    """"``lit`` and a NUL or non-ASCII byte on one line": where byte and text semantics differ (e.g. ``\\w``)."""
    h = _hs_literal(lit)
    return [h + rb"[^\n]*[\x00\x80-\xff]", rb"[\x00\x80-\xff][^\n]*" + h]


# ------------------------------------------------------------------------------------- presence engines


class _PythonPresence:
    """Which literals occur in a window, without a native engine, at C speed for the common case.

    A big log is big because it repeats: a few dozen line shapes (NCCL INFO lines, the same warning from every
    rank, iteration lines) with other numbers and ids. Digits and lowercase hex letters are mapped to ``0`` (one
    ``bytes.translate``), the window is split into lines and made a set, all in C; only line shapes never seen
    before are searched, for every literal mapped the same way (the map is per byte, so a literal in a line is a
    mapped literal in its mapped line: the answer can only over-approximate). What each shape holds is
    remembered, so a window of known shapes costs a set difference and a set intersection. The few literals
    named are then checked exactly on the window itself. A literal holding a newline is searched directly.
    """

    name = "python"
    MAX_SHAPES = 1 << 14  # remembered line shapes (then forgotten all at once): memory stays bounded
    MAX_SHAPE_BYTES = 1024  # a longer line is searched whenever it occurs, never remembered

    def __init__(self, literals: list[bytes]):
        self.literals = literals
        self.mapped = [lit.translate(_SHAPE) for lit in literals]
        self.multiline = [i for i, lit in enumerate(literals) if b"\n" in lit]
        self.seen: set[bytes] = set()  # every remembered shape
        self.holding: dict[bytes, tuple[int, ...]] = {}  # the remembered shapes that hold a literal
        self.holding_keys: set[bytes] = set()

    def present(self, window: bytes) -> list[int]:
        shapes = set(window.translate(_SHAPE).split(b"\n"))
        named: set[int] = set(self.multiline)
        new = shapes - self.seen
        if len(self.seen) + len(new) > self.MAX_SHAPES:  # forget everything, then learn this window's shapes
            self.seen.clear()
            self.holding.clear()
            self.holding_keys.clear()
            new = shapes
        if new:
            named.update(self._learn(new))
        for shape in shapes & self.holding_keys:
            named.update(self.holding[shape])
        return sorted(i for i in named if self.literals[i] in window)

    def _learn(self, new: set[bytes]) -> set[int]:
        joined = b"\n".join(new)
        found = [i for i, m in enumerate(self.mapped) if m in joined]
        for shape in new:
            if len(shape) > self.MAX_SHAPE_BYTES:
                continue
            self.seen.add(shape)
            if found:
                held = tuple(i for i in found if self.mapped[i] in shape)
                if held:
                    self.holding[shape] = held
                    self.holding_keys.add(shape)
        return set(found)


class _Re2Presence:
    name = "re2"

    def __init__(self, literals: list[bytes]):
        import re2

        options = re2.Options()
        options.max_mem = 256 << 20
        self._set = re2.Set.SearchSet(options)
        for lit in literals:
            self._set.Add(re2.escape(lit))
        self._set.Compile()

    def present(self, window: bytes) -> list[int]:
        return sorted(self._set.Match(window) or [])


class _HyperscanPresence:
    name = "hyperscan"

    def __init__(self, literals: list[bytes]):
        import hyperscan

        self._db = _cached_database(hyperscan, [_hs_literal(lit) for lit in literals],
                                    [hyperscan.HS_FLAG_SINGLEMATCH] * len(literals))

    def present(self, window: bytes) -> list[int]:
        found: list[int] = []
        self._db.scan(window, match_event_handler=lambda i, _f, _t, _fl, _c: found.append(i),
                      scratch=thread_scratch(self._db))
        return sorted(found)


_ENGINES = {"hyperscan": _HyperscanPresence, "re2": _Re2Presence, "python": _PythonPresence}


class _Locator:
    """Hyperscan database locating the lines where one anchor's rules can match (see module docstring).

    Two variants: ``plain`` (the loosened regexes) for windows that are pure ASCII without NUL, where byte and text
    semantics agree, and ``mixed`` (plus "anchor and a special byte on one line") for the others.
    """

    def __init__(self, anchors: Sequence[tuple[bytes, list[str]]], plain: bool = True):
        """``anchors``: each anchor with its rules' regexes; ``plain``: the variant compiled now (the other is
        compiled when a window first needs it: a log with hundreds of distinct anchors, every dev log end to end,
        compiled ~1,000 databases, 17 % of its run, half of them never scanned with)."""
        import hyperscan

        self._hs = hyperscan
        self.literals = [lit for lit, _ in anchors]
        self._loose: list[bytes] = []
        self._mixed: list[bytes] = []
        for lit_bytes, pats in anchors:
            for p in pats:
                lp = loosen(p)
                if lp is None:
                    raise ValueError("pattern cannot be loosened")
                self._loose.append(lp.encode("ascii"))
            self._mixed += _near_special(lit_bytes)
        self._dbs: dict[bool, object] = {}
        self._db(plain)  # a regex Hyperscan refuses raises here, as when both variants were compiled at once

    def _db(self, plain: bool):
        db = self._dbs.get(plain)
        if db is None:
            hs, loose = self._hs, self._loose
            flags = [hs.HS_FLAG_PREFILTER] * len(loose)
            # from the cache folder like the main database: compiling a locator costs ~10 ms, every run
            db = self._dbs[plain] = (_cached_database(hs, loose, flags) if plain else
                                     _cached_database(hs, self._mixed + loose, [0] * len(self._mixed) + flags))
        return db

    def lines(self, window: bytes, plain: bool, starts: set[int]) -> None:
        rfind, find = window.rfind, window.find
        state = [-1]  # end of the last line reported: later matches on it are skipped

        def on_match(_i, _f, to, _fl, _c):
            if to <= state[0]:
                return
            s = rfind(b"\n", 0, to) + 1
            e = find(b"\n", s)
            state[0] = e if e != -1 else len(window)
            starts.add(s)
            return

        try:
            db = self._db(plain)
        except Exception:  # noqa: BLE001 - the variant compiled late refused (the loosened regexes did not): the
            for lit in self.literals:  # anchors' lines by their literal, a superset phase 2 reads exactly
                _find_lines(window, lit, starts)
            return
        db.scan(window, match_event_handler=on_match, scratch=thread_scratch(db))


_PER_THREAD = threading.local()


SCRATCH_KEEP = 64  # databases a thread keeps a scratch for (the least recently scanned with go first)


def thread_scratch(db):
    """This thread's Hyperscan scratch for ``db``. A scratch serves one scan at a time: two threads sharing the
    database's own fail with HS_SCRATCH_IN_USE (error -10), and the TUI's workers (an analysis, a Slurm job's
    diagnosis, a follow check) can scan at once. Each thread keeps a scratch for the SCRATCH_KEEP databases it
    scanned with last (a run with one catalogue scans with a few dozen), so a long-lived thread does not keep
    alive every database the compiled-database cache has let go. Each is held with its database: its id is not
    reused while the entry lives, and an entry evicted goes with its database (hyperscan.Database takes no weak
    reference)."""
    import hyperscan

    held: OrderedDict[int, tuple[object, object]] | None = getattr(_PER_THREAD, "scratch", None)
    if held is None:
        held = _PER_THREAD.scratch = OrderedDict()
    entry = held.get(id(db))
    if entry is not None and entry[0] is db:
        held.move_to_end(id(db))
        return entry[1]
    held[id(db)] = (db, hyperscan.Scratch(db))
    held.move_to_end(id(db))
    while len(held) > SCRATCH_KEEP:
        held.popitem(last=False)
    return held[id(db)][1]


CACHE_KEEP = 48  # compiled databases kept (per catalogue, window kind and capture locator); the oldest go first


def _cached_database(hs, exprs: list[bytes], flags: list[int], ids: list[int] | None = None):
    """A block-mode database of these expressions (ids: their positions unless given), from the cache folder when it
    holds a sound copy."""
    import platform

    ids = list(range(len(exprs))) if ids is None else ids
    parts: list[str | bytes] = [str(getattr(hs, "__version__", "")), platform.machine(), repr(ids), repr(flags), *exprs]
    key = hashlib.sha256(b"".join((p.encode() if isinstance(p, str) else p) + b"\0" for p in parts)).hexdigest()
    folder = cache_dir()
    path = os.path.join(folder, f"hs-{key[:32]}.db") if folder else None
    if path:
        try:
            with open(path, "rb") as fh:
                blob = fh.read()
            if len(blob) > 32 and hashlib.sha256(blob[32:]).digest() == blob[:32]:
                db = hs.loadb(blob[32:], hs.HS_MODE_BLOCK)
                return db
        except Exception:  # noqa: BLE001 - missing, unreadable, torn or built for another CPU: compile instead
            pass
    db = hs.Database(mode=hs.HS_MODE_BLOCK)
    db.compile(expressions=exprs, ids=ids, elements=len(exprs), flags=flags)
    if path:
        try:
            data = hs.dumpb(db)
        except Exception:  # noqa: BLE001 - a database it cannot serialise: compiled again next time
            return db
        write_file(path, hashlib.sha256(data).digest() + data, "hs-", CACHE_KEEP)
    return db


@functools.cache
def capture_locator(literal: bytes, pattern: str) -> _Locator | None:
    """A Hyperscan locator for a capture's anchor and regex (None without Hyperscan or for a regex it refuses)."""
    try:
        return _Locator([(literal, [pattern])])
    except Exception:  # noqa: BLE001 - no hyperscan, or a pattern it cannot take
        return None


class Phase1:
    """Candidate lines of a window for a set of anchors (each with its rules' regexes) and capture literals."""

    def __init__(self, anchors: list[bytes], anchor_patterns: list[list[str]], capture_literals: list[bytes],
                 backend: str = "auto"):
        self.anchors = anchors
        self.anchor_patterns = anchor_patterns
        self.n_anchors = len(anchors)
        self._locators: dict[tuple[int, ...], _Locator] = {}
        self._singles: dict[int, _Locator | None] = {}
        self._seen: dict[tuple[int, ...], int] = {}
        self.engine = _make_engine(anchors + [ESCAPE] + capture_literals, resolve_backend(backend))
        self.name = self.engine.name
        self.ascii = False  # is the window last scanned pure ASCII? (known whenever capture literals were present)
        self.present_anchors: tuple[int, ...] = ()
        self._filters: dict[int, list | None] = {}

    def scan(self, window: bytes) -> tuple[list[int], list[int]]:
        """(sorted start offsets of candidate lines, indices of the capture literals present).

        Also sets ``present_anchors``: the anchors that can match on a line of this window whose text is a part of
        its bytes (no ANSI escape, ``\\r`` rewrite, NUL or invalid UTF-8): phase 2 looks only for those there."""
        n = self.n_anchors
        present = self.engine.present(window)
        starts: set[int] = set()
        anchors_present = [i for i in present if i < n]
        self.present_anchors = tuple(anchors_present)
        self.ascii = bool(present) and window.isascii()
        if anchors_present:
            self._locate(anchors_present, window, self.ascii and b"\x00" not in window, starts)
        if n in present:
            _find_lines(window, ESCAPE, starts)
        if b"\r" in window:
            starts.update(window.rfind(b"\n", 0, m.start()) + 1 for m in _CR_REWRITE.finditer(window))
        captures = [i - n - 1 for i in present if i > n]
        return sorted(starts), captures

    def _locate(self, ids: list[int], window: bytes, plain: bool, starts: set[int]) -> None:
        """Lines of the anchors ``ids``: one Hyperscan pass with a locator for exactly that set (cached: the same
        noisy anchors fire window after window), the others (no Hyperscan, a regex it refuses, a small window:
        compiling a locator costs more than finding a few lines) by find loops and the anchor's regexes."""
        if self.name == "hyperscan" and len(window) >= LOCATOR_MIN_BYTES:
            usable = [i for i in ids if self._single(i, plain) is not None]
            for i in ids:
                if i not in usable:
                    _find_lines(window, self.anchors[i], starts)
            if not usable:
                return
            key = tuple(usable)
            locator = self._locators.get(key)
            if locator is None and len(usable) > 1 and self._seen.get(key, 0) < COMBINE_AFTER:
                # a set seen for the first time(s): one pass per anchor; compile a combined locator only for
                # sets that recur (the noisy anchors of a long log), not for every one-off set of a short text
                self._seen[key] = self._seen.get(key, 0) + 1
                for i in usable:
                    cast(_Locator, self._single(i)).lines(window, plain, starts)  # usable: has a locator
                return
            if locator is None:
                locator = (cast(_Locator, self._single(usable[0], plain)) if len(usable) == 1
                           else _Locator([(self.anchors[i], self.anchor_patterns[i]) for i in usable], plain))
                if len(self._locators) > 256:
                    self._locators.clear()
                    self._seen.clear()
                self._locators[key] = locator
            locator.lines(window, plain, starts)
            return
        for i in ids:
            _find_lines(window, self.anchors[i], starts, self._filter(i))

    def _filter(self, i: int) -> list | None:
        """The regexes of anchor ``i`` loosened for a raw line (see ``line_filter``), compiled once."""
        if i not in self._filters:
            self._filters[i] = line_filter(self.anchor_patterns[i])
        return self._filters[i]

    def _single(self, i: int, plain: bool = True) -> _Locator | None:
        """The locator of one anchor (None when its regexes cannot be loosened or compiled)."""
        if i not in self._singles:
            try:
                self._singles[i] = _Locator([(self.anchors[i], self.anchor_patterns[i])], plain)
            except Exception:  # noqa: BLE001 - a regex Hyperscan cannot take: locate by the literal instead
                self._singles[i] = None
        return self._singles[i]


def _find_lines(window: bytes, lit: bytes, starts: set[int], filters: list | None = None) -> None:
    """Add the start of every line holding ``lit``; with ``filters``, only of those where a filter matches (or whose
    text may not be a part of them)."""
    find, rfind = window.find, window.rfind
    pos = find(lit)
    while pos != -1:
        s = rfind(b"\n", 0, pos) + 1
        e = find(b"\n", pos)
        if filters is None or _line_may_match(window[s : e if e != -1 else len(window)], filters):
            starts.add(s)
        if e == -1:
            break
        pos = find(lit, e)


_LOOKAROUND = re.compile(r"\(\?<?[=!]|\\G")
FILTER_TIMEOUT_S = 1.0


def line_filter(patterns: list[str]):
    """The ``regex`` patterns a raw line must match for one of ``patterns`` to match its text, or None (no filter:
    every line holding the anchor is a candidate).

    On a line whose text is a part of its decoded bytes (the prefixes peeled off the front), a match in the text
    is a match in the line once the assertions about where the text starts or ends are dropped (``loosen``). A
    lookaround could see the prefix, so a pattern with one gets no filter. Same engine and same flags as phase 2:
    the same semantics, for every character."""
    out = []
    for p in patterns:
        lp = loosen(p) if p.isascii() else None
        if lp is None or _LOOKAROUND.search(lp):
            return None
        try:
            out.append(regex.compile(lp))
        except (regex.error, TypeError, ValueError):
            return None
    return out or None


def _line_may_match(raw: bytes, filters: list) -> bool:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return True  # shown as \\xNN escapes: the text is not a part of the line
    if "\x00" in text or "\x1b" in text or "\x9b" in text or "\r" in text.rstrip("\r"):
        return True
    try:
        return any(rx.search(text, timeout=FILTER_TIMEOUT_S) is not None for rx in filters)
    except TimeoutError:
        return True  # phase 2 times the same regex out, names it and switches the rule off


def resolve_backend(backend: str) -> str:
    """``auto`` unless ``$DIAGNOSE_SCANNER`` names an engine (hyperscan, re2, python): the benchmark measures the
    pure-Python path that way on a machine that has the wheels."""
    if backend == "auto":
        forced = os.environ.get("DIAGNOSE_SCANNER", "auto")
        return forced if forced in _ENGINES else "auto"
    return backend


def _make_engine(literals: list[bytes], backend: str):
    if backend != "auto":
        return _ENGINES[backend](literals)
    for name in ("hyperscan", "re2"):
        try:
            return _ENGINES[name](literals)
        except Exception:  # noqa: BLE001 - missing wheel, unsupported CPU: fall back to the next engine
            continue
    return _PythonPresence(literals)


@functools.cache
def text_presence(literals: tuple[bytes, ...]) -> Callable[[bytes], list[int]] | None:
    """Which of ``literals`` occur in one line's text (UTF-8), by a Hyperscan literal database; None without it.

    Phase 2 asks this for every distinct candidate text: a loop of ``in`` over hundreds of anchors is the cost
    of thousands of per-rank lines (timeouts naming their rank), one Hyperscan call is not."""
    try:
        return _HyperscanPresence(list(literals)).present if literals else None
    except Exception:  # noqa: BLE001 - no Hyperscan: the caller loops over the anchors
        return None


def phase1_for(anchors: list[bytes], anchor_patterns: list[list[str]], capture_literals: list[bytes],
               backend: str = "auto") -> Phase1:
    """A Phase1, cached: compiling the databases costs more than scanning a small text (rule examples, tests)."""
    key = (backend, tuple(anchors), tuple(tuple(p) for p in anchor_patterns), tuple(capture_literals))
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    made = Phase1(anchors, anchor_patterns, capture_literals, backend)
    _CACHE[key] = made
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return made


def windows(buffer, size: int = 1 << 20, start: int = 0, end: int | None = None,
            max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, bytes)`` windows of ``buffer[start:end]`` that end just after a newline (or at ``end``).

    ``buffer`` is an mmap or bytes; each window is a copy of at most ``size`` bytes plus the rest of its last
    line, so memory stays flat however large the input. Of a line longer than ``max_line`` only its first and last
    ``max_line / 2`` bytes are scanned, as two windows (the tail is where a ``\r``-rewritten progress line ends,
    and an error glued to it): a 300 MB line (a tensor dump) used to cost a minute of per-byte regex matches and
    hundreds of MiB. ``start`` must be a line start.
    """
    total = len(buffer) if end is None else end
    half = max(1, max_line // 2)
    offset = start
    while offset < total:
        window_end = min(offset + size, total)
        stop: int | None = window_end
        if window_end < total:
            nl = buffer.rfind(b"\n", offset, window_end)
            stop = nl + 1 if nl != -1 else None  # None: one line is longer than the window
        if stop is not None:
            yield offset, bytes(buffer[offset:stop])
            offset = stop
            continue
        line_end = buffer.find(b"\n", offset, total)
        line_end = total if line_end == -1 else line_end + 1
        if line_end - offset <= max_line:
            yield offset, bytes(buffer[offset:line_end])
        else:  # its head, then its tail (newline included); nothing between
            yield offset, bytes(buffer[offset:offset + half])
            yield line_end - half, bytes(buffer[line_end - half:line_end])
        offset = line_end
