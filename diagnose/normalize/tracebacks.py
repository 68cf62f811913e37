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

Python 3.11+ exception groups (``ExceptionGroup`` / ``BaseExceptionGroup``, from asyncio TaskGroup, anyio, trio)
print as a tree with a margin::

      + Exception Group Traceback (most recent call last):
      |   File "x.py", line 3, in <module>
      | ExceptionGroup: many (2 sub-exceptions)
      +-+---------------- 1 ----------------
        | Traceback (most recent call last):
        |   File "w.py", line 8, in write_shard
        | torch.OutOfMemoryError: CUDA out of memory. ...
        +---------------- 2 ----------------
        | TypeError: 2
        +------------------------------------

``normalize_line`` removes the margin and keeps its depth (``LogLine.group_depth``). Here every depth of an open
group gets its own state machine (a "slot": the group's own traceback at depth 1, the sub-exception being printed
at depth 2, and so on), so each sub-exception becomes an ordinary Traceback (type, message, frames, its own chained
causes) and the group keeps the structure: the group's Traceback has ``is_group`` and ``exceptions`` (its members in
printed order, ``omitted`` for "and N more exceptions" / "max_group_depth" cuts), each member has ``group`` and
``group_index``. Like chained exceptions, members are also in the flat list ``rebuild`` returns.

