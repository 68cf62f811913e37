"""Issue 19, the TUI items, driven through Textual's Pilot: each test failed before its fix."""

from __future__ import annotations

from pathlib import Path

from test_tui_app import SIZE, oom_app  # noqa: F401 - the fixture
from test_tui_reports import run_async

from diagnose.present.tui.app import DiagnoseApp, MainScreen
from diagnose.present.tui.screens import ConfirmScreen, ExportScreen


async def _export_as(app: DiagnoseApp, pilot, name: str) -> None:
    await pilot.press("e")
    assert isinstance(app.screen, ExportScreen)
    app.screen.query_one("#export-path").value = name
    await pilot.press("enter")
    await pilot.pause()


@run_async
async def test_item1_export_refuses_to_overwrite_the_log_being_read(oom_app: DiagnoseApp, tmp_path: Path) -> None:  # noqa: F811
    log = Path(oom_app.inputs[0])
    before = log.read_bytes()
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await _export_as(oom_app, pilot, str(log))
        assert isinstance(oom_app.screen, MainScreen)
        messages = [n.message for n in oom_app._notifications]
        assert any("is one of the logs being read" in m for m in messages), messages
    assert log.read_bytes() == before


@run_async
async def test_item1_export_over_an_existing_file_asks_first(oom_app: DiagnoseApp, tmp_path: Path) -> None:  # noqa: F811
    other = tmp_path / "notes.md"
    other.write_text("my notes\n")
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await _export_as(oom_app, pilot, str(other))
        assert isinstance(oom_app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause()
        assert other.read_text() == "my notes\n"
        await _export_as(oom_app, pilot, str(other))
        assert isinstance(oom_app.screen, ConfirmScreen)
        await pilot.press("y")
        await pilot.pause()
    assert "OOM103" in other.read_text()
