"""QA round 10 (docs/qa-report-10.md): a hostile new user of the commands past ``analyze``, and the answers on the
newest dev logs (``ce-`` .. ``ch-``).

Each test failed on the tree before its fix. Output tests run the real command line (``python -m diagnose``) as a
subprocess; catalogue tests read ``load_catalogue()``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "run_config.yaml"


def run(*args: str, code: tuple[int, ...] = (0, 1), cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160", "DIAGNOSE_SKIP_SLURM": "1",
           "DIAGNOSE_NO_CONFIG": "1"}
    proc = subprocess.run([sys.executable, "-m", "diagnose", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=180)
    assert proc.returncode in code, proc.stderr
    return proc


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _config_with(tmp_path: Path, key: str, value: str) -> Path:
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    out = [f"  {key}: {value}" if line.startswith(f"  {key}:") else line for line in lines]
    assert out != lines
    return write(tmp_path, "run_config.yaml", "\n".join(out) + "\n")


@pytest.mark.parametrize(("key", "value"), [("seq_length", "0"), ("vocab_size", "-1"),
                                            ("hidden_size", "99999999999999999999999999")])
def test_check_refuses_a_size_that_is_zero_negative_or_past_any_model(tmp_path: Path, key: str, value: str) -> None:
    """A seq_length of 0 was planned as 4,096 and a vocab_size of -1 as 32,000, silently; a hidden_size of 1e26
    printed a table of 45-digit figures. Each is now one line naming the key, exit 2."""
    proc = run("check", str(_config_with(tmp_path, key, value)), "--gpus", "8", code=(2,))
    assert proc.stdout == ""
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and f"model.{key}=" in err and "Traceback" not in err


def _immutable(path: Path) -> bool:
    """Make ``path`` unwritable even for root (chattr +i); False where that cannot be done here."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        path.parent.chmod(0o555)
        return True
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def test_fleet_scan_into_a_store_that_cannot_be_written_is_one_line_before_the_scan(tmp_path: Path) -> None:
    """A read-only store was opened, every log analysed, then the first commit failed with "internal error:
    OperationalError: attempt to write a readonly database". It is now refused at once, in words, and the report
    still reads it."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write(logs, "a.log", "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"
                         "RuntimeError: shard 7 is truncated\n")
    store = tmp_path / "store" / "fleet.db"
    store.parent.mkdir()
    run("fleet", "scan", str(logs), "--store", str(store), code=(0,))
    write(logs, "b.log", "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"
                         "ValueError: another failure\n")
    if not _immutable(store):
        pytest.skip("no way to make a file unwritable here")
    try:
        proc = run("fleet", "scan", str(logs), "--store", str(store), code=(2,))
        err = proc.stderr.strip().splitlines()[-1]
        assert "internal error" not in err and "cannot be written" in err, proc.stderr
        assert "1/1 jobs" not in proc.stderr  # refused before analysing anything
        assert run("fleet", "report", "--store", str(store), code=(0, 1)).stdout.startswith("FLEET REPORT")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(store)], capture_output=True)
        else:
            store.parent.chmod(0o755)
