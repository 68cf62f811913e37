"""The pre-flight memory plan in the TUI (issue 11): ``diagnose check``'s plans as a table with a bar per plan
against the GPU's capacity, and a what-if editor: type ``key=value`` (or change the GPU count), see the validator's
verdict and the plan update.

Opened by ``diagnose tui --check CONFIG --gpus N`` (``PlanApp``) or with ``p`` from the findings when the log's
config was extracted (``PlanScreen`` pushed on ``DiagnoseApp``). Validation and planning run in a worker thread;
a newer request makes the result of an older one be dropped. Typed values are parsed as data by
``diagnose.explain.config.parse_set`` (true/false/null, ints, floats, quoted or bare strings), never evaluated.
"""

from __future__ import annotations

import contextlib
import shlex
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from diagnose.checking import PlanRequest, PlanResult, Validation
from diagnose.checking import plan as compute
from diagnose.explain.render import inline_fix
from diagnose.memory_types import MemoryOption
from diagnose.model import DiagnoseError, Override
from diagnose.present.memory_text import batch_change_words, usable_words
from diagnose.present.safe import inert
from diagnose.present.tui.fmt import format_bytes
from diagnose.present.tui.screens import BaseApp, ExportScreen
from diagnose.units import format_gib_short

if TYPE_CHECKING:
    from diagnose.explain.memory.plan import MemoryPlan

BAR_CELLS = 16
COST_CELLS = 44  # the cost column's width when the screen's width is not known yet
FIXED_CELLS = 103  # the other columns with their padding: the cost column gets what is left of the width
SHORT = {"distributed_optimizer": "dist-opt"}
COLUMNS = ("#", "strategy", "dp/tp/pp/cp", "B/p", "state", "activ.", "peak", "vs GPU", "fits", "cost")


# ------------------------------------------------------------------------------------------ the model side


def parse_what_if(text: str) -> list[Override]:
    """``"train.micro_batch_size=2 ddp.use_megatron_fsdp=true"`` -> overrides; ``~key`` removes a value.

    Split like a shell line (quotes keep spaces in a value) and parsed as data; bad input is a DiagnoseError.
    """
    from diagnose.explain.config import parse_set

    try:
        parts = shlex.split(text)
    except ValueError:
        parts = text.split()
    return [parse_set(p) for p in parts if p.strip()]


def merge_sets(current: list[Override], new: list[Override]) -> list[Override]:
    """The what-ifs so far with ``new`` applied: a key set again replaces its earlier value, in place."""
    out = list(current)
    for o in new:
        for i, old in enumerate(out):
            if old.key == o.key:
                out[i] = o
                break
        else:
            out.append(o)
    return out


def gpus_from_view(view: Any, default: int = 1) -> int:
    """The job's world size, or its nodes x processes per node; ``default`` when the config says neither."""
    value = view.get("launch.world_size")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    nodes, per_node = view.get("launch.nnodes"), view.get("launch.nproc_per_node")
    if isinstance(nodes, int) and isinstance(per_node, int) and nodes > 0 and per_node > 0:
        return nodes * per_node
    return default


# ------------------------------------------------------------------------------------------ rendering


def plan_bar(p: MemoryOption, capacity: int, cells: int = BAR_CELLS) -> Text:
    """Model state then activations, against the capacity (the end of the bar); ``▶`` when over it."""
    text = Text()
    if capacity <= 0:
        return text
    state, act = p.model_state_bytes, p.activation_bytes or 0
    total = state + act
    filled = min(cells, round(cells * total / capacity))
    state_cells = min(filled, round(cells * state / capacity))
    if state > 0 and state_cells == 0 and filled:
        state_cells = 1
    over = total > capacity
    text.append("█" * state_cells, "red" if over else "green")
    text.append("▓" * (filled - state_cells), "dark_orange" if over else "cyan")
    text.append("░" * (cells - filled), "dim")
    text.append("▶" if over else "│", "bold red" if over else "dim")
    return text


def plan_row(i: int, p: MemoryOption, capacity: int, cost_cells: int = COST_CELLS) -> tuple[Any, ...]:
    """One table row; the cost is its first clause (the whole of it is under the table for the selected row)."""
    cost = (p.cost or ("as given" if i == 0 else "")).split(":", 1)[0].strip()
    if len(cost) > cost_cells:
        cost = cost[: max(1, cost_cells - 1)] + "…"
    return (
        Text("given", "bold") if i == 0 else str(i),
        Text(inert(SHORT.get(p.strategy, p.strategy))),
        f"{p.dp}/{p.tp}/{p.pp}/{p.cp}",
        f"{p.bytes_per_param:.1f}",
        format_gib_short(p.model_state_bytes),
        format_gib_short(p.activation_bytes),
        Text(format_gib_short(p.peak_bytes), "bold"),
        plan_bar(p, capacity),
        Text("invalid", "bold red") if p.valid is False else
        Text("yes", "bold green") if p.fits else Text("NO", "bold red"),
        Text(inert(cost), "dim"),
    )


