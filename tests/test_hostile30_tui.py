"""Round 30 of hostile use, the TUI through Textual's Pilot (docs/qa-report-6.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from conftest import settle
from test_issue19_tui import SIZE, _log_app, _open_log, _status, run_async


@run_async
async def test_a_shown_log_cut_shorter_shows_what_is_left_and_says_so(tmp_path: Path) -> None:
    """``diagnose tui job.log`` (not following), the file cut shorter, then End: a SIGBUS before (qa-report-5 L1;
    tests/test_hostile30.py has the subprocess that died of it). Now the view reads the file again from its start,
    shows what is left, and its status line says the file was cut shorter."""
    from test_tui_app import view_text

    log = tmp_path / "job.log"
    log.write_bytes(b"".join(b"[rank0]: iteration %d of a job shown\n" % i for i in range(40_000)))  # > 1 MiB
    old = time.time() - 3600
    os.utime(log, (old, old))  # not a live file: ingest maps the file itself
    app = _log_app(log)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open_log(app, pilot)
        assert screen.index.line_count == 40_000
        with log.open("r+b") as fh:
            fh.truncate(0)
            fh.write(b"[rank0]: the job started again\n" * 3)
        await pilot.press("end")
        await settle(pilot, lambda: screen.index.truncations == 1)
        await pilot.press("end")
        await pilot.pause(0.3)
        screen._update_status()
        assert "cut shorter" in _status(screen) and "read again" in _status(screen)
        assert screen.index.line_count == 3
        rows = [r for r in view_text(screen.view) if r.strip()]
        assert rows and all("started again" in r for r in rows), rows
