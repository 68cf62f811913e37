"""Snapshot tests (pytest-textual-snapshot) of the main screens at a fixed size.

Deterministic: a fixed report (test_tui_reports.py), display names instead of temp paths, no clock, dark theme
unless the test toggles it. Update with ``pytest tests/test_tui_snapshots.py --snapshot-update`` after a
deliberate UI change, and look at the SVGs in tests/__snapshots__/ before committing them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tui_reports import copy_log, ddp_wrap_oom_report

from diagnose.model import Report
from diagnose.present.tui.app import DiagnoseApp

SIZE = (120, 40)


@pytest.fixture
def app(tmp_path: Path) -> DiagnoseApp:
    log = copy_log("ddp_wrap_oom.log", tmp_path)
    return DiagnoseApp([str(log)], report=ddp_wrap_oom_report(log), display_names={str(log): "ddp_wrap_oom.log"})


async def settle(pilot) -> None:
    await pilot.pause(0.3)


def test_main_screen(snap_compare, app: DiagnoseApp) -> None:
    assert snap_compare(app, terminal_size=SIZE, run_before=settle)


def test_main_screen_python_tab_light_theme(snap_compare, app: DiagnoseApp) -> None:
    assert snap_compare(app, terminal_size=SIZE, press=["2", "t"], run_before=settle)


def test_log_view_at_evidence(snap_compare, app: DiagnoseApp) -> None:
    assert snap_compare(app, terminal_size=SIZE, press=["enter", "_", "_"], run_before=settle)


def test_help_screen(snap_compare, app: DiagnoseApp) -> None:
    assert snap_compare(app, terminal_size=SIZE, press=["question_mark"], run_before=settle)


def test_paste_screen(snap_compare) -> None:
    assert snap_compare(DiagnoseApp([], paste=True), terminal_size=SIZE, run_before=settle)


def test_no_failure_found(snap_compare) -> None:
    assert snap_compare(DiagnoseApp([], report=Report()), terminal_size=SIZE, run_before=settle)


def test_memory_plan_with_a_what_if(snap_compare, monkeypatch: pytest.MonkeyPatch) -> None:
    """``diagnose tui --check llama8b_bridge.yaml --gpus 8 --gpu-memory 80GiB --set train.micro_batch_size=2``."""
    from test_tui_reports import llama8b_plan_result

    from diagnose.checking import load_view
    from diagnose.explain.config import parse_set
    from diagnose.present.tui import plan as plan_module
    from diagnose.present.tui.plan import PlanApp

    # fixed numbers: the snapshot pins the screen; the live memory model is tested in test_tui_plan.py
    monkeypatch.setattr(plan_module, "compute", lambda req, on_memory=None: llama8b_plan_result())
    config = Path(__file__).parent / "data" / "configs" / "llama8b_bridge.yaml"
    app = PlanApp(load_view(str(config)), 8, 80 * 2**30, title="llama8b_bridge.yaml",
                  capacity_label="--gpu-memory 80GiB", sets=[parse_set("train.micro_batch_size=2")], real_mcore=False)

    async def planned(pilot) -> None:
        for _ in range(400):
            await pilot.pause(0.02)
            if not app.screen.busy:
                break
        await pilot.press("ctrl+t")  # the table has the focus: no blinking cursor in the snapshot
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=SIZE, run_before=planned)
