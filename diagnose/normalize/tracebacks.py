"""Rebuild Python (and C++ ``frame #N:``) tracebacks from normalised lines, one process stream at a time.

Thousands of ranks print their tracebacks at the same moment, so lines of different ranks interleave. Lines are
first split by ``LogLine.stream`` (the rank / local rank / host that wrote them), then each stream runs through a
small state machine:

    idle --"Traceback (most recent call last):"--> frames --unindented line--> message --blank/new record--> idle
                      (a bare ``File "...", line N`` also starts a headless traceback, e.g. a cut window)

Chained exceptions ("During handling of the above exception, another exception occurred:" and "The above exception
was the direct cause of the following exception:") link the next traceback to the previous one (``cause``,
``chain_kind``). Python 3.11+ caret lines (``^^^^``, ``~~~^^^``) are skipped. C++ stacks (``Exception raised from
X at file:line (most recent call first):`` then ``frame #0: ...``) and ``terminate called after throwing an
instance of 'T'`` / ``what():`` blocks are kept as ``cpp_frames``.

Every exception line seen becomes a Traceback's ``exc_line``; every LogLine is in at most one Traceback's
``lines``. Nothing here raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from diagnose.model import LogLine

TRACEBACK_HEADER = "Traceback (most recent call last):"
CHAIN_CONTEXT = "During handling of the above exception, another exception occurred:"
CHAIN_CAUSE = "The above exception was the direct cause of the following exception:"
MAX_MESSAGE_LINES = 60
MAX_FRAMES = 2000
MAX_BLANKS_IN_FRAMES = 2  # Python prints none between frames; a few can come from other unprefixed processes

_FRAME = re.compile(r'\s*File "(?P<file>[^"]*)", line (?P<line>\d+)(?:, in (?P<func>.*))?$')
_CARET = re.compile(r"\s*[\^~][\^~ ]*$")
_EXCEPTION = re.compile(r"(?P<type>[A-Za-z_][\w.]*(?:\[[^\]]*\])?)(?::(?: ?(?P<msg>.*))?)?$")
_CPP_RAISED = re.compile(r"Exception raised from (?P<where>.*?) \(most recent call first\):\s*$")
_CPP_FRAME = re.compile(r"\s*frame #(?P<n>\d+): (?P<what>.*)$")
_TERMINATE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']*)'")
_WHAT = re.compile(r"\s*what\(\):\s+(?P<msg>.*)$")
_WARNING_RECORD = re.compile(r"\S+\.py:\d+: \w*(?:Warning|Error):")
_REPEATED = re.compile(r"\s*\[Previous line repeated \d+ more times?\]\s*$")


@dataclass(slots=True)
class Frame:
    file: str
    line: int
    function: str
    code: str = ""
    log_line: LogLine | None = None  # the ``File "..."`` line in the log (its lineno is the evidence line)

    @property
    def text(self) -> str:
        """The frame as Python prints it, on one line: what ``frames_any`` substrings are checked against."""
        head = f'File "{self.file}", line {self.line}, in {self.function}'
        return f"{head} {self.code}" if self.code else head


@dataclass(slots=True)
class Traceback:
    """One exception as printed by one process."""

    stream: tuple
    frames: list[Frame] = field(default_factory=list)
    exc_type: str = ""
    message: str = ""
    exc_line: LogLine | None = None
    lines: list[LogLine] = field(default_factory=list)
    cpp_frames: list[str] = field(default_factory=list)
    cpp_raised_from: str = ""
    cause: "Traceback | None" = None  # the exception this one happened while handling / was raised from
    chain_kind: str | None = None  # "cause" (raise ... from) or "context" (during handling)
    headless: bool = False  # started at a File line: the "Traceback" header was not seen

    @property
    def functions(self) -> list[str]:
        return [f.function for f in self.frames]

    @property
    def frame_names(self) -> list[str]:
        """``file:function`` and the code line of every frame: what rule ``frames_any`` checks look in."""
        return [f"{f.file}:{f.function} {f.code}".rstrip() for f in self.frames] + list(self.cpp_frames)

    @property
    def chain(self) -> list["Traceback"]:
        """Earlier exceptions this one is chained to, oldest first (not including self)."""
        out: list[Traceback] = []
        seen: set[int] = set()
        node = self.cause
        while node is not None and id(node) not in seen:
            seen.add(id(node))
            out.append(node)
            node = node.cause
        out.reverse()
        return out

    @property
    def first_line(self) -> int:
        return self.lines[0].lineno if self.lines else 0


_IDLE, _FRAMES, _CODE, _MESSAGE, _CPP, _AFTER = range(6)


class _StreamParser:
    """The state machine for one stream."""

    def __init__(self, stream: tuple, out: list[Traceback]) -> None:
        self.stream = stream
        self.out = out
        self.state = _IDLE
        self.tb: Traceback | None = None
        self.last: Traceback | None = None  # the most recent finished traceback (for chaining)
        self.pending_chain: str | None = None
        self.message_lines = 0
        self.blank_run = 0

    # -- helpers
    def _start(self, line: LogLine, headless: bool) -> None:
        self._finish()
        tb = Traceback(stream=self.stream, headless=headless)
        if self.pending_chain is not None and self.last is not None:
            tb.cause = self.last
            tb.chain_kind = self.pending_chain
        self.pending_chain = None
        self.tb = tb
        self.state = _FRAMES
        self.blank_run = 0
        tb.lines.append(line)

    def _finish(self) -> None:
        if self.tb is not None:
            self.out.append(self.tb)
            self.last = self.tb
            self.tb = None
        self.state = _IDLE

    def _set_exception(self, line: LogLine, text: str) -> None:
        tb = self.tb
        assert tb is not None
        m = _EXCEPTION.match(text)
        if m is not None:
            tb.exc_type = m.group("type")
            tb.message = (m.group("msg") or "").rstrip()
        else:
            tb.exc_type = ""
            tb.message = text.strip()
        tb.exc_line = line
        tb.lines.append(line)
        self.state = _MESSAGE
        self.message_lines = 0

    def _ends_message(self, line: LogLine, text: str) -> bool:
        tb = self.tb
        if not text.strip():
            return True
        stripped = text.lstrip()
        if stripped.startswith((TRACEBACK_HEADER, CHAIN_CAUSE, CHAIN_CONTEXT)) or _FRAME.match(text):
            return True
        exc = tb.exc_line if tb is not None else None
        if exc is not None and (line.level, line.timestamp) != (exc.level, exc.timestamp):
            if line.level is not None or line.timestamp is not None:
                return True  # a new log record
        if _WARNING_RECORD.match(stripped) or _TERMINATE.match(stripped):
            return True
        return self.message_lines >= MAX_MESSAGE_LINES

    # -- the machine
    def feed(self, line: LogLine) -> None:
        text = line.text
        state = self.state
        if state in (_FRAMES, _CODE):
            self._in_frames(line, text)
        elif state == _MESSAGE:
            self._in_message(line, text)
        elif state == _CPP:
            self._in_cpp(line, text)
        else:
            self._idle(line, text)

    def _idle(self, line: LogLine, text: str) -> None:
        stripped = text.strip()
        if stripped.startswith(TRACEBACK_HEADER):
            self._start(line, headless=False)
            return
        if stripped == CHAIN_CONTEXT or stripped == CHAIN_CAUSE:
            if self.last is not None:
                self.pending_chain = "context" if stripped == CHAIN_CONTEXT else "cause"
                self.last.lines.append(line)
            return
        m = _TERMINATE.search(stripped)
        if m is not None:
            self._finish()
            self.tb = Traceback(stream=self.stream, exc_type=m.group("type"), exc_line=line, lines=[line])
            self.tb.message = ""
            self.state = _MESSAGE
            self.message_lines = 0
            return
        if stripped.startswith("File \"") and _FRAME.match(text):
            self._start(line, headless=True)
            self.tb.lines.pop()
            self._in_frames(line, text)
            return
        m = _CPP_RAISED.search(stripped)
        if m is not None:
            self._finish()
            self.tb = Traceback(stream=self.stream, exc_type="", exc_line=line, lines=[line])
            self.tb.message = stripped
            self.tb.cpp_raised_from = m.group("where")
            self.state = _CPP
            return
        if stripped and self.pending_chain is None:
            self.last = None  # unrelated output breaks any chain

    def _in_frames(self, line: LogLine, text: str) -> None:
        tb = self.tb
        assert tb is not None
        m = _FRAME.match(text)
        if m is not None:
            if len(tb.frames) < MAX_FRAMES:
                tb.frames.append(
                    Frame(m.group("file"), int(m.group("line")), (m.group("func") or "").strip(), log_line=line)
                )
            tb.lines.append(line)
            self.state = _CODE
            return
        if not text.strip():
            self.blank_run += 1
            if self.blank_run > MAX_BLANKS_IN_FRAMES:
                self._finish()  # the traceback was cut off: what follows is not its exception
                return
            tb.lines.append(line)
            return
        self.blank_run = 0
        if _CARET.match(text) or _REPEATED.match(text):
            tb.lines.append(line)
            return
        if text[:1] in (" ", "\t"):
            if self.state == _CODE and tb.frames and not tb.frames[-1].code:
                tb.frames[-1].code = text.strip()
            tb.lines.append(line)
            return
        if text.startswith(TRACEBACK_HEADER):
            self._start(line, headless=False)  # a new traceback before this one finished (cut output)
            return
        self._set_exception(line, text)

    def _in_message(self, line: LogLine, text: str) -> None:
        tb = self.tb
        assert tb is not None
        m = _WHAT.match(text)
        if m is not None and tb.exc_line is not None and not tb.message and not tb.frames:
            tb.message = m.group("msg").rstrip()  # terminate called ... / what(): the message
            tb.exc_line = line
            tb.lines.append(line)
            return
        raised = _CPP_RAISED.search(text)
        if raised is not None:
            tb.cpp_raised_from = raised.group("where")
            tb.lines.append(line)
            self.state = _CPP
            return
        if self._ends_message(line, text):
            self._finish()
            self._idle(line, text)
            return
        tb.message = f"{tb.message}\n{text.strip()}" if tb.message else text.strip()
        tb.lines.append(line)
        self.message_lines += 1

    def _in_cpp(self, line: LogLine, text: str) -> None:
        tb = self.tb
        assert tb is not None
        m = _CPP_FRAME.match(text)
        if m is not None:
            if len(tb.cpp_frames) < MAX_FRAMES:
                tb.cpp_frames.append(m.group("what").strip())
            tb.lines.append(line)
            return
        if not text.strip() and not tb.cpp_frames:
            tb.lines.append(line)
            return
        self._finish()
        self._idle(line, text)


def rebuild(lines: list[LogLine]) -> list[Traceback]:
    """All tracebacks in ``lines``, in the order their first line appears. Never raises."""
    out: list[Traceback] = []
    parsers: dict[tuple, _StreamParser] = {}
    try:
        for line in lines:
            key = line.stream
            parser = parsers.get(key)
            if parser is None:
                parser = parsers[key] = _StreamParser(key, out)
            parser.feed(line)
        for parser in parsers.values():
            parser._finish()
    except Exception:  # pragma: no cover - defensive: never break the scan
        for parser in parsers.values():
            if parser.tb is not None and parser.tb not in out:
                out.append(parser.tb)
    out.sort(key=lambda tb: (tb.lines[0].path, tb.lines[0].lineno) if tb.lines else ("", 0))
    return out


def traceback_ending_at(lines: list[LogLine], exc_line_index: int) -> Traceback | None:
    """The traceback whose exception (or message continuation) is ``lines[exc_line_index]``.

    ``lines`` is a window of lines (any streams) that ends at or after the matched line; only lines of the matched
    line's stream are used. Returns None when that line is not part of any traceback.
    """
    try:
        target = lines[exc_line_index]
    except (IndexError, TypeError):
        return None
    try:
        stream = target.stream
        same = [ln for ln in lines[: exc_line_index + 1] if ln.stream == stream]
        after = [ln for ln in lines[exc_line_index + 1 :] if ln.stream == stream][:MAX_MESSAGE_LINES]
        for tb in rebuild(same + after):
            if any(ln is target for ln in tb.lines):
                return tb
    except Exception:  # pragma: no cover - defensive
        return None
    return None