def verdict_text(replay: Validation | None) -> Text:
    if replay is None:
        return Text("Validation: …", "dim")
    if replay.passes:
        return Text("Validation: passes", "bold green")
    text = Text(f"Validation: {len(replay.violations)} violation(s): ", "bold red")
    text.append(inert(replay.violations[0].message))
    fix = replay.result
    if fix.fix:
        text.append("  fix: ", "bold")
        text.append(inert(inline_fix(fix.fix)), "green" if fix.passes else "yellow")
        text.append(" (passes after replay)" if fix.passes else " (still fails after replay)", "dim")
    if replay.changes_global_batch_size is not None:
        was, now = replay.changes_global_batch_size
        text.append(f"\nnote: this fix changes train.global_batch_size {was} -> {now}, a training hyper-parameter",
                    "yellow")
    return text


def summary_text(memory: MemoryPlan) -> Text:
    plans, cap = memory.plans, memory.capacity
    if not plans:
        return Text("No plan.", "dim")
    given = plans[0]
    peak = format_bytes(given.peak_bytes or 0)
    text = Text()
    cheapest = next((i for i, p in enumerate(plans) if i and p.fits and p.valid is not False), None)
    if given.valid is False:
        text.append("As given: INVALID (fails validation), so it cannot run whatever its memory.", "bold red")
        text.append(f" Cheapest valid plan that fits: #{cheapest}.{batch_change_words(plans[cheapest])}" if cheapest
                    else " No valid alternative at this GPU count fits.", "bold")
        return text
    if given.fits:
        text.append(f"As given: fits (peak {peak} of {usable_words(cap)}).", "bold green")
        return text
    text.append(f"As given: does NOT fit (peak {peak} of {usable_words(cap)}).", "bold red")
    text.append(f" Cheapest working change: #{cheapest}.{batch_change_words(plans[cheapest])}" if cheapest
                else " No alternative at this GPU count fits.", "bold")
    return text


def plan_detail(i: int, p: MemoryOption) -> Text:
    text = Text()
    text.append("given: the config as given, with the what-ifs" if i == 0 else f"#{i}", "bold")
    if i:
        text.append(f"  {inert(p.label)}")
    text.append("\n")
    if p.overrides:
        text.append("change: ", "bold")
        text.append(inert(inline_fix(p.overrides)), "green")
        text.append("\n")
    if p.cost:
        text.append("cost: ", "bold")
        text.append(inert(p.cost) + "\n", "dim")
    parts = {k: v for k, v in p.components.to_dict().items() if v}  # a kind this plan does not hold is left out
    if parts:
        text.append("per GPU: ", "bold")
        text.append(" · ".join(f"{k} {format_gib_short(v)}" for k, v in parts.items()))
        text.append(f" · activations {format_gib_short(p.activation_bytes)}")
    return text


# ------------------------------------------------------------------------------------------ the screen


