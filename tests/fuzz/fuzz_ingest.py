"""Fuzz target: the file-reading layer, on bytes written where the user would have them.

Each input picks a way in, then its payload is read through it:

* a file with a fuzzed name and suffix (``.log``, ``.gz``, ``.bz2``, ``.xz``, none) -> ``open_inputs``;
* a folder of up to three such files (rank names, rotated names, hidden names) -> ``open_inputs``;
* standard input (``-``) -> the stdin spool;
* ``decompress_to_file`` with small limits (so the size and ratio bounds are reached);
* flight-recorder dumps (pickle or JSON, one or two ranks) -> ``find_dumps``, ``read_dumps``, ``analyse_dumps``.

Invariants: the only exception is the project's one-line error (``DiagnoseError``), its message printable on one
line; every opened source's buffer holds ``size`` bytes; plain text (no magic bytes, no BOM, not binary) comes
back byte for byte; nothing is left in the temporary folder once the inputs are closed.

    python3 tests/fuzz/fuzz_ingest.py --seconds 1800 --crash-dir /tmp/fuzz-ingest
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import lzma
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # run as a script from a checkout: import the checkout's package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # the harness beside it, also from the test suite
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Choices, encode  # noqa: E402

from diagnose.ingest import (  # noqa: E402
    GzipLimits,
    open_inputs,
    sniff,  # noqa: E402
)
from diagnose.ingest.flight_recorder import find_dumps, read_dumps  # noqa: E402
from diagnose.ingest.gzip_bounded import decompress_to_file  # noqa: E402
from diagnose.match.hang import analyse_dumps  # noqa: E402
from diagnose.model import DiagnoseError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = ["", ".log", ".txt", ".gz", ".log.gz", ".bz2", ".xz", ".out", ".log.1", ".json", ".pkl"]
NAMES = ["rank0", "rank12", "stdout", "stderr", ".hidden", "job-%j", "log_rank_03", "attempt_0", "x[b]", "\u202eeh"]
SMALL_LIMITS = GzipLimits(max_output_bytes=1 << 16, max_ratio=50.0, ratio_grace_bytes=1 << 12)
MODES = ("file", "folder", "stdin", "decompress", "dumps")


def _name(c: Choices) -> str:
    """A file name from the input: a fuzzed stem (no separator, no NUL, not '.' or '..') and a suffix."""
    stem = c.text(40).replace("/", "_").replace("\x00", "_") if c.flag() else c.pick(NAMES)
    name = (stem or "f") + c.pick(SUFFIXES)
    return "f" + name if name in (".", "..") else name


def _write(path: str, data: bytes) -> None:
    with open(os.fsencode(path), "wb") as fh:
        fh.write(data)


def _plain_text(data: bytes) -> bool:
    head = data[: sniff.SAMPLE_BYTES]
    return (sniff.compressed_by_magic(head) is None and sniff.bom_encoding(head) is None
            and sniff.bomless_utf16(head) is None and not sniff.cr_lines(head)
            and not sniff.looks_binary(head) and not any(head.startswith(m) for m in sniff.REFUSED))


def _read_all(paths: list[str], expect: dict[str, bytes] | None = None, limits: GzipLimits | None = None) -> None:
    with open_inputs(paths, gzip_limits=limits) as sources:
        for source in sources:
            buf = bytes(source.buffer[:])
            assert len(buf) == source.size, (source.path, len(buf), source.size)
            if expect and source.path in expect:
                assert buf == expect[source.path], f"{source.path}: text changed on the way in"


def _assert_one_line(e: BaseException) -> None:
    message = str(e)
    assert message and message.isprintable(), f"error message not one printable line: {message!r}"


def check(data: bytes) -> None:
    c = Choices(data)
    mode = c.pick(MODES)
    work = tempfile.mkdtemp(prefix="fuzz-ingest-")
    spool = os.path.join(work, "spool")  # open_inputs' temporary folder goes here, to be checked empty
    os.mkdir(spool)
    saved_tempdir, saved_stdin = tempfile.tempdir, sys.stdin
    tempfile.tempdir = spool
    try:
        _one(mode, c, work)
    except DiagnoseError as e:
        _assert_one_line(e)
    finally:
        tempfile.tempdir, sys.stdin = saved_tempdir, saved_stdin
        left = os.listdir(spool)
        shutil.rmtree(work, ignore_errors=True)
    assert not left, f"left behind in the temporary folder: {left}"


def _one(mode: str, c: Choices, work: str) -> None:
    if mode == "file":
        path = os.path.join(work, _name(c))
        payload = c.rest()
        _write(path, payload)
        plain = _plain_text(payload) and not path.lower().endswith((".gz", ".bz2", ".xz"))
        _read_all([path], {path: payload} if plain else None, SMALL_LIMITS if c.flag() else None)
    elif mode == "folder":
        folder = os.path.join(work, "job")
        os.mkdir(folder)
        parts = c.rest().split(b"\x00\x01", 2)
        for i, part in enumerate(parts):
            sub = folder if i % 2 == 0 else os.path.join(folder, f"attempt_{i}", "0")
            os.makedirs(sub, exist_ok=True)
            _write(os.path.join(sub, f"rank{i}.log" if i else "stdout.log"), part)
        _read_all([folder])
    elif mode == "stdin":
        payload = c.rest()
        sys.stdin = io.TextIOWrapper(io.BytesIO(payload), encoding="utf-8", errors="surrogateescape")
        _read_all(["-"], {"-": payload} if _plain_text(payload) else None)
    elif mode == "decompress":
        kind = c.pick([".gz", ".bz2", ".xz"])
        src, dst = os.path.join(work, "in" + kind), os.path.join(work, "out.log")
        _write(src, c.rest())
        try:
            written = decompress_to_file(src, dst, SMALL_LIMITS, kind=kind)
        except DiagnoseError:
            assert not os.path.exists(dst), "a refused decompression left its partial output"
            raise
        assert written <= SMALL_LIMITS.max_output_bytes and os.path.getsize(dst) == written
    else:
        folder = os.path.join(work, "dumps")
        os.mkdir(folder)
        suffix = c.pick(["", ".json", ".pkl"])
        for i, part in enumerate(c.rest().split(b"\x00\x02", 1)):
            _write(os.path.join(folder, f"nccl_trace_rank_{i}{suffix}"), part)
        found = find_dumps([folder])
        dumps, warnings = read_dumps(found.dumps)
        for w in warnings:
            assert w.isprintable(), f"warning not one printable line: {w!r}"
        analyse_dumps(dumps, warnings, world_size=c.byte() or None)


def _sample(name: str, limit: int = 3000) -> bytes:
    return (ROOT / "sample_logs" / name).read_bytes()[:limit]


def _dump_seed() -> bytes:
    entries = [{"record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": i,
                "p2p_seq_id": 0, "op_id": i, "profiling_name": "nccl:all_reduce", "time_created_ns": 1,
                "input_sizes": [[4, 4]], "output_sizes": [[4, 4]], "input_dtypes": ["Float"],
                "output_dtypes": ["Float"], "state": "completed" if i < 3 else "scheduled",
                "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": False,
                "timeout_ms": 600000, "is_p2p": False,
                "frames": [{"name": "train_step", "filename": "train.py", "line": 10}]} for i in range(4)]
    return pickle.dumps({"version": "2.10", "comm_lib_version": "2.27.3", "pg_config": {"0": {"name": "0",
                         "desc": "default_pg", "ranks": "[0, 1]"}}, "pg_status": {"0": {
                         "last_enqueued_collective": 3, "last_started_collective": 3,
                         "last_completed_collective": 2}}, "entries": entries}, protocol=2)


def seeds() -> list[bytes]:
    oom = _sample("ddp_wrap_oom.log")
    nccl = _sample("nccl_desync_seqnum.log")
    dump = _dump_seed()
    fr = ROOT / "tests" / "data" / "flight_recorder" / "h200"
    return [
        encode(0, 1, "rank3", 1, oom),  # file rank3.log
        encode(0, 0, 3, gzip.compress(oom)),  # NAMES[0] + .gz
        encode(0, 1, "plain", 0, gzip.compress(nccl)),  # gzip without .gz
        encode(0, 0, 5, bz2.compress(oom)),
        encode(0, 0, 6, lzma.compress(oom)),
        encode(0, 1, "ps", 1, codecs.BOM_UTF16_LE + oom.decode("utf-8", "replace").encode("utf-16-le")),
        encode(0, 1, "zst", 1, b"\x28\xb5\x2f\xfd" + oom[:100]),
        encode(0, 1, "u16", 1, oom.decode("utf-8", "replace").encode("utf-16-be")),  # no BOM
        encode(1, oom, b"\x00\x01", nccl, b"\x00\x01", b"[rank2]: ok\n"),
        encode(2, nccl),
        encode(2, gzip.compress(oom)),
        encode(3, 0, gzip.compress(oom * 4) + gzip.compress(b"second member\n")),
        encode(3, 1, bz2.compress(b"x" * 100000)),
        encode(4, 0, fr.joinpath("timeout_new_env", "nccl_trace_rank_0").read_bytes()),
        encode(4, 1, fr.joinpath("nccl_dump.json").read_bytes()[:6000]),
        encode(4, 0, dump, b"\x00\x02", dump),
    ]


if __name__ == "__main__":
    from harness import main

    sys.exit(main("ingest", check, seeds()))
