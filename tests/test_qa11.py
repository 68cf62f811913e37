"""QA round 11 (docs/qa-report-11.md): the TUI, the output formats and multi-file inputs, and the newest logs.

Each test failed on the tree before its fix. Output tests run the real command line (tests/cli_run.py)."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys
import time

from diagnose.match import engine
from diagnose.normalize import decode, normalize_line
from tests.cli_run import ROOT


class _Recording(bytes):
    """A log buffer that remembers the lowest byte offset any search started from."""

    lowest: int

    def rfind(self, sub, start=None, end=None):  # type: ignore[override]
        self.lowest = min(getattr(self, "lowest", len(self)), 0 if start is None else start)
        return super().rfind(sub, start, end)

    def find(self, sub, start=None, end=None):  # type: ignore[override]
        self.lowest = min(getattr(self, "lowest", len(self)), 0 if start is None else start)
        return super().find(sub, start, end)


def test_a_traceback_look_back_near_the_end_of_a_big_log_reads_only_its_window() -> None:
    """A 1.5 GB log of iteration lines whose only failure is at its end: the first look-back for a traceback
    searched the whole file from byte 0 (peak RSS 1.5 GB: the log faulted in a second time), though only the last
    TRACEBACK_LOOKBACK_BYTES can answer. It must search no further back than that window, and still find the
    traceback inside it."""
    filler = b"[rank0]: iteration 1 | lm loss: 2.3 | grad norm: 0.8\n" * (3 * engine.TRACEBACK_LOOKBACK_BYTES // 50)
    tail = b'[rank0]: Traceback (most recent call last):\n[rank0]:   File "train.py", line 9, in step\n'
    last = b"[rank0]: torch.OutOfMemoryError: CUDA out of memory.\n"
    buf = _Recording(filler + tail + last)
    start = len(buf) - len(last)
    stream = normalize_line(decode(last.rstrip()), "big.log", 0, None).stream
    assert engine._stream_has_traceback_before(engine._LineReader(buf, "big.log"), start, stream)
    assert buf.lowest >= start - engine.TRACEBACK_LOOKBACK_BYTES


def test_tui_on_a_pipe_that_has_not_ended_says_it_is_reading_standard_input(tmp_path) -> None:
    """``tail -f job.log | diagnose tui -``: the TUI spools the pipe before drawing, so a pipe that does not end
    left a blank terminal on which no key did anything, with no word. It must say on the terminal that it reads
    standard input until the pipe ends, and how to stop or follow a growing file instead."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DIAGNOSE_NO_CONFIG": "1", "DIAGNOSE_SKIP_SLURM": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "diagnose", "tui", "-"], stdin=subprocess.PIPE, stdout=slave,
                            stderr=slave, env=env, cwd=tmp_path, start_new_session=True)
    os.close(slave)
    seen = b""
    try:
        assert proc.stdin is not None
        proc.stdin.write((ROOT / "sample_logs" / "b042_first_iter_oom.log").read_bytes())
        proc.stdin.flush()  # and kept open: the pipe has not ended
        deadline = time.monotonic() + 30
        while b"standard input" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
            if proc.poll() is not None:
                break
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(master)
    text = seen.decode("utf-8", "replace")
    assert "standard input" in text and "--follow" in text, text
