"""Round 29 of hostile use, the TUI through Textual's Pilot (docs/qa-report-5.md)."""

from __future__ import annotations

import threading
from pathlib import Path

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
