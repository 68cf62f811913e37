"""``diagnose tui --fleet STORE``: the fleet screen lists the store's classes and nodes; enter on a class lists its
jobs, enter on a job opens its triage in the main screen, ``j`` comes back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_tui_reports import run_async

from diagnose.fleet.scan import ScanOptions, list_files, scan
from diagnose.fleet.store import FleetStore
from diagnose.present.tui.app import MainScreen
from diagnose.present.tui.fleet import FleetScreen, fleet_app

REPO = Path(__file__).resolve().parents[1]
LOGS = {"ddp_wrap_oom": "OOM102", "dataset_idx_missing": "DA001", "clean_run": None}


def make_store(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in LOGS:
        for i in range(3 if name == "ddp_wrap_oom" else 1):
            (logs / f"{name}-{i}.log").write_text(f"run {i}\n" + (REPO / "sample_logs" / f"{name}.log").read_text())
    db = tmp_path / "fleet.db"
    with FleetStore(str(db)) as store:
        scan(store, list_files([str(logs)]), ScanOptions(jobs=1))
    return db


async def _until(pilot, condition, steps: int = 300) -> None:
    for _ in range(steps):
        await pilot.pause(0.05)
        if condition():
            return
    raise AssertionError("the screen did not get there")


@run_async
async def test_fleet_screen_class_then_job_then_back(tmp_path: Path) -> None:
    db = make_store(tmp_path)
    app = fleet_app(str(db), "7d", [])
    async with app.run_test(size=(140, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        await _until(pilot, lambda: screen.report is not None)
        classes = screen.query_one("#classes")
        assert classes.row_count == 2  # OOM102 (3 jobs) first, then DA001; the clean run is no class
        assert [c.signature for c in screen.report.classes] == ["OOM102", "DA001"]
        await pilot.press("enter")  # the OOM class: its 3 jobs
        await _until(pilot, lambda: screen.jobs_filter == "class OOM102")
        assert len(screen.jobs) == 3
        await pilot.press("enter")  # the first job: its triage in the main screen
        await _until(pilot, lambda: app.report is not None or app.error is not None)
        assert isinstance(app.screen, MainScreen) and app.error is None
        assert app.report.root is not None and app.report.root.rule == "OOM102"
        assert Path(app.inputs[0]).name.startswith("ddp_wrap_oom-")
        await pilot.press("j")
        assert isinstance(app.screen, FleetScreen)


def test_tui_fleet_refuses_a_missing_store_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "diagnose", "tui", "--fleet", str(tmp_path / "none.db")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("diagnose: error: no fleet store") and done.stderr.count("\n") == 1


@run_async
async def test_fleet_tables_show_markup_in_names_as_typed(tmp_path: Path) -> None:
    """DataTable reads a ``str`` cell as markup: a job named ``train[/]`` crashed the fleet screen with MarkupError,
    and ``[@click=app.quit]`` in a name became an action (found by tests/fuzz/fuzz_tui_text.py)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    oom = (REPO / "sample_logs" / "ddp_wrap_oom.log").read_text()
    for i, name in enumerate(("train[]", "[@click=app.quit]x", "[b]bold")):
        (logs / f"{name}.log").write_text(f"run {i}\n{oom}")
    db = tmp_path / "fleet.db"
    with FleetStore(str(db)) as store:
        scan(store, list_files([str(logs)]), ScanOptions(jobs=1))
    app = fleet_app(str(db), "7d", [])
    async with app.run_test(size=(140, 40)) as pilot:
        screen = app.screen
        await _until(pilot, lambda: screen.report is not None)
        await pilot.press("a")
        await _until(pilot, lambda: len(screen.jobs) == 3)
        from textual.widgets import TabbedContent

        screen.query_one(TabbedContent).active = "tab-jobs"
        await pilot.pause()
        jobs = screen.query_one("#jobs")
        shown = "\n".join(jobs.render_line(y).text for y in range(jobs.size.height))
        for name in ("train[]", "[@click=app.quit]x", "[b]bold"):
            assert name in shown, shown
        assert isinstance(app.screen, FleetScreen)  # still running, nothing quit


def test_fleet_rows_are_text_cells_whatever_the_store_holds() -> None:
    from textual.widgets._data_table import default_cell_formatter

    from diagnose.fleet.report import FailureClass, JobRow, NodeRow
    from diagnose.present.tui.fleet import class_row, job_row, node_row

    hostile = "train[/] [@click=app.quit]q \x1b[31m"
    rows = [
        job_row(JobRow(hostile, hostile, hostile, hostile, hostile, hostile, hostile, 0.0, "diagnosed", [])),
        class_row(FailureClass(hostile, "OOM102", "oom", hostile, 1, 1.0, 0.0, 0.0, 0, 1, True, "new", "1")),
        node_row(NodeRow(hostile, 2, 1, 0.5, 0.01, True, hostile, None)),
    ]
    for row in rows:
        for cell in row:
            shown = default_cell_formatter(cell).plain
            assert "\x1b" not in shown and ("[/]" in shown or hostile not in str(cell.plain))
    assert default_cell_formatter(rows[0][1]).plain == "train[/] [@click=app.quit]q \\x1b[31m"
