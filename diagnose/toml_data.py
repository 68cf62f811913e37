"""The project's TOML data files (the rules catalogue, the phase file, the user's settings): reading them and
checking their fields, with one wording for every file. Below every stage: anything may import it."""

from __future__ import annotations

import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diagnose.model import DiagnoseError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = ["tomllib", "read_text", "parse", "need", "optional", "one_of", "str_list", "known_keys"]


MAX_TOML_BYTES = 16 << 20  # the built-in catalogue's largest file is 0.2 MiB


def read_text(path: Path, what: str) -> str:
    """The file's text; DiagnoseError ``<what> <path>: cannot read: ...``. Only a regular file of at most
    MAX_TOML_BYTES: a ``--rules`` folder's ``x.toml`` linked to /dev/zero was read until memory ran out, a FIFO
    named ``x.toml`` blocked for ever."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise DiagnoseError(f"{what} {path}: cannot read: not a regular file")
        if st.st_size > MAX_TOML_BYTES:
            raise DiagnoseError(f"{what} {path}: cannot read: larger than {MAX_TOML_BYTES >> 20} MiB")
        with open(path, "rb") as fh:
            data = fh.read(MAX_TOML_BYTES + 1)
        if len(data) > MAX_TOML_BYTES:
            raise DiagnoseError(f"{what} {path}: cannot read: larger than {MAX_TOML_BYTES >> 20} MiB")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DiagnoseError(f"{what} {path}: cannot read: {e}") from None


def parse(text: str, path: Path, what: str) -> dict[str, Any]:
    """The parsed TOML; DiagnoseError ``<what> <path>: invalid TOML: ...``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DiagnoseError(f"{what} {path}: invalid TOML: {e}") from None


def need(raw: dict, key: str, kind: type) -> Any:
    """A required field of type ``kind`` (ValueError otherwise)."""
    if key not in raw:
        raise ValueError(f"missing '{key}'")
    return optional(raw, key, kind, None)


def optional(raw: dict, key: str, kind: type, default: Any) -> Any:
    """A field of type ``kind``, ``default`` when absent (ValueError when present with another type)."""
    value = raw.get(key, default)
    if not isinstance(value, kind):
        raise ValueError(f"'{key}' must be {kind.__name__}")
    return value


def one_of(raw: dict, key: str, default: str, allowed: Sequence[str], name: str = "") -> Any:
    value = raw.get(key, default)
    if value not in allowed:
        raise ValueError(f"{name or key} {value!r} is not one of {', '.join(allowed)}")
    return value


def str_list(raw: dict, key: str) -> list[str]:
    if key not in raw:  # absent: most keys of most rules (the catalogue reads ~10,000 at each start)
        return []
    value = raw[key]
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"'{key}' must be a list of strings")
    return list(value)


def known_keys(raw: dict, known: set[str]) -> None:
    if unknown := sorted(set(raw) - known):
        raise ValueError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
