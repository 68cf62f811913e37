"""Open what the user named (files, folders of per-rank logs, ``.gz``, ``-`` for stdin) as scannable Sources.

A Source's ``buffer`` is an mmap of the file as it was when opened (so a multi-GB log is never read into memory
and a file that grows or is truncated later cannot make the scan read past what was mapped), or ``bytes`` for an
empty file (mmap refuses size 0) and for small FIFO reads. Compressed input and stdin are first copied into a
temporary file (bounded for gzip) that is deleted when the context closes.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

from diagnose.ingest.discover import expand_inputs
from diagnose.ingest.errors import input_error, os_error
from diagnose.ingest.gzip_bounded import GzipLimits, compressed_kind, decompress_to_file
from diagnose.model import DiagnoseError

FIFO_TIMEOUT_S = 10.0
# A file modified this recently may still be written, rotated or truncated (copytruncate) while we scan it. Reading
# an mmap past a truncated end kills the process with SIGBUS, so such a file is first copied (up to its size at
# open) into our temporary folder and the copy is mapped. Very large live files are mapped in place.
LIVE_WINDOW_S = 10.0  # a job's log is usually read after the job ended; copying GiBs costs seconds per GiB
LIVE_SNAPSHOT_MAX_BYTES = 1 << 30
_COPY_CHUNK = 1 << 20
# Files up to this size are read into memory and closed at once; larger ones are memory-mapped, and each mapping
# holds one file descriptor (CPython's mmap keeps a dup of it) until the analysis ends. A folder of 4096 per-rank
# logs would otherwise need 4096 descriptors where `ulimit -n` is often 1024.
SMALL_READ_BYTES = 1 << 20


@dataclass
class Source:
    """One input log. ``path`` is as the user named it (or the file inside a folder they named)."""

    path: str
    size: int
    buffer: mmap.mmap | bytes
    rank_hint: int | None = None
    local_rank_hint: int | None = None
    attempt: int | None = None  # torchrun --log-dir attempt_N
    stream_name: str | None = None  # "stdout" / "stderr" for torchrun --log-dir files
    _closers: list = field(default_factory=list, repr=False)

    def close(self) -> None:
        while self._closers:
            closer = self._closers.pop()
            with contextlib.suppress(Exception):
                closer()


@contextlib.contextmanager
def open_inputs(inputs: list[str], gzip_limits: GzipLimits | None = None) -> Iterator[list[Source]]:
    """Open every input; close them (and delete temporary files) on exit. Raises DiagnoseError, one line."""
    if isinstance(inputs, (str, bytes)):
        inputs = [inputs]
    if not inputs:
        raise DiagnoseError("no input given: name a log file, a folder of logs, or - for stdin")
    limits = gzip_limits or GzipLimits()
    sources: list[Source] = []
    with tempfile.TemporaryDirectory(prefix="diagnose-") as tmp:
        try:
            entries = expand_inputs(list(inputs))
            raise_open_file_limit(len(entries) + 64)
            for entry in entries:
                sources.append(_open_one(entry.path, entry, tmp, limits))
            yield sources
        finally:
            for source in sources:
                source.close()


def _open_one(path: str, entry, tmp: str, limits: GzipLimits) -> Source:
    hints = dict(
        rank_hint=entry.rank_hint,
        local_rank_hint=entry.local_rank_hint,
        attempt=entry.attempt,
        stream_name=entry.stream_name,
    )
    if path == "-":
        spooled = _spool_stdin(tmp)
        return _map_file(spooled, display_path="-", **hints)
    if compressed_kind(path) is not None:
        out = os.path.join(tmp, f"gunzip-{len(os.listdir(tmp))}.log")
        decompress_to_file(path, out, limits)
        return _map_file(out, display_path=path, **hints)
    try:
        st = os.stat(path)
    except OSError as e:
        raise os_error(path, e, denied="cannot reach this path") from None
    if stat.S_ISFIFO(st.st_mode):
        return _read_stream(path, tmp, **hints)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        # /dev/zero or a terminal would never end; use "-" to read a pipe or a paste on standard input.
        raise input_error(path, "a device or socket, not a log file (use - to read standard input)")
    if not stat.S_ISREG(st.st_mode):
        raise input_error(path, "not a regular file")
    # a small file is read whole (up to its size at open) by _map_file, which is already a snapshot: copy only
    # the larger live files that would otherwise be mapped
    if SMALL_READ_BYTES < st.st_size <= LIVE_SNAPSHOT_MAX_BYTES and time.time() - st.st_mtime < LIVE_WINDOW_S:
        snapshot = _snapshot(path, tmp)
        return _map_file(snapshot, display_path=path, **hints)
    return _map_file(path, display_path=path, **hints)


def _snapshot(path: str, tmp: str) -> str:
    """Copy a file that may still change, up to the size it has now."""
    out = os.path.join(tmp, f"snapshot-{len(os.listdir(tmp))}.log")
    try:
        with open(path, "rb") as src, open(out, "wb") as dst:
            remaining = os.fstat(src.fileno()).st_size
            while remaining > 0:
                chunk = src.read(min(_COPY_CHUNK, remaining))
                if not chunk:
                    break  # truncated while copying: keep what was there
                dst.write(chunk)
                remaining -= len(chunk)
    except OSError as e:
        raise os_error(path, e, "read") from None
    return out


def _map_file(real_path: str, display_path: str, **hints) -> Source:
    try:
        fh = open(real_path, "rb")
    except OSError as e:
        raise os_error(display_path, e) from None
    try:
        size = os.fstat(fh.fileno()).st_size
        if size <= SMALL_READ_BYTES:
            data = fh.read(size)  # at most its size at open, even if it grows meanwhile
            fh.close()
            return Source(path=display_path, size=len(data), buffer=data, **hints)
        try:
            mapped = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
        except (ValueError, OSError) as e:
            # Truncated between fstat and mmap, or a file system without mmap: read it (bounded by size).
            if isinstance(e, OSError) and e.errno not in (errno.ENODEV, errno.EINVAL, errno.EACCES, None):
                raise os_error(display_path, e, "map") from None
            data = fh.read(size)
            fh.close()
            return Source(path=display_path, size=len(data), buffer=data, **hints)
    except DiagnoseError:
        fh.close()
        raise
    except OSError as e:
        fh.close()
        raise os_error(display_path, e, "read") from None
    fh.close()  # the mapping keeps its own descriptor: one per large file, not two
    source = Source(path=display_path, size=size, buffer=mapped, **hints)
    source._closers.append(mapped.close)
    return source


def raise_open_file_limit(needed: int) -> None:
    """Raise the soft limit on open files towards the hard limit when ``needed`` is more than the soft one (many
    large per-rank logs are each mapped, one descriptor apiece). Never lowers it; a failure is left to the open that
    then hits the limit, whose error says to raise ``ulimit -n``."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or needed <= soft:
            return
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):
        pass


