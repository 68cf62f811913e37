"""Where a command writes: standard output, or the file named by ``-o/--output``.

One place turns a file that cannot be opened or written (a missing folder, no permission, a full disk) into the
one-line ``cannot write PATH: reason`` error, exit code 2, for every command.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TextIO

from diagnose.ingest.errors import shown
from diagnose.model import DiagnoseError


@contextmanager
def output_stream(path: str | None) -> Iterator[TextIO]:
    """Yield standard output when ``path`` is empty, else the file, opened for writing (UTF-8) and closed after."""
    if not path:
        if sys.stdout is None or getattr(sys.stdout, "closed", False):
            raise DiagnoseError("standard output is closed: nowhere to write the report (use -o FILE)")
        yield sys.stdout
        return
    try:
        fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as e:
        raise DiagnoseError(f"cannot write {shown(path)}: {e.strerror or e}") from None
    try:
        with fh:
            yield fh
    except OSError as e:
        raise DiagnoseError(f"cannot write {shown(path)}: {e.strerror or e}") from None


def write_output(path: str | None, text: str) -> None:
    with output_stream(path) as fh:
        fh.write(text)


def deliver(path: str | None, write: Callable[[TextIO], None]) -> None:
    """Write with ``write(stream)`` to ``path`` or standard output. A reader that closed the pipe early (``| head``,
    ``| true``) is not an error and changes nothing about the answer: the exit code stays the diagnosis's. Any
    other failure to write standard output (``> /dev/full``) is one line, exit 2."""
    try:
        with output_stream(path) as fh:
            write(fh)
            if not path:
                fh.flush()
    except BrokenPipeError:
        silence_stdout()
    except OSError as e:
        if path:
            raise
        silence_stdout()
        raise DiagnoseError(f"cannot write the report to standard output: {e.strerror or e}") from None


def silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the flush at exit cannot fail a second time."""
    with suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def is_input(target: str, inputs: list[str]) -> bool:
    """Is ``target`` one of the files read (the same file, a hard link too) or inside a folder read? A report
    written there would replace the only copy of a failed job's log."""
    real = os.path.realpath(target)
    for path in inputs:
        if not path or path == "-" or not os.path.exists(path):
            continue
        real_in = os.path.realpath(path)
        if real == real_in or (os.path.isdir(real_in) and real.startswith(real_in.rstrip(os.sep) + os.sep)):
            return True
        if os.path.exists(target) and os.path.samefile(target, path):
            return True
    return False


class _PipeTolerant:
    """Standard output that takes a closed pipe (``| head -1``, ``| true``) as "the reader has seen enough": the
    rest is dropped and the command goes on to return its own exit code. Without it, a command printing through a
    plain rich Console (``rules list``, ``check``) ended with rich's ``SystemExit(1)``, and one printing through
    ``print`` (``replay``) with the command line's catch-all ``0``, whatever the verdict was."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.pipe_closed = False

    def write(self, text: str) -> int:
        if not self.pipe_closed:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._closed()
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.pipe_closed:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._closed()

    def _closed(self) -> None:
        self.pipe_closed = True
        silence_stdout()  # what is still buffered goes to /dev/null at exit, not to a second EPIPE

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextmanager
def pipe_tolerant_stdout() -> Iterator[None]:
    """Run a command with :class:`_PipeTolerant` as ``sys.stdout``; the real stream is put back after."""
    real = sys.stdout
    if real is None:
        yield
        return
    sys.stdout = _PipeTolerant(real)
    try:
        yield
    finally:
        sys.stdout = real


def hint_if_stdin_is_a_terminal(paths: list[str]) -> None:
    """``diagnose analyze -`` typed at a terminal read it in silence: say what it waits for (on stderr, so that
    the report on stdout stays clean); a pipe or a file on stdin says nothing."""
    if "-" not in paths:
        return
    with suppress(OSError, ValueError, AttributeError):
        if sys.stdin.isatty():
            sys.stderr.write("diagnose: reading a log from the terminal: paste it, then press Ctrl-D on an empty "
                             "line (Ctrl-C stops)\n")
            sys.stderr.flush()


class NoCICommands:
    """A text stream that writes whole lines through ``inert.no_ci_commands``: a report that shows log lines, read
    in a CI step (``diagnose analyze job.log`` in GitHub Actions), cannot issue the runner a workflow command that
    a log line carried (``::error::``, ``::add-mask::``, ``##[error]``). Everything else is the wrapped stream's."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._pending = ""

    def write(self, text: str) -> int:
        head, newline, self._pending = (self._pending + text).rpartition("\n")
        if newline:
            from diagnose.inert import no_ci_commands

            self._out.write(no_ci_commands(head + newline))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            from diagnose.inert import no_ci_commands

            self._out.write(no_ci_commands(self._pending))
            self._pending = ""
        self._out.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self._out, name)
