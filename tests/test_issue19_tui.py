"""Issue 19, the TUI items, driven through Textual's Pilot: each test failed before its fix."""

from __future__ import annotations

from pathlib import Path

from conftest import settle
from test_tui_app import SIZE, oom_app, open_log_screen  # noqa: F401 - the fixture
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


# ---------------------------------------------------------------------------------------------- item 11


@run_async
async def test_item11_toasts_show_markup_as_typed(tmp_path: Path) -> None:
    """An error toast naming ``run[t=10:30].log`` crashed with MarkupError; ``[@click=app.quit]`` became an action."""
    from test_tui_reports import copy_log, ddp_wrap_oom_report

    log = copy_log("ddp_wrap_oom.log", tmp_path)
    app = DiagnoseApp([str(log)], report=ddp_wrap_oom_report(log))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        app.show_error("cannot read run[t=10:30].log.gz: bad[/b] [@click=app.quit]x[/]")
        await pilot.pause(0.3)
        await _export_as(app, pilot, str(tmp_path / "no" / "run[t=10:30][/].md"))
        await pilot.pause(0.3)
        shown = [str(t.render()) for t in app.screen.query("Toast")]  # drawing used to raise MarkupError
        assert any("run[t=10:30].log.gz: bad[/b] [@click=app.quit]x[/]" in t for t in shown), shown
        assert any("run[t=10:30][/].md" in t for t in shown), shown
        assert app.is_running


