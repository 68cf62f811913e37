"""Decompress a ``.gz`` log into a temporary file without trusting it: output size and ratio are capped.

A gzip bomb (a few KB that inflate to many GB) or a corrupt/truncated stream is a one-line DiagnoseError, never a
traceback and never a full disk. Concatenated gzip members (``cat a.gz b.gz``) are read like ``gzip -d`` does.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

from diagnose.ingest.errors import input_error
from diagnose.model import DiagnoseError

_CHUNK_IN = 1 << 16
_CHUNK_OUT = 1 << 20


@dataclass(frozen=True)
class GzipLimits:
    max_output_bytes: int = 64 << 30  # 64 GiB: a real multi-GB training log still fits
    max_ratio: float = 1000.0  # text logs compress 5-30x; a 1000x stream is a bomb
    ratio_grace_bytes: int = 64 << 20  # small outputs are never refused for their ratio


def decompress_to_file(src: str, dst: str, limits: GzipLimits) -> int:
    """Inflate ``src`` into ``dst``; return the number of bytes written."""
    try:
        fin = open(src, "rb")
    except FileNotFoundError:
        raise input_error(src, f"no such file or directory") from None
    except PermissionError:
        raise input_error(src, f"permission denied (no read access)") from None
    except IsADirectoryError:
        raise input_error(src, f"is a directory, not a .gz file") from None
    except OSError as e:
        raise input_error(src, f"cannot open ({e.strerror or e})") from None
    written = 0
    read = 0
    try:
        with fin, open(dst, "wb") as fout:
            inflater = zlib.decompressobj(wbits=31)
            started = False
            pending = b""
            while True:
                chunk = pending or fin.read(_CHUNK_IN)
                pending = b""
                if not chunk:
                    break
                read += len(chunk)
                if inflater.eof:
                    # Another gzip member follows (or trailing garbage, which gzip -d warns about and ignores).
                    if not chunk.startswith(b"\x1f\x8b"):
                        break
                    inflater = zlib.decompressobj(wbits=31)
                started = True
                data = inflater.decompress(chunk, _CHUNK_OUT)
                while True:
                    written += len(data)
                    _check(src, written, read, limits)
                    fout.write(data)
                    if not inflater.unconsumed_tail:
                        break
                    data = inflater.decompress(inflater.unconsumed_tail, _CHUNK_OUT)
                if inflater.eof and inflater.unused_data:
                    pending = inflater.unused_data
                    read -= len(pending)
            if not started:
                return 0  # an empty .gz file: empty input
            if not inflater.eof:
                raise input_error(src, f"corrupt or truncated gzip (stream ends early)")
            tail = inflater.flush()
            written += len(tail)
            _check(src, written, read, limits)
            fout.write(tail)
    except zlib.error as e:
        raise input_error(src, f"corrupt gzip ({e})") from None
    except OSError as e:
        if os.path.exists(dst):
            os.unlink(dst)
        raise input_error(src, f"cannot decompress ({e.strerror or e})") from None
    return written


def _check(src: str, written: int, read: int, limits: GzipLimits) -> None:
    if written > limits.max_output_bytes:
        raise input_error(src, f"refusing to decompress more than {limits.max_output_bytes} bytes (gzip bomb or huge log)"
        )
    if written > limits.ratio_grace_bytes and written > limits.max_ratio * max(read, 1):
        raise input_error(src, f"refusing to decompress: expands more than {limits.max_ratio:.0f}x (looks like a gzip bomb)"
        )
