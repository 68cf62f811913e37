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

from diagnose.ingest import sniff
from diagnose.ingest.discover import expand_inputs
from diagnose.ingest.errors import input_error, os_error, shown
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
    maps_input: bool = False  # ``buffer`` maps the user's file itself (not a copy): it can shrink under the map
    # bytes at the head that are a hole of a sparse file (NULs the file system never stored: a log truncated while
    # its writer kept its offset): the scan starts after them instead of reading gigabytes of zero pages
    head_hole: int = 0
    _closers: list = field(default_factory=list, repr=False)

    def close(self) -> None:
        while self._closers:
            closer = self._closers.pop()
            with contextlib.suppress(Exception):
                closer()


class Sources(list):
    """The opened inputs, plus ``warnings`` for the report: files of a folder skipped, rotated logs not read,
    a pipe that went quiet before its end."""

    def __init__(self) -> None:
        super().__init__()
        self.warnings: list[str] = []


@contextlib.contextmanager
def open_inputs(inputs: list[str], gzip_limits: GzipLimits | None = None, include: list[str] | None = None,
                exclude: list[str] | None = None) -> Iterator[list[Source]]:
    """Open every input; close them (and delete temporary files) on exit. Raises DiagnoseError, one line."""
    if not inputs:
        raise DiagnoseError("no input given: name a log file, a folder of logs, or - for stdin")
    limits = gzip_limits or GzipLimits()
    sources = Sources()
    with tempfile.TemporaryDirectory(prefix="diagnose-") as tmp:
        try:
            entries = expand_inputs(list(inputs), sources.warnings, include, exclude)
            raise_open_file_limit(len(entries) + 64)
            skipped: list[str] = []
            for entry in entries:
                try:
                    sources.append(_open_one(entry.path, entry, tmp, limits, sources.warnings))
                except DiagnoseError as e:
                    if not entry.in_folder or not getattr(e, "about_the_file", True):
                        raise
                    skipped.append(str(e))  # one bad file in a folder of per-rank logs must not lose the others
            if skipped:
                if not sources:
                    raise DiagnoseError(f"no readable log in the folder: {skipped[0]}"
                                        + (f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""))
                sources.warnings.append(f"{len(skipped)} file{'s' if len(skipped) != 1 else ''} skipped: "
                                        f"{skipped[0]}" + (" (and more)" if len(skipped) > 1 else ""))
            yield sources
        finally:
            for source in sources:
                source.close()


def _open_one(path: str, entry, tmp: str, limits: GzipLimits, notes: list[str] | None = None) -> Source:
    hints = {name: getattr(entry, name) for name in ("rank_hint", "local_rank_hint", "attempt", "stream_name")}
    if path == "-":
        return _map_file(_decoded(_spool_stdin(tmp), "-", tmp, limits, notes=notes), display_path="-", **hints)
    if compressed_kind(path) is not None:
        out = os.path.join(tmp, f"gunzip-{len(os.listdir(tmp))}.log")
        decompress_to_file(path, out, limits, notes=notes)
        return _map_file(_decoded(out, path, tmp, limits, compressed=True), display_path=path, **hints)
    try:
        st = os.stat(path)
    except OSError as e:
        raise os_error(path, e, denied="cannot reach this path") from None
    if stat.S_ISFIFO(st.st_mode):
        if entry.in_folder:  # a FIFO among per-rank logs may have no writer: never wait on it
            raise input_error(path, "a FIFO in the folder (name it to read it)")
        return _map_file(_decoded(_read_stream(path, tmp, notes), path, tmp, limits, notes=notes), display_path=path,
                         **hints)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        # /dev/zero or a terminal would never end; use "-" to read a pipe or a paste on standard input.
        raise input_error(path, "a device or socket, not a log file (use - to read standard input)")
    if not stat.S_ISREG(st.st_mode):
        raise input_error(path, "not a regular file")
    real = path
    # a small file is read whole (up to its size at open) by _map_file, which is already a snapshot: copy only
    # the larger live files that would otherwise be mapped
    if SMALL_READ_BYTES < st.st_size <= LIVE_SNAPSHOT_MAX_BYTES and time.time() - st.st_mtime < LIVE_WINDOW_S:
        real = _snapshot(path, tmp)
    return _map_file(_decoded(real, path, tmp, limits, notes=notes), display_path=path, **hints)


