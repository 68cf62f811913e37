"""Where diagnose keeps what is slow to rebuild (compiled Hyperscan databases, megatron-core parameter counts).

``$DIAGNOSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/diagnose``, else ``~/.cache/diagnose``; ``DIAGNOSE_NO_CACHE=1`` (or
an empty ``DIAGNOSE_CACHE_DIR``) switches every cache off. Everything cached is checked or rebuilt on doubt, so a
missing, read-only or damaged folder only costs time.
"""

from __future__ import annotations

import os


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
