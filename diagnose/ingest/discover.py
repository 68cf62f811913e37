"""Expand what the user named into the list of log files to read, in natural order, with rank hints.

A folder is walked recursively. Files count as logs by name: ``*.log``, ``*.txt``, ``*.out``, ``*.err``, torchrun's
``stdout``/``stderr`` files, and the same names ending in ``.gz``, ``.bz2`` or ``.xz``. Hidden files, JSON
(torchrun's ``error.json``)
and anything else are skipped. Rank hints come from the name: ``rank3.log``, ``log_rank_03.txt``, ``rank-7.out``,
or torchrun's ``--log-dir`` layout ``<run>/attempt_N/<local_rank>/{stdout,stderr}.log`` (local rank; the same
number is offered as the rank hint since torchrun's per-node folder does not say which node it is).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, replace

from diagnose.ingest.errors import input_error, os_error, shown
from diagnose.ingest.gzip_bounded import COMPRESSED_SUFFIXES
from diagnose.model import DiagnoseError

_LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".stdout", ".stderr")
_LOG_STEMS = ("stdout", "stderr", "output", "log")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,7})(?!\d)", re.IGNORECASE)
_ATTEMPT = re.compile(r"^attempt_(\d+)$")
_NATURAL_SPLIT = re.compile(r"(\d+)")
_COMPRESSED = re.compile("(?:" + "|".join(map(re.escape, COMPRESSED_SUFFIXES)) + ")$", re.IGNORECASE)
_ROTATED = re.compile(r"\.(?:log|txt|out|err)\.\d{1,4}(?:\.(?:gz|bz2|xz))?$", re.IGNORECASE)  # logrotate: rank0.log.1


@dataclass(frozen=True)
class InputEntry:
    path: str
    rank_hint: int | None = None
    local_rank_hint: int | None = None
    attempt: int | None = None
    stream_name: str | None = None
    in_folder: bool = False  # found by walking a folder the user named: a broken one is skipped, not fatal


def natural_key(text: str) -> tuple:
    """``rank2`` before ``rank10``: digits compare as numbers."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part.lower()) for part in _NATURAL_SPLIT.split(text) if part
    )


def looks_like_log(name: str) -> bool:
    if name.startswith("."):
        return False
    lower = _COMPRESSED.sub("", name.lower())
    return lower.endswith(_LOG_SUFFIXES) or lower in _LOG_STEMS


def hints_for(path: str) -> InputEntry:
    """Rank / local rank / attempt hints from a file's name and its parent folders."""
    parts = os.path.normpath(path).split(os.sep)
    name = parts[-1]
    stem = os.path.splitext(_COMPRESSED.sub("", name))[0]
    rank = local = attempt = None
    stream_name = stem if stem in ("stdout", "stderr") else None
    if len(parts) >= 3 and parts[-2].isdigit():
        m = _ATTEMPT.match(parts[-3])
        if m is not None and stream_name is not None:
            local = int(parts[-2])
            attempt = int(m.group(1))
            rank = local
    m = _RANK_IN_NAME.search(stem)
    if m is not None:
        rank = int(m.group(1))
    return InputEntry(path=path, rank_hint=rank, local_rank_hint=local, attempt=attempt, stream_name=stream_name)


