"""Flight-recorder dumps are untrusted files from a job folder: a pickle that would run code is refused without
running it, a truncated or corrupt dump is one warning line, sizes and counts are bounded, text from a dump cannot
drive the terminal. Finding dumps beside the logs: folders, names as PyTorch writes them, the prefix."""

from __future__ import annotations

import copyreg
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.ingest.flight_recorder import find_dumps, read_dumps
from diagnose.ingest.flight_recorder.discover import DumpFile
from diagnose.ingest.flight_recorder.read import MAX_DUMP_BYTES, MAX_ENTRIES, DumpError, read_dump
from diagnose.ingest.flight_recorder.safe_pickle import RefusedPickle, load_plain
from diagnose.pipeline import AnalyzeOptions, analyze

H200 = Path(__file__).resolve().parent / "data" / "flight_recorder" / "h200"
REAL = H200 / "timeout_new_env" / "nccl_trace_rank_0"


def _entry(seq: int, op: str = "nccl:all_reduce", sizes=((8,),), frames=None) -> dict:
    return {"record_id": seq, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": op, "input_sizes": [list(s) for s in sizes],
            "output_sizes": [list(s) for s in sizes], "state": "completed", "retired": True,
            "frames": frames or [{"name": "step", "filename": "train.py", "line": 10}]}


def _dump(entries, ranks=2) -> dict:
    return {"version": "2.10", "comm_lib_version": "2.21.5", "entries": entries,
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(ranks)))}},
            "pg_status": {"0": {"last_enqueued_collective": len(entries), "last_started_collective": -1,
                                "last_completed_collective": len(entries)}}}


