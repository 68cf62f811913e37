"""``diagnose tui`` end to end in a real pseudo-terminal: the command starts Textual, shows the diagnosis, quits
on ``q`` with the analyze exit codes (1: failure diagnosed). Covers a file argument, ``-`` (a piped log, with the
keyboard read from the terminal) and paste mode (a bracketed paste, then ctrl+r)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import sys
import termios
import time

import pytest
from test_tui_reports import need_log

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses a Linux pseudo-terminal")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_in_pty(args: list[str], *, stdin_data: bytes | None = None, steps: list[tuple[bytes, bytes]],
               timeout: float = 90) -> tuple[int, bytes]:
    """Run ``python -m diagnose ARGS`` in a 140x45 pty; for each (wait_for, keys) step, wait until the screen
    output contains ``wait_for`` and type ``keys``. Returns (exit code, everything the app wrote)."""
    pid, fd = pty.fork()
    if pid == 0:  # child: optionally a pipe on stdin, the pty stays the controlling terminal (/dev/tty)
        try:
            os.chdir(REPO)
            if stdin_data is not None:
                read_end, write_end = os.pipe()
                if os.fork() == 0:
                    os.close(read_end)
                    os.write(write_end, stdin_data)
                    os._exit(0)
                os.close(write_end)
                os.dup2(read_end, 0)
            env = dict(os.environ, PYTHONPATH=REPO, TERM="xterm-256color")
            os.execvpe(sys.executable, [sys.executable, "-m", "diagnose", *args], env)
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 45, 140, 0, 0))
    out = b""
    pending = list(steps)
    seen_at = 0
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            if pending and pending[0][0] in out[seen_at:]:
                seen_at = len(out)
                time.sleep(0.3)
                os.write(fd, pending.pop(0)[1])
    finally:
        if time.monotonic() >= deadline:
            os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert not pending, f"never saw {pending[0][0]!r}"
    return os.waitstatus_to_exitcode(status), out


def test_tui_on_a_file_shows_the_root_cause_and_quits() -> None:
    log = need_log("ddp_wrap_oom.log")
    code, out = run_in_pty(["tui", str(log)], steps=[(b"root cause", b"q")])
    assert code == 1
    assert b"cuda_oom" in out


def test_tui_reads_a_piped_log_and_the_keyboard_from_the_terminal() -> None:
    log = need_log("fsdp2_pg_collection.log")
    code, out = run_in_pty(["tui", "-"], stdin_data=log.read_bytes(), steps=[(b"root cause", b"q")])
    assert code == 1
    assert b"fsdp_config" in out


def test_tui_paste_mode_in_a_terminal() -> None:
    log = need_log("b062_ckpt_format_new.log")
    paste = b"\x1b[200~" + log.read_bytes().replace(b"\n", b"\r") + b"\x1b[201~"
    last_line = str(len(log.read_bytes().splitlines()) + 1).encode()  # the paste is in: its last line number shows
    code, out = run_in_pty(["tui"], steps=[(b"Paste a failed job", paste), (last_line, b"\x12"), (b"root cause", b"q")])
    assert code == 1
    assert b"checkpoint_format" in out
