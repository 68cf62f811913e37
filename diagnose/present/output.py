"""Where a command writes: standard output, or the file named by ``-o/--output``.

One place turns a file that cannot be opened or written (a missing folder, no permission, a full disk) into the
one-line ``cannot write PATH: reason`` error, exit code 2, for every command.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from diagnose.ingest.errors import shown
from diagnose.model import DiagnoseError


@contextmanager
def output_stream(path: str | None) -> Iterator[TextIO]:
    """Yield standard output when ``path`` is empty, else the file, opened for writing (UTF-8) and closed after."""
    if not path:
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
