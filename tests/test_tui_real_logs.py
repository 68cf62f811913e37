"""The TUI on the real engine: the three failures the user named, a big log, paste mode.

Nothing is mocked here: ``pipeline_analyzer`` runs ``diagnose.pipeline.analyze`` with the built-in catalogue in
the app's worker thread, exactly as ``diagnose tui job.log`` does.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from test_tui_reports import copy_log, find_log, need_log, run_async

from diagnose.present.tui.app import DiagnoseApp, MainScreen, pipeline_analyzer
from diagnose.present.tui.screens import LogScreen, PasteScreen

SIZE = (140, 45)

# The user's three failures: the root cause category and config keys the fix must set (from the sample log's
# expected file when the repo has it, else what the capture README says happened).
NAMED = {
    "fsdp2_pg_collection.log": ("fsdp_config", ["ddp.use_megatron_fsdp"]),
    "b062_ckpt_format_new.log": ("checkpoint_format", ["checkpoint.ckpt_format"]),
    "ddp_wrap_oom.log": ("cuda_oom", []),
}


def expectation(name: str) -> tuple[str, list[str]]:
    log = find_log(name)
    expected = log.with_suffix(".expected.json") if log is not None else None
    if expected is not None and expected.is_file():
        data = json.loads(expected.read_text())
        return data["root_cause"]["category"], list(data.get("fix_keys", []))
    return NAMED[name]


def shown(widget) -> str:
    content = widget.content
    return content.plain if hasattr(content, "plain") else str(content)


async def wait_for_report(app: DiagnoseApp, pilot, seconds: float = 60) -> None:
    for _ in range(int(seconds / 0.05)):
        if app.report is not None or app.error is not None:
            break
        await pilot.pause(0.05)
    await pilot.pause()
    assert app.error is None, app.error
    assert app.report is not None, "analysis did not finish"


@pytest.mark.parametrize("name", sorted(NAMED))
@run_async
async def test_named_failure_opens_at_the_root_cause_with_copyable_overrides(name: str, tmp_path: Path) -> None:
    log = copy_log(name, tmp_path)
    category, fix_keys = expectation(name)
    app = DiagnoseApp([str(log)], analyzer=pipeline_analyzer([]), display_names={str(log): name})
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_report(app, pilot)
        report = app.report
        main = app.screen
        assert isinstance(main, MainScreen)
        assert report.root_cause is not None
        root = report.findings[report.root_cause]
        assert root.category == category
        assert main.findings.selected_finding == report.root_cause
        evidence = shown(main.query_one("#finding-evidence"))
        first = root.evidence[0]
        assert f"{name}:{first.line}" in evidence
        assert first.text.strip()[:40] in evidence
        await pilot.press("c")
        copied = app.clipboard
        assert copied, "no overrides to copy"
        for key in fix_keys:
            assert key in copied
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert isinstance(app.screen, LogScreen)
        assert app.screen.view.cursor_line == first.line - 1


@run_async
async def test_findings_are_listed_before_the_log_is_indexed(tmp_path: Path) -> None:
    """The index of a big log is held at a gate: the engine's findings still appear, and the log view opens."""
    oom = need_log("ddp_wrap_oom.log")
    big = tmp_path / "big.log"
    filler = b"".join(b"[rank%d]: iteration %8d | lm loss 2.3456 | grad norm 1.234\n" % (i % 8, i) for i in range(60_000))
    big.write_bytes(filler + oom.read_bytes())  # about 4 MB; the failure is at the end
    gate = threading.Event()
    app = DiagnoseApp([str(big)], analyzer=pipeline_analyzer([]), display_names={str(big): "big.log"},
                      index_gate=gate)
    shown_progress: list[tuple[int, int, str]] = []
    show_progress = app._show_progress

    def record_progress(done: int, total: int) -> None:  # the real method, watched
        show_progress(done, total)
        shown_progress.append((done, total, shown(app.main.query_one("#status"))))

    app._show_progress = record_progress
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for_report(app, pilot)
            index = app.indices[str(big)]
            assert not index.done.is_set() and index.line_count == 0  # still held at the gate
            assert not index.paused  # paused while the engine ran, resumed with the findings
            assert app.screen.findings.option_count > 0
            assert app.report.root is not None
            assert shown_progress and shown_progress[-1][:2] == (big.stat().st_size, big.stat().st_size)
            assert all(text.startswith("Reading the log…") for _, _, text in shown_progress)
            assert app.main.query_one("#progress").has_class("hidden")
            await pilot.press("enter")  # jump to the evidence: waits for the index, the UI does not
            await pilot.pause(0.3)
            screen = app.screen
            assert isinstance(screen, LogScreen)
            assert "indexing" in shown(screen.query_one("#log-status"))
            gate.set()
            assert index.done.wait(20)
            await pilot.pause(0.5)
            assert index.line_count == 60_000 + len(oom.read_bytes().splitlines())
            assert screen.view.cursor_line == app.report.root.evidence[0].line - 1
            assert f"{index.line_count:,} lines" in shown(screen.query_one("#log-status"))
    finally:
        gate.set()


@run_async
async def test_paste_mode_diagnoses_the_pasted_text(tmp_path: Path) -> None:
    log = need_log("fsdp2_pg_collection.log")
    app = DiagnoseApp([], analyzer=pipeline_analyzer([]), paste=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, PasteScreen)
        await pilot.press("ctrl+r")  # nothing pasted: stays
        assert isinstance(app.screen, PasteScreen)
        app.screen.query_one("#paste-area").text = log.read_text(encoding="utf-8")
        await pilot.press("ctrl+r")
        await wait_for_report(app, pilot)
        assert isinstance(app.screen, MainScreen)
        assert app.report.root is not None
        assert "pasted log:" in shown(app.screen.query_one("#finding-evidence"))
        temp = app.inputs[0]
        assert Path(temp).is_file()
    assert not Path(temp).exists()  # the pasted text's temp file is removed at exit


@run_async
async def test_unreadable_input_shows_one_line_error(tmp_path: Path) -> None:
    missing = tmp_path / "gone.log"
    app = DiagnoseApp([str(missing)], analyzer=pipeline_analyzer([]))
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(200):
            if app.error:
                break
            await pilot.pause(0.05)
        assert app.error and "\n" not in app.error
        assert shown(app.screen.query_one("#status")).startswith("error:")


def test_cli_rejects_a_missing_path(capsys: pytest.CaptureFixture[str]) -> None:
    from diagnose.present.cli import main

    assert main(["tui", "/no/such/file.log"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diagnose: error:") and err.count("\n") == 1
