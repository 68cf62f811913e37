"""open_inputs: files, folders, torchrun --log-dir, gzip (bombs, corruption), stdin, FIFOs, permissions, live files."""

from __future__ import annotations

import gzip
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from diagnose.ingest import GzipLimits, natural_key, open_inputs
from diagnose.ingest import sources as sources_module
from diagnose.model import DiagnoseError

REPO = Path(__file__).resolve().parents[1]
OLD = time.time() - 3600  # an mtime that is not "live"


def _write(path: Path, data: bytes, old: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if old:
        os.utime(path, (OLD, OLD))
    return path


def _one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message
    return message


def test_large_file_is_memory_mapped_small_and_empty_files_are_bytes(tmp_path):
    body = b"line one\nline two\n" * ((sources_module.SMALL_READ_BYTES // 18) + 1)
    log = _write(tmp_path / "job.log", body)
    small = _write(tmp_path / "small.log", b"line one\nline two\n")
    empty = _write(tmp_path / "empty.log", b"")
    with open_inputs([str(log), str(small), str(empty)]) as sources:
        first, second, third = sources
        assert isinstance(first.buffer, mmap.mmap) and first.size == len(body) > sources_module.SMALL_READ_BYTES
        assert first.buffer[:18] == b"line one\nline two\n" and first.path == str(log)
        assert second.buffer == b"line one\nline two\n" and second.size == 18  # read and closed: no descriptor kept
        assert third.buffer == b"" and third.size == 0
    assert first.buffer.closed  # closed when the context ends


def test_missing_path_and_bad_arguments(tmp_path):
    with pytest.raises(DiagnoseError) as e:
        with open_inputs([str(tmp_path / "nope.log")]):
            pass
    assert "no such file" in _one_line_error(e)
    with pytest.raises(DiagnoseError):
        with open_inputs([]):
            pass
    with pytest.raises(DiagnoseError):
        with open_inputs(["bad\x00path"]):
            pass


def test_folder_sorted_naturally_with_rank_hints(tmp_path):
    for rank in (10, 2, 0, 1):
        _write(tmp_path / "logs" / f"rank{rank}.log", f"hello {rank}\n".encode())
    _write(tmp_path / "logs" / "notes.json", b"{}")
    _write(tmp_path / "logs" / ".hidden.log", b"x")
    with open_inputs([str(tmp_path / "logs")]) as sources:
        assert [Path(s.path).name for s in sources] == ["rank0.log", "rank1.log", "rank2.log", "rank10.log"]
        assert [s.rank_hint for s in sources] == [0, 1, 2, 10]


def test_torchrun_log_dir_layout(tmp_path):
    run = tmp_path / "run_abc" / "attempt_0"
    for local in (0, 1, 10):
        _write(run / str(local) / "stdout.log", f"out {local}\n".encode())
        _write(run / str(local) / "stderr.log", f"err {local}\n".encode())
        _write(run / str(local) / "error.json", b"{}")
    with open_inputs([str(tmp_path)]) as sources:
        assert [(s.local_rank_hint, s.stream_name) for s in sources] == [
            (0, "stderr"), (0, "stdout"), (1, "stderr"), (1, "stdout"), (10, "stderr"), (10, "stdout"),
        ]
        assert all(s.attempt == 0 and s.rank_hint == s.local_rank_hint for s in sources)


def test_folder_without_logs(tmp_path):
    _write(tmp_path / "only.json", b"{}")
    with pytest.raises(DiagnoseError) as e:
        with open_inputs([str(tmp_path)]):
            pass
    assert "no log files" in _one_line_error(e)


def test_natural_key():
    assert sorted(["r10", "r2", "R1", "r2a"], key=natural_key) == ["R1", "r2", "r2a", "r10"]


# ---------------------------------------------------------------------------------------------- gzip


def test_gzip_and_concatenated_members(tmp_path):
    path = tmp_path / "job.log.gz"
    path.write_bytes(gzip.compress(b"first\n") + gzip.compress(b"second\n"))
    empty = tmp_path / "empty.log.gz"
    empty.write_bytes(b"")
    with open_inputs([str(path), str(empty)]) as (source, nothing):
        assert source.buffer[:] == b"first\nsecond\n" and source.path == str(path)
        assert nothing.size == 0


def test_corrupt_and_truncated_gzip(tmp_path):
    corrupt = tmp_path / "bad.log.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate" * 10)
    data = gzip.compress(os.urandom(50_000))
    truncated = tmp_path / "cut.log.gz"
    truncated.write_bytes(data[: len(data) // 2])
    not_gzip = tmp_path / "plain.log.gz"
    not_gzip.write_bytes(b"just text\n")
    for path in (corrupt, truncated, not_gzip):
        with pytest.raises(DiagnoseError) as e:
            with open_inputs([str(path)]):
                pass
        assert str(path) in _one_line_error(e)


def test_gzip_bomb_is_refused_by_ratio_and_by_size(tmp_path):
    bomb = tmp_path / "bomb.log.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        chunk = b"\0" * (1 << 20)
        for _ in range(64):  # 64 MiB of zeros -> about 64 KB compressed (ratio ~1000)
            fh.write(chunk)
    with pytest.raises(DiagnoseError) as e:
        with open_inputs([str(bomb)], gzip_limits=GzipLimits(max_ratio=100, ratio_grace_bytes=1 << 20)):
            pass
    assert "gzip bomb" in _one_line_error(e)
    with pytest.raises(DiagnoseError) as e:
        with open_inputs([str(bomb)], gzip_limits=GzipLimits(max_output_bytes=8 << 20)):
            pass
    assert "refusing" in _one_line_error(e)
    # The temporary output is gone with the context.
    leftovers = [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("diagnose-*") if (p / "gunzip-0.log").exists()]
    assert leftovers == []


# ---------------------------------------------------------------------------------------------- stdin / FIFO

_READ_STDIN = (
    "import sys\n"
    "from diagnose.ingest import open_inputs\n"
    "from diagnose.model import DiagnoseError\n"
    "try:\n"
    "    with open_inputs(['-']) as s:\n"
    "        sys.stdout.write(repr((s[0].path, s[0].size, bytes(s[0].buffer[:]))))\n"
    "except DiagnoseError as e:\n"
    "    sys.stdout.write('ERROR ' + str(e))\n"
)


def test_stdin_is_spooled():
    out = subprocess.run(
        [sys.executable, "-c", _READ_STDIN], input=b"pasted \xff log\n", cwd=REPO, capture_output=True, timeout=60
    )
    assert out.stdout.decode() == repr(("-", 13, b"pasted \xff log\n"))


def test_stdin_closed_is_a_clear_error():
    out = subprocess.run(
        ["bash", "-c", f'exec "{sys.executable}" -c "$0" 0<&-', _READ_STDIN], cwd=REPO, capture_output=True, timeout=60
    )
    assert out.stdout.decode() == "ERROR -: standard input is closed"
    assert b"Traceback" not in out.stderr


def test_fifo_with_a_writer_is_read(tmp_path):
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)

    def writer():
        time.sleep(0.2)
        with open(fifo, "wb") as fh:
            fh.write(b"from a pipe\n")

    thread = threading.Thread(target=writer)
    thread.start()
    with open_inputs([str(fifo)]) as (source,):
        assert source.buffer[:] == b"from a pipe\n" and source.path == str(fifo)
    thread.join()


def test_fifo_without_writer_times_out(tmp_path, monkeypatch):
    fifo = tmp_path / "silent.log"
    os.mkfifo(fifo)
    monkeypatch.setattr(sources_module, "FIFO_TIMEOUT_S", 0.3)
    start = time.monotonic()
    with pytest.raises(DiagnoseError) as e:
        with open_inputs([str(fifo)]):
            pass
    assert "FIFO" in _one_line_error(e) and time.monotonic() - start < 5


# ---------------------------------------------------------------------------------------------- permissions


def test_no_read_permission(tmp_path):
    if os.geteuid() == 0:
        # pytest's own tmp folders are private to root; use a world-traversable one for the unprivileged reader.
        tmp_path = Path(tempfile.mkdtemp(prefix="diagnose-perm-"))
        tmp_path.chmod(0o755)
    secret = _write(tmp_path / "secret.log", b"x\n")
    secret.chmod(0o000)
    folder = tmp_path / "closed"
    _write(folder / "a.log", b"x\n")
    folder.chmod(0o000)
    script = (
        "import sys\n"
        "from diagnose.ingest import open_inputs\n"
        "from diagnose.model import DiagnoseError\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        with open_inputs([p]): print('READ')\n"
        "    except DiagnoseError as e: print('ERROR', e)\n"
    )
    command = [sys.executable, "-c", script, str(secret), str(folder), str(folder / "a.log")]
    if os.geteuid() == 0:
        # root reads anything: run the real check as an unprivileged user when the system lets us.
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    try:
        out = subprocess.run(command, cwd=REPO, capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        folder.chmod(0o755)
        if os.geteuid() == 0:
            shutil.rmtree(tmp_path, ignore_errors=True)
    lines = out.stdout.decode().splitlines()
    if os.geteuid() == 0 and out.returncode != 0 and not lines:
        pytest.skip(f"cannot run Python as an unprivileged user here: {out.stderr[-200:]!r}")
    assert lines == [
        f"ERROR {secret}: permission denied (no read access)",
        f"ERROR {folder}: permission denied (cannot list folder)",
        f"ERROR {folder / 'a.log'}: permission denied (cannot reach this path)",
    ]


# ---------------------------------------------------------------------------------------------- live files


def test_file_growing_after_open_keeps_the_size_at_open(tmp_path):
    log = _write(tmp_path / "grow.log", b"a" * 5000)
    with open_inputs([str(log)]) as (source,):
        with open(log, "ab") as fh:
            fh.write(b"b" * 100_000)
        assert source.size == 5000 and len(source.buffer) == 5000
        assert source.buffer[-1:] == b"a"


def test_recently_written_file_is_snapshot_so_truncation_cannot_crash(tmp_path):
    # larger than SMALL_READ_BYTES, so it is mapped (a small file is read whole at open, a snapshot by itself)
    body = b"x" * (sources_module.SMALL_READ_BYTES + 300_000) + b"\nend\n"
    log = _write(tmp_path / "live.log", body, old=False)
    with open_inputs([str(log)]) as (source,):
        os.truncate(log, 0)  # copytruncate log rotation while we scan
        assert isinstance(source.buffer, mmap.mmap)
        assert source.buffer[-4:] == b"end\n"  # reading the whole map would SIGBUS if it were the original file
        assert source.size == len(body) and source.path == str(log)


def test_a_small_live_file_is_read_at_open_without_a_copy(tmp_path, monkeypatch):
    def no_copy(path, tmp):
        raise AssertionError("a small file needs no snapshot copy")

    monkeypatch.setattr(sources_module, "_snapshot", no_copy)
    log = _write(tmp_path / "live.log", b"x" * 300_000 + b"\nend\n", old=False)
    with open_inputs([str(log)]) as (source,):
        os.truncate(log, 0)  # copytruncate log rotation while we scan
        assert source.buffer[-4:] == b"end\n" and source.size == 300_005


def test_sources_close_idempotently(tmp_path):
    log = _write(tmp_path / "a.log", b"abc\n")
    with open_inputs([str(log)]) as (source,):
        pass
    source.close()
    source.close()


def test_devices_are_refused_not_read_forever():
    with pytest.raises(DiagnoseError) as e:
        with open_inputs(["/dev/zero"]):
            pass
    assert "not a log file" in _one_line_error(e)


def test_error_for_a_path_with_control_characters_stays_on_one_line(tmp_path):
    name = tmp_path / "evil\nname\x1b]0;title\x07.log"
    with pytest.raises(DiagnoseError) as e:
        with open_inputs([str(name)]):
            pass
    message = _one_line_error(e)
    assert "\x1b" not in message and "\\n" in message and "\\x1b" in message


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300), st.booleans())
def test_any_gz_bytes_give_data_or_a_one_line_error(tmp_path, data, with_header):
    path = tmp_path / "fuzz.log.gz"
    path.write_bytes((b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" if with_header else b"") + data)
    try:
        with open_inputs([str(path)]) as (source,):
            assert len(source.buffer) == source.size
    except DiagnoseError as e:
        assert "\n" not in str(e) and str(path) in str(e)


def test_bz2_and_xz_and_a_member_boundary_inside_a_read(tmp_path):
    import bz2
    import lzma

    from diagnose.ingest import gzip_bounded

    (tmp_path / "a.log.bz2").write_bytes(bz2.compress(b"bz line\n") + bz2.compress(b"second\n"))
    (tmp_path / "b.log.xz").write_bytes(lzma.compress(b"xz line\n"))
    first = gzip.compress(os.urandom(3000).hex().encode())  # text (binary data is refused), incompressible
    boundary = tmp_path / "c.log.gz"
    boundary.write_bytes(first + gzip.compress(b"tail\n"))
    with open_inputs([str(tmp_path)]) as sources:
        assert [s.buffer[:] for s in sources[:2]] == [b"bz line\nsecond\n", b"xz line\n"]
        assert sources[2].buffer[-5:] == b"tail\n"
    # The next member's magic split across two reads is still found.
    old = gzip_bounded._CHUNK_IN
    try:
        gzip_bounded._CHUNK_IN = len(first) + 1
        with open_inputs([str(boundary)]) as (source,):
            assert source.buffer[-5:] == b"tail\n"
    finally:
        gzip_bounded._CHUNK_IN = old
    bad = tmp_path / "bad.log.xz"
    bad.write_bytes(b"\xfd7zXZ\x00" + b"\x00" * 40)
    with pytest.raises(DiagnoseError) as e:
        with open_inputs([str(bad)]):
            pass
    assert "corrupt" in _one_line_error(e)


def test_stdin_named_twice_keeps_the_first_copy_intact():
    """Named twice, standard input is read once (as a file named twice is; qa14), and that copy is whole."""
    script = (
        "from diagnose.ingest import open_inputs\n"
        "with open_inputs(['-', '-']) as sources:\n"
        "    print(bytes(sources[0].buffer[:]), len(sources))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], input=b"x" * 5000, cwd=REPO, capture_output=True, timeout=60)
    assert out.stdout.decode().strip() == repr(b"x" * 5000) + " 1"


def test_a_subfolder_removed_during_the_walk_is_skipped_not_an_error(tmp_path, monkeypatch):
    """A job's scratch folder can vanish while `analyze DIR` walks it; the logs that remain are still read."""
    from diagnose.ingest import discover

    (tmp_path / "rank0.log").write_text("[rank0]: RuntimeError: boom\n")
    scratch = tmp_path / "zz_scratch"
    scratch.mkdir()
    (scratch / "x.log").write_text("gone\n")
    real = discover.looks_like_log

    def remove_scratch_then_check(name: str) -> bool:
        shutil.rmtree(scratch, ignore_errors=True)  # deleted after the top folder was listed, before its turn
        return real(name)

    monkeypatch.setattr(discover, "looks_like_log", remove_scratch_then_check)
    assert discover._walk_logs(str(tmp_path)) == [str(tmp_path / "rank0.log")]


def test_an_unlistable_top_folder_is_still_a_one_line_error(tmp_path):
    from diagnose.ingest import discover

    with pytest.raises(DiagnoseError) as e:
        discover._walk_logs(str(tmp_path / "missing"))
    assert "no such file or directory" in _one_line_error(e)


def test_os_errors_have_one_wording_per_kind():
    from diagnose.ingest.errors import os_error

    assert str(os_error("a", FileNotFoundError(2, "No such file"))) == "a: no such file or directory"
    assert str(os_error("a", PermissionError(13, "Permission denied"))) == "a: permission denied (no read access)"
    assert str(os_error("a", PermissionError(13, "x"), denied="cannot list folder")) == "a: permission denied (cannot list folder)"
    assert str(os_error("a", IsADirectoryError(21, "Is a directory"))) == "a: is a directory"
    assert str(os_error("a\x1b[2J", OSError(5, "Input/output error"), "read")) == "a\\x1b[2J: cannot read (Input/output error)"


def _run_with_fd_limit(limit: int, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a child whose open-file limit (soft and hard) is ``limit``, like a login node's ulimit -n."""
    import resource

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          preexec_fn=lower, cwd=str(Path(__file__).resolve().parents[1]))


def test_a_folder_of_more_per_rank_logs_than_the_open_file_limit(tmp_path):
    """600 small per-rank logs under `ulimit -n 128`: small files are read and closed, none is held open."""
    for r in range(600):
        text = "iteration 1\n" + ("[rank%d]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB\n" % r
                                  if r == 517 else "")
        (tmp_path / f"rank{r}.log").write_text(text)
    old = time.time() - 3600
    for p in tmp_path.iterdir():
        os.utime(p, (old, old))
    done = _run_with_fd_limit(128, (
        "import json, sys\nfrom diagnose.pipeline import analyze, AnalyzeOptions\n"
        f"r = analyze([{str(tmp_path)!r}], AnalyzeOptions(replay=False)).to_dict()\n"
        "print(json.dumps([len(r['inputs']), r['findings'][r['root_cause']]['ranks']]))"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [600, [517]]


def test_too_many_large_logs_for_the_hard_limit_is_a_one_line_error(tmp_path):
    """Large logs are mapped (one descriptor each); past a hard limit that cannot be raised, the error says what
    to do instead of a traceback. (SMALL_READ_BYTES is lowered in the child so that small files stand in for large.)"""
    for r in range(100):
        (tmp_path / f"rank{r}.log").write_text("iteration 1\n" * 10)
    old = time.time() - 3600
    for p in tmp_path.iterdir():
        os.utime(p, (old, old))
    done = _run_with_fd_limit(48, (
        "from diagnose.ingest import sources\nsources.SMALL_READ_BYTES = 0\n"
        "from diagnose.model import DiagnoseError\n"
        "try:\n"
        f"    with sources.open_inputs([{str(tmp_path)!r}]) as s: print('opened', len(s))\n"
        "except DiagnoseError as e: print('ERROR', e)"))
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    assert out.startswith("ERROR ") and "too many open files" in out and "ulimit -n" in out
    assert len(out.splitlines()) == 1


def test_the_soft_open_file_limit_is_raised_towards_the_hard_one():
    done = _run_with_fd_limit(4096, (
        "import resource\nfrom diagnose.ingest.sources import raise_open_file_limit\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))\n"
        "raise_open_file_limit(1000); a = resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
        "raise_open_file_limit(100000); b = resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
        "raise_open_file_limit(10); c = resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
        "print(a, b, c)"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1000", "4096", "4096"]  # raised as needed, capped at hard, never lowered