def _walk_logs(folder: str, rotated: list[str] | None = None) -> list[str]:
    """Log files under ``folder``, natural order; rotated ones (``rank0.log.1``) go to ``rotated`` instead."""
    found: list[str] = []

    def on_error(err: OSError) -> None:
        if isinstance(err, FileNotFoundError) and err.filename != folder:
            return  # a subfolder removed while walking (a job's scratch dir): nothing left in it to read
        raise os_error(err.filename or folder, err, "list folder", denied="cannot list folder")

    for root, dirs, files in os.walk(folder, onerror=on_error, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if looks_like_log(name):
                found.append(os.path.join(root, name))
            elif rotated is not None and _ROTATED.search(name) and not name.startswith("."):
                rotated.append(os.path.join(root, name))
    found.sort(key=lambda p: natural_key(os.path.relpath(p, folder)))
    return found


def _wanted(path: str, folder: str, include: list[str], exclude: list[str]) -> bool:
    """``--include`` / ``--exclude`` globs, matched against the path inside the folder and the file name."""
    from fnmatch import fnmatch

    rel = os.path.relpath(path, folder)
    name = os.path.basename(path)

    def hit(pattern: str) -> bool:
        return fnmatch(rel, pattern) or fnmatch(name, pattern)

    return (not include or any(hit(p) for p in include)) and not any(hit(p) for p in exclude)


def expand_inputs(inputs: list[str], notes: list[str] | None = None, include: list[str] | None = None,
                  exclude: list[str] | None = None) -> list[InputEntry]:
    """Files stay as named (any name); folders become their log files (those ``include`` / ``exclude`` globs
    keep). Raises DiagnoseError, one line. ``notes`` receives what the user should know about a folder (rotated
    logs not read)."""
    entries: list[InputEntry] = []
    for raw in inputs:
        if not isinstance(raw, str) or raw == "":
            raise DiagnoseError(f"{raw!r}: not a path")
        if "\x00" in raw:
            raise DiagnoseError("input path contains a NUL byte")
        if raw == "-":
            entries.append(InputEntry(path="-"))
            continue
        try:
            st = os.stat(raw)
        except FileNotFoundError:
            if os.path.islink(raw):
                raise input_error(raw, "broken symbolic link") from None
            raise input_error(raw, "no such file or directory") from None
        except OSError as e:
            raise os_error(raw, e, denied="cannot reach this path") from None
        if stat.S_ISDIR(st.st_mode):
            if not os.access(raw, os.R_OK | os.X_OK):
                raise input_error(raw, "permission denied (cannot list folder)")
            rotated: list[str] = []
            logs = _walk_logs(raw, rotated)
            if (include or exclude) and logs:
                logs = [p for p in logs if _wanted(p, raw, include or [], exclude or [])]
                if not logs:
                    raise input_error(raw, "no log file in the folder is kept by --include/--exclude")
            if rotated and notes is not None:
                rotated.sort(key=natural_key)
                notes.append(f"{len(rotated)} rotated log{'s' if len(rotated) != 1 else ''} not read (e.g. "
                             f"{shown(rotated[0])}): name them to read them too")
            if not logs:
                raise input_error(
                    raw,
                    "folder has no log files (looked for *.log, *.txt, *.out, *.err, stdout/stderr, also .gz/.bz2/.xz)",
                )
            entries.extend(replace(hints_for(p), in_folder=True) for p in logs)
            continue
        entries.append(hints_for(raw))
    return _once_each(entries, notes)


def _once_each(entries: list[InputEntry], notes: list[str] | None) -> list[InputEntry]:
    """Each file once: ``analyze job.log ./job.log`` or a folder and a file inside it used to read the file twice
    (every finding counted twice, "2 inputs"). Standard input too: ``analyze - -`` read the pipe once and then an
    empty second "-" ("1 of 2 inputs are empty ... those ranks wrote nothing")."""
    seen: set[tuple[int, int]] = set()
    out: list[InputEntry] = []
    repeated: list[str] = []
    stdin_seen = False
    for entry in entries:
        if entry.path == "-":
            if stdin_seen:
                repeated.append(entry.path)
                continue
            stdin_seen = True
        else:
            try:
                st = os.stat(entry.path)
            except OSError:
                out.append(entry)  # the reader reports it
                continue
            if stat.S_ISREG(st.st_mode):
                if (st.st_dev, st.st_ino) in seen:
                    repeated.append(entry.path)
                    continue
                seen.add((st.st_dev, st.st_ino))
        out.append(entry)
    if repeated and notes is not None:
        notes.append(f"{len(repeated)} input{'s' if len(repeated) != 1 else ''} named twice, read once (e.g. "
                     f"{'standard input' if repeated[0] == '-' else shown(repeated[0])})")
    return out
