"""What the two megatron-core child processes share (the meta-device parameter count, the real config checks):
whether megatron-core is installed, the versions their cached answers depend on, where the child runs, and the
JSON file the answers are cached in."""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

# the folder holding the ``diagnose`` package: the children run ``python -m diagnose...`` from it
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def megatron_installed() -> bool:
    """torch and megatron-core are installed (found, not imported: the import costs seconds)."""
    try:
        return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        return False


def versions() -> str:
    """``torch=X,megatron-core=Y`` (``?`` for one not installed): part of every cache key."""
    from importlib import metadata

    out = []
    for dist in ("torch", "megatron-core"):
        try:
            out.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            out.append(f"{dist}=?")
    return ",".join(out)


class JsonCache:
    """One JSON object in diagnose's cache folder (``diagnose.cache``), replaced atomically; missing or damaged
    reads as empty. ``max_entries``: a full file is emptied before the next write."""

    def __init__(self, name: str, max_entries: int | None = None):
        self.name = name
        self.max_entries = max_entries

    def path(self) -> str | None:
        from diagnose.cache import cache_dir

        base = cache_dir()
        return os.path.join(base, self.name) if base else None

    def read(self) -> dict[str, Any]:
        path = self.path()
        if path is None:
            return {}
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return {}  # missing or damaged: a miss, rebuilt and rewritten
        return data if isinstance(data, dict) else {}

    def write(self, key: str, value: Any) -> None:
        from diagnose.cache import write_atomic

        path = self.path()
        if path is None:
            return
        data = self.read()
        if self.max_entries is not None and len(data) >= self.max_entries:
            data.clear()
        data[key] = value
        write_atomic(path, json.dumps(data).encode("utf-8"))  # a read-only home: no cache, same answers
