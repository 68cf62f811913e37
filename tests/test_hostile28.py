"""Round 28 of hostile input, through the real command line (docs/qa-report-4.md).

Each test failed before its fix: an internal error on a 5000-digit integer in a config, a misleading message and a
5000-character echo for a ``--gpus`` too long to be a GPU count, ``-j N`` forking N workers for a file of two
chunks, a UTF-16 BOM in front of UTF-8 text read as UTF-16 ("No failure found", exit 0), the temporary files of a
run killed by SIGTERM (12 GB of a spooled pipe) left behind, and ``diagnose tui -`` spooling ``/dev/zero`` until the
disk was full.
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for_file

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_logs" / "ddp_wrap_oom.log"
TIMEOUT = 60


def cli(*args: str, env_extra: dict | None = None, timeout_s: float = TIMEOUT) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "COLUMNS": "120", "DIAGNOSE_SKIP_SLURM": "1"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "diagnose", *args], capture_output=True, timeout=timeout_s,
                          cwd=ROOT, env=env, stdin=subprocess.DEVNULL)


def one_line_error(res: subprocess.CompletedProcess, *words: str) -> str:
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 2, (res.returncode, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("diagnose: error: "), err
    assert "internal error" not in err and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return lines[0]


def test_a_5000_digit_integer_in_a_config_is_a_one_line_error(tmp_path):
    """PyYAML's int() raised CPython's "Exceeds the limit (4300 digits)" ValueError: an internal error."""
    config = tmp_path / "huge.yaml"
    config.write_text("model:\n  num_layers: " + "9" * 5000 + "\n  hidden_size: 4096\n  num_attention_heads: 32\n")
    for command in (["check", str(config), "--gpus", "8"], ["replay", str(config)]):
        line = one_line_error(cli(*command), "huge.yaml", "line 2")
        assert len(line) < 300, line
    month = tmp_path / "month.yaml"  # datetime's ValueError from PyYAML's timestamp constructor: the same path
    month.write_text("model:\n  num_layers: 32\n  started: 2026-13-41\n")
    one_line_error(cli("check", str(month), "--gpus", "8"), "month.yaml", "month must be in 1..12")


def test_gpus_too_large_to_be_a_gpu_count_is_refused_in_one_short_line():
    """``--gpus 10**30`` planned 10**30-way data parallelism; 5000 digits were called "not a whole number" and
    echoed whole."""
    for value in ("1" + "0" * 30, "9" * 5000):
        line = one_line_error(cli("check", "examples/run_config.yaml", "--gpus", value), "--gpus")
        assert "not a whole number" not in line and len(line) < 300, line
    assert cli("check", "examples/run_config.yaml", "--gpus", "65536").returncode in (0, 1)
    line = one_line_error(cli("analyze", "-j", "9" * 5000, str(SAMPLE)), "--jobs", "too large")
    assert len(line) < 300, line


def test_jobs_never_forks_more_workers_than_the_log_has_chunks(tmp_path, monkeypatch, capsys):
    """``-j 40`` on a 33 MiB log (two 32 MiB chunks) forked 40 workers; ``-j 100000`` would fork that many."""
    import multiprocessing

    from diagnose.match import engine
    from diagnose.present import cli as cli_module

    log = tmp_path / "big.log"
    line = b"[rank3]: iteration 10/100 | lm loss 2.3 | consumed samples 1024 | padding padding padding\n"
    with open(log, "wb") as fh:
        fh.write(line * ((33 << 20) // len(line)))
        fh.write(SAMPLE.read_bytes())
    sizes: list[int] = []
    real_get_context = multiprocessing.get_context

    def spying_get_context(method=None):
        ctx = real_get_context(method)

        class Spy:
            def __getattr__(self, name):
                return getattr(ctx, name)

            def Pool(self, processes=None, *args, **kwargs):  # noqa: N802 - multiprocessing's name
                sizes.append(processes)
                return ctx.Pool(processes, *args, **kwargs)

        return Spy()

    monkeypatch.setattr(multiprocessing, "get_context", spying_get_context)
    monkeypatch.setattr(engine, "PARALLEL_MIN_BYTES", 1 << 20)  # 64 MiB in use: keep the test's log at 33 MiB
    monkeypatch.setenv("DIAGNOSE_NO_CONFIG", "1")
    rc = cli_module.main(["analyze", "-q", "--no-replay", "-j", "40", str(log)])
    assert rc == 1, capsys.readouterr()
    assert sizes == [2], sizes


def test_a_utf16_bom_in_front_of_utf8_text_does_not_hide_the_failure(tmp_path):
    """Bytes FF FE followed by a UTF-8 log were decoded as UTF-16: CJK garbage, "No failure found", exit 0."""
    log = tmp_path / "bom.log"
    log.write_bytes(b"\xff\xfe" + SAMPLE.read_bytes())
    res = cli("analyze", "-q", str(log))
    assert res.returncode == 1, res.stdout.decode()
    assert "OOM102" in res.stdout.decode()
    real = tmp_path / "real16.log"  # a real UTF-16 log with its BOM is still decoded
    real.write_bytes(b"\xff\xfe" + SAMPLE.read_text().encode("utf-16-le"))
    assert "OOM102" in cli("analyze", "-q", str(real)).stdout.decode()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_run_killed_by_a_signal_leaves_no_temporary_files(tmp_path, signum):
    """``yes | diagnose analyze -`` stopped by ``timeout`` (SIGTERM) left its 12 GB spool in /tmp: the worker died
    of the signal before its TemporaryDirectory was removed."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir), "DIAGNOSE_NO_CACHE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "diagnose", "analyze", "-q", "-"], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None
        proc.stdin.write(SAMPLE.read_bytes() * 800)  # 4.5 MB, more than one read; the pipe stays open
        proc.stdin.flush()
        wait_for_file(tmpdir)
        proc.send_signal(signum)
        proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -signum  # it still dies the way it was told to
    assert list(tmpdir.iterdir()) == []


