"""The hang screen (``g``): what the flight-recorder dumps say, and a ranks x collectives grid.

One row per rank, one column per collective around the divergence; the ranks the analysis names are marked in
the first column and their cells coloured (never entered: red; another op or other sizes: magenta; no dump: grey).
Every string from a dump goes into a ``Text`` (never parsed as markup) after :func:`inert`.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from diagnose.model import HangReport
from diagnose.present.hang_view import LEGEND, SYMBOLS, hang_lines
from diagnose.present.safe import inert

MAX_ROWS = 4096
_STYLE = {"completed": "green", "waiting": "yellow", "absent": "bold white on red", "desync": "bold magenta",
          "size_mismatch": "bold magenta", "no_dump": "dim"}
_WORD = {"completed": "done", "waiting": "waiting", "absent": "NEVER", "desync": "OTHER OP",
         "size_mismatch": "SIZES", "no_dump": "no dump"}


def cell_text(state: str) -> Text:
    return Text(f"{SYMBOLS.get(state, '?')} {_WORD.get(state, state)}", style=_STYLE.get(state, ""))


class HangScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("g", "app.pop_screen", "Back", show=False)]
    DEFAULT_CSS = """
    HangScreen #hang-summary { height: auto; padding: 0 1; }
    HangScreen #hang-legend { height: 1; padding: 0 1; color: $text-muted; }
    HangScreen DataTable { height: 1fr; }
    """

    def __init__(self, hang: HangReport) -> None:
        super().__init__()
        self.hang = hang

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text("\n".join(inert(line) for line in hang_lines(self.hang))), id="hang-summary")
            yield Static(Text(LEGEND), id="hang-legend")
            yield DataTable(id="hang-grid", zebra_stripes=True, cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        hang = self.hang
        named = {c.rank: c.role for c in hang.culprits}
        named.update(dict.fromkeys(hang.missing_dumps, "no_dump"))
        table.add_column(Text("rank"), key="rank")
        for i, col in enumerate(hang.grid):
            table.add_column(Text(inert(f"#{col.seq} {col.op}")), key=f"c{i}")
        if not hang.grid:
            return
        states = [{cell.rank: cell.state for cell in col.cells} for col in hang.grid]
        for cell in hang.grid[0].cells[:MAX_ROWS]:
            r = cell.rank
            label = Text(f"{'▶ ' if r in named else '  '}rank {r}", style="bold red" if r in named else "")
            table.add_row(label, *(cell_text(s.get(r, "")) for s in states), key=str(r))
        table.focus()
