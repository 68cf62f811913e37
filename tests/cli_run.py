"""The real command line for the QA rounds' tests: ``python -m diagnose`` in a subprocess with this tree's code,
no user config and no Slurm lookup, so each test reads what a user's terminal would print."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, code: tuple[int, ...] = (0, 1), cwd: Path = ROOT,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``env``: variables added for this run (e.g. the ones Slurm gives an epilog)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160", "DIAGNOSE_SKIP_SLURM": "1",
           "DIAGNOSE_NO_CONFIG": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "diagnose", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=180)
    assert proc.returncode in code, proc.stderr
    return proc


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def root_finding(tmp_path: Path, text: str) -> dict:
    """The root cause's finding of ``analyze --format json`` on ``text`` written as a log; a failure must have one."""
    report = json.loads(run("analyze", "--format", "json", str(write(tmp_path, "job.log", text))).stdout)
    assert report["root_cause"] is not None
    return report["findings"][report["root_cause"]]


def finding_words(finding: dict) -> str:
    """Every word a user reads of a finding: title, explanation, the fix's summary and steps."""
    fix = finding["fix"]
    return " ".join([finding["title"], finding["explanation"], fix["summary"], *fix.get("steps", [])])
