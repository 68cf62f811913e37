"""``diagnose tui --fleet STORE``: the fleet report as a screen (classes, nodes, jobs); enter on a class or a node
lists its jobs, enter on a job opens its triage (its logs through the pipeline, in the main screen); ``j`` there
comes back to the fleet screen.

The store is read in a worker thread (``diagnose.fleet.report``); every value shown goes through ``safe.inert``.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static, TabbedContent, TabPane

from diagnose.model import DiagnoseError
from diagnose.present.fleet_render import day
from diagnose.present.safe import inert


class FleetScreen(Screen[list[str] | None]):
    """Dismissed with the chosen job's log paths (None: closed)."""

    BINDINGS = [Binding("escape", "close", "Back"), Binding("a", "all_jobs", "All failed jobs"),
                Binding("q", "app.quit", "Quit")]
    DEFAULT_CSS = """
    FleetScreen #fleet-status { height: auto; padding: 0 1; background: $panel; }
    FleetScreen DataTable { height: 1fr; }
    """

    def __init__(self, store_path: str, since: str = "7d") -> None:
        super().__init__()
        self.store_path = store_path
        self.since = since
        self.error: str | None = None
        self.report = None
        self.jobs: dict[str, list[str]] = {}  # job key -> its log paths
        self.jobs_filter = "all failed jobs"

    def compose(self) -> ComposeResult:
        yield Static(Text(f"Fleet store {inert(self.store_path)}: loading…"), id="fleet-status")
        with TabbedContent(id="fleet-tabs"):
            for name in ("classes", "nodes", "jobs"):
                with TabPane(name.capitalize(), id=f"tab-{name}"):
                    yield DataTable(id=name, cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#classes", DataTable).add_columns("class", "jobs", "GPU-h lost", "last seen", "trend", "title")
        self.query_one("#nodes", DataTable).add_columns("node", "jobs", "failed", "rate", "p-value", "flag",
                                                        "most common")
        self.query_one("#jobs", DataTable).add_columns("job", "name", "user", "state", "class", "ended (UTC)")
        self.query_one("#classes", DataTable).focus()
        self.load()

    @work(thread=True, exclusive=True, group="fleet-load")
    def load(self, signature: str | None = None, node: str | None = None) -> None:
        from diagnose.fleet.report import build_report, list_jobs
        from diagnose.fleet.store import FleetStore

        try:
            with FleetStore(self.store_path, readonly=True) as store:
                report = self.report if self.report is not None else build_report(store, since=self.since)
                jobs = list_jobs(store, since=self.since, signature=signature, node=node)
        except DiagnoseError as e:
            self.app.call_from_thread(self._show_error, str(e))
            return
        self.app.call_from_thread(self._show, report, jobs, signature, node)

    def _show_error(self, message: str) -> None:
        self.error = message
        self.query_one("#fleet-status", Static).update(Text(f"error: {inert(message)}", style="bold red"))

    def _show(self, report, jobs, signature: str | None, node: str | None) -> None:
        if self.report is None:
            self.report = report
            classes = self.query_one("#classes", DataTable)
            for c in report.classes:
                classes.add_row(*class_row(c), key=c.signature)
            nodes = self.query_one("#nodes", DataTable)
            for n in report.nodes:
                nodes.add_row(*node_row(n), key=n.node)
            self.query_one("#fleet-status", Static).update(Text(
                f"{report.jobs} jobs in the last {inert(self.since)}: {report.failed} failed, "
                f"{report.gpu_hours_lost:.1f} GPU-hours lost, {len(report.new_signatures)} new classes, "
                f"{sum(n.flagged for n in report.nodes)} flagged nodes. Enter lists a class's or a node's jobs."
            ))
        table = self.query_one("#jobs", DataTable)
        table.clear()
        self.jobs = {}
        for j in jobs:
            self.jobs[j.job_key] = j.sources
            table.add_row(*job_row(j), key=j.job_key)
        self.jobs_filter = f"class {signature}" if signature else f"node {node}" if node else "all failed jobs"
        if signature or node:
            self.query_one(TabbedContent).active = "tab-jobs"
            table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = event.row_key.value
        if key is None:
            return
        table_id = event.data_table.id
        if table_id == "classes":
            self.load(signature=str(key))
        elif table_id == "nodes":
            self.load(node=str(key))
        elif table_id == "jobs":
            sources = self.jobs.get(str(key)) or []
            if not sources:
                self.notify("This job's log could not be read when it was stored.", severity="warning")
                return
            self.dismiss(sources)

    def action_all_jobs(self) -> None:
        self.load()

    def action_close(self) -> None:
        self.dismiss(None)


def _cell(value: object, style: str = "") -> Text:
    """A table cell from store text: inert, and a ``Text`` (DataTable reads a plain ``str`` cell as markup, so a job
    named ``train[/]`` crashed the screen and ``[@click=app.quit]`` in a name became an action)."""
    return Text(inert(value if isinstance(value, str) else str(value)), style=style)


def class_row(c) -> tuple[Text, ...]:
    return (_cell(c.signature), _cell(c.jobs), _cell(f"{c.gpu_hours:.1f}"), _cell(day(c.last_seen)),
            _cell(c.trend, "bold" if c.trend in ("new", "rising") else ""), _cell(c.title[:80]))


def node_row(n) -> tuple[Text, ...]:
    return (_cell(n.node), _cell(n.jobs), _cell(n.failed), _cell(f"{100 * n.rate:.0f}%"), _cell(f"{n.p_value:.2g}"),
            _cell("FLAG", "bold red") if n.flagged else _cell(""), _cell(n.top_signature or ""))


def job_row(j) -> tuple[Text, ...]:
    return (_cell(j.job_id or j.job_key[:24]), _cell(j.name), _cell(j.user), _cell(j.state or j.status),
            _cell(j.signature or ""), _cell(day(j.end_ts)))


def fleet_app(store_path: str, since: str, rules_dirs: list[str]):
    """The TUI opened on the fleet screen; picking a job diagnoses its logs in the main screen."""
    from diagnose.present.tui.app import DiagnoseApp, pipeline_analyzer

    class FleetApp(DiagnoseApp):
        def __init__(self) -> None:
            # ``slurm`` set: the main screen's "j" binding is enabled, and comes back to this list (open_jobs)
            super().__init__([], slurm=(since, None), rules_dirs=rules_dirs)

        def open_jobs(self) -> None:
            self.push_screen(FleetScreen(store_path, since), self._open_fleet_job)

        def _open_fleet_job(self, sources: list[str] | None) -> None:
            if sources is None:
                if self.report is None:
                    self.exit()
                return
            self.report = None
            self.inputs = list(sources)
            self._last_percent = -1
            self.analyzer = pipeline_analyzer(self.rules_dirs)
            self.main.query_one("#progress").remove_class("hidden")
            self.main.findings.clear_options()
            self._start()

    return FleetApp()
