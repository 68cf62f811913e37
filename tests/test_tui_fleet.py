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
