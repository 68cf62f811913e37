"""QA round 11 (docs/qa-report-11.md): the TUI, the output formats and multi-file inputs, and the newest logs.

Each test failed on the tree before its fix. Output tests run the real command line (tests/cli_run.py)."""

from __future__ import annotations

from diagnose.match import engine
from diagnose.normalize import decode, normalize_line


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