def test_tui_refuses_binary_on_stdin_instead_of_spooling_it_forever(tmp_path):
    """``diagnose tui - < /dev/zero`` copied zeros into the temporary folder until the disk was full (2 GB in 5 s),
    with no size bound and no binary check; ``analyze -`` refuses the same input after 64 KiB."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    primary, secondary = pty.openpty()  # the TUI wants a terminal on stdout before it reads stdin
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir), "NO_COLOR": "1"}
    try:
        with open("/dev/zero", "rb") as zero:
            proc = subprocess.Popen([sys.executable, "-m", "diagnose", "tui", "-"], cwd=ROOT, env=env,
                                    stdin=zero, stdout=secondary, stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    finally:
        os.close(primary)
        os.close(secondary)
    text = err.decode("utf-8", "replace")
    assert proc.returncode == 2, text
    assert "binary data" in text and len(text.strip().splitlines()) == 1, text
    assert list(tmpdir.iterdir()) == []


def test_a_gpu_memory_too_large_for_a_float_is_a_one_line_error():
    """``--gpu-memory`` of 5000 nines: float() gives inf, int(round(inf)) raised OverflowError (internal error)."""
    huge = "9" * 5000 + "GiB"
    one_line_error(cli("analyze", "-q", "--gpu-memory", huge, str(SAMPLE)), "--gpu-memory", "not a memory size")
    one_line_error(cli("check", "examples/run_config.yaml", "--gpus", "8", "--gpu-memory", huge), "--gpu-memory")


@pytest.mark.parametrize("command", [["rules", "show", "OOM102"], ["analyze", str(SAMPLE)]])
def test_a_huge_columns_value_neither_hangs_nor_eats_memory(command):
    """COLUMNS=999999999: rich laid the report out a billion columns wide; ``analyze`` took 51 s and 1 GiB of
    memory, ``rules show`` did not end within a minute. The width is capped."""
    res = cli(*command, env_extra={"COLUMNS": "999999999"}, timeout_s=30)
    assert res.returncode in (0, 1), res.stderr.decode()
    assert max(len(line) for line in res.stdout.decode().splitlines()) <= 10_000


def test_a_config_file_that_is_not_utf8_is_named_in_the_error(tmp_path):
    """A pyproject.toml starting with a UTF-16 BOM: "'utf-8' codec can't decode byte 0xff in position 0", no file
    named (tomllib raises UnicodeDecodeError, which is not a TOMLDecodeError)."""
    (tmp_path / "pyproject.toml").write_bytes(b"\xff\xfe[tool.diagnose]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    env.pop("DIAGNOSE_NO_CONFIG", None)
    res = subprocess.run([sys.executable, "-m", "diagnose", "analyze", "-q", str(SAMPLE)], capture_output=True,
                         timeout=TIMEOUT, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    one_line_error(res, "pyproject.toml", "not UTF-8")


def _limited_memory():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # before the fix /dev/zero grew to 24 GB


@pytest.mark.parametrize("command", [["check", "/dev/zero", "--gpus", "8"], ["replay", "/dev/zero"]])
def test_a_device_as_the_config_is_refused_not_read_forever(command):
    """``check /dev/zero`` read the device whole: 24 GB of memory in 55 s, then the OOM killer."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    res = subprocess.run([sys.executable, "-m", "diagnose", *command], capture_output=True, timeout=TIMEOUT,
                         cwd=ROOT, env=env, stdin=subprocess.DEVNULL, preexec_fn=_limited_memory)
    one_line_error(res, "/dev/zero", "device")


