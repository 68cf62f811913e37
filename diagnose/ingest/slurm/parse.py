"""Parsers of Slurm's text output: ``scontrol show job``, ``sacct --parsable2``, exit codes, durations.

Pure functions, no I/O. Slurm 22.05 has no ``scontrol --json``, and ``sacct --json`` reports wrong exit codes for
ordinary non-zero exits, so the text forms are the reliable ones.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass

# A key starts a token: start of line or whitespace, then a name (JobId, AllocNode:Sid, CPUs/Task, ReqB:S:C:T...)
_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_:/]*)=")


@dataclass(slots=True)
class ScontrolRecord:
    """One job as ``scontrol show job`` prints it: fields in order, and the record's text with its line number."""

    fields: dict[str, str]
    line: int  # 1-based line of the record in scontrol's output
    text: str  # the record joined on one line


def parse_scontrol_jobs(text: str) -> list[ScontrolRecord]:
    """Split ``scontrol show job`` output (``-o`` one line per job, or the indented multi-line form) into records.

    A value runs to the next ``Key=``, so values with spaces (Comment, Command, WorkDir) stay whole. When a key
    repeats (the per-node ``Nodes=`` of ``-d``), the first value is kept.
    """
    records: list[ScontrolRecord] = []
    current: list[str] = []
    start = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("JobId="):
            if current:
                records.append(_record(current, start))
            current, start = [line], lineno
        elif line and current:
            current.append(line)
    if current:
        records.append(_record(current, start))
    return records


def _record(lines: list[str], start: int) -> ScontrolRecord:
    joined = " ".join(lines)
    return ScontrolRecord(parse_key_values(joined), start, joined)


def parse_key_values(line: str) -> dict[str, str]:
    """``A=1 B=two words C=`` -> ``{"A": "1", "B": "two words", "C": ""}``; first occurrence of a key wins."""
    out: dict[str, str] = {}
    keys = list(_KEY.finditer(line))
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out.setdefault(m.group(1), line[m.end() : end].strip())
    return out


@dataclass(slots=True)
class SacctRow:
    fields: dict[str, str]
    line: int  # 1-based line in sacct's output (the header is line 1)
    text: str


def parse_sacct(text: str) -> list[SacctRow]:
    """Parse ``sacct --parsable2`` output with its header line.

    A SubmitLine can contain ``|`` itself (``--wrap 'a | b'``); put such a free-text field last and the surplus
    columns are joined back into it.
    """
    lines = text.splitlines()
    if not lines:
        return []
    header = lines[0].split("|")
    rows: list[SacctRow] = []
    for lineno, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) > len(header):
            cells = cells[: len(header) - 1] + ["|".join(cells[len(header) - 1 :])]
        cells += [""] * (len(header) - len(cells))
        rows.append(SacctRow(dict(zip(header, cells)), lineno, line))
    return rows


@dataclass(frozen=True, slots=True)
class ExitStatus:
    code: int | None
    signal: int | None

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.signal)

    @property
    def failed(self) -> bool:
        return bool(self.code) or bool(self.signal)

    def __str__(self) -> str:
        if self.code is None and self.signal is None:
            return "unknown"
        return f"{self.code or 0}:{self.signal or 0}"


def parse_exit_code(text: str | None) -> ExitStatus:
    """Slurm's ``code:signal`` form (``1:0``, ``0:15``); anything else -> unknown."""
    m = re.fullmatch(r"\s*(\d{1,3}):(\d{1,3})\s*", text or "")
    if not m:
        return ExitStatus(None, None)
    return ExitStatus(int(m.group(1)), int(m.group(2)))


def signal_name(number: int | None) -> str | None:
    if not number:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


_DURATION = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.(\d+))?")


def parse_seconds(text: str | None) -> float | None:
    """Slurm's ``[D-][HH:]MM:SS[.mmm]`` (a duration, sacct's TotalCPU) in seconds, the fraction kept."""
    m = _DURATION.fullmatch((text or "").strip())
    if m is None:
        return None
    days, hours, minutes, seconds, frac = m.groups()
    whole = int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds)
    return whole + (int(frac) / 10 ** len(frac) if frac else 0.0)


def parse_duration(text: str | None) -> int | None:
    """Slurm's printed durations to whole seconds: ``1-02:03:04``, ``02:03:04``, ``03:04`` (MM:SS), ``1-02``
    (days-hours). None for ``UNLIMITED``, ``Partition_Limit``, empty, or anything else.
    """
    days_hours = re.fullmatch(r"(\d+)-(\d+)", (text or "").strip())
    if days_hours:
        return int(days_hours.group(1)) * 86400 + int(days_hours.group(2)) * 3600
    seconds = parse_seconds(text)
    return None if seconds is None else int(seconds)


def format_duration(seconds: int | None) -> str:
    if seconds is None:
        return "unlimited"
    days, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{days}-{h:02d}:{m:02d}:{s:02d}" if days else f"{h:02d}:{m:02d}:{s:02d}"


def split_state(text: str | None) -> tuple[str, str | None]:
    """``CANCELLED by 1000`` -> (``CANCELLED``, ``1000``); ``FAILED`` -> (``FAILED``, None)."""
    parts = (text or "").split()
    if not parts:
        return "", None
    by = parts[2] if len(parts) >= 3 and parts[1] == "by" else None
    return parts[0].rstrip("+"), by


def parse_env_outputs(env_text: str) -> dict[str, str]:
    """From ``sacct --env-vars`` output keep only SBATCH_OUTPUT / SBATCH_ERROR (never the rest: it may hold secrets)."""
    out: dict[str, str] = {}
    for line in env_text.splitlines():
        for name in ("SBATCH_OUTPUT", "SBATCH_ERROR"):
            if line.startswith(name + "="):
                out[name] = line[len(name) + 1 :].strip()
    return out
