"""Read ``rules/phases/phases.toml``: the phase markers trainers print and the traceback frames that name a phase.

The knowledge is data (a message is taught once, in rules/); this module only reads and checks it. The file is
read once per process (the scanner's captures are built from it at import). A malformed file is one
``DiagnoseError`` naming the file and the entry.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from diagnose.model import PHASES, CaptureSpec, DiagnoseError

KEEPS = ("first", "last", "first_last", "all")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Examples:
    match: tuple[str, ...]  # lines (markers) or frame keys (frames) that must be recognised
    no_match: tuple[str, ...]  # near misses that must not


@dataclass(frozen=True, slots=True)
class Marker:
    spec: CaptureSpec  # what the scanner collects
    phase: str  # the phase a failure right after this marker is in
    progress: bool  # the job got past its first iteration
    weak: bool  # says nothing once progress was seen (NCCL's start-up for a communicator created later)
    note: str
    examples: Examples


@dataclass(frozen=True, slots=True)
class FramePattern:
    phase: str
    pattern: re.Pattern[str]  # searched in the frame keys, one per line
    note: str
    examples: Examples


@dataclass(frozen=True, slots=True)
class PhaseFile:
    path: Path
    markers: tuple[Marker, ...]
    frames: tuple[FramePattern, ...]  # most specific first: the first that matches decides


def phase_file_path() -> Path:
    """``diagnose/_rules/phases/phases.toml`` when installed, ``rules/phases/phases.toml`` in a checkout."""
    package = Path(__file__).resolve().parents[1]
    for rules in (package / "_rules", package.parent / "rules"):
        if (rules / "phases" / "phases.toml").is_file():
            return rules / "phases" / "phases.toml"
    raise DiagnoseError("the built-in phase markers file rules/phases/phases.toml is missing (reinstall diagnose)")


@functools.cache
def load_phase_file(path: Path | None = None) -> PhaseFile:
    """The markers and frame patterns of ``path`` (the built-in file by default), checked."""
    path = path or phase_file_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        markers, frames = tuple(_entries(data, "marker", _marker)), tuple(_entries(data, "frame", _frame))
    except (OSError, UnicodeDecodeError) as e:
        raise DiagnoseError(f"phase markers file {path}: cannot read: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise DiagnoseError(f"phase markers file {path}: invalid TOML: {e}") from None
    except ValueError as e:
        raise DiagnoseError(f"phase markers file {path}: {e}") from None
    names = [m.spec.name for m in markers]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise DiagnoseError(f"phase markers file {path}: marker {', '.join(twice)} is defined twice")
    return PhaseFile(path, markers, frames)


def _entries(data: dict, kind: str, parse: Callable[[dict], T]) -> Iterator[T]:
    for i, raw in enumerate(_get(data, kind, list, []), 1):
        try:
            if not isinstance(raw, dict):
                raise ValueError("not a table")
            yield parse(raw)
        except (ValueError, re.error) as e:
            label = f" ({raw['name']})" if isinstance(raw, dict) and isinstance(raw.get("name"), str) else ""
            raise ValueError(f"{kind} {i}{label}: {e}") from None


def _marker(raw: dict) -> Marker:
    _known_keys(raw, {"name", "anchor", "regex", "keep", "phase", "progress", "weak", "note", "examples"})
    regex = _regex(raw) if "regex" in raw else None
    keep = _get(raw, "keep", str, "first")
    if keep not in KEEPS:
        raise ValueError(f"keep {keep!r} is not one of {', '.join(KEEPS)}")
    spec = CaptureSpec(_get(raw, "name", str), anchor=_get(raw, "anchor", str), regex=regex, keep=keep)
    if not spec.name or not spec.anchor:
        raise ValueError("empty name or anchor")
    if regex is not None:
        re.compile(regex)
    flags = _get(raw, "progress", bool, False), _get(raw, "weak", bool, False)
    return Marker(spec, _phase(raw), *flags, _get(raw, "note", str, "").strip(), _examples(raw))


def _frame(raw: dict) -> FramePattern:
    _known_keys(raw, {"phase", "regex", "note", "examples"})
    pattern = re.compile(_regex(raw), re.M)
    return FramePattern(_phase(raw), pattern, _get(raw, "note", str, "").strip(), _examples(raw))


def _known_keys(raw: dict, known: set[str]) -> None:
    if unknown := sorted(set(raw) - known):
        raise ValueError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")


def _get(raw: dict, key: str, kind: type, default: Any = None) -> Any:
    value = raw.get(key, default)
    if not isinstance(value, kind):
        raise ValueError(f"{key!r} must be a {kind.__name__}" if key in raw else f"no {key!r}")
    return value


def _phase(raw: dict) -> str:
    phase = _get(raw, "phase", str)
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {', '.join(PHASES)}")
    return phase


def _regex(raw: dict) -> str:
    """A regex, or a list of alternatives joined by ``|`` (a long alternation reads better one per line)."""
    value = raw.get("regex")
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return "|".join(value)
    if isinstance(value, str) and value:
        return value
    raise ValueError("'regex' must be a string or a list of strings")


def _examples(raw: dict) -> Examples:
    examples = _get(raw, "examples", dict, {})
    lists = [examples.get(key, []) for key in ("match", "no_match")]
    if set(examples) - {"match", "no_match"} or not all(
        isinstance(v, list) and all(isinstance(s, str) for s in v) for v in lists
    ):
        raise ValueError("'examples' takes 'match' and 'no_match', lists of strings")
    return Examples(tuple(lists[0]), tuple(lists[1]))
