"""``diagnose tui`` refuses what ``analyze`` refuses, in one line and before a screen opens (qa-report-9 L6).

It used to open empty panes with a notification for an empty file, a binary file or a folder without logs, and exit
2 only when the user quit. The refusal comes before the terminal is asked for, so it is the same line with or
without one (here: without, as in a pipe or CI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _tui(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "diagnose", "tui", *args], capture_output=True, text=True,
                          env=env, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("make", "said"), [
    (lambda p: p.write_bytes(b""), "is empty (0 bytes)"),
    (lambda p: p.write_bytes(bytes(range(256)) * 64), "binary data, not a text log"),
])
def test_a_bad_file_is_one_line_before_the_screen(tmp_path: Path, make, said: str) -> None:
    log = tmp_path / "job.log"
    make(log)
    done = _tui(str(log))
    assert done.returncode == 2
    assert said in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""


def test_a_folder_without_logs_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("no log here\n")
    done = _tui(str(tmp_path))
    assert done.returncode == 2 and "folder has no log files" in done.stderr


def test_a_good_log_still_asks_for_a_terminal(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("step 1 loss 2.3\nRuntimeError: CUDA error: an illegal memory access was encountered\n")
    done = _tui(str(log))
    assert done.returncode == 2 and "tui needs a terminal" in done.stderr
