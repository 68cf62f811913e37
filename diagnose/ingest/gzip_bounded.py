"""Decompress a ``.gz`` (or ``.bz2`` / ``.xz``) log into a temporary file without trusting it.

Output size and expansion ratio are capped, so a bomb (a few KB that inflate to many GB) or a corrupt stream is a
one-line DiagnoseError, never a traceback and never a full disk. An archive cut short (a copy of a log still being
written) keeps what it decompressed, with a warning that says where it ends; one that yields nothing is refused.
Concatenated members (``cat a.gz b.gz``) are read like ``gzip -d`` does; trailing garbage after a complete member
is ignored, as gzip does with a warning.
"""

from __future__ import annotations

import bz2
import contextlib
import lzma
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from diagnose.ingest.errors import input_error, os_error
from diagnose.units import format_bytes

_CHUNK_IN = 1 << 16
_CHUNK_OUT = 1 << 20

COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz")


@dataclass(frozen=True)
class GzipLimits:
    max_output_bytes: int = 64 << 30  # 64 GiB: a real multi-GB training log still fits
    max_ratio: float = 1000.0  # text logs compress 5-30x (up to ~200x for very repetitive ones); bombs ~1000x+
    ratio_grace_bytes: int = 64 << 20  # small outputs are never refused for their ratio


class _Zlib:
    """zlib's gzip reader behind the same small interface as bz2/lzma decompressors."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj(wbits=31)
        self._tail = b""

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data

    @property
    def needs_input(self) -> bool:
        return not self._tail

    def decompress(self, data: bytes, max_length: int) -> bytes:
        out = self._d.decompress(self._tail + data, max_length)
        self._tail = self._d.unconsumed_tail
        return out


_FORMATS: dict[str, tuple[str, bytes, Callable[[], object], tuple[type[Exception], ...]]] = {
    ".gz": ("gzip", b"\x1f\x8b", _Zlib, (zlib.error,)),
    ".bz2": ("bzip2", b"BZh", bz2.BZ2Decompressor, (OSError, ValueError)),
    ".xz": ("xz", b"\xfd7zXZ\x00", lzma.LZMADecompressor, (lzma.LZMAError,)),
}


def compressed_kind(path: str) -> str | None:
    return next((suffix for suffix in COMPRESSED_SUFFIXES if path.lower().endswith(suffix)), None)


def decompress_to_file(src: str, dst: str, limits: GzipLimits, kind: str | None = None,
                       display: str | None = None, notes: list[str] | None = None) -> int:
    """Decompress ``src`` (``kind`` a suffix, else from its name, gzip by default) into ``dst``; return the bytes
    written. Errors name ``display`` (what the user named, e.g. ``-``) when given, else ``src``.

    A stream that ends early after some output (the archive copied while the log was still written) keeps that
    output and adds one warning to ``notes``; corrupt data mid-stream, or a cut before any output, is an error."""
    name, magic, make, errors = _FORMATS[kind or compressed_kind(src) or ".gz"]
    user_src = src
    src = display or src
    try:
        fin = open(user_src, "rb")
    except IsADirectoryError:
        raise input_error(src, f"is a directory, not a {name} file") from None
    except OSError as e:
        raise os_error(src, e) from None
    try:
        with fin, open(dst, "wb") as fout:
            written, cut = _copy(fin, fout, src, name, magic, make, limits)
    except BaseException as e:
        with contextlib.suppress(OSError):  # never leave half a file behind, whatever stopped the copy
            os.unlink(dst)
        if isinstance(e, errors):
            raise input_error(src, f"corrupt {name} data ({e})") from None
        if isinstance(e, EOFError):
            raise input_error(src, f"corrupt or truncated {name} data (stream ends early)") from None
        if isinstance(e, OSError):
            raise os_error(src, e, "decompress") from None
        raise
    if cut and notes is not None:
        notes.append(f"{src}: the {name} archive ends early (cut short?): diagnosed the first "
                     f"{format_bytes(written)} ({written} bytes) it holds; the rest of the log is missing")
    return written


def _copy(fin: BinaryIO, fout: BinaryIO, src: str, name: str, magic: bytes, make,
          limits: GzipLimits) -> tuple[int, bool]:
    """Copy the decompressed stream; return (bytes written, whether the input ended inside a stream). An input
    that ends inside its stream before any output raises EOFError (nothing there to read)."""
    decompressor = make()
    read = written = 0
    started = False
    while True:
        if decompressor.eof:
            rest = decompressor.unused_data
            while len(rest) < len(magic):  # the next member's magic may straddle a read
                more = fin.read(_CHUNK_IN)
                if not more:
                    break
                read += len(more)
                rest += more
            if not rest or not rest.startswith(magic):
                break  # end of input, or trailing garbage after a complete member
            decompressor = make()
            data_in = rest
        elif decompressor.needs_input:
            data_in = fin.read(_CHUNK_IN)
            read += len(data_in)
            if not data_in:
                break
        else:
            data_in = b""
        started = True
        out = decompressor.decompress(data_in, _CHUNK_OUT)
        written += len(out)
        _check(src, name, written, read, limits)
        fout.write(out)
    cut = started and not decompressor.eof
    if cut and written == 0:
        raise EOFError
    return written, cut


def _check(src: str, name: str, written: int, read: int, limits: GzipLimits) -> None:
    if written > limits.max_output_bytes:
        raise input_error(
            src, f"refusing to decompress more than {limits.max_output_bytes} bytes ({name} bomb or huge log)"
        )
    if written > limits.ratio_grace_bytes and written > limits.max_ratio * max(read, 1):
        raise input_error(
            src, f"refusing to decompress: expands more than {limits.max_ratio:.0f}x (looks like a {name} bomb)"
        )
