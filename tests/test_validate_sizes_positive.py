"""qa-report-4 L2: a batch or parallel size of 0 or less is refused by replay with one line naming where upstream
divides by it (it used to read as absent, and replay said "passes validation with your overrides")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "data" / "configs" / "run_config.yaml"


def _replay(*sets: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "diagnose", "replay", str(CONFIG), "--format", "json"]
    for s in sets:
        argv += ["--set", s]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env={"COLUMNS": "200",
                          "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": "/tmp"})


@pytest.mark.parametrize("setting, where", [
    ("train.micro_batch_size=0", "divides the global batch size by micro_batch_size * data_parallel_size"),
    ("train.micro_batch_size=-1", "divides the global batch size by micro_batch_size * data_parallel_size"),
    ("model.tensor_model_parallel_size=0", "get_data_parallel_size divides the world size by TP * PP * CP"),
    ("model.context_parallel_size=-2", "get_data_parallel_size divides the world size by TP * PP * CP"),
    ("train.global_batch_size=0", "asserts 'number of microbatches should be at least 1'"),
])
def test_replay_refuses_a_size_below_one(setting, where):
    done = _replay(setting)
    assert done.returncode == 1, done.stderr
    after = json.loads(done.stdout)["replay"]["after_fix"]
    key, value = setting.split("=")
    assert after["passes"] is False
    assert [v["message"] for v in after["violations"] if v["check"] == "sizes_positive"] == [
        next(m for m in [v["message"] for v in after["violations"]] if m.startswith(f"{key} is {value}: "))]
    message = after["violations"][0]["message"]
    assert message.startswith(f"{key} is {value}: it must be 1 or more (") and where in message


def test_a_positive_size_still_passes():
    done = _replay("train.micro_batch_size=2")
    assert done.returncode == 0 and json.loads(done.stdout)["replay"]["after_fix"]["passes"] is True
