"""``diagnose tui --slurm``: a list of your recent failed Slurm jobs; pick one to diagnose it.

The list comes from ``diagnose.ingest.slurm.list_failed_jobs`` (sacct) and a job's diagnosis from
``diagnose_job`` (its output file through the pipeline, plus what Slurm knows), both in worker threads.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from diagnose.model import DiagnoseError, Report
from diagnose.present.safe import inert

STATE_STYLE = {"FAILED": "red", "OUT_OF_MEMORY": "magenta", "TIMEOUT": "yellow", "NODE_FAIL": "red",
               "CANCELLED": "dim", "PREEMPTED": "yellow"}


def job_analyzer(job_id: str, rules_dirs: list[str], outputs: list[str]) -> Callable:
    """An analyzer for the app's worker: diagnose the Slurm job; ``outputs`` receives the files it read (the batch
    output, then srun's per-task files), so that the log view can open every evidence line's file."""

    def run(_inputs: list[str], progress: Callable[[int, int], None]) -> Report:
        from diagnose.ingest.slurm import parse_job_id
        from diagnose.ingest.slurm.diagnosis import diagnose_job
        from diagnose.pipeline import AnalyzeOptions

        result = diagnose_job(parse_job_id(job_id), AnalyzeOptions(rules_dirs=list(rules_dirs), progress=progress))
        outputs[:] = [path for path, _rank in result.job.analysis_inputs]
        return result.report

    return run


class JobsScreen(Screen[str | None]):
    """Recent failed jobs, newest first; enter diagnoses the highlighted one."""

    BINDINGS = [Binding("escape", "close", "Back"), Binding("g", "reload", "Reload"), Binding("q", "app.quit", "Quit")]
    DEFAULT_CSS = """
    JobsScreen #jobs-status { height: auto; padding: 0 1; background: $panel; }
    JobsScreen DataTable { height: 1fr; }
    """

    def __init__(self, since: str = "1d", user: str | None = None, rules_dirs: list[str] | None = None) -> None:
        super().__init__()
        self.since = since
        self.user = user
        self.rules_dirs = list(rules_dirs or [])
        self.job_ids: list[str] = []
        self.diagnoses: dict[str, str] = {}  # job id -> its one-line diagnosis, as the worker finds them
        self.error: str | None = None
        self._diagnosis_column = None

    def compose(self) -> ComposeResult:
        yield Static(Text(f"Failed Slurm jobs since {self.since}: loading…"), id="jobs-status")
        yield DataTable(id="jobs", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        *_, self._diagnosis_column = table.add_columns("job", "name", "state", "ended", "elapsed", "nodes",
                                                        "diagnosis")
        table.focus()
        self.load()

    def action_reload(self) -> None:
        self.load()

    @work(thread=True, exclusive=True, group="slurm-list")
    def load(self) -> None:
        from diagnose.ingest.slurm import list_failed_jobs

        try:
            jobs = list_failed_jobs(self.since, self.user)
        except DiagnoseError as e:
            self.app.call_from_thread(self._show_error, str(e))
            return
        self.app.call_from_thread(self._show_jobs, jobs)

    def _show_error(self, message: str) -> None:
        self.error = message
        self.query_one("#jobs-status", Static).update(Text(f"error: {inert(message)}", style="bold red"))

    def _show_jobs(self, jobs: list) -> None:
        from diagnose.ingest.slurm.parse import format_duration

        table = self.query_one(DataTable)
        table.clear()
        self.job_ids = []
        for job in jobs:
            self.job_ids.append(job.job_id)
            state = Text(inert(job.state_text()), style=STATE_STYLE.get(job.state, ""))
            table.add_row(Text(inert(job.job_id)), Text(inert(job.name)), state, Text(inert(job.end)),
                          Text(format_duration(job.elapsed_s)), Text(inert(job.nodes)),
                          Text("…", style="dim"), key=job.job_id)
        n = len(jobs)
        status = f"{n} failed job{'s' if n != 1 else ''} since {self.since}" + (": enter diagnoses one" if n else "")
        self.query_one("#jobs-status", Static).update(Text(status))
        self.diagnoses = {}
        if jobs:
            self.diagnose_rows(list(self.job_ids))

    @work(thread=True, exclusive=True, group="slurm-diagnoses")
    def diagnose_rows(self, job_ids: list[str]) -> None:
        """The diagnosis column, newest job first, as ``slurm --failed`` writes it (quick: no replay)."""
        from textual.worker import get_current_worker

        from diagnose.pipeline import AnalyzeOptions
        from diagnose.present.commands.slurm import MAX_LISTED, diagnose_listed

        quick = AnalyzeOptions(rules_dirs=self.rules_dirs, replay=False)
        worker = get_current_worker()
        for job_id in job_ids[:MAX_LISTED]:
            if worker.is_cancelled:
                return
            line, _outputs, _root = diagnose_listed(job_id, quick)
            try:
                self.app.call_from_thread(self._show_diagnosis, job_id, line)
            except RuntimeError:  # the app closed while this job was diagnosed
                return

    def _show_diagnosis(self, job_id: str, line: str) -> None:
        from textual.css.query import NoMatches

        self.diagnoses[job_id] = line
        try:
            table = self.query_one(DataTable)
        except NoMatches:  # the screen was closed (a job picked) while the column filled
            return
        if job_id not in self.job_ids or self._diagnosis_column is None:
            return  # the list was reloaded meanwhile
        from textual.widgets.data_table import CellDoesNotExist

        healthy = line.startswith("no failure")
        try:
            table.update_cell(job_id, self._diagnosis_column, Text(inert(line), style="green" if healthy else "red"))
        except CellDoesNotExist:  # reloaded between the check and here
            return

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.dismiss(str(event.row_key.value))

    def action_close(self) -> None:
        self.dismiss(None)


def slurm_app(rules_dirs: list[str], since: str = "1d", user: str | None = None):
    from diagnose.present.tui.app import DiagnoseApp

    return DiagnoseApp([], slurm=(since, user), rules_dirs=rules_dirs)
