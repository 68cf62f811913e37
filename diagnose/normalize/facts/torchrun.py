"""torchrun (torch.distributed.elastic) facts: the ChildFailedError summary block and the agent's lines.

The summary block (printed after ``torch.distributed.elastic.multiprocessing.errors.ChildFailedError:``)::

    ============================================================
    train.py FAILED
    ------------------------------------------------------------
    Failures:
    [1]:
      time      : 2026-11-29_15:26:45
      host      : node01
      rank      : 1 (local_rank: 1)
      exitcode  : -6 (pid: 1124)  (SIGABRT)          older torch: no "(SIGNAME)"
      error_file: <N/A>
      traceback : Signal 6 (SIGABRT) received by PID 1124
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      ...the same six fields...
    ============================================================

``Failures:`` holds ``<NO_OTHER_FAILURES>`` when only one rank failed. Agent lines:
``failed (exitcode: 1) local_rank: 0 (pid: 447) of binary: /usr/bin/python`` and
``Sending process 179 closing signal SIGTERM``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_FIELD = re.compile(r"\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*: ?(?P<value>.*)$")
_INDEX = re.compile(r"\s*\[(?P<i>\d+)\]:\s*$")
_RANK = re.compile(r"(?P<rank>-?\d+) \(local_rank: (?P<local>-?\d+)\)")
_EXITCODE = re.compile(r"(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)(?:\s+\((?P<sig>SIG\w+)\))?")
_TITLE = re.compile(r"\s*(?P<script>.+) FAILED\s*$")

ENTRY_KEYS = ("index", "time", "host", "rank", "local_rank", "exitcode", "pid", "signal", "error_file", "traceback")


def parse_torchrun_failure(lines: Iterable[str]) -> dict[str, Any] | None:
    """Facts of a ChildFailedError summary; ``lines`` may start anywhere before its ``====`` border."""
    out: dict[str, Any] = {"script": None, "failures": [], "root_cause": None, "no_other_failures": False}
    section: str | None = None
    current: dict[str, Any] | None = None
    last_key: str | None = None
    seen_any = False
    for raw in lines:
        text = raw.rstrip()
        stripped = text.strip()
        if not stripped:
            continue
        if stripped.startswith("Failures:"):
            section, current, seen_any = "failures", None, True
            continue
        if stripped.startswith("Root Cause (first observed failure):"):
            section, current, seen_any = "root", None, True
            continue
        if stripped == "<NO_OTHER_FAILURES>":
            out["no_other_failures"] = True
            continue
        if set(stripped) <= {"="} or set(stripped) <= {"-"}:
            if section == "root" and current is not None and set(stripped) <= {"="}:
                break  # the closing border
            current = None
            continue
        title = _TITLE.match(text)
        if title is not None and section is None and out["script"] is None:
            out["script"] = title.group("script")
            seen_any = True
            continue
        index = _INDEX.match(text)
        if index is not None and section is not None:
            current, last_key = {**dict.fromkeys(ENTRY_KEYS), "index": int(index.group("i"))}, None
            if section == "root":
                out["root_cause"] = current
            else:
                out["failures"].append(current)
            continue
        field_m = _FIELD.match(text)
        if field_m is not None and current is not None:
            last_key = field_m.group("key")
            _set_field(current, last_key, field_m.group("value").strip())
        elif current is not None and last_key == "traceback":
            # With @record and an error file, the child's own traceback follows on indented lines.
            current["traceback"] = f"{current['traceback']}\n{stripped}" if current["traceback"] else stripped
    if not seen_any or not (out["script"] or out["failures"] or out["root_cause"]):
        return None  # a heading alone (the engine passed one line, no block) says nothing
    return out


def _set_field(entry: dict[str, Any], key: str, value: str) -> None:
    if key == "rank":
        m = _RANK.match(value)
        if m is not None:
            entry["rank"], entry["local_rank"] = int(m.group("rank")), int(m.group("local"))
        return
    if key == "exitcode":
        m = _EXITCODE.match(value)
        if m is not None:
            entry["exitcode"], entry["pid"] = int(m.group("code")), int(m.group("pid"))
            entry["signal"] = m.group("sig")
        return
    entry[key] = value


_AGENT_FAILED = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>-?\d+) \(pid: (?P<pid>\d+)\) "
    r"of binary: (?P<binary>\S+)"
)
_AGENT_SIGNAL = re.compile(r"Sending process (?P<pid>\d+) closing signal (?P<sig>SIG\w+)")
_AGENT_RESTART = re.compile(r"\[(?P<role>\w+)\] Worker group FAILED\. (?P<left>\d+)/(?P<max>\d+) attempts left")


def parse_torchrun_agent(text: str) -> dict[str, Any] | None:
    m = _AGENT_FAILED.search(text)
    if m is not None:
        return {
            "event": "worker_failed",
            "exitcode": int(m.group("code")),
            "local_rank": int(m.group("local")),
            "pid": int(m.group("pid")),
            "binary": m.group("binary"),
        }
    m = _AGENT_SIGNAL.search(text)
    if m is not None:
        return {"event": "closing_signal", "pid": int(m.group("pid")), "signal": m.group("sig")}
    m = _AGENT_RESTART.search(text)
    if m is not None:
        return {
            "event": "restart",
            "role": m.group("role"),
            "attempts_left": int(m.group("left")),
            "max_restarts": int(m.group("max")),
        }
    return None
