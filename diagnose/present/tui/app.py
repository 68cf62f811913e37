"""``DiagnoseApp``: findings on the left, the selected finding on the right, the log one key away.

Analysis runs in a worker thread (``diagnose.pipeline.analyze`` with a progress callback) and each input's line
index builds in its own thread, so the findings appear while a big log is still being indexed and the UI never
waits on either.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, OptionList, ProgressBar, Static, TabbedContent

from diagnose.model import DiagnoseError, Finding, Report
from diagnose.present.output import is_input
from diagnose.present.safe import inert
from diagnose.present.tui.detail import FindingDetail
from diagnose.present.tui.export import export_report
from diagnose.present.tui.findings import FindingsList
from diagnose.present.tui.fmt import format_bytes
from diagnose.present.tui.logindex import LogIndex
from diagnose.present.tui.screens import BaseApp, ConfirmScreen, ExportScreen, LogScreen, PasteScreen

if TYPE_CHECKING:
    from diagnose.pipeline import OpenedInputs
    from diagnose.present.tui.follow import FailureLines

Analyzer = Callable[[list[str], Callable[[int, int], None]], Report]


EAGER_INDEX_FILES = 8  # logs indexed in the background at start; the others when the user opens them


def pipeline_analyzer(rules_dirs: list[str], opened: OpenedInputs | None = None) -> Analyzer:
    """The real engine: ``diagnose.pipeline.analyze`` with the user's rule folders and our progress callback;
    ``opened``: the inputs ``refuse_unreadable`` already opened and checked (``OpenedInputs``), which the first
    analysis reads instead of opening them again."""

    def run(inputs: list[str], progress: Callable[[int, int], None]) -> Report:
        from diagnose.pipeline import AnalyzeOptions, analyze

        # one report on one screen: logs of several jobs stay merged here, with the different-jobs warning
        return analyze(inputs, AnalyzeOptions(rules_dirs=list(rules_dirs), progress=progress,
                                                  refuse_empty=True, split_jobs=False, opened=opened))

    return run


class MainScreen(Screen):
    BINDINGS = [
        Binding("c", "copy_fix", "Copy fix"),
        Binding("l", "open_log", "Log"),
        Binding("e", "export", "Export"),
        Binding("1", "fix_tab('cli')", "CLI", show=False),
        Binding("2", "fix_tab('python')", "Python", show=False),
        Binding("3", "fix_tab('yaml')", "YAML", show=False),
        Binding("4", "fix_tab('mlm')", "MLM", show=False),
        Binding("5", "fix_tab('env')", "Env", show=False),
        Binding("j", "jobs", "Jobs"),
        Binding("p", "plan", "Plan"),
        Binding("g", "hang", "Hang grid"),
    ]
    DEFAULT_CSS = """
    MainScreen #body { height: 1fr; }
    MainScreen #left { width: 42%; min-width: 30; }
    MainScreen #left-title { height: 1; padding: 0 1; background: $panel; text-style: bold; }
    MainScreen FindingDetail { width: 1fr; }
    MainScreen #status-bar { height: auto; padding: 0 1; background: $panel; }
    MainScreen #progress { height: 1; }
    MainScreen #progress.hidden { display: none; }
    """

    @property
    def diagnose_app(self) -> DiagnoseApp:
        app = self.app
        assert isinstance(app, DiagnoseApp)
        return app

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="◆")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                yield Static("Findings", id="left-title")
                yield FindingsList(id="findings")
            yield FindingDetail(self.diagnose_app.display_names, id="detail")
        with Vertical(id="status-bar"):
            yield Static(id="status")
            yield ProgressBar(id="progress", total=100, show_eta=False)
        yield Footer()

    @property
    def findings(self) -> FindingsList:
        return self.query_one(FindingsList)

    @property
    def detail(self) -> FindingDetail:
        return self.query_one(FindingDetail)

    def _selected(self) -> Finding | None:
        report, index = self.diagnose_app.report, self.findings.selected_finding
        return report.findings[index] if report is not None and index is not None else None

    def on_mount(self) -> None:
        self.findings.focus()
        self.diagnose_app.start_up()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        app = self.diagnose_app
        if app.report is not None:
            self.detail.show(app.report, self.findings.finding_index(event.option_index))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        app = self.diagnose_app
        index = self.findings.finding_index(event.option_index)
        if app.report is not None and index is not None:
            app.open_evidence(app.report.findings[index])

    def action_open_evidence(self, number: int) -> None:
        """Open the log at the selected finding's evidence line ``number`` (a click on its location)."""
        finding = self._selected()
        if finding is not None:
            self.diagnose_app.open_evidence(finding, number)

    def action_copy_fix(self) -> None:
        title, text = self.detail.active_form
        if not text:
            self.notify("This finding has no config change to copy.", severity="warning")
            return
        self.app.copy_to_clipboard(text)
        self.notify(f"Copied the fix ({title}) to the clipboard.")

    def action_fix_tab(self, key: str) -> None:
        rendered = self.detail.rendered
        if rendered is not None and key not in rendered.tabs:  # a form this job is not shown (render.fix_style)
            return
        self.query_one("#fix-tabs", TabbedContent).active = f"fix-{key}"

    def action_open_log(self) -> None:
        app, finding = self.diagnose_app, self._selected()
        path = finding.evidence[0].path if finding is not None and finding.evidence else None
        path = path or next((p for p in app.inputs if os.path.isfile(p)), None)
        if path is None:
            self.notify("No log file to show.", severity="warning")
            return
        app.open_log(path, None, set())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        app = self.diagnose_app
        if action == "jobs":
            return app.slurm is not None
        if action == "plan":
            return app.plan_view() is not None
        if action == "hang":
            return app.report is not None and app.report.hang is not None
        return True

    def action_hang(self) -> None:
        self.diagnose_app.open_hang()

    def action_plan(self) -> None:
        self.diagnose_app.open_plan()

    def on_key(self, event) -> None:
        """``p`` while no plan can be made: its binding is hidden (check_action), so say why instead of nothing."""
        app = self.diagnose_app
        if event.key == "p" and app.plan_view() is None:
            event.stop()
            reason = ("the analysis is still running" if app.report is None
                      else "no config with a model shape was found in the log (try 'diagnose tui --check CONFIG')")
            self.notify(f"No memory plan: {reason}.", severity="warning")

    def action_jobs(self) -> None:
        self.diagnose_app.open_jobs()

    def action_export(self) -> None:
        app = self.diagnose_app
        if app.report is None:
            self.notify("Nothing to export yet: the analysis is still running.", severity="warning")
            return
        self.app.push_screen(ExportScreen(app.export_default), app.export_to)