@run_async
async def test_item11_slurm_job_table_shows_names_as_typed(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from textual.widgets import DataTable

    from diagnose.present.tui.slurmjobs import JobsScreen

    class Jobs(JobsScreen):
        def load(self) -> None:  # no Slurm here: the list comes from the test
            job = SimpleNamespace(job_id="123", name="train[/] [@click=app.quit]go[/]", state="FAILED",
                                  state_text=lambda: "FAILED [b]", end="2026-12-01T10:00:00", elapsed_s=61,
                                  nodes="node[01-02]")
            self._show_jobs([job])

    app = DiagnoseApp([], report=None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = Jobs()
        await app.push_screen(screen)
        await pilot.pause(0.2)
        table = screen.query_one(DataTable)
        row = [str(getattr(c, "plain", c)) for c in table.get_row_at(0)]
        assert row[1] == "train[/] [@click=app.quit]go[/]" and row[5] == "node[01-02]"
        assert app.is_running


@run_async
async def test_item10_p_without_a_plan_says_why(tmp_path: Path) -> None:
    from test_tui_reports import copy_log

    from diagnose.model import Report

    log = copy_log("ddp_wrap_oom.log", tmp_path)
    app = DiagnoseApp([str(log)], report=Report())  # a report with no config: no plan can be made
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("p")
        await pilot.pause()
        messages = [n.message for n in app._notifications]
        assert any(m.startswith("No memory plan:") for m in messages), messages


@run_async
async def test_item10_forward_search_wraps_to_the_top(oom_app: DiagnoseApp) -> None:  # noqa: F811

    async with oom_app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = await open_log_screen(pilot, oom_app, "l")
        screen.index.done.wait(10)

        async def press(*keys: str) -> None:
            await pilot.press(*keys)
            await oom_app.workers.wait_for_complete()
            await pilot.pause()

        await press("colon", *"60", "enter")
        await press("slash", *"warnings.warn", "enter")  # no match after line 60: the first one, line 2
        assert screen.view.cursor_line == 1
        assert "wrapped to the top" in str(screen.query_one("#log-status").content)


@run_async
async def test_item10_plan_screen_copies_and_exports(tmp_path: Path, monkeypatch) -> None:
    import json

    from test_tui_plan import SIZE as PLAN_SIZE
    from test_tui_plan import plan_app, planned
    from textual.widgets import DataTable

    from diagnose.present.tui.plan import PlanScreen

    monkeypatch.setenv("DIAGNOSE_EXACT_PARAMS", "0")
    monkeypatch.chdir(tmp_path)
    app = plan_app()
    async with app.run_test(size=PLAN_SIZE) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        await planned(pilot, screen)
        table = screen.query_one("#plans", DataTable)
        table.focus()
        table.move_cursor(row=1)
        await pilot.press("c")
        await pilot.pause()
        assert app.clipboard and "=" in app.clipboard  # the highlighted plan's Bridge CLI words
        await pilot.press("e")
        await pilot.pause()
        await pilot.press("enter")  # the default name
        await pilot.pause()
    plan = json.loads((tmp_path / "diagnose-plan.json").read_text())
    assert plan["plans"] and "peak_bytes" in plan["plans"][0]


# ------------------------------------------------------------------------- item 10: what was left

def _long_lines_log(tmp_path: Path, n: int = 200) -> Path:
    log = tmp_path / "long.log"
    log.write_text("".join(f"[rank{i % 4}]: step {i} " + "x" * 300 + f" end{i}\n" for i in range(n)))
    return log


def _log_app(log: Path) -> DiagnoseApp:
    from diagnose.model import InputInfo, Report

    report = Report(inputs=[InputInfo(str(log), log.stat().st_size, 0)])
    return DiagnoseApp([str(log)], report=report, display_names={str(log): log.name})


async def _open_log(app: DiagnoseApp, pilot):

    await pilot.pause()
    screen = await open_log_screen(pilot, app, "l")
    assert screen.index.done.wait(10)
    await pilot.pause(0.2)
    return screen


@run_async
async def test_item10_horizontal_scroll_keeps_the_line_numbers(tmp_path: Path) -> None:
    """Scrolling sideways moved the gutter out of sight with the text."""
    from test_tui_app import view_text

    app = _log_app(_long_lines_log(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open_log(app, pilot)
        view = screen.view
        assert view.max_scroll_x > 100
        view.scroll_to(x=80, animate=False, immediate=True)
        await pilot.pause()
        rows = view_text(view)
        assert rows[0].startswith("  1  ") and rows[9].startswith(" 10  "), rows[:2]
        assert "[rank0]" not in rows[0] and "x" * 20 in rows[0]  # the text did move
        view.scroll_to(x=view.max_scroll_x, animate=False, immediate=True)
        await pilot.pause()
        assert view_text(view)[0].startswith("  1  ") and "end0" in view_text(view)[0]


@run_async
async def test_item19_bridge_cli_tab_never_wraps_the_command(tmp_path: Path) -> None:
    """A long override line was wrapped in the tab: a mouse copy of it got a newline. It scrolls sideways now."""
    from test_tui_reports import copy_log, ddp_wrap_oom_report
    from textual.widgets import Static

    log = copy_log("ddp_wrap_oom.log", tmp_path)
    report = ddp_wrap_oom_report(log)  # its Bridge CLI line: three overrides, 110 characters on one line
    app = DiagnoseApp([str(log)], report=report, display_names={str(log): "ddp_wrap_oom.log"})
    async with app.run_test(size=(100, 45)) as pilot:
        await pilot.pause()
        static = app.main.query_one("#fix-text-cli", Static)
        lines = static.content.plain.splitlines()
        assert any("ddp.use_megatron_fsdp=true" in line and "ckpt_format=fsdp_dtensor" in line for line in lines)
        longest = max(len(line) for line in lines)
        assert longest > app.main.detail.size.width  # the case that wrapped
        assert static.size.height == len(lines), (static.size, len(lines))
        assert static.size.width >= longest


def _status(screen) -> str:
    return str(screen.query_one("#log-status").content)


@run_async
async def test_item10_search_says_k_of_n_and_drops_a_stale_status(tmp_path: Path, monkeypatch) -> None:
    """The status said "match on line 10" with no count, and kept saying it after the cursor moved on."""
    from diagnose.present.tui import screens

    log = tmp_path / "search.log"
    needles = {4, 9, 19, 29}  # 0-based lines holding the term
    log.write_text("".join(f"line {i} " + ("Needle here" if i in needles else "hay") + "\n" for i in range(60)))
    app = _log_app(log)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open_log(app, pilot)

        async def press(*keys: str) -> None:
            await pilot.press(*keys)
            await app.workers.wait_for_complete()
            await pilot.pause()
            screen._update_status()

        await press("slash", *"needle", "enter")
        assert screen.view.cursor_line == 4
        assert "match 1 of 4 on line 5" in _status(screen), _status(screen)
        await press("n")
        assert "match 2 of 4 on line 10" in _status(screen), _status(screen)
        await press("N", "N")
        assert "match 4 of 4 on line 30 (wrapped to the end)" in _status(screen), _status(screen)
        await press("down")  # moved away: the status no longer names a match
        assert "match" not in _status(screen), _status(screen)
        await press("slash", "ctrl+u", *"absent", "enter")
        assert "no match for 'absent'" in _status(screen) and "of 4" not in _status(screen)

        monkeypatch.setattr(screens, "MATCH_COUNT_CAP", 3)  # a huge log: counted up to a cap, "N+"
        await press("slash", "ctrl+u", *"here", "enter")
        assert "of 3+" in _status(screen), _status(screen)


@run_async
async def test_item10_rank_filter_keeps_the_place_and_shows_rows_while_scanning(tmp_path: Path, monkeypatch) -> None:
    """On a 1 GiB log the filter showed an empty screen for a minute, then the top of the log: the user's place was
    lost, and lost again when the filter was cleared. Here the scan of the lines above the user's place is held
    back, as a slow scan would be: the place must already be on screen, on the same screen row, and stay there
    when those rows arrive and when the filter is cleared."""
    import threading

    from test_tui_app import view_text

    from diagnose.present.tui.rankfacet import RankFacet

    log = tmp_path / "ranks.log"
    log.write_text("".join(f"[rank{i % 4}]: step {i}\n" for i in range(30_000)))
    gate = threading.Event()
    real_batch = RankFacet._scan_batch

    def held(self, start, limit, above):
        if above:
            gate.wait(20)
        return real_batch(self, start, limit, above)

    monkeypatch.setattr(RankFacet, "_scan_batch", held)
    app = _log_app(log)
    try:
        async with app.run_test(size=SIZE) as pilot:
            screen = await _open_log(app, pilot)
            view = screen.view
            await pilot.press("colon", *"20001", "enter")
            await pilot.pause(0.2)
            assert view.cursor_line == 20_000
            screen_row = view.cursor - view.scroll_offset.y

            def cursor_screen_row() -> int:
                return view.cursor - view.scroll_offset.y

            await pilot.press("r", "2", "enter")
            for _ in range(50):
                await pilot.pause(0.1)
                if view.facet is not None and view.facet.covers(20_000) and view._anchor is None:
                    break
            assert not view.facet.done.is_set()  # the lines above are still held back
            rows = [r for r in view_text(view) if r.strip()]
            assert len(rows) == view.size.height and all("[rank2]: " in r for r in rows), rows[:3]
            assert view.cursor_line == 19_998  # the rank's line at or before the user's
            assert cursor_screen_row() == screen_row
            assert "scanning" in _status(screen)

            gate.set()  # the rows above arrive: the screen must not jump
            assert view.facet.done.wait(20)
            await pilot.pause(0.3)
            assert view.cursor_line == 19_998 and cursor_screen_row() == screen_row
            assert len(view.facet.rows) == 7_500

            await pilot.press("r", "enter")  # all ranks again: still there
            await pilot.pause(0.2)
            assert view.facet is None
            assert view.cursor_line == 19_998 and cursor_screen_row() == screen_row
    finally:
        gate.set()


# ---------------------------------------------------------------------------------------------- item 21


@run_async
async def test_item21_job_list_has_a_diagnosis_column_filled_in_the_background(tmp_path: Path) -> None:
    """The job list had no diagnosis column. It shows at once ("diagnosing…") and fills as a worker diagnoses
    each job; a summary is inert text on one line."""
    import threading
    from types import SimpleNamespace

    from textual.widgets import DataTable

    from diagnose.present.tui.slurmjobs import JobsScreen

    def job(job_id: str, name: str):
        return SimpleNamespace(job_id=job_id, name=name, state="FAILED", state_text=lambda: "FAILED",
                               end="2026-12-01T10:00:00", elapsed_s=61, nodes="node01")

    release = threading.Event()
    asked: list[str] = []

    def summarize(job_id: str) -> str:
        asked.append(job_id)
        if job_id == "102":
            release.wait(20)  # a slow diagnosis: the list and the first answer must not wait for it
            return "MB150 [b]config\n[@click=app.quit]x"
        return "OOM103 cuda_oom"

    class Jobs(JobsScreen):
        def load(self) -> None:  # no Slurm here: the list comes from the test
            self._show_jobs([job("101", "pretrain"), job("102", "sft")])

    app = DiagnoseApp([], report=None)
    summaries: dict[str, str] = {}
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = Jobs(summarize=summarize, summaries=summaries)
            await app.push_screen(screen)
            table = screen.query_one(DataTable)

            def column(row: int) -> str:
                return str(getattr(table.get_row_at(row)[-1], "plain", ""))

            for _ in range(50):
                await pilot.pause(0.1)
                if column(0) != "diagnosing…":
                    break
            assert table.row_count == 2
            assert column(0) == "OOM103 cuda_oom" and column(1) == "diagnosing…"
            release.set()
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert column(1) == "MB150 [b]config [@click=app.quit]x"  # one line, markup as typed
            assert app.is_running and asked == ["101", "102"]
            assert summaries == {"101": "OOM103 cuda_oom", "102": "MB150 [b]config\n[@click=app.quit]x"}
    finally:
        release.set()


# ------------------------------------------------------------------------------- conventions: tail mode


@run_async
async def test_conventions_follow_shows_new_lines_and_rediagnoses_on_failure_lines(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """``diagnose tui --follow LOG`` (Toolong's tail mode) did not exist. Lines appended while the app runs
    appear at the end of the log view; plain lines do not start a diagnosis, failure lines do (debounced)."""
    from test_tui_app import view_text
    from test_tui_reports import need_log

    from diagnose.present.tui import follow
    from diagnose.present.tui.app import pipeline_analyzer
    from diagnose.present.tui.screens import LogScreen

    monkeypatch.setattr(follow, "DEBOUNCE_S", 0.3)
    log = tmp_path / "live.log"
    log.write_bytes(need_log("clean_run.log").read_bytes())
    runs: list[int] = []
    analyzer = pipeline_analyzer([])

    def counted(inputs, progress):
        runs.append(1)
        return analyzer(inputs, progress)

    app = DiagnoseApp([str(log)], analyzer=counted, display_names={str(log): "live.log"}, follow=True)

    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, lambda: app.report is not None and isinstance(app.screen, LogScreen))
        screen = app.screen
        assert app.report.root is None and runs == [1]
        assert "following" in _status(screen)

        with log.open("a") as fh:
            fh.writelines(f"[default0]: iteration {i}/200 | lm loss: 2.1 |\n" for i in range(101, 161))
        await settle(pilot, lambda: any("iteration 160/200" in r for r in view_text(screen.view)))
        assert "iteration 160/200" in view_text(screen.view)[-1] or \
            screen.view.cursor_line == screen.index.line_count - 1  # the view stays at the end
        await pilot.pause(1.2)  # past the debounce: plain lines start no diagnosis
        assert runs == [1]

        with log.open("ab") as fh:
            fh.write(need_log("ddp_wrap_oom.log").read_bytes())
        await settle(pilot, lambda: app.report is not None and app.report.root is not None)
        assert app.report.root.category == "cuda_oom" and len(runs) == 2
        await pilot.pause(0.3)
        screen._update_status()
        assert f"root cause {app.report.root.rule} (cuda_oom)" in _status(screen), _status(screen)
        assert isinstance(app.screen, LogScreen) and screen.view.tail

        await pilot.press("up")  # moving up leaves tail mode; f goes back to it
        assert not screen.view.tail
        await pilot.press("f")
        assert screen.view.tail and screen.view.cursor == screen.view.row_count - 1


def test_conventions_follow_refuses_what_cannot_grow(tmp_path: Path, capsys) -> None:
    import gzip

    from diagnose.present.cli import main

    gz = tmp_path / "job.log.gz"
    gz.write_bytes(gzip.compress(b"x\n"))
    plain = tmp_path / "a.log"
    plain.write_text("x\n")
    for argv, says in ((["tui", "--follow", str(gz)], "compressed"),
                       (["tui", "--follow", str(plain), str(plain)], "exactly one path"),
                       (["tui", "--follow", str(tmp_path)], "only a plain log file")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err


@run_async
async def test_conventions_follow_reads_a_failure_line_written_in_two_parts(tmp_path: Path, monkeypatch) -> None:
    """A writer's buffer can end mid-line: the line is checked again once it is complete."""
    from test_tui_reports import need_log

    from diagnose.present.tui import follow
    from diagnose.present.tui.app import pipeline_analyzer

    monkeypatch.setattr(follow, "DEBOUNCE_S", 0.3)
    log = tmp_path / "live.log"
    log.write_bytes(need_log("clean_run.log").read_bytes())
    app = DiagnoseApp([str(log)], analyzer=pipeline_analyzer([]), follow=True)
    oom = b"[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(200):
            await pilot.pause(0.1)
            if app.report is not None and app._followed is not None and app._followed.done.is_set():
                break
        assert app.report is not None and app.report.root is None
        with log.open("ab") as fh:
            fh.write(b"[rank0]: torch.OutOf")
        await pilot.pause(1.5)
        assert app.report.root is None
        with log.open("ab") as fh:
            fh.write(oom[len(b"[rank0]: torch.OutOf"):] + b"capacity of 79.11 GiB of which 1.00 GiB is free.\n")
        for _ in range(200):
            await pilot.pause(0.1)
            if app.report.root is not None:
                break
        assert app.report.root is not None and app.report.root.category == "cuda_oom"
