"""Issue 19: what a new user and a hostile input hit, through the real command line.

Each test ran against the tree before its fix and failed there; each says which item it keeps fixed.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

from test_hostile_cli import OOM, ROOT, assert_clean_error, cli

SAMPLE = ROOT / "sample_logs" / "ddp_wrap_oom.log"


def run_shell(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "DIAGNOSE_SKIP_SLURM": "1"}
    return subprocess.run(["bash", "-c", script], capture_output=True, cwd=cwd, env=env, timeout=120)


# ---------------------------------------------------------------------------------------------- item 1


def test_item1_output_that_is_the_file_on_stdin_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(SAMPLE.read_bytes())
    res = run_shell(f'{sys.executable} -m diagnose analyze - -o job.log < job.log', tmp_path)
    assert res.returncode == 2, res.stderr
    assert b"standard input" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert log.read_bytes() == SAMPLE.read_bytes()