class DiagnoseApp(BaseApp):
    """The TUI. Give ``inputs`` (and an ``analyzer``), or a ready ``report``, or ``paste=True``."""

    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("t", "toggle_theme", "Theme"),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(self, inputs: list[str] | None = None, *, analyzer: Analyzer | None = None,
                 report: Report | None = None, display_names: dict[str, str] | None = None, paste: bool = False,
                 index_gate: threading.Event | None = None, export_default: str = "diagnose-report.md",
                 slurm: tuple[str, str | None] | None = None, rules_dirs: list[str] | None = None,
                 follow: bool = False) -> None:
        super().__init__()
        self.follow = follow  # ``tui --follow LOG``: the log view follows the file, the diagnosis is redone
        self.inputs = list(inputs or [])
        self.analyzer = analyzer
        self.report: Report | None = report
        self.display_names = dict(display_names or {})  # real path -> what the user should see
        self.paste = paste
        self.index_gate = index_gate  # tests hold the log indexing at a gate
        self.export_default = export_default
        self.slurm = slurm  # (since, user): start with the list of recent failed Slurm jobs
        self.rules_dirs = list(rules_dirs or [])
        self.job_id: str | None = None
        self.job_summaries: dict[str, str] = {}  # job id -> the job list's diagnosis column
        self._job_outputs: list[str] = []
        self.indices: dict[str, LogIndex] = {}
        self.error: str | None = None
        self._temp_files: list[str] = []
        self._last_percent = -1
        self._plan_view: tuple[Report, object] | None = None
        self.plan_real_mcore = True  # the plan's validator also builds megatron-core's configs (tests turn it off)
        self._analyzing = False
        self._followed: LogIndex | None = None  # the followed log: new failure lines there mean a new diagnosis
        self._follow_seen = 0  # lines of it already checked for failure lines
        self._follow_size = 0  # its size then
        self._follow_truncations = 0  # times it was cut shorter, as last seen
        self._follow_growth = 0.0  # when it last grew (monotonic)
        self._follow_pending: float | None = None  # since when a new failure line waits for a diagnosis
        self._failure_lines: FailureLines | None = None  # built in the first check's thread

    # ---------------------------------------------------------------------------------------- start

    def get_default_screen(self) -> Screen:
        return MainScreen()

    @property
    def main(self) -> MainScreen:
        screen = self.screen_stack[0]
        assert isinstance(screen, MainScreen)
        return screen

    def start_up(self) -> None:
        """Called once the main screen is mounted: paste screen, or index the inputs and analyze them."""
        self.sub_title = self._inputs_title()
        if self.slurm is not None:
            self._set_status(Text("Pick a job to diagnose.", style="dim"))
            self.open_jobs()
            return
        if self.paste and not self.inputs and self.report is None:
            self._set_status(Text("Waiting for a pasted log…", style="dim"))
            self.push_screen(PasteScreen(), self._diagnose_pasted)
            return
        self._start()

    def _start(self) -> None:
        self.sub_title = self._inputs_title()
        # index the first few now, in the background, while the engine reads; the rest when opened (4096 per-rank
        # logs named on the command line must not start 4096 threads and mappings)
        for path in [p for p in self.inputs if os.path.isfile(p)][:EAGER_INDEX_FILES]:
            self.index_for(path)
        if self.report is not None:
            self.show_report(self.report)
        elif self.analyzer is not None:
            self._set_status(Text("Reading the log…"))
            if not self.follow:  # the findings come first (measured: 5 GB, 130 s -> 42 s); the index after
                self._pause_indexing(True)
            self._analyzing = True
            self.analyze_worker()
        else:
            self._set_status(Text("Nothing to analyze.", style="dim"))
        if self.follow and self.inputs:
            index = self.index_for(self.inputs[0])
            refused = index.start_following()
            if refused:
                self.notify(inert(refused), severity="error")
            else:
                self.watch_followed(index)
                self.open_log(self.inputs[0], None, set(), tail=True)

    def _inputs_title(self) -> str:
        names = [self.display_names.get(p, p) for p in self.inputs]
        if not names:
            return ""
        return inert(names[0]) if len(names) == 1 else f"{inert(names[0])} +{len(names) - 1} more"

    def _diagnose_pasted(self, text: str | None) -> None:
        if not text:
            self.exit()
            return
        fd, path = tempfile.mkstemp(prefix="diagnose-paste-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")
        self._temp_files.append(path)
        self.display_names[path] = "pasted log"
        self.main.detail.display_names = self.display_names
        self.inputs = [path]
        self._start()

    def open_jobs(self) -> None:
        from diagnose.present.tui.slurmjobs import JobsScreen, job_summary

        since, user = self.slurm or ("1d", None)
        rules_dirs = list(self.rules_dirs)
        self.push_screen(JobsScreen(since, user, summarize=lambda job_id: job_summary(job_id, rules_dirs),
                                    summaries=self.job_summaries), self._diagnose_job)

    def _diagnose_job(self, job_id: str | None) -> None:
        if job_id is None:
            if self.report is None and self.job_id is None:
                self.exit()
            return
        from diagnose.present.tui.slurmjobs import job_analyzer

        self.job_id = job_id
        self.report = None
        self._job_outputs = []
        self._last_percent = -1
        self.analyzer = job_analyzer(job_id, self.rules_dirs, self._job_outputs)
        self.sub_title = f"Slurm job {inert(job_id)}"
        self.main.query_one("#progress").remove_class("hidden")
        self.main.findings.clear_options()
        self._set_status(Text(f"Diagnosing Slurm job {inert(job_id)}…"))
        self.analyze_worker()

    # ------------------------------------------------------------------------------------- analysis

    @work(thread=True, exclusive=True, group="analyze")
    def analyze_worker(self) -> None:
        assert self.analyzer is not None
        try:
            report = self.analyzer(self.inputs, self._progress_from_thread)
        except DiagnoseError as e:
            self._call_from_worker(self.show_error, str(e))
        except Exception as e:  # noqa: BLE001 - an engine bug must not take the UI down
            self._call_from_worker(self.show_error, f"internal error: {type(e).__name__}: {e}")
        else:
            self._call_from_worker(self.show_report, report)

    def _call_from_worker(self, fn: Callable, *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the app is closing
            self.call_from_thread(fn, *args)

    def _progress_from_thread(self, done: int, total: int) -> None:
        percent = 100 if total <= 0 else min(100, int(100 * done / total))
        if percent != self._last_percent:
            self._last_percent = percent
            self._call_from_worker(self._show_progress, done, total)

    def _show_progress(self, done: int, total: int) -> None:
        bar = self.main.query_one("#progress", ProgressBar)
        bar.update(total=max(total, 1), progress=done)
        self._set_status(Text(f"Reading the log… {done / max(total, 1):.0%} of {format_bytes(total)}"))

    def _pause_indexing(self, pause: bool) -> None:
        for index in self.indices.values():
            (index.pause if pause else index.resume)()

    def show_report(self, report: Report) -> None:
        self._pause_indexing(False)
        self._analyzing = False
        self.report = report
        if self.job_id is not None:
            self.inputs = list(self._job_outputs)
            self.sub_title = f"Slurm job {inert(self.job_id)}" + (f" · {self._inputs_title()}" if self.inputs else "")
        main = self.main
        main.query_one("#progress").add_class("hidden")
        main.findings.show_report(report)
        main.detail.show(report, main.findings.selected_finding)
        self._set_status(self._summary(report))
        if self.screen is main:
            main.findings.focus()
        main.refresh_bindings()  # ``p`` (plan) shows once a config is known

    def show_error(self, message: str) -> None:
        self._pause_indexing(False)
        self._analyzing = False
        self.error = message
        self.main.query_one("#progress").add_class("hidden")
        self._set_status(Text(f"error: {inert(message)}", style="bold red"))
        self.notify(inert(message), title="Cannot analyze", severity="error", timeout=10)

    def _summary(self, report: Report) -> Text:
        text = Text()
        n = len(report.findings)
        text.append(f"{n} finding{'s' if n != 1 else ''}")
        root = report.root
        if root is not None:
            text.append(" · root cause ")
            text.append(f"{inert(root.rule)} ({inert(root.category)}, {inert(root.phase)})", "bold")
        elif n == 0:
            text.append(" · no failure found", "green")
        if report.warnings:
            text.append(f" · {len(report.warnings)} warning(s): ", "yellow")
            text.append(inert(report.warnings[0]), "yellow")
        return text

    def _set_status(self, text: Text) -> None:
        self.main.query_one("#status", Static).update(text)

    # ------------------------------------------------------------------------------------------ log

    def index_for(self, path: str) -> LogIndex:
        index = self.indices.get(path)
        if index is None:
            index = LogIndex(path, gate=self.index_gate).start()  # opens in its thread; errors go to index.error
            self.indices[path] = index
        return index

    def open_log(self, path: str, line: int | None, marked: set[int], tail: bool = False) -> None:
        index = self.index_for(path)
        index.resume()  # the user is looking at it now, analysis or not
        ranks = sorted({r for f in self.report.findings for r in f.ranks}) if self.report is not None else []
        self.push_screen(LogScreen(index, self.display_names.get(path, path), line, marked, ranks,
                                   tail=tail or (index.following and line is None)))

    # ---------------------------------------------------------------------------------------- follow

    def watch_followed(self, index: LogIndex) -> None:
        """Watch a followed log: lines an error rule matches start a new diagnosis once the file is quiet."""
        if self._followed is index:
            return
        first = self._followed is None
        self._followed = index
        self._follow_seen = index.line_count
        self._follow_size = index.size
        if first:
            self.set_interval(0.5, self._follow_tick)

    def follow_summary(self) -> str:
        """The diagnosis in a few words, for the followed log's status line."""
        if self._analyzing or self._follow_pending is not None:
            return "new failure lines: diagnosing…" if self.report is not None else "diagnosing…"
        if self.report is None:
            return ""
        root = self.report.root
        return f"root cause {inert(root.rule)} ({inert(root.category)})" if root is not None else "no failure yet"

    def _follow_tick(self) -> None:
        from time import monotonic

        from diagnose.present.tui.follow import CHECK_LINES, DEBOUNCE_S, MAX_WAIT_S

        index = self._followed
        if index is None or self.analyzer is None:
            return
        count = index.line_count
        now = monotonic()
        if not index.done.is_set():  # still indexing what was there at the start: the first analysis reads it
            self._follow_seen = count
            self._follow_size = index.size
            return
        if index.truncations != self._follow_truncations:  # cut shorter and read again: every line is new
            self._follow_truncations = index.truncations
            self._follow_seen = self._follow_size = 0
            # the report is of lines no longer there: diagnose what the file holds now, failure lines or not
            # (a job restarted into the file would otherwise keep the old run's root cause; qa-report-21)
            self._failure_seen()
        if count > self._follow_seen or index.size > self._follow_size:  # new lines, or the last one completed
            start = max(0, self._follow_seen - 1)  # the last line again: it may have been cut mid-write
            self._follow_growth = now
            self._follow_seen = count
            self._follow_size = index.size
            if count - start > CHECK_LINES:
                self._failure_seen()  # a burst: diagnose again without reading every line here
            elif count > start:
                self._check_new_lines(index, start, count)
        pending = self._follow_pending
        if pending is not None and not self._analyzing and (
                now - self._follow_growth >= DEBOUNCE_S or now - pending >= MAX_WAIT_S):
            self._follow_pending = None
            self._analyzing = True
            self._set_status(Text("New failure lines in the followed log: diagnosing again…"))
            self.analyze_worker()

    @work(thread=True, group="follow-check")
    def _check_new_lines(self, index: LogIndex, start: int, end: int) -> None:
        from diagnose.present.tui.follow import FailureLines

        if self._failure_lines is None:
            self._failure_lines = FailureLines(self.rules_dirs)
        found = self._failure_lines.first(index.line_bytes(n) for n in range(start, end))
        if found is not None:
            self._call_from_worker(self._failure_seen)

    def _failure_seen(self) -> None:
        from time import monotonic

        if self._follow_pending is None:
            self._follow_pending = monotonic()

    def open_evidence(self, finding: Finding, number: int = 0) -> None:
        if not finding.evidence:
            self.notify("This finding has no evidence line to open.", severity="warning")
            return
        chosen = finding.evidence[min(max(number, 0), len(finding.evidence) - 1)]
        hang = self.report.hang if self.report is not None else None
        if hang is not None and chosen.path in {d.path for d in hang.dumps}:
            self.open_hang()  # a flight-recorder dump is binary: its evidence is the grid, not a log line
            return
        marked = {e.line - 1 for e in finding.evidence if e.path == chosen.path}
        self.open_log(chosen.path, max(0, chosen.line - 1), marked)

    # -------------------------------------------------------------------------------------- the plan

    def plan_view(self):
        """The job's config as a ConfigView when the log gave one with a model shape, else None."""
        if self.report is None:
            return None
        if self._plan_view is None or self._plan_view[0] is not self.report:
            config = self.report.config  # the plan screen changes its own copy
            view = config.copy() if config is not None and config.known() and config.get("model.num_layers") else None
            self._plan_view = (self.report, view)
        return self._plan_view[1]

    def open_hang(self) -> None:
        """The flight-recorder view: the hang's sentences and the ranks x collectives grid (``g``)."""
        from diagnose.present.tui.hangview import HangScreen

        if self.report is None or self.report.hang is None:
            self.notify("No flight-recorder dump was found beside the logs.", severity="warning")
            return
        self.push_screen(HangScreen(self.report.hang))

    def open_plan(self) -> None:
        """The memory plan with a what-if editor for the job's config, GPU count and GPU (``p``)."""
        from diagnose.explain.memory.gpus import gpu_by_name
        from diagnose.present.tui.plan import PlanScreen, gpus_from_view

        view = self.plan_view()
        if view is None:
            self.notify("No config with a model shape was found in the log: nothing to plan.", severity="warning")
            return
        memory = self.report.memory if self.report is not None else None
        default_gpus = memory.current.gpus if memory is not None and memory.current is not None else 1
        capacity = memory.gpu_capacity_bytes if memory is not None else None
        label = "from the OOM message"
        if not capacity or capacity <= 0:
            gpu = gpu_by_name("h100-80gb")
            capacity, label = gpu.capacity_bytes, f"{gpu.name}, assumed: the log does not say"
        title = self._inputs_title() or "job config"
        self.push_screen(PlanScreen(view, gpus_from_view(view, default_gpus or 1), capacity, title=title,
                                    capacity_label=label, real_mcore=self.plan_real_mcore))

    # --------------------------------------------------------------------------------------- actions

    def export_to(self, path: str | None) -> None:
        """Export, after two checks: never over an input (the only copy of a failed job's log), and only over
        another existing file once the user said yes."""
        if not path or self.report is None:
            return
        target = os.path.expanduser(path)
        if is_input(target, [*self.inputs, *self._job_outputs]):
            self.notify(f"{inert(path)} is one of the logs being read: choose another name.",
                        title="Not exported", severity="error", markup=False)
            return
        if os.path.exists(target) and not os.path.isfile(target):  # writing a FIFO froze the TUI in open()
            self.notify(f"{inert(path)} is not a regular file (a folder, a FIFO or a device): choose another name.",
                        title="Not exported", severity="error", markup=False)
            return
        if os.path.exists(target):
            def answered(yes: bool | None) -> None:
                if yes:
                    self._write_export(path)
                else:
                    self.notify("Not exported.", markup=False)

            self.push_screen(ConfirmScreen(f"{inert(path)} exists. Overwrite it?"), answered)
            return
        self._write_export(path)

    def _write_export(self, path: str) -> None:
        assert self.report is not None
        try:
            fmt = export_report(self.report, path)
        except DiagnoseError as e:
            self.notify(inert(str(e)), severity="error", markup=False)
            return
        self.notify(f"Saved the report as {fmt} to {inert(path)}.", markup=False)

    def on_unmount(self) -> None:
        for index in self.indices.values():
            index.close()
        for path in self._temp_files:
            with contextlib.suppress(OSError):
                os.unlink(path)
