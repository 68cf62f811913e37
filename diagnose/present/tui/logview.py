"""The log view: only the visible rows are drawn (Textual's line API), from a background-built ``LogIndex``.

Rows are lines of the file, or of one rank when the rank facet is on. Each line is made inert
(``diagnose.present.safe.inert``) and put in a rich ``Text``: markup and escape sequences in a log never style or
drive the screen. Lines are cut at ``MAX_LINE_CELLS`` so one 10 MB line does not stall drawing.
"""

from __future__ import annotations

import re

from rich.segment import Segment
from rich.text import Text
from textual.binding import Binding
from textual.cache import LRUCache
from textual.events import Click
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from diagnose.present.safe import inert, shorten
from diagnose.present.tui.logindex import LogIndex
from diagnose.present.tui.rankfacet import RankFacet

MAX_LINE_CELLS = 1000
LINE_BYTES_CAP = 4096
# SGR (colour) sequences only: dropped in the default view, as a terminal would not print them. Every other
# escape sequence (cursor moves, screen clears, OSC) is kept and shown inert.
_SGR = re.compile(r"\x1b\[[0-9;:]*m")


class LogView(ScrollView, can_focus=True):
    """Rows of a ``LogIndex`` (or of one ``RankFacet``), a cursor row, and search-term highlights."""

    COMPONENT_CLASSES = {"logview--gutter", "logview--cursor", "logview--match", "logview--evidence"}
    DEFAULT_CSS = """
    LogView { background: $surface; }
    LogView > .logview--gutter { color: $text-muted; }
    LogView > .logview--cursor { background: $primary 40%; }
    LogView > .logview--match { background: $warning 60%; color: $text; }
    LogView > .logview--evidence { color: $error; text-style: bold; }
    """
    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown,space", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "Top", show=False),
        Binding("end,G", "edge(1)", "Bottom", show=False),
    ]

    cursor = reactive(0, always_update=True)

    def __init__(self, index: LogIndex, *, marked_lines: set[int] | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.index = index
        self.facet: RankFacet | None = None
        self.term: str = ""
        self.marked_lines = marked_lines or set()  # 0-based evidence lines: a marker in the gutter
        self._pending_line: int | None = None
        self.raw = False  # True: show colour sequences too (inert) instead of dropping them
        self._strips: LRUCache[tuple, Strip] = LRUCache(1024)
        self._rows_seen = -1
        self._anchor: tuple[int, int] | None = None  # (file line, screen row) to keep in place across a facet change
        # the screen row the kept place is owed: near the end of a log the rank's rows after the place fill less
        # than a screen, so it cannot be shown there until the rows above it arrive
        self._owed_row: int | None = None
        self._truncations_seen = 0
        self.tail = False  # tail mode: the cursor stays on the last row as lines are appended (moving up ends it)

    # ----------------------------------------------------------------------------------------- rows

    @property
    def row_count(self) -> int:
        return len(self.facet.rows) if self.facet is not None else self.index.line_count

    def line_at_row(self, row: int) -> int:
        return self.facet.rows[row] if self.facet is not None else row

    @property
    def cursor_line(self) -> int:
        """0-based file line under the cursor (0 when the view is empty)."""
        return self.line_at_row(self.cursor) if 0 <= self.cursor < self.row_count else 0

    def on_mount(self) -> None:
        self._poll()
        self.set_interval(0.1, self._poll)

    def _poll(self) -> None:
        """Grow the scrollable area as the index (or facet) grows; keep the rows on screen in place when the
        facet's scan adds rows above them; honour a jump (or a kept place) waiting for its line."""
        facet = self.facet
        anchor_ready = facet is not None and self._anchor is not None and facet.covers(self._anchor[0])
        if facet is not None:  # (``covers`` read before ``publish``: what it covers is then published)
            above = facet.head_rows
            shift = facet.publish()
            if shift:
                self._grow()
                if self.cursor >= above:  # the cursor's row moved down: keep it on its screen row
                    screen_row = self.cursor - self.scroll_offset.y if self._owed_row is None else self._owed_row
                    self.set_reactive(LogView.cursor, self.cursor + shift)
                    self._scroll_cursor_to(screen_row)
                elif self.scroll_offset.y >= above:
                    self.scroll_to(y=self.scroll_offset.y + shift, animate=False, immediate=True, force=True)
        truncations = getattr(self.index, "truncations", 0)
        if truncations != self._truncations_seen:  # the file was cut and read again: new text
            self._truncations_seen = truncations
            self._rows_seen = -1
        grew = self.row_count != self._rows_seen
        self._grow()
        if self.tail and grew and self._anchor is None:
            self.move_to_row(self.row_count - 1)
        if anchor_ready and self._anchor is not None:
            line, screen_y = self._anchor
            self._anchor = None
            self._place(self.facet.row_of_line(line) if self.facet is not None else line, screen_y)
        if self._pending_line is not None:
            line = self._pending_line
            if (line < self.index.line_count or self.index.done.is_set()) and (
                    self.facet is None or self.facet.covers(line)):
                self._pending_line = None
                self.go_to_line(line)

    def _grow(self) -> None:
        rows = self.row_count
        if rows != self._rows_seen:
            self._rows_seen = rows
            gutter = self._gutter_width()
            width = min(self.index.longest_line, MAX_LINE_CELLS) + gutter + 2
            self.virtual_size = Size(width, rows)
            self._strips.clear()
            self.refresh()

    def _gutter_width(self) -> int:
        total = self.index.line_count if self.index.done.is_set() else max(self.index.line_count, 999_999)
        return len(str(max(total, 1)))

    # ------------------------------------------------------------------------------------------ draw

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.size.width
        base = self.rich_style
        if row >= self.row_count:
            return Strip.blank(width, base)
        line = self.line_at_row(row)
        key = (line, row == self.cursor, self.term, self._gutter_width(), self.raw)
        strip = self._strips.get(key)
        if strip is None:
            strip = self._render_row(line, row == self.cursor)
            self._strips[key] = strip
        # the gutter (line number, evidence marker, one blank) stays put; only the text scrolls sideways
        gutter = min(self._gutter_width() + 2, width)
        return Strip.join([strip.crop_extend(0, gutter, base),
                           strip.crop_extend(gutter + scroll_x, gutter + scroll_x + width - gutter, base)])

    def _render_row(self, line: int, is_cursor: bool) -> Strip:
        gutter_style = self.get_component_rich_style("logview--gutter")
        marker = " "
        if line in self.marked_lines:
            gutter_style = self.get_component_rich_style("logview--evidence")
            marker = "▶"
        body = shorten(inert(self.shown_text(line)), MAX_LINE_CELLS)
        text = Text(no_wrap=True, end="")
        text.append(f"{line + 1:>{self._gutter_width()}}{marker}", gutter_style)
        text.append(" ")
        start = len(text)
        text.append(body)
        if self.term:
            flags = 0 if any(c.isupper() for c in self.term) else re.IGNORECASE
            match_style = self.get_component_rich_style("logview--match")
            for m in re.finditer(re.escape(inert(self.term)), body, flags):
                text.stylize(match_style, start + m.start(), start + m.end())
        if is_cursor:
            text.stylize(self.get_component_rich_style("logview--cursor"))
        segments = [Segment(s.text, self.rich_style + s.style if s.style else self.rich_style) for s in
                    text.render(self.app.console)]
        return Strip(segments)

    def shown_text(self, line: int) -> str:
        """The line as read, less its colour sequences unless ``raw`` (not yet inert)."""
        text = self.index.line_text(line, LINE_BYTES_CAP)
        return text if self.raw or "\x1b" not in text else _SGR.sub("", text)

    def toggle_raw(self) -> None:
        self.raw = not self.raw
        self._strips.clear()
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    # ---------------------------------------------------------------------------------------- moving

    def watch_cursor(self, old: int, new: int) -> None:
        self._owed_row = None  # the user moved (a kept place re-owes its row right after, in _scroll_cursor_to)
        self._strips.clear()
        self.refresh()

    def _show_row(self, row: int, center: bool = False) -> None:
        height = max(1, self.size.height)
        top = self.scroll_offset.y
        if center:
            self.scroll_to(y=max(0, row - height // 2), animate=False, immediate=True, force=True)
        elif row < top:
            self.scroll_to(y=row, animate=False, immediate=True, force=True)
        elif row >= top + height:
            self.scroll_to(y=row - height + 1, animate=False, immediate=True, force=True)

    def move_to_row(self, row: int, center: bool = False) -> None:
        rows = self.row_count
        if rows == 0:
            return
        row = max(0, min(row, rows - 1))
        self.cursor = row
        self._show_row(row, center)

    def action_cursor(self, delta: int) -> None:
        self.tail = self.tail and delta > 0
        self.move_to_row(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self.tail = self.tail and direction > 0
        self.move_to_row(self.cursor + direction * max(1, self.size.height - 1))

    def action_edge(self, end: int) -> None:
        self.tail = self.tail and bool(end)
        self.move_to_row(self.row_count - 1 if end else 0)

    def set_tail(self, on: bool) -> None:
        """Tail mode on: to the last row now, and after each append."""
        self.tail = on
        if on:
            self.move_to_row(self.row_count - 1)

    def _place(self, row: int, screen_y: int) -> None:
        """Cursor on ``row``, shown on screen row ``screen_y`` (as near as the ends of the log allow)."""
        if self.row_count == 0:
            return
        row = max(0, min(row, self.row_count - 1))
        self.cursor = row
        self._scroll_cursor_to(screen_y)

    def _scroll_cursor_to(self, screen_y: int) -> None:
        """Scroll so that the cursor is on screen row ``screen_y``; when the rows above it are too few for that,
        the row is owed (``_owed_row``) and paid when a facet's scan adds rows above."""
        want = max(0, self.cursor - screen_y)
        # force: rows that just arrived have no scrollbar yet, and without one Textual ignores the scroll
        self.scroll_to(y=want, animate=False, immediate=True, force=True)
        self._owed_row = screen_y if self.facet is not None and self.scroll_offset.y < want else None

    def go_to_line(self, line: int) -> None:
        """Put the cursor on 0-based file ``line`` (centred); waits for the index (and the rank facet's scan)
        when not there yet."""
        if (line >= self.index.line_count and not self.index.done.is_set()) or (
                self.facet is not None and not self.facet.covers(line)):
            self._pending_line = line
            return
        row = self.facet.row_of_line(line) if self.facet is not None else line
        self.move_to_row(row, center=True)

    def on_click(self, event: Click) -> None:
        row = self.scroll_offset.y + event.y
        if 0 <= row < self.row_count:
            self.tail = False
            self.cursor = row

    # ---------------------------------------------------------------------------------------- facets

    def set_facet(self, facet: RankFacet | None) -> None:
        """Show one rank's rows (or all again with None), keeping the user's place: the line under the cursor
        (or, filtered, the nearest line of the rank before it) stays on the same screen row. A facet still
        scanning shows what it found at once; the place is taken once its scan has read that line."""
        line = self.cursor_line
        screen_y = max(0, min(self.cursor - self.scroll_offset.y, max(0, self.size.height - 1)))
        if self.facet is not None and self.facet is not facet:
            self.facet.stop()
        self.facet = facet
        self._pending_line = None
        self._rows_seen = -1
        self._anchor = (line, screen_y)
        if facet is None:
            self._anchor = None
            self._grow()
            self._place(line, screen_y)
            return
        self.set_reactive(LogView.cursor, 0)  # until the place is known: the rows found so far, from the top
        self.scroll_to(y=0, animate=False, immediate=True)
        self._strips.clear()
        self._poll()

    def set_term(self, term: str) -> None:
        self.term = term
        self._strips.clear()
        self.refresh()

    def find_from(self, term: str, line: int, backward: bool = False) -> int | None:
        """The next (previous) 0-based line after (before) ``line`` containing ``term`` among the rows shown
        (the rank facet's when it is on); None if none. Reads only: safe to call from a worker thread."""
        facet = self.facet
        while True:
            found = self.index.search(term, line, backward)
            if found is None or facet is None or facet.holds(found):
                return found
            line = found