class PlanScreen(Screen):
    """The plans for one config at one GPU count, and the what-if editor."""

    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("ctrl+r", "reset", "Reset what-ifs", priority=True),
        Binding("ctrl+e", "edit", "What-if", priority=True),
        Binding("ctrl+t", "table", "Table", priority=True),
        # hidden (the footer and its snapshot stay as they were); the help lists them
        Binding("c", "copy_plan", "Copy", show=False),
        Binding("e", "export_plan", "Export", show=False),
    ]
    DEFAULT_CSS = """
    PlanScreen #plan-title { height: auto; padding: 0 1; background: $panel; }
    PlanScreen #whatif-row { height: 3; }
    PlanScreen #whatif { width: 1fr; }
    PlanScreen #gpus-label { width: auto; padding: 1 1 0 1; }
    PlanScreen #gpus { width: 12; }
    PlanScreen #applied { height: auto; padding: 0 1; }
    PlanScreen #verdict { height: auto; padding: 0 1; }
    PlanScreen #plans-box { height: 1fr; }
    PlanScreen #plans { height: 1fr; }
    PlanScreen #plan-detail { height: auto; max-height: 8; padding: 0 1; border-top: solid $panel; }
    PlanScreen #plan-summary { height: auto; padding: 0 1; background: $panel; }
    """

    def __init__(self, base: Any, gpus: int, capacity: int, *, title: str, capacity_label: str = "",
                 sets: list[Override] | None = None, bridge_version: str | None = None,
                 real_mcore: bool = True) -> None:
        super().__init__()
        self.base = base
        self.gpus = max(1, int(gpus))
        self.capacity = int(capacity)
        self.config_title = title
        self.capacity_label = capacity_label
        self.sets: list[Override] = list(sets or [])
        self.bridge_version = bridge_version
        self.real_mcore = real_mcore
        self.result: PlanResult | None = None
        self.busy = False
        self._generation = 0

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="◆")
        yield Static(id="plan-title")
        with Horizontal(id="whatif-row"):
            yield Input(placeholder="what if: key=value … then enter (e.g. train.micro_batch_size=2)", id="whatif")
            yield Static("GPUs", id="gpus-label")
            yield Input(str(self.gpus), type="integer", id="gpus")
        yield Static(id="applied")
        yield Static(id="verdict")
        with Vertical(id="plans-box"):
            yield DataTable(id="plans", cursor_type="row", zebra_stripes=False)
            yield Static(id="plan-detail")
        yield Static(id="plan-summary")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#plans", DataTable)
        for col in COLUMNS:
            table.add_column(col, key=col)
        self._show_title()
        self.replan()
        self.query_one("#whatif", Input).focus()

    # -------------------------------------------------------------------------------------- planning

    def replan(self) -> None:
        self._generation += 1
        self.busy = True
        self._show_applied()
        self.query_one("#verdict", Static).update(Text("Validating and planning…", "dim"))
        req = PlanRequest(self.base, self.gpus, self.capacity, list(self.sets), self.bridge_version, self.real_mcore)
        self._plan_worker(req, self._generation)

    @work(thread=True, exclusive=True, group="plan")
    def _plan_worker(self, req: PlanRequest, generation: int) -> None:
        def post(result: PlanResult, final: bool) -> None:
            with contextlib.suppress(RuntimeError):  # the app is closing
                self.app.call_from_thread(self._planned, result, generation, final)

        post(compute(req, on_memory=lambda partial: post(partial, False)), True)

    def _planned(self, result: PlanResult, generation: int, final: bool = True) -> None:
        """Show a result: the plan first (``final`` False), then the plan with the validator's verdict."""
        if generation != self._generation:
            return  # an older request: a newer one is on its way
        self.result = result
        if final:
            self.busy = False
            if result.replay is not None:
                self.query_one("#verdict", Static).update(verdict_text(result.replay))
            elif result.error:
                self.query_one("#verdict", Static).update(Text(f"error: {inert(result.error)}", "bold red"))
        if not final and result.memory is None and result.error is None:
            return
        table = self.query_one("#plans", DataTable)
        table.clear()
        memory = result.memory
        if memory is None:
            why = f"No plan: {inert(result.error)}" if result.error else "No plan."
            self.query_one("#plan-summary", Static).update(Text(why, "bold red" if result.error else "dim"))
            self.query_one("#plan-detail", Static).update("")
            return
        cap = memory.capacity or self.capacity
        cost_cells = max(12, self.size.width - FIXED_CELLS) if self.size.width else COST_CELLS
        for i, p in enumerate(memory.plans):
            table.add_row(*plan_row(i, p, cap, cost_cells), key=str(i))
        summary = summary_text(memory)
        summary.append("  bars: █ state ▓ activations │ GPU", "dim")
        for note in memory.notes:
            summary.append("\nnote: " + inert(note), "dim")
        self.query_one("#plan-summary", Static).update(summary)
        self._show_title()
        self._show_detail(table.cursor_row)

    # ------------------------------------------------------------------------------------------ input

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.input.id == "gpus":
            self._set_gpus(event.value)
        elif event.input.id == "whatif":
            self._add_what_if(event.value)

    def _add_what_if(self, raw: str) -> None:
        if not raw.strip():
            return
        try:
            new = parse_what_if(raw)
        except DiagnoseError as e:
            self.notify(inert(str(e)), title="What-if", severity="error")
            return
        self.sets = merge_sets(self.sets, new)
        self.query_one("#whatif", Input).value = ""
        self.replan()

    def _set_gpus(self, raw: str) -> None:
        try:
            n = int(raw.strip())
        except ValueError:
            n = 0
        if n < 1 or n > 1_000_000:
            self.notify("The GPU count must be a whole number from 1.", title="What-if", severity="error")
            return
        if n != self.gpus:
            self.gpus = n
            self.replan()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail(event.cursor_row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on an alternative: take its change as what-ifs (then edit on from there)."""
        plans = self.plan_rows()
        row = event.cursor_row
        if self.busy or not (0 < row < len(plans)):
            return
        change = plans[row].overrides
        if not change:
            return
        self.sets = merge_sets(self.sets, change)
        self.notify(f"Trying plan #{row}: " + inert(inline_fix(change)), title="What-if")
        self.replan()

    def _selected_change(self) -> tuple[int, list[Override]]:
        plans = self.plan_rows()
        row = self.query_one("#plans", DataTable).cursor_row
        return row, list(plans[row].overrides) if 0 <= row < len(plans) else []

    def action_copy_plan(self) -> None:
        """``c``: the highlighted plan's change (Bridge CLI words, export lines) to the clipboard, made inert."""
        row, change = self._selected_change()
        if not change:
            self.notify("This row changes nothing to copy (the config as given).", severity="warning")
            return
        self.app.copy_to_clipboard(inert(inline_fix(change)))
        self.notify(f"Copied plan #{row}'s change to the clipboard.")

    def action_export_plan(self) -> None:
        """``e``: the memory plan as JSON (the ``check --format json`` memory section) to a file."""
        self.app.push_screen(ExportScreen("diagnose-plan.json"), self._write_plan)

    def _write_plan(self, path: str | None) -> None:
        import json
        import os

        if not path:
            return
        target = os.path.expanduser(path)
        if os.path.exists(target):
            self.notify(f"{inert(path)} exists: choose a new name.", severity="error")
            return
        memory = self.result.memory if self.result is not None else None
        try:
            with open(target, "x", encoding="utf-8") as fh:
                json.dump(memory.to_dict() if memory is not None else {}, fh, indent=2, default=str)
        except OSError as e:
            self.notify(f"cannot write {inert(path)}: {e.strerror or e}", severity="error")
            return
        self.notify(f"Saved the memory plan to {inert(path)}.")

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 1 and self.app.screen_stack[0] is not self:
            self.app.pop_screen()
        else:
            self.app.exit()

    def action_reset(self) -> None:
        if self.sets:
            self.sets = []
            self.replan()

    def action_edit(self) -> None:
        self.query_one("#whatif", Input).focus()

    def action_table(self) -> None:
        self.query_one("#plans", DataTable).focus()

    # ----------------------------------------------------------------------------------------- display

    def _show_title(self) -> None:
        text = Text()
        text.append("Memory plan ", "bold")
        text.append(inert(self.config_title), "bold cyan")
        text.append(f" · {self.gpus} GPU{'s' if self.gpus != 1 else ''} of {format_bytes(self.capacity)}")
        if self.capacity_label:
            text.append(f" ({inert(self.capacity_label)})", "dim")
        memory = self.result.memory if self.result is not None else None
        if memory is not None:
            text.append(f" · {memory.params / 1e9:.2f}B parameters")
        self.query_one("#plan-title", Static).update(text)

    def _show_applied(self) -> None:
        text = Text()
        if self.sets:
            text.append("what-ifs: ", "bold")
            text.append(inert(inline_fix(self.sets)), "yellow")
            text.append("  (ctrl+r resets)", "dim")
        else:
            text.append("what-ifs: none (the config as given)", "dim")
        self.query_one("#applied", Static).update(text)

    def _show_detail(self, row: int | None) -> None:
        plans = self.plan_rows()
        if row is None or not (0 <= row < len(plans)):
            self.query_one("#plan-detail", Static).update("")
            return
        self.query_one("#plan-detail", Static).update(plan_detail(row, plans[row]))

    # ---------------------------------------------------------------------------------------- for tests

    def plan_rows(self) -> list[MemoryOption]:
        memory = self.result.memory if self.result is not None else None
        return list(memory.plans) if memory is not None else []


class PlanApp(BaseApp):
    """``diagnose tui --check CONFIG --gpus N``: the plan screen on its own (its arguments are ``PlanScreen``'s)."""

    BINDINGS = [Binding("ctrl+q", "quit", "Quit"), Binding("f1", "help", "Help"),
                Binding("f2", "toggle_theme", "Theme")]

    def __init__(self, base: Any, gpus: int, capacity: int, **options: Any) -> None:
        super().__init__()
        self.plan_args = dict(base=base, gpus=gpus, capacity=capacity, **options)

    def get_default_screen(self) -> Screen:
        return PlanScreen(**self.plan_args)

    def on_mount(self) -> None:
        self.sub_title = "pre-flight check"


__all__ = ["PlanApp", "PlanScreen", "PlanRequest", "PlanResult", "compute", "parse_what_if", "merge_sets",
           "gpus_from_view"]
