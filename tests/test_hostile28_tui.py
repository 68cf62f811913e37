"""Round 28, the TUI (Textual's Pilot): the test failed before its fix (docs/qa-report-4.md)."""

from __future__ import annotations

import os
from pathlib import Path

from test_tui_app import SIZE, oom_app  # noqa: F401 - the fixture
from test_tui_reports import run_async

from diagnose.present.tui.app import DiagnoseApp, MainScreen
from diagnose.present.tui.screens import ExportScreen


@run_async
async def test_export_onto_a_fifo_or_a_folder_is_refused_before_asking(oom_app: DiagnoseApp, tmp_path: Path) -> None:  # noqa: F811
    """``e`` then the name of an existing FIFO asked "exists. Overwrite it?", and yes froze the whole TUI in
    ``open()`` until something read the FIFO; a folder got the same question before failing."""
    fifo = tmp_path / "report.md"
    os.mkfifo(fifo)
    folder = tmp_path / "reports.json"
    folder.mkdir()
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        for target in (fifo, folder):
            await pilot.press("e")
            assert isinstance(oom_app.screen, ExportScreen)
            oom_app.screen.query_one("#export-path").value = str(target)
            await pilot.press("enter")
            await pilot.pause()
            assert isinstance(oom_app.screen, MainScreen)  # no "Overwrite it?" question
            assert any("is not a regular file" in n.message and target.name in n.message
                       for n in oom_app._notifications)