class _OpensAFile:
    """Pickles as ``open(path, "w")``: loading it with pickle.load would create the file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_that_would_create_a_file_is_refused_without_running(tmp_path):
    target = tmp_path / "pwned"
    payload = pickle.dumps({"version": "2.10", "entries": [_OpensAFile(str(target))]}, protocol=2)
    dump = tmp_path / "nccl_trace_rank_0"
    dump.write_bytes(payload)
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(_dump([_entry(1)]), protocol=2))
    (tmp_path / "rank0.log").write_text("training step 1\n")
    report = analyze([str(tmp_path)], AnalyzeOptions(replay=False))
    assert not target.exists()
    [warning] = [w for w in report.warnings if "nccl_trace_rank_0" in w]
    assert "unsafe pickle refused" in warning and "io.open" in warning and "\n" not in warning
    assert report.hang is not None and [d.rank for d in report.hang.dumps] == [1]
    pickle.loads(payload)[  # the control: the same bytes loaded by pickle.load do create the file
        "entries"][0].close()
    assert target.exists()


@pytest.mark.parametrize("opcode", ["global", "stack_global", "inst", "ext", "persid"])
def test_every_opcode_that_imports_or_calls_is_refused(tmp_path, opcode):
    target = tmp_path / "pwned"
    arg = str(target).encode()
    payloads = {
        "global": b"\x80\x02cbuiltins\nopen\nX" + len(arg).to_bytes(4, "little") + arg + b"X\x01\x00\x00\x00w\x86R.",
        "stack_global": pickle.dumps(_OpensAFile(str(target)), protocol=4),
        "inst": b"(X" + len(arg).to_bytes(4, "little") + arg + b"X\x01\x00\x00\x00wibuiltins\nopen\n.",
        "ext": b"\x80\x02\x82\xf0X" + len(arg).to_bytes(4, "little") + arg + b"X\x01\x00\x00\x00w\x86R.",
        "persid": b"\x80\x02Pfile\n.",
    }
    copyreg.add_extension("builtins", "open", 0xF0)
    try:
        with pytest.raises(RefusedPickle):
            load_plain(payloads[opcode])
    finally:
        copyreg.remove_extension("builtins", "open", 0xF0)
    assert not target.exists()


def test_a_truncated_dump_is_reported_and_the_others_still_analysed(tmp_path):
    good = pickle.dumps(_dump([_entry(1), _entry(2)]), protocol=2)
    (tmp_path / "nccl_trace_rank_0").write_bytes(good)
    (tmp_path / "nccl_trace_rank_1").write_bytes(REAL.read_bytes()[:1500])
    (tmp_path / "nccl_trace_rank_2.json").write_text(json.dumps(_dump([_entry(1)]))[:-40])
    (tmp_path / "job.log").write_text("step 1\n")
    report = analyze([str(tmp_path)], AnalyzeOptions(replay=False))
    warnings = " | ".join(report.warnings)
    assert "nccl_trace_rank_1: truncated flight-recorder pickle" in warnings
    assert "nccl_trace_rank_2.json: truncated flight-recorder JSON" in warnings
    assert report.hang.kind == "dead_rank" and report.hang.missing_dumps == [1]


def test_cli_on_a_hostile_folder_exits_cleanly_with_one_line_warnings(tmp_path):
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"\x80\x02}(X\x07\x00\x00\x00entries" + b"\xff" * 50)
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps({"version": [1] * 3, "entries": 5}, protocol=2))
    proc = subprocess.run([sys.executable, "-m", "diagnose", "analyze", "--format", "json", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr + proc.stdout
    warnings = json.loads(proc.stdout)["warnings"]
    assert any("nccl_trace_rank_0: corrupt flight-recorder pickle" in w for w in warnings)
    assert any("nccl_trace_rank_1: not a flight-recorder dump (no entries list)" in w for w in warnings)
    assert all("\n" not in w for w in warnings)


def test_size_and_counts_are_bounded(tmp_path):
    big = tmp_path / "nccl_trace_rank_0"
    with open(big, "wb") as fh:
        fh.write(b"\x80\x02}(X\x07\x00\x00\x00version")
        fh.truncate(MAX_DUMP_BYTES + 10)  # sparse: costs no disk
    with pytest.raises(DumpError, match="larger than 64 MiB"):
        read_dump(DumpFile(str(big), 0, "pickle"))
    # one entry referenced a million times through the memo: a small file, a huge list; capped, counted
    shared = _entry(1)
    many = pickle.dumps({"version": "2.10", "entries": [shared] * 1_000_000}, protocol=2)
    assert len(many) < 4 << 20
    path = tmp_path / "nccl_trace_rank_1"
    path.write_bytes(many)
    dump = read_dump(DumpFile(str(path), 1, "pickle"))
    assert len(dump.entries) == MAX_ENTRIES and dump.dropped_entries == 1_000_000 - MAX_ENTRIES
    assert dump.entries[-1].frames and not dump.entries[0].frames  # stacks kept for the newest entries only
    # a self-referencing list and absurd numbers: read, never looped over or formatted
    loop: list = []
    loop.append(loop)
    odd = _entry(2, sizes=((10**400,),))
    odd["frames"] = loop
    odd["record_id"] = 10**5000 if sys.get_int_max_str_digits() == 0 else 2**70
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": [odd]}, protocol=2))
    [entry] = read_dump(DumpFile(str(path), 1, "pickle")).entries
    assert entry.input_sizes == [[]] and entry.frames == [] and entry.record_id == 0


def test_text_from_a_dump_cannot_drive_the_terminal(tmp_path):
    evil = "\x1b]52;c;cHduZWQ=\x07[bold red]x[/]\u202e"
    for rank in (0, 1):
        entries = [_entry(1), _entry(2, op=f"nccl:all_reduce{evil}" if rank else "nccl:all_reduce",
                                     frames=[{"name": evil, "filename": f"/x/{evil}.py", "line": 3}])]
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(_dump(entries), protocol=2))
    for fmt in ("text", "markdown", "json"):
        proc = subprocess.run([sys.executable, "-m", "diagnose", "analyze", "--format", fmt, "--color", "always",
                               str(tmp_path)], capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 1, proc.stderr
        assert "\x1b]52" not in proc.stdout and "\u202e" not in proc.stdout and "\x07" not in proc.stdout
    assert "[bold red]x[/]" in subprocess.run(
        [sys.executable, "-m", "diagnose", "analyze", str(tmp_path)], capture_output=True, text=True, timeout=60,
        check=False).stdout


# ----------------------------------------------------------------------------------------------- finding


def test_dumps_are_found_by_folder_by_name_and_by_prefix(tmp_path):
    folder = tmp_path / "dumps"
    folder.mkdir()
    for rank in range(3):
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(_dump([_entry(1)], 3), protocol=2))
    (folder / "nccl_trace_rank_1.json").write_text(json.dumps(_dump([_entry(1)], 3)))  # same rank: pickle wins
    (folder / "notes_7").write_text("not a dump\n")
    (folder / "train.log").write_text("step\n")
    found = find_dumps([str(folder)])
    assert [(Path(d.path).name, d.rank, d.format) for d in found.dumps] == [
        ("nccl_trace_rank_0", 0, "pickle"), ("nccl_trace_rank_1", 1, "pickle"), ("nccl_trace_rank_2", 2, "pickle")]
    assert found.log_inputs == [str(folder)]
    by_prefix = find_dumps([str(folder / "nccl_trace_rank_"), str(folder / "train.log")])
    assert [d.rank for d in by_prefix.dumps] == [0, 1, 2] and by_prefix.log_inputs == [str(folder / "train.log")]
    one = find_dumps([str(folder / "nccl_trace_rank_2")])
    assert [d.rank for d in one.dumps] == [2] and one.log_inputs == []
    unnamed = find_dumps([str(H200 / "nccl_dump.pkl")])
    assert not unnamed.dumps and not unnamed.log_inputs and "without a rank number" in unnamed.warnings[0]


def test_a_folder_of_dumps_only_is_analysed_without_logs(tmp_path):
    for rank in range(2):
        entries = [_entry(1), _entry(2)] if rank == 0 else [_entry(1)]
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(_dump(entries), protocol=2))
    report = analyze([str(tmp_path)], AnalyzeOptions(replay=False))
    assert report.root.rule == "FR001" and report.root.ranks == [1] and report.hang.culprits[0].frame == \
        "train.py:10 in step"


def test_older_formats_are_read(tmp_path):
    """1.x named the sequence ``seq_id`` (1.4: pg_config as pg_id -> ranks); 2.3-2.7 said ``nccl_version``."""
    old = {"version": "1.5", "entries": [{"record_id": i, "pg_id": 0, "seq_id": i, "profiling_name": "nccl:all_reduce",
                                          "input_sizes": [[4]], "output_sizes": [[4]], "state": "scheduled",
                                          "frames": []} for i in (1, 2)]}
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(old, protocol=2))
    dump = read_dump(DumpFile(str(path), 0, "pickle"))
    assert [(e.group, e.seq, e.op) for e in dump.entries] == [("0", 1, "nccl:all_reduce"), ("0", 2, "nccl:all_reduce")]
    old["version"], old["pg_config"] = "1.4", {0: [0, 1, 2, 3]}  # 1.4: ranks per pg_id, a list
    path.write_bytes(pickle.dumps(old, protocol=2))
    assert read_dump(DumpFile(str(path), 0, "pickle")).groups["0"].ranks == [0, 1, 2, 3]
    mid = _dump([_entry(1)])
    mid["nccl_version"] = mid.pop("comm_lib_version")
    mid["version"] = "2.4"
    path.write_bytes(pickle.dumps(mid, protocol=2))
    assert read_dump(DumpFile(str(path), 0, "pickle")).comm_lib_version == "2.21.5"
    assert read_dumps([DumpFile(str(path), 0, "pickle")])[1] == []


def test_huge_lengths_deep_nesting_and_fifos_are_one_line_errors(tmp_path):
    import os
    import struct

    cases = {
        "nccl_trace_rank_0": b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"abc",  # BINBYTES8 of a terabyte
        "nccl_trace_rank_1": b"\x80\x02\x8b" + struct.pack("<i", 2**31 - 1) + b"abc",  # LONG4 of 2 GiB
        "nccl_trace_rank_2.json": b'{"entries":' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        fmt = "json" if name.endswith(".json") else "pickle"
        with pytest.raises(DumpError) as err:
            read_dump(DumpFile(str(tmp_path / name), 0, fmt))
        assert "\n" not in str(err.value) and name in str(err.value)
    fifo = tmp_path / "nccl_trace_rank_3"
    os.mkfifo(fifo)
    with pytest.raises(DumpError, match="not a regular file"):
        read_dump(DumpFile(str(fifo), 3, "pickle"))  # would block forever if opened for a plain read
    # the FIFO is never opened; pickles without the recorder's keys in their first bytes are not taken for dumps
    assert [d.rank for d in find_dumps([str(tmp_path)]).dumps] == [2]


def test_a_json_log_named_like_a_dump_stays_a_log(tmp_path):
    log = tmp_path / "worker_3"
    log.write_text('{"level": "error", "version": "1", "msg": "CUDA out of memory"}\n')
    found = find_dumps([str(log)])
    assert not found.dumps and found.log_inputs == [str(log)]


# Found by tests/fuzz/fuzz_ingest.py: a LONG_BINPUT naming memo index ~1e9 made CPython's C unpickler allocate and
# zero an array of twice that many pointers (16 GiB here) from a 10-byte dump.
MEMO_BOMB = b"\x80\x02K\x01r\xff\xff\xff\x3f."


def test_a_huge_memo_index_does_not_allocate_its_memo(tmp_path):
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
              "from diagnose.ingest.flight_recorder.safe_pickle import load_plain; "
              f"print(load_plain({MEMO_BOMB!r}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr[-500:]


def test_real_dumps_still_take_the_fast_unpickler():
    from diagnose.ingest.flight_recorder.safe_pickle import memo_indices_bounded

    assert memo_indices_bounded(REAL.read_bytes())
    many = pickle.dumps(_dump([_entry(i) for i in range(400)]), protocol=2)  # > 256 memo entries: LONG_BINPUT
    assert b"r" in many and memo_indices_bounded(many)
    assert not memo_indices_bounded(MEMO_BOMB)


def test_a_refused_global_with_control_characters_is_one_printable_warning(tmp_path):
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(b"\x80\x02}q\x00X\x07\x00\x00\x00entriesc\x1b]52;c;x\x07\nname\n.")
    dumps, warnings = read_dumps([DumpFile(str(path), 0, "pickle")])
    assert not dumps and len(warnings) == 1
    assert warnings[0].isprintable() and "refused to import" in warnings[0], warnings