def test_a_fifo_config_without_a_writer_is_a_one_line_error(tmp_path):
    """``check FIFO`` with nobody writing blocked in open() for ever."""
    fifo = tmp_path / "run_config.yaml"
    os.mkfifo(fifo)
    one_line_error(cli("check", str(fifo), "--gpus", "8", timeout_s=40), "FIFO", "no writer")


def test_replay_reads_a_config_from_process_substitution(tmp_path):
    """``diagnose replay <(cat run_config.yaml)``: the log sniffing read the pipe first, so the config was empty
    ("63 is not a Megatron-Bridge config"); ``check`` read it once and worked."""
    import threading

    fifo = tmp_path / "63"
    os.mkfifo(fifo)
    text = (ROOT / "examples" / "run_config.yaml").read_bytes()

    def writer():
        with open(fifo, "wb") as fh:
            fh.write(text)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    res = cli("replay", str(fifo))
    thread.join(timeout=5)
    assert res.returncode == 0, res.stderr.decode()
    assert "passes validation" in res.stdout.decode()


def test_a_worker_killed_by_sigkill_ends_without_a_traceback():
    """The OOM killer's SIGKILL of the worker made the supervising parent print a traceback (``signal.signal`` on
    SIGKILL raises OSError) instead of dying of the same signal."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "diagnose", "analyze", "-q", "-"], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        end = time.monotonic() + 30
        while not children.read_text().split() and time.monotonic() < end:
            time.sleep(0.05)
        worker = int(children.read_text().split()[0])
        os.kill(worker, signal.SIGKILL)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert b"Traceback" not in err, err.decode()


@pytest.mark.parametrize("kind", ["device", "fifo", "huge"])
def test_a_rules_file_that_is_not_a_plain_small_file_is_refused(tmp_path, kind):
    """A ``--rules`` folder whose ``x.toml`` links to /dev/zero was read until memory ran out (MemoryError under a
    3 GiB limit, the machine's memory without one); a FIFO named ``x.toml`` blocked for ever; a 300 MB one took
    25 s and 1.2 GiB."""
    rules = tmp_path / "rules"
    rules.mkdir()
    target = rules / "x.toml"
    if kind == "device":
        target.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.write_text('x = "' + "a" * (17 << 20) + '"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "DIAGNOSE_NO_CONFIG": "1"}
    res = subprocess.run([sys.executable, "-m", "diagnose", "analyze", "-q", "--rules", str(rules), str(SAMPLE)],
                         capture_output=True, timeout=40, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                         preexec_fn=_limited_memory)
    one_line_error(res, "x.toml", "cannot read")


def test_verify_refuses_an_empty_log_as_analyze_does(tmp_path):
    """``verify empty.log`` printed a full verdict ("No failure in the log: PASS", then FAIL for no iteration),
    exit 1; ``analyze`` and the TUI call the same input a usage error (exit 2)."""
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    one_line_error(cli("verify", str(empty)), "empty.log", "0 bytes")


@pytest.mark.parametrize("name", ["run_config.yaml", "mlm_args.txt"])
def test_a_utf16_config_is_read_like_a_utf16_log(tmp_path, name):
    """A config Notepad saved as "Unicode" (UTF-16 with a BOM) or PowerShell's ``>`` wrote: "not valid YAML:
    special characters are not allowed", exit 2, while the same encoding of a log is decoded."""
    text = (ROOT / "examples" / name).read_text()
    config = tmp_path / name
    config.write_bytes(b"\xff\xfe" + text.encode("utf-16-le"))
    plain = cli("check", str(ROOT / "examples" / name), "--gpus", "8")
    res = cli("check", str(config), "--gpus", "8")
    assert res.returncode == plain.returncode, res.stderr.decode()
    assert res.stdout.decode().splitlines()[-1] == plain.stdout.decode().splitlines()[-1]
