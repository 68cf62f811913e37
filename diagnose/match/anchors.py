"""Phase 1 of the scan: find the lines that contain any anchor literal, in raw bytes, as fast as the machine allows.

Every rule pattern and every capture spec has a literal anchor that occurs in each of its matches, so a line with
no anchor cannot match anything and is never decoded. Three interchangeable backends answer the same question
("which lines of this window contain at least one anchor?") and must give IDENTICAL answers:

* Hyperscan (``hyperscan`` wheel): one SINGLEMATCH pass over the window says which anchors occur at all;
* RE2 (``google-re2``): a ``re2.Set`` over the escaped literals says the same;
* pure Python: ``bytes.find`` for every anchor.

Then, for the anchors that occur (usually none: failures are rare lines), a ``bytes.find`` loop locates their lines,
skipping to the end of each hit line, so a noisy anchor costs one find per line, not one per occurrence.
"""

from __future__ import annotations

from typing import Callable, Protocol

ESCAPE = b"\x1b"  # an ANSI sequence can split an anchor: such lines are candidates too (phase 2 checks them)


class LiteralScanner(Protocol):
    name: str

    def present(self, window: bytes) -> list[int]:
        """Indices of the anchors that occur somewhere in ``window``."""


class PythonScanner:
    name = "python"

    def __init__(self, literals: list[bytes]):
        self.literals = literals

    def present(self, window: bytes) -> list[int]:
        return [i for i, lit in enumerate(self.literals) if lit in window]


class Re2Scanner:
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


def _hs_escape(lit: bytes) -> bytes:
    return b"".join(b"\\x%02x" % b for b in lit)


class HyperscanScanner:
    name = "hyperscan"

    def __init__(self, literals: list[bytes]):
        import hyperscan

        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._db.compile(
            expressions=[_hs_escape(lit) for lit in literals],
            ids=list(range(len(literals))),
            elements=len(literals),
            flags=[hyperscan.HS_FLAG_SINGLEMATCH] * len(literals),
        )

    def present(self, window: bytes) -> list[int]:
        found: list[int] = []
        self._db.scan(window, match_event_handler=lambda i, _f, _t, _fl, _c: found.append(i))
        return sorted(found)


BACKENDS: dict[str, Callable[[list[bytes]], LiteralScanner]] = {
    "hyperscan": HyperscanScanner,
    "re2": Re2Scanner,
    "python": PythonScanner,
}


def make_scanner(literals: list[bytes], backend: str = "auto") -> LiteralScanner:
    """The fastest backend that imports (``auto``), or the one named (tests compare them)."""
    if not literals:
        return PythonScanner([])
    if backend != "auto":
        return BACKENDS[backend](literals)
    for name in ("hyperscan", "re2"):
        try:
            return BACKENDS[name](literals)
        except Exception:  # noqa: BLE001 - missing wheel, unsupported CPU: fall back to the next engine
            continue
    return PythonScanner(literals)


def candidate_line_starts(window: bytes, literals: list[bytes], present: list[int]) -> list[int]:
    """Sorted start offsets (in ``window``) of the lines containing any of the ``present`` literals."""
    starts: set[int] = set()
    find, rfind = window.find, window.rfind
    for i in present:
        lit = literals[i]
        pos = find(lit)
        while pos != -1:
            starts.add(rfind(b"\n", 0, pos) + 1)
            end = find(b"\n", pos)
            if end == -1:
                break
            pos = find(lit, end)
    return sorted(starts)


def windows(buffer, size: int = 8 << 20, max_line: int = 64 << 20):
    """Yield ``(offset, bytes)`` windows of ``buffer`` that end just after a newline (or at the end).

    ``buffer`` is an mmap or bytes; each window is a copy of at most ``size`` bytes plus the rest of its last
    line, so memory stays flat however large the input. A line longer than ``max_line`` is cut.
    """
    total = len(buffer)
    offset = 0
    while offset < total:
        end = min(offset + size, total)
        if end < total:
            nl = buffer.rfind(b"\n", offset, end)
            if nl != -1:
                end = nl + 1
            else:
                nl = buffer.find(b"\n", end, min(total, offset + max_line))
                end = nl + 1 if nl != -1 else min(total, offset + max_line)
        yield offset, bytes(buffer[offset:end])
        offset = end
