"""Defaults from a config file, as ruff and pytest read theirs: ``[tool.diagnose]`` in the nearest
``pyproject.toml`` (this folder or a parent), else ``~/.config/diagnose/config.toml`` (``$XDG_CONFIG_HOME``).

Keys: ``rules`` (folders of user rules, relative to the file), ``gpu``, ``gpu-memory``, ``format``, ``select``,
``ignore``, ``color``. Options on the command line win. An unknown key or a value of the wrong type is a one-line
error with a did-you-mean, like an unknown option. ``DIAGNOSE_NO_CONFIG=1`` skips the files.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from diagnose.model import DiagnoseError
from diagnose.toml_data import tomllib

# key -> (argparse dest, type, commands it applies to)
KEYS: dict[str, tuple[str, type, tuple[str, ...]]] = {
    "rules": ("rules", list, ("analyze", "rules", "slurm", "tui")),
    "gpu": ("gpu", str, ("check", "tui")),
    "gpu-memory": ("gpu_memory", str, ("analyze", "check", "tui")),
    "format": ("format", str, ("analyze", "slurm")),
    "select": ("select", list, ("analyze",)),
    "ignore": ("ignore", list, ("analyze",)),
    "color": ("color", str, ("analyze", "check", "replay", "slurm")),
}


def find_config(start: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The file and its ``[tool.diagnose]`` table (or the user config's top level), or None."""
    if os.environ.get("DIAGNOSE_NO_CONFIG") == "1":
        return None
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            data = _read(candidate)
            table = data.get("tool", {}).get("diagnose") if isinstance(data.get("tool"), dict) else None
            if isinstance(table, dict):
                return candidate, table
            break  # the project's own pyproject.toml without our table: the user config may still apply
    home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "diagnose" / "config.toml"
    if home.is_file():
        return home, _read(home)
    return None


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise DiagnoseError(f"config file {path}: {e}") from None
    except UnicodeDecodeError as e:  # tomllib reads UTF-8 only; the error alone did not say which file
        raise DiagnoseError(f"config file {path}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def defaults_for(command: str, found: tuple[Path, dict[str, Any]] | None) -> dict[str, Any]:
    """argparse defaults for ``command`` from the config file; DiagnoseError for an unknown key or a bad value."""
    if found is None:
        return {}
    path, table = found
    out: dict[str, Any] = {}
    value: Any
    for key, value in table.items():
        spec = KEYS.get(key) or KEYS.get(str(key).replace("_", "-"))
        if spec is None:
            close = difflib.get_close_matches(str(key), KEYS, n=1, cutoff=0.6)
            raise DiagnoseError(f"config file {path}: unknown key {key!r}"
                                + (f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(KEYS)})"))
        dest, kind, commands = spec
        if kind is list and isinstance(value, str):
            value = [value]
        items: list[Any] = list(value) if isinstance(value, list) else []
        if not isinstance(value, kind) or (kind is list and not all(isinstance(v, str) for v in items)):
            wanted = "a list of strings" if kind is list else "a string"
            raise DiagnoseError(f"config file {path}: {key} must be {wanted}")
        if command not in commands:
            continue
        if dest == "rules":
            value = [str((path.parent / v).resolve()) if not os.path.isabs(v) else v for v in items]
        out[dest] = value
    return out
