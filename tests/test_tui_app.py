"""Pilot tests: drive ``DiagnoseApp`` with keys and check what it shows, copies and exports.

These use a report fixture that mirrors the diagnosis of the real ddp_wrap_oom.log (test_tui_reports.py), so
they do not depend on the state of the rules catalogue; test_tui_real_logs.py runs the real pipeline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_tui_reports import copy_log, ddp_wrap_oom_report, run_async

from diagnose.model import Evidence, Finding, InputInfo, Report
from diagnose.present.tui.app import DiagnoseApp, MainScreen
from diagnose.present.tui.logview import LogView
from diagnose.present.tui.screens import ExportScreen, HelpScreen, LogScreen

SIZE = (140, 45)


def shown(widget) -> str:
    content = widget.content
    return content.plain if hasattr(content, "plain") else str(content)


def view_text(view: LogView) -> list[str]:
    return [view.render_line(y).text for y in range(view.size.height)]


async def open_log_screen(pilot, app: DiagnoseApp, key: str) -> LogScreen:
    """Press ``key`` (``l``: the log at its top, ``enter``: at the selected finding's evidence) and return the log
    screen it opened."""
    await pilot.press(key)
    await pilot.pause(0.2)
    screen = app.screen
    assert isinstance(screen, LogScreen)
    return screen


@pytest.fixture
def oom_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DiagnoseApp:
    monkeypatch.chdir(tmp_path)
    log = copy_log("ddp_wrap_oom.log", tmp_path)
    report = ddp_wrap_oom_report(log)
    return DiagnoseApp([str(log)], report=report, display_names={str(log): "ddp_wrap_oom.log"})


@run_async
async def test_opens_with_root_cause_selected_evidence_and_fix_shown(oom_app: DiagnoseApp) -> None:
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        main = oom_app.screen
        assert isinstance(main, MainScreen)
        assert main.findings.selected_finding == oom_app.report.root_cause == 1
        assert main.findings.has_focus
        header = shown(main.query_one("#finding-header"))
        assert "CUDA out of memory while wrapping" in header and "OOM103" in header and "dp_wrap" in header
        evidence = shown(main.query_one("#finding-evidence"))
        assert "ddp_wrap_oom.log:34" in evidence and "Tried to allocate 135.33 GiB" in evidence
        assert "ddp_wrap_oom.log:32" in evidence
        cli = shown(main.query_one("#fix-text-cli"))
        assert "ddp.use_megatron_fsdp=true" in cli and "checkpoint.ckpt_format=fsdp_dtensor" in cli
        assert shown(main.query_one("#fix-verdict")).startswith("✔ passes validation")
        memory = shown(main.query_one("#memory"))
        assert "GPU capacity 139.80 GiB" in memory and "grads" in memory and "135.33 GiB" in memory
        assert "fits" in memory and "ddp.use_megatron_fsdp=True" in memory
        status = shown(main.query_one("#status"))
        assert "3 findings" in status and "OOM103" in status


@run_async
async def test_moving_the_selection_shows_the_other_finding(oom_app: DiagnoseApp) -> None:
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("down")
        main = oom_app.screen
        index = main.findings.selected_finding
        assert index in (0, 2) and index != oom_app.report.root_cause
        assert oom_app.report.findings[index].title in shown(main.query_one("#finding-header"))
        assert not main.query_one("#memory").display  # not an OOM finding
        assert shown(main.query_one("#fix-text-cli")) == "(nothing to set)"


@run_async
async def test_copy_sends_the_shown_form_to_the_clipboard(oom_app: DiagnoseApp) -> None:
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("c")
        assert oom_app.clipboard == oom_app.report.to_dict()["replay"]["render"]["cli"]
        await pilot.press("2", "c")
        assert oom_app.clipboard == oom_app.report.to_dict()["replay"]["render"]["python"]
        await pilot.press("4", "c")
        assert oom_app.clipboard.splitlines() == [
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy optim_grads_params",
            "--ckpt-format fsdp_dtensor",
        ]


@run_async
async def test_copy_writes_osc52(oom_app: DiagnoseApp, monkeypatch: pytest.MonkeyPatch) -> None:
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        written: list[str] = []
        monkeypatch.setattr(oom_app._driver, "write", written.append)
        await pilot.press("c")
        import base64

        payload = base64.b64encode(oom_app.report.to_dict()["replay"]["render"]["cli"].encode()).decode()
        assert f"\x1b]52;c;{payload}\a" in written


@pytest.mark.parametrize("name, fmt", [("out.json", "json"), ("out.md", "markdown")])
@run_async
async def test_export_writes_the_report(oom_app: DiagnoseApp, tmp_path: Path, name: str, fmt: str) -> None:
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("e")
        assert isinstance(oom_app.screen, ExportScreen)
        field = oom_app.screen.query_one("#export-path")
        field.value = ""
        await pilot.press(*name, "enter")
        await pilot.pause()
        assert isinstance(oom_app.screen, MainScreen)
    written = (tmp_path / name).read_text(encoding="utf-8")
    if fmt == "json":
        data = json.loads(written)
        assert data == json.loads(json.dumps(oom_app.report.to_dict(), default=str))
        assert data["findings"][data["root_cause"]]["rule"] == "OOM103"
    else:
        assert "CUDA out of memory while wrapping" in written and "OOM103" in written


@run_async
async def test_export_to_a_bad_path_says_so(oom_app: DiagnoseApp, tmp_path: Path) -> None:
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("e")
        oom_app.screen.query_one("#export-path").value = str(tmp_path / "no" / "such" / "dir.md")
        await pilot.press("enter")
        await pilot.pause()
        messages = [n.message for n in oom_app._notifications]
        assert any("cannot write" in m for m in messages)


@run_async
async def test_enter_opens_the_log_at_the_evidence_and_escape_returns(oom_app: DiagnoseApp) -> None:
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = await open_log_screen(pilot, oom_app, "enter")
        view = screen.view
        assert view.cursor_line == 33  # 0-based: line 34, the OOM message
        rows = view_text(view)
        cursor_rows = [r for r in rows if "Tried to allocate 135.33 GiB" in r]
        assert cursor_rows and cursor_rows[0].lstrip().startswith("34▶")
        assert any(r.lstrip().startswith("32▶") for r in rows)  # the other evidence line is marked
        await pilot.press("escape")
        assert isinstance(oom_app.screen, MainScreen)
        assert oom_app.screen.findings.selected_finding == 1


@run_async
async def test_enter_opens_an_xz_log_at_the_evidence_as_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lzma

    monkeypatch.chdir(tmp_path)
    log = copy_log("ddp_wrap_oom.log", tmp_path)
    packed = tmp_path / "ddp_wrap_oom.log.xz"
    packed.write_bytes(lzma.compress(log.read_bytes()))
    report = ddp_wrap_oom_report(log, str(packed))  # the evidence names the .xz, as analyze's report does
    log.unlink()
    app = DiagnoseApp([str(packed)], report=report, display_names={})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = await open_log_screen(pilot, app, "enter")
        assert screen.view.cursor_line == 33
        rows = view_text(screen.view)
        cursor_rows = [r for r in rows if "Tried to allocate 135.33 GiB" in r]
        assert cursor_rows and cursor_rows[0].lstrip().startswith("34▶")


@run_async
async def test_log_search_next_previous(oom_app: DiagnoseApp) -> None:
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = await open_log_screen(pilot, oom_app, "l")
        assert screen.view.cursor_line == 0

        async def press(*keys: str) -> None:  # a search runs in a worker thread: wait for it
            await pilot.press(*keys)
            await oom_app.workers.wait_for_complete()
            await pilot.pause()

        await press("slash", *"warnings.warn", "enter")
        assert screen.view.cursor_line == 1
        await press("n")
        assert screen.view.cursor_line == 3
        await press("N")
        assert screen.view.cursor_line == 1
        await press("colon", *"60", "enter")
        assert screen.view.cursor_line == 59
        await press("N")  # previous "warnings.warn" before line 60: line 15
        assert screen.view.cursor_line == 14
        await press("slash", *"no such text", "enter")
        assert "no match for" in shown(screen.query_one("#log-status"))  # none anywhere (search wraps: issue 19)
        assert screen.view.cursor_line == 14
        await press("y")
        assert oom_app.clipboard == "  warnings.warn("
        await press("r")
        assert "the findings name ranks 0" in screen.query_one("#log-prompt").placeholder


@run_async
async def test_go_to_line_says_when_the_input_is_not_a_line_number(oom_app: DiagnoseApp) -> None:
    """qa-report-11 L6: ':' followed by 'abc' or '-5' did nothing and said nothing; now the status says so (the text
    shown inert) and the cursor stays where it was."""
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = await open_log_screen(pilot, oom_app, "l")
        await pilot.press("colon", *"12", "enter")
        await pilot.pause()
        assert screen.view.cursor_line == 11
        for typed in ("abc", "-5", "[b]x"):
            await pilot.press("colon", *typed, "enter")
            await pilot.pause()
            status = shown(screen.query_one("#log-status"))
            assert f"not a line number: {typed}" in status, status
            assert screen.view.cursor_line == 11


@run_async
async def test_rank_facet_shows_one_rank(tmp_path: Path) -> None:
    log = copy_log("nccl_duplicate_gpu.log", tmp_path)
    report = Report(inputs=[InputInfo(str(log), log.stat().st_size, 0)])
    app = DiagnoseApp([str(log)], report=report, display_names={str(log): "nccl_duplicate_gpu.log"})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = await open_log_screen(pilot, app, "l")
        await pilot.press("r", "1", "enter")
        facet = screen.view.facet
        assert facet is not None and facet.done.wait(5)
        await pilot.pause(0.3)
        rows = [r for r in view_text(screen.view) if r.strip()]
        assert rows and all("[rank1]:" in r or "[default1]:" in r for r in rows)
        total = sum(1 for line in log.read_text().splitlines() if "[rank1]:" in line or line.startswith("[default1]:"))
        assert len(facet.rows) == total
        assert "rank 1:" in shown(screen.query_one("#log-status"))
        await pilot.press("r", "enter")  # empty: all ranks again
        assert screen.view.facet is None


@run_async
async def test_log_markup_and_escapes_are_shown_as_text(tmp_path: Path) -> None:
    log = tmp_path / "hostile.log"
    hostile = "[rank0]: [bold]x[/] [link=https://evil.example]click[/link] \x1b[2J\x1b]52;c;AAAA\x07 done"
    coloured = "[rank0]: \x1b[31mred\x1b[0m \x1b[1;32mgreen\x1b[0m"
    log.write_text("first line\n" + hostile + "\n" + coloured + "\n", encoding="utf-8")
    finding = Finding(rule="PY001", name="py", title="[bold]t[/] \x1b[31mred", category="other", phase="unknown",
                      severity="error", role="root", confidence=0.3, ranks=[0],
                      evidence=[Evidence(str(log), 2, hostile)], explanation="[i]why[/i]")
    report = Report(inputs=[InputInfo(str(log), log.stat().st_size, 2)], findings=[finding], root_cause=0)
    app = DiagnoseApp([str(log)], report=report, display_names={str(log): "hostile.log"})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        main = app.screen
        evidence = shown(main.query_one("#finding-evidence"))
        assert "[bold]x[/]" in evidence and "\\x1b[2J" in evidence and "\x1b" not in evidence
        assert "[bold]t[/] \\x1b[31mred" in shown(main.query_one("#finding-header"))
        assert "[i]why[/i]" in shown(main.query_one("#finding-explanation"))
        await pilot.press("enter")
        await pilot.pause(0.2)
        view = app.screen.view
        strip = view.render_line(1)
        assert "[bold]x[/] [link=https://evil.example]click[/link] \\x1b[2J\\x1b]52;c;AAAA\\x07 done" in strip.text
        assert not any(seg.style and (seg.style.bold or seg.style.link) for seg in strip if "x[/]" in seg.text)
        assert all("\x1b" not in seg.text and "\x07" not in seg.text for seg in strip)
        await pilot.press("y")  # copying the line copies the inert text, never the escape sequences
        assert "\\x1b[2J" in app.clipboard and "\x1b" not in app.clipboard and "\x07" not in app.clipboard
        assert view.render_line(2).text.rstrip().endswith("[rank0]: red green")  # colour codes dropped, not applied
        await pilot.press("a")
        assert view.render_line(2).text.rstrip().endswith("[rank0]: \\x1b[31mred\\x1b[0m \\x1b[1;32mgreen\\x1b[0m")
        assert "\\x1b[2J" in view.render_line(1).text


@run_async
async def test_help_theme_and_no_color(oom_app: DiagnoseApp, monkeypatch: pytest.MonkeyPatch) -> None:
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert oom_app.theme == "textual-dark"
        await pilot.press("t")
        assert oom_app.theme == "textual-light"
        await pilot.press("t")
        assert oom_app.theme == "textual-dark"
        await pilot.press("question_mark")
        assert isinstance(oom_app.screen, HelpScreen)
        await pilot.press("escape")
        assert isinstance(oom_app.screen, MainScreen)
    monkeypatch.setenv("NO_COLOR", "1")
    assert DiagnoseApp([], report=Report()).no_color


@run_async
async def test_empty_report_says_no_failure(tmp_path: Path) -> None:
    app = DiagnoseApp([], report=Report())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        options = app.screen.findings
        assert options.option_count == 1 and "No failure found" in str(options.get_option_at_index(0).prompt)
        assert "0 findings" in shown(app.screen.query_one("#status"))
        await pilot.press("c")
        assert oom_app_clipboard_empty(app)


def oom_app_clipboard_empty(app: DiagnoseApp) -> bool:
    return app.clipboard == ""


@run_async
async def test_clicking_an_evidence_location_opens_the_log_there(oom_app: DiagnoseApp) -> None:
    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        evidence = oom_app.screen.query_one("#finding-evidence")
        from textual.geometry import Region

        rendered = [strip.text for strip in evidence.render_lines(Region(0, 0, *evidence.size))]
        row = next(i for i, line in enumerate(rendered) if line.startswith("ddp_wrap_oom.log:32"))
        assert row > 1  # the first evidence line wraps above it
        await pilot.click(evidence, offset=(3, row))
        await pilot.pause(0.2)
        assert isinstance(oom_app.screen, LogScreen)
        assert oom_app.screen.view.cursor_line == 31


@run_async
async def test_mouse_selects_a_finding_and_a_fix_tab(oom_app: DiagnoseApp) -> None:
    from textual.geometry import Region

    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        findings = oom_app.screen.findings
        rows = [strip.text for strip in findings.render_lines(Region(0, 0, *findings.size))]
        row = next(i for i, text in enumerate(rows) if "LA010" in text)
        await pilot.click(findings, offset=(6, row))
        await pilot.pause()
        selected = findings.selected_finding
        assert oom_app.report.findings[selected].rule == "LA010"
        assert "destroy_process_group" in shown(oom_app.screen.query_one("#finding-header"))
        assert isinstance(oom_app.screen, MainScreen)  # one click shows, it does not open the log
        await pilot.click(findings, offset=(6, next(i for i, t in enumerate(rows) if "OOM103" in t)))
        await pilot.pause()
        await pilot.click("#fix-tabs #--content-tab-fix-yaml")
        await pilot.pause()
        await pilot.press("c")
        assert oom_app.clipboard == oom_app.report.to_dict()["replay"]["render"]["yaml"]
        await pilot.double_click(findings, offset=(6, next(i for i, t in enumerate(rows) if "OOM103" in t)))
        await pilot.pause(0.2)
        assert isinstance(oom_app.screen, LogScreen) and oom_app.screen.view.cursor_line == 33


@run_async
async def test_many_logs_named_on_the_command_line_are_indexed_lazily(tmp_path) -> None:
    """4096 per-rank logs given as files must not start 4096 index threads and mappings: the first few are indexed
    at once, the others when opened."""
    from diagnose.present.tui import app as app_module

    paths = []
    for r in range(40):
        p = tmp_path / f"rank{r}.log"
        p.write_text(f"[rank{r}]: iteration 1\n")
        paths.append(str(p))
    app = app_module.DiagnoseApp(paths, analyzer=lambda inputs, progress: Report(inputs=[]))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        assert len(app.indices) == app_module.EAGER_INDEX_FILES
        app.index_for(paths[-1])
        assert len(app.indices) == app_module.EAGER_INDEX_FILES + 1


def test_help_lists_every_fix_tab_key_and_says_the_tabs_follow_the_stack() -> None:
    """qa-report-8 L7: the help read "1 2 3 4: fix as Bridge CLI / Python / YAML / Megatron-LM flags" whatever the
    job's stack, and key 5 (Environment) was not listed. Every fix-tab binding is listed with its tab's title."""
    import re

    from diagnose.present.tui.fixrender import TAB_ORDER

    titles = dict(TAB_ORDER)
    tab_keys = {b.key: re.search(r"fix_tab\('(\w+)'\)", b.action).group(1)  # type: ignore[union-attr]
                for b in MainScreen.BINDINGS if b.action.startswith("fix_tab")}
    assert tab_keys.get("5") == "env"
    line = next((keys, what) for keys, what in HelpScreen.KEY_HELP if "1" in keys.split())
    assert set(line[0].split()) == set(tab_keys)
    for key, tab in tab_keys.items():
        assert titles[tab] in line[1], (key, tab)
    assert "stack" in line[1]  # the tabs a job is shown depend on its stack
