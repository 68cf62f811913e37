"""TOML files already read once (the rules files, the phase file): their data as JSON, in diagnose's cache
folder, keyed by the file's bytes. Shared by match (rules) and normalize (phases), so it sits beside ``cache``.

Reading the 13 built-in files costs ~0.45 s per run (TOML parsing, and compiling every rule's regexes to check
them), most of a small log's analysis. A file whose content hash is cached was parsed and every regex in it
compiled when it was stored, so a hit skips both; the engine then compiles a regex only when a line needs it.
Only files that loaded without a single error are stored. Any doubt (missing, damaged, another version) is a miss.
The phase markers file (``normalize/phase_file``) is cached the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from typing import Any

from diagnose import __version__
from diagnose.cache import cache_dir, write_atomic

FORMAT = 1
KEEP = 64  # cached files kept; the oldest go first


def _path(text: str) -> str | None:
    folder = cache_dir()
    if folder is None:
        return None
    h = hashlib.sha256(f"{FORMAT}\0{__version__}\0".encode() + text.encode("utf-8", "surrogatepass")).hexdigest()
    return os.path.join(folder, f"rules-{h[:32]}.json")


def get(text: str) -> dict[str, Any] | None:
    """The TOML data of a file with exactly this text, validated when stored; None on a miss."""
    path = _path(text)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def put(text: str, data: dict[str, Any]) -> None:
    path = _path(text)
    if path is None:
        return
    try:
        blob = json.dumps(data, allow_nan=False)
        if json.loads(blob) != data:
            return  # a TOML value JSON cannot carry (a date): not cached
    except (TypeError, ValueError):
        return
    write_file(path, blob.encode("utf-8"), "rules-", KEEP)


def write_file(path: str, data: bytes, prefix: str, keep: int) -> None:
    """Write a cache entry atomically, then keep only the ``keep`` newest entries named ``prefix*`` with ``path``'s
    extension. A read-only home is fine: it is rebuilt next time."""
    folder = os.path.dirname(path)
    if not write_atomic(path, data):
        return
    try:
        names = os.listdir(folder)
    except OSError:
        return
    suffix = os.path.splitext(path)[1]
    entries = []
    for name in names:
        if name.startswith(prefix) and name.endswith(suffix):
            p = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                entries.append((os.stat(p).st_mtime, p))
    entries.sort(reverse=True)
    for _m, p in entries[keep:]:
        with contextlib.suppress(OSError):
            os.unlink(p)
