"""The real command line for the QA rounds' tests: ``python -m diagnose`` in a subprocess with this tree's code,
no user config and no Slurm lookup, so each test reads what a user's terminal would print."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
