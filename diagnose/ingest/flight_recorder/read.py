"""Read one flight-recorder dump (pickle or JSON, any format version) into a typed ``FrDump``.

Formats PyTorch has written (``version`` key, ``FlightRecorder.hpp`` / ``NCCLUtils.hpp``):

* 1.x (torch 2.2-2.3): entries keyed ``pg_id`` and ``seq_id`` (no ``process_group``, no p2p counter); 1.1 has no
  ``record_id`` / ``op_id`` / ``pg_config``; 1.4 adds them, ``pg_config`` as ``{pg_id: [ranks]}``;
* 2.0-2.2: ``collective_seq_id`` / ``p2p_seq_id`` / ``op_id``, ``process_group`` (name, desc), ``pg_config``;
* 2.3-2.7: ``pg_status`` (last enqueued / started / completed per group), ``is_p2p``, dtypes, ``timeout_ms``,
  thread id and name, ``nccl_version``;
* 2.8-2.10 (torch 2.8-2.13): ``comm_lib_version`` instead of ``nccl_version``; the backend-neutral recorder
  (gloo) writes the same layout with an empty ``comm_lib_version``.

The JSON dump (``_dump_nccl_trace_json``) differs from the pickle: no ``frames``, ``process_group`` as a list,
``pg_status`` values as strings, ``time_discovered_*`` 0 instead of None. Every field is read defensively:
a wrong type is dropped, numbers are bounded, lists are capped, so a hostile dump costs at most its (bounded)
size and never raises out of :func:`read_dump` except as ``DumpError`` (one line).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import stat
import sys
from typing import Any

from diagnose.coerce import as_int
from diagnose.ingest.errors import shown
from diagnose.ingest.flight_recorder.discover import DumpFile
from diagnose.ingest.flight_recorder.safe_pickle import RefusedPickle, load_plain
from diagnose.model import FrDump, FrEntry, FrFrame, FrGroup

MAX_DUMP_BYTES = 64 << 20  # 2000 entries with 30-frame stacks are ~3 MiB; a larger file is not a dump
MAX_TOTAL_BYTES = 1 << 30
MAX_ENTRIES = 20000  # TORCH_FR_BUFFER_SIZE entries per rank; the oldest beyond this are dropped (counted)
MAX_FRAMES = 64
# Stacks are kept for each rank's last entries only: the analysis names where a rank was at the divergence, which is
# at the end of the buffer (every earlier collective matched); older stacks would cost most of the memory and time.
FRAMES_KEPT = 256
MAX_SHAPES = 64  # tensors per collective argument list
MAX_DIMS = 16
MAX_STR = 512
MAX_GROUPS = 4096
MAX_INT = 1 << 62
_RANK_LIST = re.compile(r"^\s*\[\s*(\d{1,7}(?:\s*,\s*\d{1,7}){0,131071})?\s*\]\s*$")


class DumpError(Exception):
    """A dump that cannot be read: its message is one line, ready to show as a warning."""


def read_dumps(files: list[DumpFile]) -> tuple[list[FrDump], list[str]]:
    """Every readable dump, and one warning line per unreadable one (bounded in total size)."""
    dumps: list[FrDump] = []
    warnings: list[str] = []
    total = 0
    for f in files:
        try:
            size = os.path.getsize(f.path)
        except OSError as e:
            warnings.append(f"{shown(f.path)}: flight-recorder dump unreadable ({e.strerror or e})")
            continue
        if total + size > MAX_TOTAL_BYTES:
            warnings.append(f"flight-recorder dumps beyond {MAX_TOTAL_BYTES >> 20} MiB in total were not read "
                            f"(from {shown(f.path)} on)")
            break
        total += size
        try:
            dumps.append(read_dump(f))
        except DumpError as e:
            warnings.append(str(e))
    return dumps, warnings


def read_dump(f: DumpFile) -> FrDump:
    where = shown(f.path)
    try:
        # non-blocking open and a regular-file check: a dump swapped for a FIFO after discovery cannot block us
        fd = os.open(f.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise DumpError(f"{where}: not a regular file, not read")
            data = fh.read(MAX_DUMP_BYTES + 1)
    except OSError as e:
        raise DumpError(f"{where}: flight-recorder dump unreadable ({e.strerror or e})") from None
    if len(data) > MAX_DUMP_BYTES:
        raise DumpError(f"{where}: flight-recorder dump larger than {MAX_DUMP_BYTES >> 20} MiB, not read")
    raw = _decode(data, f.format, where)
    if not isinstance(raw, dict):
        raise DumpError(f"{where}: not a flight-recorder dump (top level is {type(raw).__name__}, not a dict)")
    if not isinstance(raw.get("entries", []), list):
        raise DumpError(f"{where}: not a flight-recorder dump (no entries list)")
    return normalise(raw, f.path, f.rank, f.format)


def _decode(data: bytes, fmt: str, where: str) -> Any:
    if fmt == "pickle":
        try:
            return load_plain(data)
        except RefusedPickle as e:
            raise DumpError(f"{where}: unsafe pickle refused, not loaded: {_one_line(e)}") from None
        except (EOFError, pickle.UnpicklingError) as e:
            # a whole pickle ends with STOP ("."); PyTorch's end with the top dict's SETITEMS then STOP
            bad_byte = "invalid load key" in str(e)
            kind = "truncated" if isinstance(e, EOFError) or not (bad_byte or data.endswith(b".")) else "corrupt"
            raise DumpError(f"{where}: {kind} flight-recorder pickle ({_one_line(e)})") from None
        except RecursionError:
            raise DumpError(f"{where}: flight-recorder pickle nested too deeply, not read") from None
        except MemoryError:
            raise DumpError(f"{where}: flight-recorder pickle needs too much memory, not read") from None
        except Exception as e:  # noqa: BLE001 - any opcode-level failure of a hostile or broken pickle
            raise DumpError(f"{where}: corrupt flight-recorder pickle ({type(e).__name__}: {_one_line(e)})") from None
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise DumpError(f"{where}: flight-recorder JSON is not UTF-8") from None
    except json.JSONDecodeError as e:
        kind = "corrupt" if data.rstrip().endswith(b"}") else "truncated"  # a whole dump ends its top object
        raise DumpError(f"{where}: {kind} flight-recorder JSON ({e.msg} at byte {e.pos})") from None
    except (RecursionError, ValueError) as e:
        raise DumpError(f"{where}: flight-recorder JSON not readable ({type(e).__name__})") from None


def _one_line(e: BaseException) -> str:
    return shown(str(e)[:200])


# --------------------------------------------------------------------------------------------- fields


def _int(value: Any) -> int | None:
    n = as_int(value, max_len=20)  # an int or a string of digits (JSON's pg_status), never a bool
    return n if n is not None and -MAX_INT <= n <= MAX_INT else None


def _str(value: Any) -> str:
    if isinstance(value, str):
        return value[:MAX_STR]
    if isinstance(value, bytes):
        return value[:MAX_STR].decode("utf-8", "replace")
    return ""


def _shapes(value: Any) -> list[list[int]]:
    if not isinstance(value, (list, tuple)):
        return []
    shapes = [[_int(d) for d in shape[:MAX_DIMS]] for shape in value[:MAX_SHAPES] if isinstance(shape, (list, tuple))]
    return [[d for d in dims if d is not None] for dims in shapes]


def _frames(value: Any) -> list[FrFrame]:
    if not isinstance(value, (list, tuple)):
        return []
    return [FrFrame(name=_str(fr.get("name")), filename=_str(fr.get("filename")), line=_int(fr.get("line")) or 0)
            for fr in value[:MAX_FRAMES] if isinstance(fr, dict)]


def _pg(entry: dict) -> tuple[str, str]:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and len(pg) >= 2:
        return _str(pg[0]), _str(pg[1])
    if isinstance(pg, str):
        return pg[:MAX_STR], ""
    pg_id = _int(entry.get("pg_id"))
    return (str(pg_id) if pg_id is not None else "?"), ""


def _entry(e: Any, with_frames: bool = True) -> FrEntry | None:
    if not isinstance(e, dict):
        return None
    seq = _int(e.get("collective_seq_id"))
    if seq is None:
        seq = _int(e.get("seq_id"))  # format 1.x
    if seq is None:
        return None
    group, desc = _pg(e)
    group, desc = sys.intern(group), sys.intern(desc)  # the same few words in every entry of every rank
    state = sys.intern(_str(e.get("state")) or "scheduled")
    op = sys.intern(_str(e.get("profiling_name")))
    return FrEntry(
        record_id=_int(e.get("record_id")) or 0,
        group=group,
        group_desc=desc,
        seq=seq,
        p2p_seq=_int(e.get("p2p_seq_id")) or 0,
        is_p2p=e.get("is_p2p") is True or op.split(":")[-1] in ("send", "recv"),
        op=op,
        input_sizes=_shapes(e.get("input_sizes")),
        state=state,
        completed=state == "completed" or bool(_int(e.get("time_discovered_completed_ns"))),
        frames=_frames(e.get("frames")) if with_frames else [],
    )


def _ranks(value: Any) -> list[int] | None:
    if isinstance(value, (list, tuple)):
        ranks = [_int(r) for r in value[:131072]]
        return [r for r in ranks if r is not None and r >= 0]
    if isinstance(value, str) and len(value) < (1 << 21):
        m = _RANK_LIST.match(value)  # "[0, 1, 2]": parsed, never evaluated
        if m is not None:
            return [int(x) for x in re.findall(r"\d+", value)]
    return None


def _groups(raw: dict) -> dict[str, FrGroup]:
    groups: dict[str, FrGroup] = {}
    config = raw.get("pg_config")
    if isinstance(config, dict):
        for key, value in list(config.items())[:MAX_GROUPS]:
            if isinstance(value, (list, tuple)) and isinstance(key, int):  # format 1.4: {pg_id: [ranks]}
                groups[str(key)] = FrGroup(name=str(key), desc="", ranks=_ranks(value))
            elif isinstance(value, dict):
                name = _str(value.get("name")) or _str(key)
                groups[_str(key)] = FrGroup(name=name, desc=_str(value.get("desc")), ranks=_ranks(value.get("ranks")))
    status = raw.get("pg_status")
    if isinstance(status, dict):
        for key, value in list(status.items())[:MAX_GROUPS]:
            if not isinstance(value, dict):
                continue
            g = groups.setdefault(_str(key), FrGroup(name=_str(key), desc="", ranks=None))
            g.last_enqueued = _int(value.get("last_enqueued_collective"))
            g.last_completed = _int(value.get("last_completed_collective"))
    return groups


def normalise(raw: dict, path: str, rank: int, fmt: str) -> FrDump:
    items = raw.get("entries") or []
    entries: list[FrEntry] = []
    dropped = max(0, len(items) - MAX_ENTRIES)
    items = items[-MAX_ENTRIES:]  # a ring buffer: the newest entries are the ones that matter
    frames_from = len(items) - FRAMES_KEPT
    for i, e in enumerate(items):
        entry = _entry(e, with_frames=i >= frames_from)
        if entry is None:
            dropped += 1
        else:
            entries.append(entry)
    entries.sort(key=lambda e: e.record_id)
    return FrDump(
        path=path,
        rank=rank,
        format=fmt,
        version=_str(raw.get("version")) or "unknown",
        comm_lib_version=_str(raw.get("comm_lib_version")) or _str(raw.get("nccl_version")),
        groups=_groups(raw),
        entries=entries,
        dropped_entries=dropped,
    )
