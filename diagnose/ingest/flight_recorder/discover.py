"""Find flight-recorder dumps among what the user named, and leave the rest to the log reader.

PyTorch writes one file per rank, named ``<prefix><rank>``: the prefix is ``TORCH_FR_DUMP_TEMP_FILE`` (formerly
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``), ``/tmp/nccl_trace_rank_`` by default, so ``/tmp/nccl_trace_rank_3``. Dumps
copied by hand or taken through ``_dump_nccl_trace_json`` often gain ``.pkl`` / ``.json``. Accepted inputs:

* a folder (walked like a log folder): files with a rank number at the end of the name whose first bytes are a
  pickle or a JSON object mentioning the recorder's keys;
* a file named directly, recognised by the same sniffing (so a dump named on the command line is not scanned as
  a log);
* a prefix that is not itself a path, ``/tmp/nccl_trace_rank_`` or ``job/dumps/nccl_trace_rank_``: the files
  beginning with it followed by a rank number.

Everything is decided from names and the first bytes; nothing is loaded here.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field

from diagnose.ingest.discover import looks_like_log, natural_key
from diagnose.ingest.errors import shown

SNIFF_BYTES = 4096
MAX_DUMP_FILES = 16384
_RANKED_NAME = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d{1,7})(?P<ext>\.(?:json|pkl|pickle))?$", re.IGNORECASE)
_KEYS = (b"entries", b"version", b"pg_config")
# PyTorch's JSON dump is an object whose keys come sorted (nlohmann's map): it opens with one of these. A JSON log
# line ({"level": ...}) does not, so a log named like a dump is still read as a log.
_JSON_START = re.compile(rb'^\s*\{\s*"(?:comm_lib_version|entries|nccl_comm_state|nccl_version|pg_config|pg_status|'
                         rb'version)"\s*:')


@dataclass(frozen=True, slots=True)
class DumpFile:
    path: str
    rank: int
    format: str  # "pickle" | "json"


@dataclass(slots=True)
class Discovery:
    dumps: list[DumpFile] = field(default_factory=list)
    log_inputs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dumps_only_folders: list[str] = field(default_factory=list)  # named folders that hold dumps and no logs


def sniff(path: str) -> str | None:
    """"pickle" / "json" when the file's first bytes look like a recorder dump, else None (never raises)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return None
    if len(head) >= 3 and head[0] == 0x80 and 2 <= head[1] <= 5 and any(k in head for k in _KEYS):
        return "pickle"
    if _JSON_START.match(head):
        return "json"
    return None


def _candidate(path: str, name: str) -> DumpFile | None:
    if name.startswith(".") or looks_like_log(name):
        return None
    ranked = _RANKED_NAME.match(name)
    if ranked is None:
        return None
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # a FIFO or device named like a dump: never open it
    except OSError:
        return None
    kind = sniff(path)
    return DumpFile(path, int(ranked.group("rank")), kind) if kind else None


def _walk(folder: str) -> list[DumpFile]:
    found: list[DumpFile] = []
    for root, dirs, files in os.walk(folder, followlinks=False, onerror=lambda e: None):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files, key=natural_key):
            if len(found) >= MAX_DUMP_FILES:
                return found
            if (dump := _candidate(os.path.join(root, name), name)) is not None:
                found.append(dump)
    return found


def _has_logs(folder: str) -> bool:
    for _root, dirs, files in os.walk(folder, followlinks=False, onerror=lambda e: None):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if any(looks_like_log(n) for n in files):
            return True
    return False


def _by_prefix(prefix: str) -> list[DumpFile]:
    folder, start = os.path.split(prefix)
    folder = folder or "."
    if not start or not os.path.isdir(folder):
        return []
    try:
        names = sorted(os.listdir(folder), key=natural_key)
    except OSError:
        return []
    out = []
    for name in names:
        rest = name[len(start):] if name.startswith(start) else ""
        m = _RANKED_NAME.match(rest)
        if m is not None and m.group("prefix") == "" and (dump := _candidate(os.path.join(folder, name), rest)):
            out.append(dump)
    return out[:MAX_DUMP_FILES]


def find_dumps(inputs: list[str]) -> Discovery:
    """Split ``inputs`` into dumps and log inputs. Inputs that are neither stay log inputs (their errors are the
    log reader's to report)."""
    out = Discovery()
    for raw in inputs:
        if not isinstance(raw, str) or raw in ("", "-") or "\x00" in raw:
            out.log_inputs.append(raw)
            continue
        if os.path.isdir(raw):
            dumps = _walk(raw)
            out.dumps.extend(dumps)
            if dumps and not _has_logs(raw):
                out.dumps_only_folders.append(raw)
            else:
                out.log_inputs.append(raw)
            continue
        if os.path.isfile(raw):
            if (dump := _candidate(raw, os.path.basename(raw))) is not None:
                out.dumps.append(dump)
            elif not looks_like_log(os.path.basename(raw)) and sniff(raw) is not None:  # which rank wrote it?
                out.warnings.append(f"{shown(raw)}: a flight-recorder dump without a rank number in its name; "
                                    "skipped (PyTorch names them <prefix><rank>)")
            else:
                out.log_inputs.append(raw)
            continue
        if not os.path.exists(raw) and not os.path.islink(raw):
            dumps = _by_prefix(raw)
            if dumps:
                out.dumps.extend(dumps)
                continue
        out.log_inputs.append(raw)
    out.dumps = _one_per_rank(out.dumps, out.warnings)
    return out


def _one_per_rank(dumps: list[DumpFile], warnings: list[str]) -> list[DumpFile]:
    """One dump per rank: a pickle (it has the stack frames) over a JSON one; the first in order otherwise."""
    chosen: dict[int, DumpFile] = {}
    for d in dumps:
        have = chosen.get(d.rank)
        if have is None or (have.format == "json" and d.format == "pickle"):
            chosen[d.rank] = d
        elif have.format == d.format and have.path != d.path:
            warnings.append(f"two flight-recorder dumps for rank {d.rank}: using {shown(have.path)}, "
                            f"not {shown(d.path)}")
    return [chosen[r] for r in sorted(chosen)]