def _decoded(real: str, display: str, tmp: str, limits: GzipLimits, compressed: bool = False,
             notes: list[str] | None = None) -> str:
    """The file to scan for ``real``: itself when it is text; decompressed when its magic bytes say gzip, bzip2 or
    xz whatever its name; re-encoded as UTF-8 when a BOM says UTF-16/32. Archives we do not open and binary data
    are refused in one line (they used to be scanned as garbage and called "no failure")."""
    sample = sniff.head(real, display)
    kind = None if compressed else sniff.compressed_by_magic(sample)
    if kind is not None:
        out = os.path.join(tmp, f"unpacked-{len(os.listdir(tmp))}.log")
        decompress_to_file(real, out, limits, kind=kind[0], display=display, notes=notes)
        real, sample = out, sniff.head(out, display)
    encoding = sniff.bom_encoding(sample) or sniff.bomless_utf16(sample)
    if encoding is not None:
        out = os.path.join(tmp, f"utf8-{len(os.listdir(tmp))}.log")
        sniff.transcode_to_utf8(real, out, encoding, display, limits.max_output_bytes)
        real, sample = out, sniff.head(out, display)
    sample = sniff.after_nul_hole(real, display, sample)
    sniff.refuse_unreadable(sample, display)
    if sniff.cr_lines(sample):
        out = os.path.join(tmp, f"cr-{len(os.listdir(tmp))}.log")
        sniff.cr_to_newlines(real, out, display)
        real = out
    return real


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
    with fh:  # a mapping keeps its own descriptor: one per large file, not two
        try:
            size = os.fstat(fh.fileno()).st_size
            if size > SMALL_READ_BYTES:
                try:
                    mapped = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
                except (ValueError, OSError) as e:
                    # Truncated between fstat and mmap, or a file system without mmap: read it (bounded by size).
                    if isinstance(e, OSError) and e.errno not in (errno.ENODEV, errno.EINVAL, errno.EACCES, None):
                        raise os_error(display_path, e, "map") from None
                else:
                    source = Source(path=display_path, size=size, buffer=mapped, maps_input=real_path == display_path,
                                    head_hole=_head_hole(fh.fileno(), size), **hints)
                    source._closers.append(mapped.close)
                    return source
            data = fh.read(size)  # at most its size at open, even if it grows meanwhile
        except OSError as e:
            raise os_error(display_path, e, "read") from None
    return Source(path=display_path, size=len(data), buffer=data, **hints)


def _head_hole(fd: int, size: int) -> int:
    """Where the first data of the file ``fd`` (``size`` bytes) starts when it starts with a hole (SEEK_DATA: the
    bytes before read as NULs, and hold no newline); 0 when it starts with data, or where SEEK_DATA is missing or
    refused (the file is then read from its first byte, as before)."""
    try:
        data = os.lseek(fd, 0, os.SEEK_DATA)
    except (AttributeError, OSError):  # no SEEK_DATA here, or no data at all (ENXIO: sniff refused that file)
        return 0
    return data if 0 < data < size else 0


