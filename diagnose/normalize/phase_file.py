"""Read ``rules/phases/phases.toml``: the phase markers trainers print and the traceback frames that name a phase.

The knowledge is data (a message is taught once, in rules/); this module only reads and checks it. The file is
read once per process (the scanner's captures are built from it at import). A malformed file is one
``DiagnoseError`` naming the file and the entry. A file read and checked once is cached as JSON by its text
(``toml_cache``, as the rules files are): a hit skips the TOML parse and compiling every regex to check it,
and a frame pattern is compiled when a traceback is first read against it (``rules lint`` checks every one).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from diagnose.model import PHASES, CaptureSpec, DiagnoseError
from diagnose.toml_data import known_keys, need, one_of, optional, parse, read_text, str_list

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
    background: bool  # progress, not what the job was doing: never the last marker; read on the failure line too
    note: str
    examples: Examples


@dataclass(frozen=True, slots=True)
class FramePattern:
    phase: str
    regex: str  # searched (re.M) in the frame keys, one per line
    note: str
    examples: Examples

    @property
    def pattern(self) -> re.Pattern[str]:
        return _frame_pattern(self.regex)


@functools.cache
def _frame_pattern(regex: str) -> re.Pattern[str]:
    return re.compile(regex, re.M)


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
def load_phase_file(path: Path | None = None, check: bool = False) -> PhaseFile:
    """The markers and frame patterns of ``path`` (the built-in file by default), checked.

    ``check``: compile every regex even when the file's text was cached after that check (``rules lint``)."""
    from diagnose import toml_cache

    path = path or phase_file_path()
    text = read_text(path, "phase markers file")
    cached = None if check else toml_cache.get(text)  # read and checked before: no TOML parse, no regex compile
    data = cached if cached is not None else parse(text, path, "phase markers file")
    compile_all = cached is None
    try:
        markers = tuple(_entries(data, "marker", functools.partial(_marker, check=compile_all)))
        frames = tuple(_entries(data, "frame", functools.partial(_frame, check=compile_all)))
    except ValueError as e:
        raise DiagnoseError(f"phase markers file {path}: {e}") from None
    names = [m.spec.name for m in markers]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise DiagnoseError(f"phase markers file {path}: marker {', '.join(twice)} is defined twice")
    if cached is None:
        toml_cache.put(text, data)
    return PhaseFile(path, markers, frames)


def _entries(data: dict, kind: str, parse: Callable[[dict], T]) -> Iterator[T]:
    for i, raw in enumerate(optional(data, kind, list, []), 1):
        try:
            if not isinstance(raw, dict):
                raise ValueError("not a table")
            yield parse(raw)
        except (ValueError, re.error) as e:
            label = f" ({raw['name']})" if isinstance(raw, dict) and isinstance(raw.get("name"), str) else ""
            raise ValueError(f"{kind} {i}{label}: {e}") from None


def _marker(raw: dict, check: bool = True) -> Marker:
    known_keys(raw, {"name", "anchor", "regex", "keep", "phase", "progress", "weak", "background", "note", "examples"})
    regex = _regex(raw) if "regex" in raw else None
    keep = one_of(raw, "keep", "first", KEEPS)
    spec = CaptureSpec(need(raw, "name", str), anchor=need(raw, "anchor", str), regex=regex, keep=keep)
    if not spec.name or not spec.anchor:
        raise ValueError("empty name or anchor")
    if regex is not None and check:
        re.compile(regex)
    flags = optional(raw, "progress", bool, False), optional(raw, "weak", bool, False)
    background = optional(raw, "background", bool, False)
    if background and not flags[0]:
        raise ValueError("a background marker shows progress: it needs progress = true")
    return Marker(spec, _phase(raw), *flags, background, optional(raw, "note", str, "").strip(), _examples(raw))


def _frame(raw: dict, check: bool = True) -> FramePattern:
    known_keys(raw, {"phase", "regex", "note", "examples"})
    regex = _regex(raw)
    if check:
        _frame_pattern(regex)
    return FramePattern(_phase(raw), regex, optional(raw, "note", str, "").strip(), _examples(raw))


def _phase(raw: dict) -> str:
    return one_of(raw, "phase", need(raw, "phase", str), PHASES)


def _regex(raw: dict) -> str:
    """A regex, or a list of alternatives joined by ``|`` (a long alternation reads better one per line)."""
    value = raw.get("regex")
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return "|".join(value)
    if isinstance(value, str) and value:
        return value
    raise ValueError("'regex' must be a string or a list of strings")


def _examples(raw: dict) -> Examples:
    examples = optional(raw, "examples", dict, {})
    known_keys(examples, {"match", "no_match"})
    return Examples(tuple(str_list(examples, "match")), tuple(str_list(examples, "no_match")))
