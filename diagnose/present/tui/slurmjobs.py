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
from textual.widgets.data_table import ColumnKey

from diagnose.model import DiagnoseError, Report
from diagnose.present.safe import inert, shorten

STATE_STYLE = {"FAILED": "red", "OUT_OF_MEMORY": "magenta", "TIMEOUT": "yellow", "NODE_FAIL": "red",
               "CANCELLED": "dim", "PREEMPTED": "yellow"}
SUMMARY_CELLS = 60  # the diagnosis column: one line, cut


def job_analyzer(job_id: str, rules_dirs: list[str], outputs: list[str]) -> Callable:
    """An analyzer for the app's worker: diagnose the Slurm job; ``outputs`` receives the files it read (the batch
    output, then srun's per-task files), so that the log view can open every evidence line's file."""

    def run(_inputs: list[str], progress: Callable[[int, int], None]) -> Report:
        from diagnose.ingest.slurm import parse_job_id
        from diagnose.pipeline import AnalyzeOptions
        from diagnose.slurm_diagnosis import diagnose_job

        result = diagnose_job(parse_job_id(job_id), AnalyzeOptions(rules_dirs=list(rules_dirs), progress=progress))
        outputs[:] = [path for path, _rank in result.job.analysis_inputs]
        return result.report

    return run


def job_summary(job_id: str, rules_dirs: list[str]) -> str:
    """One line for the job list's diagnosis column, as ``slurm --failed`` writes it (quick: no replay)."""
    from diagnose.pipeline import AnalyzeOptions
    from diagnose.present.commands.slurm import diagnose_listed

    return diagnose_listed(job_id, AnalyzeOptions(rules_dirs=list(rules_dirs), replay=False))[0]


class JobsScreen(Screen[str | None]):
    """Recent failed jobs, newest first; enter diagnoses the highlighted one.

    The list shows as soon as sacct answers; a worker then diagnoses the jobs one by one (newest first) and fills
    the diagnosis column. Answers are kept in ``summaries`` (the app's, so going back to the list is instant).
    """

    BINDINGS = [Binding("escape", "close", "Back"), Binding("g", "reload", "Reload"), Binding("q", "app.quit", "Quit")]
    DEFAULT_CSS = """
    JobsScreen #jobs-status { height: auto; padding: 0 1; background: $panel; }
    JobsScreen DataTable { height: 1fr; }
    """

    def __init__(self, since: str = "1d", user: str | None = None, *,
                 summarize: Callable[[str], str] | None = None, summaries: dict[str, str] | None = None) -> None:
        super().__init__()
        self.since = since
        self.user = user
        self.job_ids: list[str] = []
        self.error: str | None = None
        self.summarize = summarize or (lambda job_id: job_summary(job_id, []))
        self.summaries = summaries if summaries is not None else {}
        self._diagnosis_column: ColumnKey | None = None

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
                          self._diagnosis_cell(job.job_id), key=job.job_id)
        n = len(jobs)
        status = f"{n} failed job{'s' if n != 1 else ''} since {self.since}" + (": enter diagnoses one" if n else "")
        self.query_one("#jobs-status", Static).update(Text(status))
        self.diagnose_all([j for j in self.job_ids if j not in self.summaries])

    def _diagnosis_cell(self, job_id: str) -> Text:
        summary = self.summaries.get(job_id)
        if summary is None:
            return Text("diagnosing…", style="dim")
        style = "dim" if summary.startswith(("could not diagnose", "no failure")) else "bold"
        return Text(shorten(inert(" ".join(summary.split())), SUMMARY_CELLS), style=style)

    @work(thread=True, exclusive=True, group="slurm-diagnose")
    def diagnose_all(self, job_ids: list[str]) -> None:
        """Diagnose the listed jobs one after the other, off the UI thread; stops when the screen goes."""
        from textual.worker import get_current_worker

        worker = get_current_worker()
        for job_id in job_ids:
            if worker.is_cancelled:
                return
            try:
                summary = self.summarize(job_id)
            except Exception as e:  # noqa: BLE001 - one job's failure must not stop the column
                summary = f"not diagnosed: {type(e).__name__}"
            if worker.is_cancelled:
                return
            try:
                self.app.call_from_thread(self._show_summary, job_id, summary)
            except RuntimeError:  # the app is closing
                return

    def _show_summary(self, job_id: str, summary: str) -> None:
        self.summaries[job_id] = summary
        if job_id in self.job_ids and self._diagnosis_column is not None:
            self.query_one(DataTable).update_cell(job_id, self._diagnosis_column, self._diagnosis_cell(job_id))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.dismiss(str(event.row_key.value))

    def action_close(self) -> None:
        self.dismiss(None)
