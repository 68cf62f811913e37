"""Where diagnose keeps what is slow to rebuild (compiled Hyperscan databases, megatron-core parameter counts).

``$DIAGNOSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/diagnose``, else ``~/.cache/diagnose``; ``DIAGNOSE_NO_CACHE=1`` (or
an empty ``DIAGNOSE_CACHE_DIR``) switches every cache off. Everything cached is checked or rebuilt on doubt, so a
missing, read-only or damaged folder only costs time.
"""

from __future__ import annotations

import contextlib
import os
import tempfile


def cache_dir() -> str | None:
    if os.environ.get("DIAGNOSE_NO_CACHE"):
        return None
    d = os.environ.get("DIAGNOSE_CACHE_DIR")
    if d is None:
        base = os.environ.get("XDG_CACHE_HOME")
        if not base:
            home = os.path.expanduser("~")
            if not os.path.isdir(home):  # HOME=/nonexistent (system accounts, some CI): no cache, never a new home
                return None
            base = os.path.join(home, ".cache")
        d = os.path.join(base, "diagnose")
    return d or None


def write_atomic(path: str, data: bytes) -> bool:
    """Write a cache file atomically (two runs at once never see half a file); False, and no temporary file left
    behind, when it cannot be written (a read-only home: the entry is rebuilt next time)."""
    folder = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False
