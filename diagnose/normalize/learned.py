"""Prefixes learned from the log itself: a layer ``normalize_line`` does not know, peeled where a traceback shows it.

Collectors, container runtimes and schedulers put their own text before every line (``[worker-3 stdout] ``,
``job.1234.0 ``, ``<stderr> ``, ...). No list of layers is ever complete, and a traceback behind an unknown prefix
is read as message text: its header, frames and exception never start a line, and a failed job reads "no failure
found". A Python traceback announces itself unmistakably, so the log can teach its own prefix:

1. a line whose text (after the known layers) contains ``Traceback (most recent call last):`` or
   ``Fatal Python error: `` after some leading text gives a *candidate*: the head of that leading text that no known
   layer explains (``4-task-1-0/0 `` of ``4-task-1-0/0 [default0]:[rank0]: ``: the layers behind it stay known);
2. the candidate's *shape* keeps its letters, punctuation and trailing spaces as they are; what varies from line to
   line of one stream is masked: every run of digits (time stamps, pids, ranks, job ids) matches any run of digits,
   and an inner run of spaces (padding that aligns names of different widths) any run of spaces;
3. the shape is *learned* only when it also starts one of the lines right after the candidate, followed there (after
   any known layers) by a traceback's next line (a frame ``  File "...", line N, in f``; for ``Fatal Python error``:
   a thread or stack header or a frame). A traceback quoted inside one line (a ``repr`` with ``\\n``) never teaches one.

A learned shape is then peeled from every line of that input that starts with it, before the known layers are tried
again on the rest (``[worker-3 stdout] [rank3]: ...`` keeps its rank). A log whose tracebacks start their lines
(after the known layers) never learns anything, so its reading is unchanged.

Stateless helpers live here; the input's set of learned shapes (:class:`LearnedPrefixes`) is kept by whoever reads
the input (the matcher's line reader) and handed to ``normalize_line``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from diagnose.normalize.lines import normalize_line
from diagnose.normalize.tracebacks import GROUP_HEADER, TRACEBACK_HEADER

HEADER = TRACEBACK_HEADER
_GROUP_WORDS = GROUP_HEADER[: -len(TRACEBACK_HEADER)]  # "Exception Group ": Python 3.11's group header before it
FATAL = "Fatal Python error: "
MAX_PREFIX_CHARS = 200  # a prefix longer than this is a message, not a transport's tag
MAX_SHAPES = 16  # shapes learned per input (distinct streams whose tag has letters that differ: pods, hosts)
MAX_ATTEMPTS = 256  # candidates examined per input (each reads a few lines ahead)
MAX_REFUSALS = 8  # a candidate shape refused this often is not tried again (bounds the work on odd logs)
FOLLOWING_LINES = 6  # lines after the candidate searched for a traceback's next line under the same prefix

_DIGITS_OR_SPACES = re.compile(r"\d+| {2,}")
_FRAME = re.compile(r'  File "[^"]*", line \d+')
_FATAL_NEXT = ("Current thread ", "Thread 0x", "Stack (most recent call first)", "Python runtime state",
               "Extension modules", '  File "')


def candidate(text: str) -> str | None:
    """The leading text before a traceback's unmistakable start in ``text``, or None (none, or at the start)."""
    at = text.find(HEADER)
    if at == -1:
        at = text.find(FATAL)
        if at == -1:
            return None
    if at == 0 or at > MAX_PREFIX_CHARS:
        return None
    lead = text[:at]
    if lead.endswith(_GROUP_WORDS):  # Python 3.11's group header: the prefix is before these words
        lead = lead[:-len(_GROUP_WORDS)]
    if not lead or lead.isspace() or "\\n" in lead or '"' in lead or "'" in lead:  # an indented quote; a string's repr
        return None
    return lead


def _known_text(text: str) -> str:
    """``text`` less the layers ``normalize_line`` knows."""
    return normalize_line(text).text


def unknown_part(lead: str) -> str:
    """The head of ``lead`` that no known layer explains: the shortest one (ending at a space, ``]`` or ``:``) behind
    which the known layers peel the rest of ``lead`` entirely. ``4-task-1-0/0 [default0]:[rank0]: `` gives
    ``4-task-1-0/0 ``: the torchrun and rank layers behind it are then read as on any line (the rank is kept)."""
    for p in range(1, len(lead)):
        if lead[p - 1] in " ]:" and _known_text(lead[p:] + HEADER) == HEADER:
            return lead[:p]
    return lead


def shape_of(prefix: str) -> str:
    """A regex source for ``prefix`` with what varies masked: digit runs, inner runs of spaces (see the module)."""
    body = prefix.rstrip(" ")
    trailing = prefix[len(body):]
    parts: list[str] = []
    last = 0
    for m in _DIGITS_OR_SPACES.finditer(body):
        parts.append(re.escape(body[last:m.start()]))
        parts.append(r"\d+" if m.group()[0].isdigit() else " +")
        last = m.end()
    parts.append(re.escape(body[last:]))
    return "".join(parts) + re.escape(trailing)


def confirms(shape: str, fatal: bool, following: Iterable[str]) -> bool:
    """Does ``shape`` start one of the ``following`` texts, followed there by the traceback's next line (a frame;
    after ``Fatal Python error``: a frame or faulthandler's thread, stack or runtime-state line)?"""
    pattern = re.compile(shape)
    nexts = _FATAL_NEXT if fatal else None
    for text in following:
        m = pattern.match(text)
        if m is None:
            continue
        rest = text[m.end():]
        if rest[:1] != " ":
            rest = _known_text(rest)  # known layers behind the prefix ("[rank0]:   File ...")
        if _FRAME.match(rest) or (nexts is not None and rest.startswith(nexts)):
            return True
    return False


class LearnedPrefixes:
    """The prefix shapes one input taught (see the module). Empty for a log whose lines are already understood."""

    __slots__ = ("shapes", "pattern", "tried", "attempts")

    def __init__(self) -> None:
        self.shapes: list[str] = []
        self.pattern: re.Pattern[str] | None = None  # all shapes as one anchored alternation
        self.tried: dict[str, int] = {}  # shape -> times refused (other streams' lines can come between)
        self.attempts = 0  # candidates examined: bounded (MAX_ATTEMPTS), so an odd log costs little

    def __bool__(self) -> bool:
        return self.pattern is not None

    def learn(self, text: str, following: Iterable[str]) -> bool:
        """Learn the prefix before a traceback start in ``text`` (a line's text after the known layers) when the
        ``following`` lines' texts confirm it. True when a new shape was learned."""
        if self.attempts >= MAX_ATTEMPTS or len(self.shapes) >= MAX_SHAPES:
            return False
        lead = candidate(text)
        if lead is None:
            return False
        self.attempts += 1
        fatal = text.startswith(FATAL, len(lead))
        lead = unknown_part(lead)
        shape = shape_of(lead)
        if shape in self.shapes or self.tried.get(shape, 0) >= MAX_REFUSALS:
            return False
        if not confirms(shape, fatal, following):
            self.tried[shape] = self.tried.get(shape, 0) + 1
            return False
        self.shapes.append(shape)
        self.pattern = re.compile("|".join(f"(?:{s})" for s in self.shapes))
        return True

    def peel(self, text: str) -> int:
        """Length of the learned prefix that starts ``text`` (0: none)."""
        if self.pattern is None:
            return 0
        m = self.pattern.match(text)
        return m.end() if m is not None else 0
