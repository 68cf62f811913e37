"""QA round 21 (docs/qa-report-21.md): the TUI and analyze on big and hostile logs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from conftest import settle
from rich.text import Text
from test_issue19_tui import SIZE, _status, run_async

from diagnose.inert import inert, inert_block
from diagnose.model import Evidence
from diagnose.present.tui.app import DiagnoseApp
from diagnose.present.tui.detail import evidence_text


def test_inert_makes_a_file_names_lone_surrogate_visible():
    # os.fsdecode of a name holding the byte 0xff gives U+DCFF; a terminal cannot show it (the TUI driver wrote
    # "\udcff", six cells, where rich had counted one)
    assert inert("job_\udcff.log") == "job_\\udcff.log"
    assert inert_block("a\ud800\nb") == "a\\ud800\nb"
    assert inert("ok é ✓") == "ok é ✓"


def test_tui_evidence_of_a_log_whose_name_has_undecodable_bytes_keeps_every_word():
    f = SimpleNamespace(evidence=[Evidence(path="/tmp/evil_\udcff.log", line=54,
                                           text="torch.OutOfMemoryError: CUDA out of memory.")])
    text = evidence_text(f, {})  # type: ignore[arg-type]
    assert isinstance(text, Text)
    plain = text.plain
    assert "\udcff" not in plain and "evil_\\udcff.log:54" in plain
    assert text.cell_len == len(plain)  # what rich measures is what the terminal gets
    plain.encode("utf-8")  # strict: no surrogate left to be backslash-replaced by the driver


@run_async
async def test_a_followed_log_restarted_into_without_a_failure_drops_the_old_root_cause(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    """``tui --follow job.log`` on an OOM, then the job restarted into the same file (``: > job.log``, clean lines):
    the status line kept "root cause OOM102" and the findings the old run's evidence, for lines no longer there,
    until a new failure line came (none would, on a healthy restart)."""
    from test_tui_reports import need_log

    from diagnose.present.tui import follow
    from diagnose.present.tui.app import pipeline_analyzer
    from diagnose.present.tui.screens import LogScreen

    monkeypatch.setattr(follow, "DEBOUNCE_S", 0.3)
    log = tmp_path / "live.log"
    log.write_bytes(need_log("ddp_wrap_oom.log").read_bytes())
    app = DiagnoseApp([str(log)], analyzer=pipeline_analyzer([]), display_names={str(log): "live.log"}, follow=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, lambda: app.report is not None and isinstance(app.screen, LogScreen)
                     and app._followed is not None and app._followed.done.is_set())
        assert app.report.root is not None and app.report.root.category == "cuda_oom"
        screen = app.screen
        with log.open("r+b") as fh:
            fh.truncate(0)
            fh.write(b"".join(b"[default0]: iteration %d/200 | lm loss: 2.1 |\n" % i for i in range(1, 6)))
        await settle(pilot, lambda: app.report is not None and app.report.root is None, seconds=15)
        await pilot.pause(0.3)
        screen._update_status()
        status = _status(screen)
        assert "no failure yet" in status and "OOM102" not in status, status
