"""Secondary screens: the log view, help, export and paste."""

from __future__ import annotations

import bisect
from array import array

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Input, Static, TextArea

from diagnose.present.safe import inert
from diagnose.present.tui.fixrender import TAB_ORDER
from diagnose.present.tui.logindex import LogIndex
from diagnose.present.tui.logview import LogView
from diagnose.present.tui.rankfacet import RankFacet

DARK, LIGHT = "textual-dark", "textual-light"
MATCH_COUNT_CAP = 10_000  # "k of N" counts this many matching lines, then says "N+"


class LogScreen(Screen):
    """One log file, opened at a line; ``/`` search, ``n``/``N`` next/previous, ``r`` rank facet, esc back."""

    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("slash", "prompt('search')", "Search"),
        Binding("n", "find(False)", "Next"),
        Binding("N", "find(True)", "Previous"),
        Binding("r", "prompt('rank')", "Rank filter"),
        Binding("colon", "prompt('line')", "Go to line"),
        Binding("y", "copy_line", "Copy line"),
        Binding("a", "toggle_raw", "Colour codes", show=False),
        Binding("f", "toggle_tail", "Follow"),
        Binding("question_mark", "app.help", "Help"),
    ]
    DEFAULT_CSS = """
    LogScreen #log-status { height: 1; background: $panel; padding: 0 1; }
    LogScreen #log-prompt { dock: bottom; display: none; }
    LogScreen #log-prompt.visible { display: block; }
    """

    def __init__(self, index: LogIndex, display_name: str, line: int | None = None,
                 marked_lines: set[int] | None = None, known_ranks: list[int] | None = None,
                 tail: bool = False) -> None:
        super().__init__()
        self.start_tail = tail  # open in tail mode (``tui --follow``)
        self.index = index
        self.display_name = display_name
        self.start_line = line
        self.marked_lines = marked_lines or set()
        self.known_ranks = known_ranks or []  # ranks the findings name: a hint for the rank prompt
        self.prompt_mode = ""
        self.term = ""
        self.message = ""
        self.match: tuple[str, int, str] | None = None  # (term, 0-based line, " (wrapped …)"): the status says
        self.counted: tuple[tuple, array, bool] | None = None  # (key, matching lines, all of them?) of a term

    def compose(self) -> ComposeResult:
        yield Static(id="log-status")
        yield LogView(self.index, marked_lines=self.marked_lines, id="log-view")
        yield Input(id="log-prompt")
        yield Footer()

    @property
    def view(self) -> LogView:
        return self.query_one(LogView)

    def on_mount(self) -> None:
        self.view.focus()
        if self.start_line is not None:  # after the first layout, so the view knows its height to centre
            self.call_after_refresh(self.view.go_to_line, self.start_line)
        if self.start_tail:
            self.call_after_refresh(self.view.set_tail, True)
        self._update_status()
        self.set_interval(0.2, self._update_status)

    def _update_status(self) -> None:
        index = self.index
        text = Text()
        text.append(inert(self.display_name), "bold")
        if index.error:
            text.append(f" · cannot read: {inert(index.error)}", "red")
        elif index.done.is_set():
            text.append(f" · {index.line_count:,} lines")
        else:
            text.append(f" · indexing {index.progress:.0%} ({index.line_count:,} lines so far)", "yellow")
        facet = self.view.facet
        if facet is not None:
            state = "" if facet.done.is_set() or facet.progress >= 1 else f", scanning {facet.progress:.0%}…"
            text.append(f" · rank {facet.rank}: {len(facet.rows):,} lines{state}", "cyan")
        text.append(f" · line {self.view.cursor_line + 1:,}")
        if index.following:
            text.append(" · following" if self.view.tail else " · following (f: back to the end)", "green")
            if getattr(index, "gone", False):
                text.append(" · the file is gone (deleted or moved): waiting for it to come back", "yellow")
            elif getattr(index, "truncations", 0):
                text.append(" · the file was truncated: read again from its start", "yellow")
        elif index.follow_note:
            text.append(f" · {inert(index.follow_note)}", "yellow")
        summary = getattr(self.app, "follow_summary", None)
        if index.following and callable(summary) and summary():
            text.append(f" · {summary()}", "bold")
        if self.match is not None and self.match[1] != self.view.cursor_line:
            self.match = None  # moved away: "match 3 of 9" no longer says where the cursor is
            self.message = ""
        if self.match is not None:
            text.append(f" · {self._match_words()}", "italic")
        elif self.message:
            text.append(f" · {self.message}", "italic")
        self.query_one("#log-status", Static).update(text)

    def action_back(self) -> None:
        prompt = self.query_one("#log-prompt", Input)
        if prompt.has_class("visible"):
            self._close_prompt()
            return
        if self.view.facet is not None:
            self.view.facet.stop()
        self.app.pop_screen()

    def action_prompt(self, mode: str) -> None:
        self.prompt_mode = mode
        prompt = self.query_one("#log-prompt", Input)
        prompt.placeholder = {
            "search": "search (smart case), enter to find",
            "rank": "show only this rank (empty: all ranks)" + self._rank_hint(),
            "line": "go to line number",
        }[mode]
        prompt.value = self.term if mode == "search" else ""
        prompt.add_class("visible")
        prompt.focus()

    def _rank_hint(self) -> str:
        from diagnose.present.tui.fmt import format_ranks

        return f"; the findings name ranks {format_ranks(self.known_ranks)}" if self.known_ranks else ""

    def action_copy_line(self) -> None:
        """Copy the line under the cursor, made inert (no escape sequence reaches the clipboard)."""
        line = self.view.cursor_line
        self.app.copy_to_clipboard(inert(self.view.shown_text(line)))
        self.message = f"copied line {line + 1:,}"
        self._update_status()

    def action_toggle_tail(self) -> None:
        """``f``: follow the file (new lines appear, the view stays at the end), as ``tail -f`` and Toolong do."""
        if self.view.tail:
            self.view.set_tail(False)
            self.message = "stopped at this line (f: follow again)"
        else:
            refused = self.index.start_following()
            if refused:
                self.message = inert(refused)
            else:
                self.view.set_tail(True)
                self.message = ""
                start = getattr(self.app, "watch_followed", None)
                if callable(start):
                    start(self.index)
        self._update_status()

    def action_toggle_raw(self) -> None:
        self.view.toggle_raw()
        self.message = "showing colour codes (inert)" if self.view.raw else "colour codes hidden"
        self._update_status()

    def _close_prompt(self) -> None:
        prompt = self.query_one("#log-prompt", Input)
        prompt.remove_class("visible")
        self.view.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        self._close_prompt()
        if self.prompt_mode == "search":
            self.term = event.value
            if self.term:
                self.action_find(False)
        elif self.prompt_mode == "rank":
            self.set_rank(int(value) if value.isdigit() else None)
            if value and not value.isdigit():
                self.message = f"not a rank: {inert(value)}"
        elif self.prompt_mode == "line" and value.isdigit():
            self.view.go_to_line(max(0, int(value) - 1))
        elif self.prompt_mode == "line" and value:
            self.message = f"not a line number: {inert(value)}"  # the cursor stays (qa-report-11 L6)
        self._update_status()

    def set_rank(self, rank: int | None) -> None:
        self.view.set_facet(None if rank is None else RankFacet(self.index, rank, self.view.cursor_line).start())
        self.message = "" if rank is None else self.message

    def action_find(self, backward: bool) -> None:
        self.match = None  # a new search: the last one's status goes
        if not self.term:
            self.message = "no search term: press /"
            self._update_status()
            return
        self.view.set_term(self.term)
        self.message = f"searching for {inert(self.term)!r}…"
        self._update_status()
        self._find_worker(self.term, self.view.cursor_line, backward)

    @work(thread=True, exclusive=True, group="log-search")
    def _find_worker(self, term: str, from_line: int, backward: bool) -> None:
        """Search off the UI thread: a miss on a multi-GB log reads all of it."""
        found = self.view.find_from(term, from_line, backward)
        wrapped = False
        if found is None and self.index.done.is_set():  # wrap around, as less and vim do
            found = self.view.find_from(term, self.index.line_count if backward else -1, backward)
            wrapped = found is not None
        self.app.call_from_thread(self._found, term, found, backward, wrapped)

    def _found(self, term: str, found: int | None, backward: bool, wrapped: bool = False) -> None:
        if found is None:
            still = "" if self.index.done.is_set() else " (still indexing)"
            self.message = f"no match for {inert(term)!r}{still}"
        else:
            self.view.go_to_line(found)
            self.message = ""
            self.match = (term, found, (" (wrapped to the end)" if backward else " (wrapped to the top)")
                          if wrapped else "")
            if self.counted is None or self.counted[0] != self._count_key(term):
                self._count_worker(term, self._count_key(term))
        self._update_status()

    def _count_key(self, term: str) -> tuple:
        facet = self.view.facet
        return (term, None if facet is None else (facet.rank, facet.done.is_set()), self.index.done.is_set())

    def _match_words(self) -> str:
        """"match 3 of 9 on line 120", "match on line 120 of 10,000+", or "… (counting)" while counting."""
        assert self.match is not None
        term, line, wrapped = self.match
        counted = self.counted
        if counted is None or counted[0] != self._count_key(term):
            return f"match on line {line + 1:,}{wrapped} (counting…)"
        _, lines, complete = counted
        plus = "" if complete else "+"
        k = bisect.bisect_left(lines, line)
        if k < len(lines) and lines[k] == line:
            return f"match {k + 1:,} of {len(lines):,}{plus} on line {line + 1:,}{wrapped}"
        return f"match on line {line + 1:,} of {len(lines):,}{plus}{wrapped}"

    @work(thread=True, exclusive=True, group="log-count")
    def _count_worker(self, term: str, key: tuple) -> None:
        """Count the matching lines (of the rank shown) off the UI thread, up to ``MATCH_COUNT_CAP``."""
        from textual.worker import get_current_worker

        worker = get_current_worker()
        facet = self.view.facet
        keep = None if facet is None else facet.holds
        lines, complete = self.index.match_lines(term, MATCH_COUNT_CAP, keep, lambda: worker.is_cancelled)
        complete = complete and key[2] and (facet is None or key[1][1])  # all of the log (and of the rank)?
        if not worker.is_cancelled:
            self.app.call_from_thread(self._counted, key, lines, complete)

    def _counted(self, key: tuple, lines: array, complete: bool) -> None:
        self.counted = (key, lines, complete)
        self._update_status()


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 90; height: auto; max-height: 90%; border: round $primary; background: $surface;
                            padding: 1 2; }
    """
    KEY_HELP = (  # (Textual's own HELP is markdown for its help panel: not this)
        ("Findings", ""),
        ("up/down, click", "select a finding (root cause is selected first)"),
        ("enter, 2 clicks", "open the log at the finding's evidence (or click an evidence line)"),
        ("l", "open the log at the top"),
        ("c", "copy the fix shown in the tab (OSC 52: works over SSH)"),
        (" ".join(str(n) for n in range(1, len(TAB_ORDER) + 1)),
         "fix tab: " + " / ".join(title for _, title in TAB_ORDER) + " (only the forms the job's stack has: a "
         "Megatron-LM job its flags, a DeepSpeed or HF job the environment lines)"),
        ("e", "export the report (.md markdown, .json JSON)"),
        ("p", "memory plan and what-if editor for the log's config, if found"),
        ("t", "toggle light / dark theme"),
        ("q", "quit"),
        ("Log view", ""),
        ("/  n  N", "search, next match, previous match (smart case)"),
        ("r", "show only one rank's lines (empty: all)"),
        (":", "go to line"),
        ("y", "copy the line under the cursor"),
        ("a", "show / hide colour codes (shown as text, never applied)"),
        ("f", "follow the file as it grows (tail -f; diagnose tui --follow LOG)"),
        ("escape", "back to the findings"),
        ("Plan (p, diagnose tui --check CONFIG --gpus N)", ""),
        ("enter", "apply what-ifs (key=value, space-separated) or the GPU count"),
        ("enter on a plan", "take that plan's change as what-ifs"),
        ("^r ^e ^t", "reset the what-ifs, type a what-if, go to the table"),
        ("c e (in the table)", "copy the highlighted plan's change, export the plan as JSON"),
        ("Slurm (diagnose tui --slurm)", ""),
        ("enter", "diagnose the highlighted job"),
        ("j", "back to the job list (from the findings)"),
    )

    @classmethod
    def key_width(cls) -> int:
        """The key column: as wide as the longest key with a description, plus a gap (a fixed 16 ran
        "c e (in the table)" into its words)."""
        return max(len(key) for key, what in cls.KEY_HELP if what) + 2

    def compose(self) -> ComposeResult:
        text = Text()
        width = self.key_width()
        for key, what in self.KEY_HELP:
            if not what:
                text.append(f"\n{key}\n", "bold underline")
                continue
            text.append(f"  {key:<{width}}", "bold cyan")
            text.append(f"{what}\n")
        text.append("\nNO_COLOR is honoured. Press escape to close.", "dim")
        with Vertical():
            yield Static(Text("diagnose tui: keys", style="bold"))
            yield Static(text)


class BaseApp(App):
    """What the findings app and the plan app share: plain-text toasts, the help screen and the theme toggle."""

    TITLE = "diagnose"

    def __init__(self) -> None:
        super().__init__()
        self.theme = DARK

    def notify(self, message: str, *, title: str = "", severity: str = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Every toast is plain text: messages carry file names, job names and what-if text, and Textual's
        default (markup on) crashed on ``run[t=10:30].log`` and ran ``[@click=app.quit]`` as an action."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)  # type: ignore[arg-type]

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_theme(self) -> None:
        self.theme = LIGHT if self.theme == DARK else DARK


class ExportScreen(ModalScreen[str | None]):
    """Ask for a file name; returns it (the app writes the file) or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    ExportScreen > Vertical { width: 70; height: auto; border: round $primary; background: $surface; padding: 1 2; }
    """

    def __init__(self, default_name: str) -> None:
        super().__init__()
        self.default_name = default_name

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text("Export the report: a name ending in .json writes JSON, anything else markdown."))
            yield Input(value=self.default_name, id="export-path")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question (``y`` / ``n``, esc is no); returns True for yes."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n", "answer(False)", "No"),
                Binding("escape", "answer(False)", "No")]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 70; height: auto; border: round $warning; background: $surface; padding: 1 2; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.question + "  [y/n]"), id="confirm-question")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class PasteScreen(Screen[str]):
    """Paste a log, then ctrl+r (or the button) diagnoses it."""

    BINDINGS = [Binding("ctrl+r", "diagnose", "Diagnose", priority=True), Binding("ctrl+q", "app.quit", "Quit")]
    DEFAULT_CSS = """
    PasteScreen #paste-hint { height: auto; padding: 0 1; }
    PasteScreen TextArea { height: 1fr; }
    PasteScreen #paste-bar { height: auto; align: right middle; }
    """

    def compose(self) -> ComposeResult:
        yield Static(
            Text("Paste a failed job's log below (your terminal's paste), then press ctrl+r to diagnose it.",
                 style="bold"),
            id="paste-hint",
        )
        yield TextArea(id="paste-area", soft_wrap=False, show_line_numbers=True)
        with Vertical(id="paste-bar"):
            yield Button("Diagnose (ctrl+r)", id="paste-go", variant="primary")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "paste-go":
            self.action_diagnose()

    def action_diagnose(self) -> None:
        text = self.query_one(TextArea).text
        if not text.strip():
            self.notify("Nothing pasted yet.", severity="warning")
            return
        self.dismiss(text)
