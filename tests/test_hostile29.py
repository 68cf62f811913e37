"""Round 29 of hostile use, through the real command line (docs/qa-report-5.md).

Each test failed before its fix: a closed pipe (``| head -1``, ``| true``) changed the exit code of every command
but ``analyze`` (``rules list`` and a passing ``check`` exited 1, a failing ``replay`` 0), and SIGINT sent to the
process (``kill -INT``, ``timeout -s INT``, a notebook's interrupt button) was ignored: the supervising parent
ignored it, expecting the terminal to deliver ^C to its worker too, so a run waiting on a pipe never stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for_file

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_logs" / "ddp_wrap_oom.log"
TIMEOUT = 60


def _env(**extra: str) -> dict:
    return {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "COLUMNS": "120", "DIAGNOSE_SKIP_SLURM": "1",
            **extra}


def exit_code(*args: str) -> int:
    return subprocess.run([sys.executable, "-m", "diagnose", *args], cwd=ROOT, env=_env(), timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def exit_code_reader_gone(*args: str) -> tuple[int, str]:
    """Run with standard output a pipe whose reader has already gone (``| true``): every write gets EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        res = subprocess.run([sys.executable, "-m", "diagnose", *args], cwd=ROOT, env=_env(), timeout=TIMEOUT,
                             stdin=subprocess.DEVNULL, stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    return res.returncode, res.stderr.decode("utf-8", "replace")


@pytest.mark.parametrize("args, expected", [
    (("rules", "list"), 0),
    (("rules", "show", "MB101"), 0),
    (("check", "examples/mlm_args.txt", "--gpus", "8"), 0),  # validates and fits
    (("replay", "examples/run_config.yaml", "--set", "ddp.use_megatron_fsdp=true"), 1),  # needs more than that
    (("analyze", "-q", "sample_logs/ddp_wrap_oom.log"), 1),  # fixed in round 3, kept
])
def test_a_closed_pipe_keeps_the_commands_own_exit_code(args, expected):
    assert exit_code(*args) == expected  # the answer without a pipe
    code, err = exit_code_reader_gone(*args)
    assert code == expected, err
    assert err == "", err  # nothing said about the pipe: the reader chose to stop


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the supervising fork is Linux/POSIX only")
def test_sigint_sent_to_the_process_stops_it_with_one_line(tmp_path):
    """``kill -INT <pid>`` of ``diagnose analyze -`` waiting on an open pipe: before, the parent ignored SIGINT and
    the worker never got it (the run went on forever); now it stops, says so in one line, and exits 130."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "diagnose", "analyze", "-q", "-"], cwd=ROOT,
                            env=_env(TMPDIR=str(tmpdir), DIAGNOSE_NO_CACHE="1"),
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None
        proc.stdin.write(SAMPLE.read_bytes() * 800)  # 4.5 MB, more than one read; the pipe stays open
        proc.stdin.flush()
        wait_for_file(tmpdir)  # the worker is spooling stdin, inside the command
        proc.send_signal(signal.SIGINT)  # to the parent only, as kill -INT does
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = err.decode("utf-8", "replace")
    assert proc.returncode == 130, (proc.returncode, text)
    assert text.strip() == "diagnose: interrupted", text
    assert list(tmpdir.iterdir()) == []  # and its spool is gone


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the supervising fork is Linux/POSIX only")
def test_a_run_started_with_sigint_ignored_keeps_ignoring_it(tmp_path):
    """A command started in the background of a script (``diagnose analyze ... &``: SIGINT ignored, as POSIX shells
    do) is not interrupted by a SIGINT: the forwarding above must not undo the ignore it inherited."""
    proc = subprocess.Popen([sys.executable, "-m", "diagnose", "analyze", "-q", "-"], cwd=ROOT,
                            env=_env(TMPDIR=str(tmp_path), DIAGNOSE_NO_CACHE="1"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdin is not None
        proc.stdin.write(SAMPLE.read_bytes() * 800)
        proc.stdin.flush()
        wait_for_file(tmp_path)
        proc.send_signal(signal.SIGINT)
        for pid in _children(proc.pid):
            os.kill(pid, signal.SIGINT)  # the worker too, as a terminal's ^C would
        out, err = proc.communicate(timeout=TIMEOUT)  # closes stdin: the log ends there
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err.decode()  # the diagnosis, unaffected
    assert b"OOM102" in out


# ------------------------------------------------------------------------------------------ a config as JSON


def _json_config(tmp_path: Path, blend: int = 0, name: str = "cfg.json") -> Path:
    import json

    import yaml

    cfg = yaml.safe_load((ROOT / "examples" / "run_config.yaml").read_text())
    if blend:
        cfg["dataset"] = {**(cfg.get("dataset") or {}), "blend": [f"/data/shard_{i:07d}" for i in range(blend)]}
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def test_a_json_config_is_parsed_by_the_json_parser(tmp_path, monkeypatch):
    """``check cfg.json`` with a 450,000-path dataset blend (6.7 MB) took 30 s and 440 MiB in PyYAML's pure-Python
    parser, and a 9 MB one 29 s just to be refused: a JSON document now goes through the C JSON parser, with the
    same answer as the same config in YAML (below)."""
    from diagnose.explain.config import safe_yaml
    from diagnose.explain.config.extract import load_config
    from diagnose.model import DiagnoseError

    big = _json_config(tmp_path, blend=450_000)

    def no_yaml(*_a, **_k):
        raise AssertionError("the JSON config went through PyYAML")

    monkeypatch.setattr(safe_yaml.InertSafeLoader, "get_single_node", no_yaml)
    config = load_config(str(big))
    assert config.values["model.num_layers"].value == 32

    too_big = _json_config(tmp_path, blend=600_000, name="too_big.json")
    with pytest.raises(DiagnoseError, match="more than 500000 nodes"):
        load_config(str(too_big))


def test_a_json_config_reads_as_its_yaml_twin(tmp_path):
    import json

    import yaml

    from diagnose.explain.config.extract import load_config

    as_json = _json_config(tmp_path)
    as_yaml = tmp_path / "cfg.yaml"
    as_yaml.write_text(yaml.safe_dump(json.loads(as_json.read_text())))
    from_json, from_yaml = load_config(str(as_json)), load_config(str(as_yaml))
    assert {k: v.value for k, v in from_json.values.items()} == {k: v.value for k, v in from_yaml.values.items()}
    assert len(from_json.values) > 50


def test_json_configs_the_yaml_path_still_speaks_for(tmp_path):
    """A key given twice (its line), NaN (not JSON), and a 5000-digit integer get the YAML loader's answers."""
    from diagnose.explain.config.safe_yaml import safe_load
    from diagnose.model import DiagnoseError

    with pytest.raises(DiagnoseError, match="duplicate key 'a' at line 3"):
        safe_load('{\n"a": 1,\n"a": 2}', strict_keys=True)
    assert safe_load('{"a": 1, "a": 2}') == {"a": 2}  # not strict: the last one wins, as in YAML
    assert safe_load('{"x": NaN}') == {"x": "NaN"}  # YAML's reading, not a float nan
    with pytest.raises(DiagnoseError, match="cfg"):
        safe_load('{"n": ' + "9" * 5000 + "}", what="cfg")
    assert safe_load('{"a": [1, 2.5, true, null, "s"]}') == {"a": [1, 2.5, True, None, "s"]}


# ------------------------------------------------------------------------------ a followed log cut shorter

_FOLLOW_TRUNCATED = r"""
import sys, time
from diagnose.present.tui.logindex import LogIndex
path = sys.argv[1]
index = LogIndex(path).start()
assert index.done.wait(20)
assert index.start_following(poll_s=0.01) is None
with open(path, "ab") as fh:
    fh.write(b"appended while followed\n")  # the index now reads the file through its own map
deadline = time.monotonic() + 20
while index.line_count < 40_001 and time.monotonic() < deadline:
    time.sleep(0.01)
open(path, "wb").close()  # copytruncate: the file is cut to nothing under the open map
time.sleep(0.5)  # the follow thread sees it
for i in range(index.line_count):  # what the log view draws, top to bottom
    index.line_text(i)
with open(path, "ab") as fh:
    fh.write(b"the job goes on\n")
deadline = time.monotonic() + 20
while index.line_count != 1 and time.monotonic() < deadline:
    time.sleep(0.01)
print(index.line_count, index.following, index.line_text(0))
"""


def test_a_followed_log_cut_shorter_is_read_again_not_a_crash(tmp_path):
    """``diagnose tui --follow job.log`` and logrotate's copytruncate: following stopped ("the file shrank") but
    the old lines stayed, read through a map of the file; drawing them (scrolling up, Home) touched pages the
    file no longer has: SIGBUS, the TUI gone. Now the file is read again from its start and followed on."""
    log = tmp_path / "job.log"
    log.write_bytes(b"".join(b"[rank0]: iteration %d of a job being followed\n" % i for i in range(40_000)))
    res = subprocess.run([sys.executable, "-c", _FOLLOW_TRUNCATED, str(log)], cwd=ROOT, env=_env(),
                         timeout=TIMEOUT, capture_output=True, text=True)
    assert res.returncode == 0, (res.returncode, res.stderr[-500:])  # before: -7 (SIGBUS)
    assert res.stdout.split(None, 2) == ["1", "True", "the job goes on\n"], res.stdout
