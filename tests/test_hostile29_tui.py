"""Round 29 of hostile use, the TUI through Textual's Pilot (docs/qa-report-5.md)."""

from __future__ import annotations

import threading
from pathlib import Path

from conftest import settle
from test_issue19_tui import SIZE, _log_app, _open_log, run_async


@run_async
async def test_rank_filter_near_the_end_of_the_log_keeps_the_place(tmp_path: Path, monkeypatch) -> None:
    """``r`` on the root-cause rank from its evidence, a few lines before the end of a big log (where an OOM's
    evidence usually is): the rank's rows after the place filled less than a screen, so the screen could not
    scroll to keep the place on its row; from then on every batch of rows found above pushed the cursor down while
    the screen stayed at the top of the log (seen in tmux on a 1 GiB log: line 405 on screen, the place at line
    9,641,891). Here the batches above are let through one at a time, as a slow scan delivers them."""
    from diagnose.present.tui.rankfacet import RankFacet

    log = tmp_path / "ranks.log"
    log.write_text("".join(f"[rank{2 if i % 50 == 0 else 0}]: step {i}\n" for i in range(30_000)))
    batches = threading.Semaphore(0)
    real_batch = RankFacet._scan_batch

    def one_at_a_time(self, start, limit, above):
        if above:
            batches.acquire(timeout=20)
        return real_batch(self, start, limit, above)

    monkeypatch.setattr(RankFacet, "_scan_batch", one_at_a_time)
    app = _log_app(log)

    def on_screen() -> bool:
        return 0 <= view.cursor - view.scroll_offset.y < view.size.height

    try:
        async with app.run_test(size=SIZE) as pilot:
            screen = await _open_log(app, pilot)
            view = screen.view
            await pilot.press("colon", *"29951", "enter")
            await pilot.pause(0.2)
            assert view.cursor_line == 29_950
            await pilot.press("r", "2", "enter")
            for _ in range(50):
                await pilot.pause(0.1)
                if view.facet is not None and view.facet.covers(29_950) and view._anchor is None:
                    break
            assert view.cursor_line == 29_950 and on_screen()
            for _ in range(4):  # batches of 1024, 2048, 4096, 8192 lines above
                batches.release()
                await pilot.pause(0.3)
                assert view.cursor_line == 29_950
                assert on_screen(), (view.cursor, view.scroll_offset.y, view.size.height)
            batches.release(100)
            assert view.facet.done.wait(20)
            await pilot.pause(0.3)
            assert view.cursor_line == 29_950 and on_screen()
            assert len(view.facet.rows) == 600
    finally:
        batches.release(100)


@run_async
async def test_follow_a_log_cut_shorter_reads_it_again_and_diagnoses_what_follows(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """``diagnose tui --follow job.log`` under logrotate's copytruncate: following stopped ("the file shrank") with
    the old lines kept (scrolling to them later was a SIGBUS, tests/test_hostile29.py), and a failure written to
    the file after the cut never started a diagnosis. Now the view reads the file again from its start, says so,
    and a failure line after the cut is diagnosed."""
    from test_issue19_tui import _status
    from test_tui_app import view_text
    from test_tui_reports import need_log

    from diagnose.present.tui import follow
    from diagnose.present.tui.app import DiagnoseApp, pipeline_analyzer
    from diagnose.present.tui.screens import LogScreen

    monkeypatch.setattr(follow, "DEBOUNCE_S", 0.3)
    log = tmp_path / "live.log"
    log.write_bytes(need_log("clean_run.log").read_bytes() * 3)  # longer than what is written after the cut
    app = DiagnoseApp([str(log)], analyzer=pipeline_analyzer([]), display_names={str(log): "live.log"},
                      follow=True)

    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, lambda: app.report is not None and isinstance(app.screen, LogScreen))
        screen = app.screen
        assert app.report.root is None
        log.write_bytes(b"")  # copytruncate
        await settle(pilot, lambda: getattr(screen.index, "truncations", 0) == 1 or not screen.index.following)
        with log.open("ab") as fh:
            fh.write(need_log("ddp_wrap_oom.log").read_bytes())
        await settle(pilot, lambda: app.report is not None and app.report.root is not None)
        assert app.report.root.category == "cuda_oom"
        assert screen.index.following and screen.index.line_count == len(need_log("ddp_wrap_oom.log").read_bytes()
                                                                          .splitlines())
        screen._update_status()
        assert "truncated" in _status(screen)
        rows = [r for r in view_text(screen.view) if r.strip()]
        assert rows and all("iteration" not in r or "lm loss" not in r for r in rows)  # no line of the old text
