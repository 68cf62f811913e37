"""A traceback behind a line prefix (a collector's, a container runtime's, kubectl's, syslog's, or one no layer knows)
is diagnosed as on a bare log, and a clean log under the same prefix stays clean (issue 14: a failed job's log never
reads "no failure found")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.present.cli import main

ROOT = Path(__file__).resolve().parent.parent
PREFIXES = [
    "",
    "Dec 17 18:09:08 node1 python[123]: ",  # syslog, journalctl short
    "2023-12-17T18:09:08.123456+00:00 node1 python[123]: ",  # journalctl short-iso-precise
    "trainer-0  | ",  # docker compose
    "[pod/train-0-abc12/trainer] ",  # kubectl logs --prefix
    "(task, pid=123) ",  # SkyPilot
    # shapes no layer knows: learned from the traceback
    "[worker-3 stdout] ",
    "pod/train-0-abc12 ",
    "I1217 18:09:08.123 ",
    "<stderr> ",
    "job.1234.0 ",
    "[2023-12-17T18:09:08Z] [node1] ",
]


def _failed(pre: str) -> str:
    return (f"{pre}step 1 loss 2.31\n{pre}Traceback (most recent call last):\n"
            f'{pre}  File "/x/train.py", line 3, in main\n{pre}    open(p)\n'
            f"{pre}FileNotFoundError: [Errno 2] No such file or directory: '/a/b'\n")


def _clean(pre: str) -> str:
    return (f"{pre}step 1 loss 2.31\n{pre}step 2 loss 2.20\n{pre}saving checkpoint: done | 3 files\n"
            f"{pre}note: Traceback (most recent call last): appears in the docs\n{pre}training finished\n")


def _analyze(tmp_path: Path, text: str, capsys) -> tuple[int, dict]:
    """``diagnose analyze`` (JSON) of a log holding ``text``: the exit code and the report."""
    log = tmp_path / "job.log"
    log.write_text(text)
    code = main(["analyze", str(log), "--format", "json", "--no-replay"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("pre", PREFIXES)
def test_traceback_behind_a_prefix_is_the_root_cause(pre, tmp_path, capsys):
    code, data = _analyze(tmp_path, _failed(pre), capsys)
    assert code == 1
    root = data["findings"][0]
    assert root["rule"] == "PY001" and root["role"] == "root"
    assert root["facts"]["exc_type"] == "FileNotFoundError"
    assert root["first_line"] == 5


@pytest.mark.parametrize("pre", PREFIXES)
def test_clean_log_behind_a_prefix_stays_clean(pre, tmp_path, capsys):
    code, data = _analyze(tmp_path, _clean(pre), capsys)
    assert code == 0
    assert data["findings"] == []


def test_interleaved_streams_each_teach_their_prefix(tmp_path, capsys):
    a, b = "[pod/a-0 out] ", "[pod/b-1 out] "
    lines = []
    for la, lb in zip(_failed(a).splitlines(), _failed(b).replace("FileNotFound", "Permission").splitlines()):
        lines += [la, lb]
    code, data = _analyze(tmp_path, "\n".join(lines) + "\n", capsys)
    assert code == 1
    assert {f["facts"].get("exc_type") for f in data["findings"]} >= {"FileNotFoundError", "PermissionError"}


def test_the_command_line_reads_a_traceback_behind_an_unknown_prefix(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(_failed("job.1234.0 "))
    env = dict(os.environ, DIAGNOSE_SKIP_SLURM="1", DIAGNOSE_NO_CACHE="1")
    done = subprocess.run([sys.executable, "-m", "diagnose", "analyze", str(log), "--format", "json"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["findings"][0]["rule"] == "PY001"