def release_pages(buf: object, start: int, end: int) -> int:
    """Hand the mapped pages lying wholly inside ``[start, end)`` back to the kernel (MADV_DONTNEED) once read, so
    resident memory stays flat however large the log; they fault back in from the page cache if read again. Returns
    the page-aligned offset released up to, or ``start`` when nothing was (not a mapping, no madvise, no whole page)."""
    if not isinstance(buf, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return start
    lo = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (end // mmap.PAGESIZE) * mmap.PAGESIZE
    if hi <= lo:
        return start
    try:
        buf.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    except (OSError, ValueError):
        return start
    return hi


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


SPOOL_MAX_BYTES = 64 << 30  # what stdin or a FIFO may put in our temporary folder (as for a decompressed log)
SPOOL_FREE_MIN_BYTES = 1 << 30  # stop before the temporary folder's disk has less than this left
FIFO_IDLE_AFTER_DATA_S = 60.0  # a writer that pauses longer: analyze what came, and say so


def _copy_with_deadline(reader: IO[bytes], out_path: str, what: str, timeout_s: float | None,
                        notes: list[str] | None = None) -> None:
    """Copy a pipe into a file, bounded: by size, by the disk's free space, and by content (binary data is
    refused after its first 64 KiB, so ``- < /dev/zero`` stops at once). With a timeout: give up if no writer
    shows up; once data came, a writer quiet for FIFO_IDLE_AFTER_DATA_S ends the read (noted), nothing is lost."""
    import select

    written = 0
    head = b""
    with open(out_path, "wb") as out:
        fd = reader.fileno() if timeout_s is not None else None
        while True:
            if fd is not None:
                wait = timeout_s if written == 0 else max(timeout_s or 0.0, FIFO_IDLE_AFTER_DATA_S)
                try:
                    ready, _, _ = select.select([fd], [], [], wait)
                except (OSError, ValueError):
                    ready = [fd]  # not selectable (e.g. a regular file on stdin): just read
                if not ready:
                    if written == 0:
                        raise input_error(what, f"nothing to read after {timeout_s:.0f} s (no writer?)")
                    if notes is not None:
                        notes.append(f"{shown(what)}: the writer was quiet for {wait:.0f} s; analyzed the "
                                     f"{written} bytes read until then")
                    return
                chunk = os.read(fd, _COPY_CHUNK)
            else:
                chunk = reader.read(_COPY_CHUNK)
            if not chunk:
                return
            if len(head) < sniff.SAMPLE_BYTES:
                head += chunk[: sniff.SAMPLE_BYTES - len(head)]
                if len(head) >= sniff.SAMPLE_BYTES and sniff.compressed_by_magic(head) is None \
                        and sniff.bom_encoding(head) is None and sniff.bomless_utf16(head) is None:
                    sniff.refuse_unreadable(head, what)
            out.write(chunk)
            written += len(chunk)
            _check_spool(out, written, what)


def spool_pipe(reader: IO[bytes], out_path: str, what: str = "-") -> None:
    """Copy a pipe (the TUI's ``-``) into ``out_path`` with ``analyze -``'s bounds: size, the disk's free space,
    and binary data refused after its first 64 KiB (``diagnose tui - < /dev/zero`` filled the disk)."""
    _copy_with_deadline(reader, out_path, what, None)


def _check_spool(out: IO[bytes], written: int, what: str) -> None:
    if written > SPOOL_MAX_BYTES:
        raise input_error(what, f"more than {SPOOL_MAX_BYTES >> 30} GiB on a pipe: not spooling more (save it to "
                                "a file and name the file)")
    if written % (64 << 20) < _COPY_CHUNK:  # every 64 MiB
        try:
            st = os.fstatvfs(out.fileno())
        except OSError:
            return
        if st.f_bavail * st.f_frsize < SPOOL_FREE_MIN_BYTES:
            raise input_error(what, f"stopped reading after {written >> 20} MiB: the temporary folder's disk is "
                                    "almost full (set TMPDIR to a larger one, or name a file)")


def _read_stream(path: str, tmp: str, notes: list[str] | None = None) -> str:
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
            _copy_with_deadline(reader, out, f"{path} (a FIFO)", FIFO_TIMEOUT_S, notes)
    except OSError as e:
        raise os_error(path, e, "read") from None
    finally:
        if fd >= 0:
            os.close(fd)
    return out


def _spool_stdin(tmp: str) -> str:
    stream = sys.stdin
    if stream is None or stream.closed:
        raise DiagnoseError("-: standard input is closed")
    buffer = getattr(stream, "buffer", None)
    out = os.path.join(tmp, f"stdin-{len(os.listdir(tmp))}.log")  # a fresh file: "-" may be named twice
    try:
        if buffer is None:  # a text-only stream (tests, embedding): re-encode what it gives
            with open(out, "wb") as fh:
                while text := stream.read(_COPY_CHUNK):
                    fh.write(text.encode("utf-8", "surrogateescape"))
            return out
        _copy_with_deadline(buffer, out, "-", None)
    except (ValueError, OSError) as e:
        raise DiagnoseError(f"-: cannot read standard input ({getattr(e, 'strerror', None) or e})") from None
    return out
