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


# The job states (scontrol's JobState, sacct's State, first word) of a job that has not ended: its log is the log so
# far, its record not final. Listed once, here: `diagnose slurm` says "not ended yet", `--failed` and the fleet's
# sacct scan leave these jobs out (a later scan stores them once they end). COMPLETING is among them: slurmctld shows
# a job COMPLETING until its epilogs are done, its final state (FAILED, TIMEOUT...) not yet recorded, so a scan that
# stored it then would keep a wrong state for good. The fleet's EpilogSlurmctld sees every job COMPLETING and does not
# skip it: it settles the final state from the exit code and reason itself (fleet/epilog.py settle_state).
NOT_ENDED = frozenset({"RUNNING", "PENDING", "REQUEUED", "SUSPENDED", "CONFIGURING", "COMPLETING", "RESIZING",
                       "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "REQUEUE_HOLD", "REQUEUE_FED"})


def not_ended(text: str | None) -> bool:
    """The state (``RUNNING``, ``CANCELLED by 1000``, ``COMPLETING+``) is one of a job that has not ended."""
    return split_state(text)[0] in NOT_ENDED


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


# ------------------------------------------------------------------------------------------------- nodes

# The ``[user@time]`` Slurm appends to a node's Reason when it is set (by an admin, a health check, slurmctld itself)
_REASON_STAMP = re.compile(r"\s*\[(?P<user>[^\[\]@\s]{1,64})@(?P<time>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\]")
_NOT_FOUND = re.compile(r"Node (\S+) not found")
# sinfo's long names and one-character suffixes, for a State written that way
_STATE_ALIASES = {"DRAINED": ("IDLE", "DRAIN"), "DRAINING": ("ALLOCATED", "DRAIN")}
_STATE_SUFFIX_FLAGS = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "!": "POWERING_DOWN",
                       "%": "POWERING_DOWN", "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED",
                       "-": "PLANNED"}
MAX_REASON_CHARS = 2000  # a Reason is free text an admin or a script typed: keep a bounded part of it


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node's ``State`` split into its base state and its flags: ``IDLE+DRAIN`` -> IDLE, {DRAIN}.

    ``DOWN*`` (sinfo's not-responding mark) gives the NOT_RESPONDING flag, ``DRAINED``/``DRAINING`` the DRAIN flag,
    and any ``REBOOT_*`` flag the word REBOOT too, so a rule can name the family.
    """

    text: str
    base: str
    flags: frozenset[str]

    @property
    def words(self) -> frozenset[str]:
        return self.flags | {self.base}


def parse_node_state(text: str | None) -> NodeState:
    words = [w for w in (text or "").strip().upper().split("+") if w]
    flags: set[str] = set()
    base = ""
    for i, word in enumerate(words):
        while word and word[-1] in _STATE_SUFFIX_FLAGS:
            flags.add(_STATE_SUFFIX_FLAGS[word[-1]])
            word = word[:-1]
        if word in _STATE_ALIASES:
            alias_base, alias_flag = _STATE_ALIASES[word]
            flags.add(alias_flag)
            word = alias_base if i == 0 else ""
        if not word:
            continue
        if i == 0:
            base = word
        else:
            flags.add(word)
    if any(f.startswith("REBOOT_") for f in flags):
        flags.add("REBOOT")
    return NodeState((text or "").strip(), base, frozenset(flags))


@dataclass(slots=True)
class NodeRecord:
    """One node as ``scontrol show node`` prints it: name, state, and the Reason with who set it and when."""

    name: str
    state: NodeState
    reason: str  # without the "[user@time]" stamp; at most MAX_REASON_CHARS
    reason_user: str
    reason_time: str  # ISO 8601 as Slurm prints it (local time, no zone), "" when not stamped
    line: int  # 1-based line of the record in scontrol's output
    fields: dict[str, str]


def parse_scontrol_nodes(text: str) -> tuple[list[NodeRecord], list[str]]:
    """``scontrol show node`` output (``-o`` one line per node, or the indented multi-line form) -> the records,
    and the names scontrol said it does not know (``Node X not found``).

    A record starts at ``NodeName=``; its continuation lines are indented. The Reason is free text: it may contain
    ``Key=`` words, brackets, quotes and markup, so it is read as everything from ``Reason=`` to Slurm's own
    ``[user@time]`` stamp (the last one), and the fields before it are read without it.
    """
    records: list[NodeRecord] = []
    missing: list[str] = []
    current: list[str] = []
    start = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("NodeName="):
            if current:
                records.append(_node_record(current, start))
            current, start = [line], lineno
        elif line and current and raw[:1].isspace():
            current.append(line)
        else:
            if current:
                records.append(_node_record(current, start))
                current = []
            if m := _NOT_FOUND.fullmatch(line):
                missing.append(m.group(1))
    if current:
        records.append(_node_record(current, start))
    return records, missing


def _node_record(lines: list[str], start: int) -> NodeRecord:
    joined = " ".join(lines)
    reason_key = next((m for m in _KEY.finditer(joined) if m.group(1) == "Reason"), None)
    reason, user, when = "", "", ""
    if reason_key is None:
        fields = parse_key_values(joined)
    else:
        fields = parse_key_values(joined[: reason_key.start()])
        rest = joined[reason_key.end() :]
        stamps = list(_REASON_STAMP.finditer(rest))
        if stamps:
            stamp = stamps[-1]
            reason, user, when = rest[: stamp.start()], stamp.group("user"), stamp.group("time")
            for key, value in parse_key_values(rest[stamp.end() :]).items():
                fields.setdefault(key, value)
        else:  # no stamp (another Slurm version, or cut): the Reason runs to the next key
            after = parse_key_values("Reason=" + rest)
            reason = after.pop("Reason", "")
            for key, value in after.items():
                fields.setdefault(key, value)
        reason = reason.strip()
        if reason in ("(null)", "None"):
            reason = ""
    fields["Reason"] = reason[:MAX_REASON_CHARS]
    return NodeRecord(
        name=fields.get("NodeName", ""),
        state=parse_node_state(fields.get("State")),
        reason=reason[:MAX_REASON_CHARS],
        reason_user=user,
        reason_time=when,
        line=start,
        fields=fields,
    )
