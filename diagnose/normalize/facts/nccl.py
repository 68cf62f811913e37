"""NCCL facts: the c10d watchdog timeout, ``NCCL error in:`` exceptions and ``NCCL WARN`` log lines.

Formats (../shared/knowledge/megatron-core.md section 6):

* ``<prefix>Watchdog caught collective operation timeout: WorkNCCL(SeqNum=78, OpType=BROADCAST, NumelIn=80,
  NumelOut=80, Timeout(ms)=600000) ran for 600096 milliseconds before timing out.`` where prefix is ``[Rank 1] ``
  (<= 2.2), ``[PG 0 Rank 1] `` (~2.3) or ``[PG ID 0 PG GUID 0(default_pg) Rank 3] `` (2.4+). The same WorkNCCL
  repr also appears in ``Process group watchdog thread terminated with exception: ...`` and follow-ups.
* ``NCCL error in: <file>:<line>, <reason>, NCCL version <v>`` then ``ncclXxx: <detail>`` and optionally
  ``Last error:`` and the line NCCL gave.
* ``<host>:<pid>:<tid> [<dev>] <file>:<line> NCCL WARN <message>`` (NCCL 2.3 and later); NCCL 2.2 and earlier printed
  the same header with ``WARN`` alone: ``<host>:<pid>:<tid> [<dev>] <file>:<line> WARN <message>``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_PREFIX = re.compile(
    r"\[(?:PG ID (?P<pgid>\d+) PG GUID (?P<guid>[^\s(\]]+)(?:\((?P<desc>[^)]*)\))? |PG (?P<pg>\d+) )?"
    r"Rank (?P<rank>\d+)\] "
)
_WORK = re.compile(
    r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>[A-Z_]+), NumelIn=(?P<nin>-?\d+), NumelOut=(?P<nout>-?\d+), "
    r"Timeout\(ms\)=(?P<timeout>\d+)\)"
)
_RAN_FOR = re.compile(r" ran for (?P<ran>\d+) milliseconds before timing out\.")

WATCHDOG_KEYS = ("prefix_style", "rank", "pg", "pg_guid", "pg_desc", "seq_num", "op_type", "numel_in", "numel_out",
                 "timeout_ms", "ran_for_ms")


def last_match(pattern: re.Pattern[str], text: str, end: int) -> re.Match[str] | None:
    """The last match of ``pattern`` in ``text`` before ``end`` (the rank prefix nearest a message)."""
    found = list(pattern.finditer(text, 0, end))
    return found[-1] if found else None


def parse_nccl_watchdog(text: str) -> dict[str, Any] | None:
    """Facts of a watchdog timeout line (or any line carrying a WorkNCCL repr); None when there is none."""
    work = _WORK.search(text)
    if work is None:
        return None
    out: dict[str, Any] = dict.fromkeys(WATCHDOG_KEYS)
    out.update(
        seq_num=int(work.group("seq")),
        op_type=work.group("op"),
        numel_in=int(work.group("nin")),
        numel_out=int(work.group("nout")),
        timeout_ms=int(work.group("timeout")),
    )
    ran = _RAN_FOR.match(text, work.end())
    if ran is not None:
        out["ran_for_ms"] = int(ran.group("ran"))
    prefix = last_match(_PREFIX, text, work.start())
    if prefix is not None:
        out["rank"] = int(prefix.group("rank"))
        if prefix.group("pgid") is not None:
            out["prefix_style"] = "pg_id"
            out["pg"] = int(prefix.group("pgid"))
            out["pg_guid"] = prefix.group("guid")
            out["pg_desc"] = prefix.group("desc")
        elif prefix.group("pg") is not None:
            out["prefix_style"] = "pg"
            out["pg"] = int(prefix.group("pg"))
        else:
            out["prefix_style"] = "rank"
    return out


# ------------------------------------------------------------------------------------------- NCCL error

_NCCL_ERROR = re.compile(
    r"NCCL error in: (?P<file>[^\s,]+?):(?P<line>\d+), (?P<reason>.+?), NCCL version (?P<version>[\w.+-]+)"
)
_NCCL_DETAIL = re.compile(r"(?P<code>nccl[A-Z]\w+): (?P<detail>.*)$")
_EXCEPTION_HEAD = re.compile(r"(?P<exc>[A-Za-z_][\w.]*(?:Error|Exception)): ")

NCCL_ERROR_KEYS = ("exception", "file", "line", "reason", "version", "code", "detail", "last_error")


def parse_nccl_error(text: str, context: Iterable[str] = ()) -> dict[str, Any] | None:
    """``NCCL error in: f:l, reason, NCCL version v`` plus the detail lines that follow (from ``context``)."""
    m = _NCCL_ERROR.search(text)
    if m is None:
        return None
    out: dict[str, Any] = dict.fromkeys(NCCL_ERROR_KEYS)
    head = _EXCEPTION_HEAD.match(text)
    if head is not None and head.end() == m.start():
        out["exception"] = head.group("exc")
    out.update(
        file=m.group("file"), line=int(m.group("line")), reason=m.group("reason"), version=m.group("version")
    )
    lines = [t.strip() for t in context]
    for i, t in enumerate(lines[:8]):
        d = _NCCL_DETAIL.match(t)
        if d is not None and out["code"] is None:
            out["code"] = d.group("code")
            out["detail"] = d.group("detail").strip()
            continue
        if t == "Last error:" and i + 1 < len(lines):
            out["last_error"] = lines[i + 1]
            break
    return out


# ------------------------------------------------------------------------------------------- NCCL WARN

_WARN_HOST = re.compile(r"(?P<host>[\w.-]{1,255}):(?P<pid>\d{1,12}):(?P<tid>\d{1,12})")
_WARN_DEV = re.compile(r"\[(?P<dev>\d{1,6})\]")
_WARN_FILE = re.compile(r"(?P<file>[\w./-]{1,1024}):(?P<line>\d{1,9})")
_CUDA_FAILURE = re.compile(r"Cuda failure (?P<code>\d+) '(?P<what>[^']*)'")


# NCCL 2.2 and earlier (binary releases) printed the WARN header without the ``NCCL`` word; the whole header is
# required there, since ``WARN`` alone is any logger's level.
_OLD_WARN = re.compile(r"^[\w.-]{1,255}:\d{1,12}:\d{1,12} \[\d{1,6}\] [\w./-]{1,512}:\d{1,9} WARN ")


def nccl_warn_span(text: str) -> tuple[int, int] | None:
    """Where NCCL's WARN marker starts in a line and where the message after it starts, or None: ``NCCL WARN `` (NCCL
    2.3 and later) anywhere, or ``WARN `` right after a full ``host:pid:tid [dev] file:line`` header (NCCL <= 2.2)."""
    at = text.find("NCCL WARN ")
    if at >= 0:
        return at, at + len("NCCL WARN ")
    if " WARN " in text and (m := _OLD_WARN.match(text)) is not None:
        return m.end() - len("WARN "), m.end()
    return None


def is_nccl_warn(text: str) -> bool:
    """The line is one of NCCL's WARN lines, in either release's form."""
    return nccl_warn_span(text) is not None


def parse_nccl_warn(text: str) -> dict[str, Any] | None:
    span = nccl_warn_span(text)
    if span is None:
        return None
    at, message_at = span
    out: dict[str, Any] = {
        "host": None, "pid": None, "tid": None, "device": None, "file": None, "line": None,
        "message": text[message_at:].rstrip(), "cuda_error": None,
    }
    # The header before "NCCL WARN" is "host:pid:tid [dev] file:line " (each part optional), read right to left.
    tokens = text[:at].split()[-3:]
    if tokens and (m := _WARN_FILE.fullmatch(tokens[-1])) is not None and not _WARN_HOST.fullmatch(tokens[-1]):
        out["file"], out["line"] = m.group("file"), int(m.group("line"))
        tokens.pop()
    if tokens and (m := _WARN_DEV.fullmatch(tokens[-1])) is not None:
        out["device"] = int(m.group("dev"))
        tokens.pop()
    if tokens and (m := _WARN_HOST.fullmatch(tokens[-1])) is not None:
        out["host"], out["pid"], out["tid"] = m.group("host"), int(m.group("pid")), int(m.group("tid"))
    cuda = _CUDA_FAILURE.search(out["message"])
    if cuda is not None:
        out["cuda_error"] = {"code": int(cuda.group("code")), "text": cuda.group("what")}
    out["subsystem"] = nccl_subsystem(out["file"], out["message"])
    return out


# NCCL's source tree names the subsystem that warned: the first match (file path, then message words) wins.
_SUBSYSTEMS = (
    ("net_ib", "network (InfiniBand/RoCE)"), ("ibvwrap", "network (InfiniBand/RoCE)"),
    ("NET/IB", "network (InfiniBand/RoCE)"), ("net_socket", "network (TCP sockets)"),
    ("NET/Socket", "network (TCP sockets)"), ("/net.cc", "network plugin"), ("NET/Plugin", "network plugin"),
    ("shm", "shared memory (/dev/shm)"), ("bootstrap", "bootstrap (TCP rendezvous between ranks)"),
    ("socket", "bootstrap (TCP sockets)"), ("graph/", "topology detection"), ("topo", "topology detection"),
    ("nvls", "NVLink SHARP (NVLS)"), ("p2p", "peer-to-peer (NVLink/PCIe)"), ("proxy", "proxy thread"),
    ("coll_net", "CollNet/SHARP"), ("collnet", "CollNet/SHARP"), ("init.cc", "communicator init"),
    ("enqueue", "kernel launch"), ("alloc", "memory allocation"), ("Cuda failure", "a CUDA call"),
)


def nccl_subsystem(file: str | None, message: str) -> str | None:
    """Which NCCL subsystem a WARN came from, in words, from its source file or its message."""
    for where in (file or "", message):
        for needle, name in _SUBSYSTEMS:
            if needle in where:
                return name
    return None


# ----------------------------------------------------------------------------- watchdog follow-up lines

_STATUS_NEW = re.compile(
    r"failure detected by watchdog at work sequence id: (?P<seq>\d+) PG status: last enqueued work: "
    r"(?P<enq>-?\d+), last completed work: (?P<done>-?\d+)"
)
_STATUS_OLD = re.compile(
    r"Timeout at NCCL work: (?P<seq>\d+), last enqueued NCCL work: (?P<enq>-?\d+), "
    r"last completed NCCL work: (?P<done>-?\d+)"
)
_HEARTBEAT = re.compile(r"watchdog got stuck for (?P<secs>\d+) seconds without making progress")
_HEARTBEAT_OLD = "Heartbeat monitor timed out!"


def parse_nccl_watchdog_status(text: str) -> dict[str, Any] | None:
    """The watchdog's progress summary (which collective hung, how far each side got) or a heartbeat hang."""
    for pattern in (_STATUS_NEW, _STATUS_OLD):
        if "work" not in text:
            break
        m = pattern.search(text)
        if m is not None:
            prefix = last_match(_PREFIX, text, m.start())
            return {
                "event": "watchdog_status",
                "rank": int(prefix.group("rank")) if prefix is not None else None,
                "seq_num": int(m.group("seq")),
                "last_enqueued": int(m.group("enq")),
                "last_completed": int(m.group("done")),
            }
    m = _HEARTBEAT.search(text) if "watchdog got stuck" in text else None
    if m is not None:
        return {"event": "heartbeat_hang", "stuck_seconds": int(m.group("secs"))}
    if _HEARTBEAT_OLD in text:
        return {"event": "heartbeat_hang", "stuck_seconds": None}
    return None