rich's boxed tracebacks (``rich.traceback``: HF accelerate/transformers, typer CLIs, Lightning's rich handler)
print frames as ``path:line in function`` inside a box, a long path wrapped over several box rows; the box's
location rows become ordinary Frames and the exception line after the box is read as usual::

    ╭────────── Traceback (most recent call last) ──────────╮
    │ /env/site-packages/collie/models/llama/m               │
    │ odel.py:235 in __init__                                │
    │ ❱ 235 │   │   self.embed_tokens = VocabParallelEmbedding( │
    ╰────────────────────────────────────────────────────────╯
    TypeError: VocabParallelEmbedding.__init__() missing 2 required keyword-only arguments

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
GROUP_HEADER = "Exception Group Traceback (most recent call last):"
_HEADERS = (TRACEBACK_HEADER, GROUP_HEADER)
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
# torchrun's failure summary prints a child's error file as a field: "  traceback : Traceback (most recent call
# last):", its frames indented two more spaces than Python prints them and the exception line at two spaces.
_SUMMARY_HEADER = re.compile(r"traceback\s*: Traceback \(most recent call last\):$")
_SUMMARY_EXCEPTION = re.compile(r"  (?=[A-Za-z_])")
# rich.traceback's box: header, rows, bottom; a frame's location is "path:line in function" (wrapped over rows)
_RICH_HEADER = re.compile(r"╭─+ Traceback \(most recent call last\) ─+╮$")
_RICH_ROW = re.compile(r"│(?P<body>.*)│$")
_RICH_BOTTOM = re.compile(r"╰─+╯$")
_RICH_LOCATION = re.compile(r"(?P<file>\S+?\.pyx?):(?P<line>\d+) in (?P<func>\S+)")
_RICH_CODE = re.compile(r"(?:❱\s*)?\d+\s*│")  # a source row: "  55 │ ..." or "❱ 58 │ ..."
MAX_RICH_LOCATION = 1000  # characters a wrapped location may take before it is given up
# Exception group structure lines (traceback.py's TracebackException.format): a separator before each member
# ("+-+" before the first), "..." instead of a number past max_group_width, one closing rule after the last member.
_GROUP_SEPARATOR = re.compile(r"(?P<indent>(?: {2})*)(?:\+-| {2})\+-{16} (?P<title>\d+|\.\.\.) -{16}\s*$")
_GROUP_CLOSE = re.compile(r"(?P<indent>(?: {2})*)\+-{36}\s*$")
_GROUP_MORE = re.compile(r"and (?P<n>\d+) more exceptions?\s*$")
_GROUP_TOO_DEEP = re.compile(r"\.\.\. \(max_group_depth is \d+\)\s*$")
_GROUP_SIZE = re.compile(r"\((?P<n>\d+) sub-exceptions?\)\s*$")


@dataclass(slots=True)
class Frame:
    file: str
    line: int
    function: str
    log_line: LogLine  # the ``File "..."`` line in the log (its lineno is the evidence line)
    code: str = ""
    code_line: LogLine | None = None  # the line that printed ``code`` (the source line under the frame)

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
    cause: Traceback | None = None  # the exception this one happened while handling / was raised from
    chain_kind: str | None = None  # "cause" (raise ... from) or "context" (during handling)
    headless: bool = False  # started at a File line: the "Traceback" header was not seen
    is_group: bool = False  # an ExceptionGroup / BaseExceptionGroup (its members are in ``exceptions``)
    exceptions: list[Traceback] = field(default_factory=list)  # a group's members, in printed order
    omitted: int = 0  # a group's members not printed ("and N more exceptions", "... (max_group_depth is N)")
    group: Traceback | None = None  # the exception group this exception was printed inside
    group_index: int | None = None  # its 1-based place in that group

    @property
    def groups(self) -> list[Traceback]:
        """The exception groups this exception is nested in, outermost first."""
        return _walk_up(self, "group")

    @property
    def chain(self) -> list[Traceback]:
        """Earlier exceptions this one is chained to, oldest first (not including self)."""
        return _walk_up(self, "cause")


def _walk_up(tb: Traceback, link: str) -> list[Traceback]:
    """Follow ``link`` ("cause" or "group") from ``tb``, farthest first, ``tb`` itself excluded; a cycle (never
    built by the rebuild, but cheap to guard) stops the walk."""
    out: list[Traceback] = []
    seen: set[int] = set()
    node = getattr(tb, link)
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        out.append(node)
        node = getattr(node, link)
    out.reverse()
    return out


_IDLE, _FRAMES, _CODE, _MESSAGE, _CPP, _AFTER, _RICH = range(7)


class _StreamParser:
    """The state machine for one stream."""

    def __init__(self, stream: tuple, out: list[Traceback], in_group: bool = False) -> None:
        self.stream = stream
        self.out = out
        self.state = _IDLE
        self.tb: Traceback | None = None
        self.last: Traceback | None = None  # the most recent finished traceback (for chaining)
        self.pending_chain: str | None = None
        self.message_lines = 0
        self.blank_run = 0
        # A slot of an exception group: lines come without margin, and a bare "Type: message" line is an exception
        # printed without a stack (a member created but never raised, e.g. ExceptionGroup("x", [ValueError(1)])).
        self.in_group = in_group
        self.group: _GroupPrintout | None = None  # an exception group being printed in this stream
        self.rich_location = ""  # rows of a rich frame location read so far (it may wrap)
        self.summary_block = False  # inside torchrun's summary: the exception line is indented two spaces

    # -- helpers
    def _start(self, line: LogLine, headless: bool) -> Traceback:
        self._finish()
        tb = Traceback(stream=self.stream, headless=headless, lines=[line],
                       is_group=line.text.lstrip().startswith(GROUP_HEADER))
        if self.pending_chain is not None and self.last is not None:
            tb.cause = self.last
            tb.chain_kind = self.pending_chain
        self.pending_chain = None
        self.tb = tb
        self.state = _FRAMES
        self.blank_run = 0
        return tb

    def _finish(self) -> None:
        self.summary_block = False
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
            if tb.exc_type.endswith("Group") and _GROUP_SIZE.search(tb.message):
                tb.is_group = True
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
        if stripped.startswith((*_HEADERS, CHAIN_CAUSE, CHAIN_CONTEXT)) or _FRAME.match(text):
            return True
        exc = tb.exc_line if tb is not None else None
        if exc is not None and (line.level, line.timestamp) not in ((exc.level, exc.timestamp), (None, None)):
            return True  # a new log record
        if _WARNING_RECORD.match(stripped) or _TERMINATE.match(stripped):
            return True
        return self.message_lines >= MAX_MESSAGE_LINES

    # -- the machine
    def feed(self, line: LogLine) -> None:
        text = line.text
        if not self.in_group:
            if line.group_depth or (text.startswith("  ") and _GROUP_SEPARATOR.match(text)):
                self._feed_group(line)
                return
            if self.group is not None:
                if _GROUP_CLOSE.match(text):
                    self.group.close(line)
                    return
                self._end_group()
        state = self.state
        if state in (_FRAMES, _CODE):
            self._in_frames(line, text)
        elif state == _MESSAGE:
            self._in_message(line, text)
        elif state == _CPP:
            self._in_cpp(line, text)
        elif state == _RICH:
            self._in_rich(line, text)
        else:
            self._idle(line, text)

    def _feed_group(self, line: LogLine) -> None:
        if self.group is None:
            self._finish()
            self.group = _GroupPrintout(self)
        self.group.feed(line)

    def _end_group(self) -> None:
        """The printout ended: its outermost exception is what a following "During handling..." chains to."""
        group = self.group
        self.group = None
        if group is not None:
            self.last = group.finish()
            self.pending_chain = None
            self.state = _IDLE

    def _idle(self, line: LogLine, text: str) -> None:
        stripped = text.strip()
        if stripped.startswith(_HEADERS):
            self._start(line, headless=False)
            return
        if stripped.startswith("traceback") and _SUMMARY_HEADER.match(stripped):
            self._start(line, headless=False)
            self.summary_block = True
            return
        if stripped.startswith("╭") and _RICH_HEADER.match(stripped):
            self._start(line, headless=False)
            self.state = _RICH
            self.rich_location = ""
            return
        if stripped in (CHAIN_CONTEXT, CHAIN_CAUSE):
            if self.last is not None:
                self.pending_chain = "context" if stripped == CHAIN_CONTEXT else "cause"
                self.last.lines.append(line)
            return
        m = _TERMINATE.search(stripped)
        if m is not None:
            self._finish()
            self.tb = Traceback(stream=self.stream, exc_type=m.group("type"), exc_line=line, lines=[line])
            self.state = _MESSAGE
            self.message_lines = 0
            return
        if stripped.startswith("File \"") and _FRAME.match(text):
            self._start(line, headless=True).lines.pop()  # _in_frames adds it as a frame
            self._in_frames(line, text)
            return
        m = _CPP_RAISED.search(stripped)
        if m is not None:
            self._finish()
            self.tb = Traceback(stream=self.stream, message=stripped, cpp_raised_from=m.group("where"), exc_line=line,
                                lines=[line])
            self.state = _CPP
            return
        if self.in_group and text[:1] not in (" ", "\t") and _EXCEPTION.match(text) is not None:
            # a member printed without a stack: only its exception line (_set_exception adds it)
            self._start(line, headless=False).lines.pop()
            self._set_exception(line, text)
            return
        if stripped and self.pending_chain is None:
            self.last = None  # unrelated output breaks any chain

    def _in_frames(self, line: LogLine, text: str) -> None:
        tb = self.tb
        assert tb is not None
        m = _FRAME.match(text)
        if m is not None:
            if len(tb.frames) < MAX_FRAMES:
                tb.frames.append(Frame(m.group("file"), int(m.group("line")), (m.group("func") or "").strip(), line))
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
        if self.summary_block and tb.frames and _SUMMARY_EXCEPTION.match(text) and _EXCEPTION.match(text[2:]):
            self._set_exception(line, text[2:])
            return
        if text[:1] in (" ", "\t"):
            if self.state == _CODE and tb.frames and not tb.frames[-1].code:
                tb.frames[-1].code = text.strip()
                tb.frames[-1].code_line = line
            tb.lines.append(line)
            return
        if text.startswith(_HEADERS):
            self._start(line, headless=False)  # a new traceback before this one finished (cut output)
            return
        self._set_exception(line, text)

    def _in_rich(self, line: LogLine, text: str) -> None:
        """Inside rich's box: location rows become frames; the bottom border hands over to the exception line."""
        tb = self.tb
        assert tb is not None
        stripped = text.strip()
        if _RICH_BOTTOM.match(stripped):
            tb.lines.append(line)
            self.state = _FRAMES  # the next unindented line is the exception
            return
        row = _RICH_ROW.match(stripped)
        if row is None:
            if not stripped:
                tb.lines.append(line)
                return
            self._finish()  # the box was cut off: what follows is not part of it
            self._idle(line, text)
            return
        tb.lines.append(line)
        body = row.group("body").strip()
        if not body or _RICH_CODE.match(body):
            self.rich_location = ""
            return
        pending = self.rich_location
        for joined in ((pending + body, pending + " " + body) if pending else (body,)):
            m = _RICH_LOCATION.fullmatch(joined)
            if m is not None:
                if len(tb.frames) < MAX_FRAMES:
                    tb.frames.append(Frame(m.group("file"), int(m.group("line")), m.group("func"), log_line=line))
                self.rich_location = ""
                return
        starts_location = body[:1] in ("/", "~", ".") or body[1:3] == ":\\"
        if (pending or starts_location) and len(pending) + len(body) < MAX_RICH_LOCATION:
            self.rich_location = pending + body
        else:
            self.rich_location = ""

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


@dataclass(slots=True)
class _Slot:
    """One depth of an exception group printout being read: the exceptions printed there, in a state machine."""

    depth: int
    parser: _StreamParser
    produced: list[Traceback]
    owner: Traceback | None  # the group whose member this slot prints (None: the outermost level, or unknown)
    index: int | None  # the member's number in its group; None past max_group_width ("...")
    truncated: bool = False  # the "..." slot: holds only "and N more exceptions"


class _GroupPrintout:
    """An exception group printed by one stream: one slot per nesting depth currently open.

    Depth ``d`` content (margin of ``d`` levels) goes to slot ``d``; a separator at indent ``2*d`` closes slots
    deeper than ``d`` and opens a new slot ``d+1`` for the next member of the group that slot ``d`` printed last;
    the closing rule at indent ``2*d`` closes slots ``d`` and deeper. A slot is also opened on demand when content
    arrives at a depth without one (a window that starts inside the printout).
    """

    def __init__(self, main: _StreamParser) -> None:
        self.main = main
        self.slots: dict[int, _Slot] = {}
        self.top: Traceback | None = None  # the last exception of the outermost slot

    def feed(self, line: LogLine) -> None:
        depth = line.group_depth
        if not depth:
            sep = _GROUP_SEPARATOR.match(line.text)
            if sep is not None:
                self._separator(line, len(sep.group("indent")) // 2, sep.group("title"))
            else:
                self.close(line)
            return
        self._close_deeper_than(depth)
        slot = self.slots.get(depth)
        if slot is None:
            slot = self._open(depth, owner=None, index=None)
        text = line.text
        if slot.truncated or _GROUP_TOO_DEEP.match(text):
            more = _GROUP_MORE.match(text)
            owner = slot.owner
            if owner is not None and (more is not None or not slot.truncated):
                owner.omitted += int(more.group("n")) if more is not None else 1
                owner.lines.append(line)
            return
        slot.parser.feed(line)

    def close(self, line: LogLine) -> None:
        """The closing rule after a group's last member: close the member slots it belongs to."""
        m = _GROUP_CLOSE.match(line.text)
        depth = len(m.group("indent")) // 2 if m is not None else 1
        slot = self.slots.get(depth)
        holder = slot.owner if slot is not None else None
        self._close_deeper_than(depth - 1)
        if holder is not None:
            holder.lines.append(line)

    def finish(self) -> Traceback | None:
        self._close_deeper_than(0)
        return self.top

    # -- helpers
    def _separator(self, line: LogLine, owner_depth: int, title: str) -> None:
        self._close_deeper_than(owner_depth)
        owner: Traceback | None = None
        holder = self.slots.get(owner_depth)
        if holder is not None:
            holder.parser._finish()
            owner = holder.parser.last
        if owner is not None:
            owner.is_group = True
            owner.lines.append(line)
        index = int(title) if title.isdigit() else None
        slot = self._open(owner_depth + 1, owner, index)
        slot.truncated = index is None

    def _open(self, depth: int, owner: Traceback | None, index: int | None) -> _Slot:
        produced: list[Traceback] = []
        parser = _StreamParser(self.main.stream, produced, in_group=True)
        if not any(d < depth for d in self.slots):
            # the outermost level: it continues the chain of what the stream printed before the group
            parser.last = self.main.last
            parser.pending_chain = self.main.pending_chain
            self.main.pending_chain = None
        slot = self.slots[depth] = _Slot(depth, parser, produced, owner, index)
        return slot

    def _close_deeper_than(self, depth: int) -> None:
        for d in sorted((d for d in self.slots if d > depth), reverse=True):
            self._close(self.slots.pop(d))

    def _close(self, slot: _Slot) -> None:
        slot.parser._finish()
        owner = slot.owner
        for tb in slot.produced:
            if owner is not None:
                tb.group = owner
                tb.group_index = slot.index
            self.main.out.append(tb)
        if slot.produced:
            if owner is not None:
                owner.exceptions.append(slot.produced[-1])
            if not any(d < slot.depth for d in self.slots):
                self.top = slot.produced[-1]
        slot.produced.clear()


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
            parser._end_group()
            parser._finish()
    except Exception:  # noqa: BLE001  # pragma: no cover - defensive: never break the scan
        listed = {id(tb) for tb in out}
        out.extend(p.tb for p in parsers.values() if p.tb is not None and id(p.tb) not in listed)
    out.sort(key=lambda tb: (tb.lines[0].path, tb.lines[0].lineno) if tb.lines else ("", 0))
    return out


def traceback_ending_at(lines: list[LogLine], exc_line_index: int) -> Traceback | None:
    """The traceback whose exception (or message continuation) is ``lines[exc_line_index]``.

    ``lines`` is a window of lines (any streams) that ends at or after the matched line; only lines of the matched
    line's stream are used. Returns None when that line is not part of any traceback.
    """
    try:
        target = lines[exc_line_index]
    except IndexError:
        return None
    stream = target.stream
    same = [ln for ln in lines[: exc_line_index + 1] if ln.stream == stream]
    after = [ln for ln in lines[exc_line_index + 1 :] if ln.stream == stream][:MAX_MESSAGE_LINES]
    return next((tb for tb in rebuild(same + after) if any(ln is target for ln in tb.lines)), None)