def _copy_with_deadline(reader: IO[bytes], out_path: str, what: str, timeout_s: float | None) -> None:
    """Copy a pipe into a file; with a timeout, give up if no writer shows up or it stalls that long."""
    import select

    with open(out_path, "wb") as out:
        if timeout_s is None:
            while True:
                chunk = reader.read(_COPY_CHUNK)
                if not chunk:
                    return
                out.write(chunk)
        fd = reader.fileno()
        while True:
            if timeout_s is not None:
                try:
                    ready, _, _ = select.select([fd], [], [], timeout_s)
                except (OSError, ValueError):
                    ready = [fd]  # not selectable (e.g. a regular file on stdin): just read
                if not ready:
                    raise input_error(what, f"nothing to read after {timeout_s:.0f} s (no writer?)")
            chunk = os.read(fd, _COPY_CHUNK)
            if not chunk:
                return
            out.write(chunk)


def _read_stream(path: str, tmp: str, **hints) -> Source:
    """A FIFO or character device: read it until EOF, with a timeout when nothing comes."""
    out = os.path.join(tmp, f"fifo-{len(os.listdir(tmp))}.log")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise os_error(path, e) from None
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", buffering=0) as reader:
            fd = -1
            _copy_with_deadline(reader, out, f"{path} (a FIFO)", FIFO_TIMEOUT_S)
    except OSError as e:
        raise os_error(path, e, "read") from None
    finally:
        if fd >= 0:
            os.close(fd)
    return _map_file(out, display_path=path, **hints)


def _spool_stdin(tmp: str) -> str:
    stream = sys.stdin
    if stream is None or stream.closed:
        raise DiagnoseError("-: standard input is closed")
    buffer = getattr(stream, "buffer", None)
    out = os.path.join(tmp, f"stdin-{len(os.listdir(tmp))}.log")  # a fresh file: "-" may be named twice
    try:
        if buffer is None:  # a text-only stream (tests, embedding): re-encode what it gives
            with open(out, "wb") as fh:
                while True:
                    text = stream.read(_COPY_CHUNK)
                    if not text:
                        break
                    fh.write(text.encode("utf-8", "surrogateescape"))
            return out
        _copy_with_deadline(buffer, out, "-", None)
    except (ValueError, OSError) as e:
        raise DiagnoseError(f"-: cannot read standard input ({getattr(e, 'strerror', None) or e})") from None
    return out
