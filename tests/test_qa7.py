"""QA round 7: a new user reads diagnose's answers (docs/qa-report-7.md), through the real command line.

Each test failed on the tree before its fix. They assert what the answer must say or must not claim for a kind of
log, never one rule's exact words.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CAPTURED = ROOT / "sample_logs" / "captured"
TIMEOUT = 60


def run(*args: str, columns: int = 200) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "COLUMNS": str(columns),
           "DIAGNOSE_SKIP_SLURM": "1"}
    return subprocess.run([sys.executable, "-m", "diagnose", *args], cwd=ROOT, env=env, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)


# ------------------------------------------------------------------ L3: the verify section only for Megatron FSDP


@pytest.mark.parametrize("text", ["hi\n", "epoch 1: loss 0.52\nepoch 2: loss 0.41\ntraining finished\n"])
def test_a_log_without_failure_or_megatron_fsdp_gets_no_verify_section(tmp_path, text):
    """``echo hi | diagnose analyze -`` printed "VERIFY (Megatron FSDP run)" with [FAIL] lines for a log that is no
    Megatron FSDP run at all."""
    log = tmp_path / "plain.log"
    log.write_text(text)
    res = run("analyze", str(log), "--color", "never")
    assert res.returncode == 0, res.stderr
    assert "No failure found" in res.stdout
    assert "VERIFY" not in res.stdout and "[FAIL]" not in res.stdout
    payload = json.loads(run("analyze", str(log), "--format", "json").stdout)
    assert "verify" not in payload


def test_a_megatron_ddp_run_that_worked_gets_no_megatron_fsdp_checklist():
    """A plain Megatron DDP run that trained fine was shown a verify section whose FAIL lines said it was no
    Megatron FSDP run and wrote no fsdp_dtensor checkpoint: nothing it asked for."""
    res = run("analyze", str(CAPTURED / "b062_tiny_train_success.log"), "--color", "never")
    assert res.returncode == 0, res.stderr
    assert "VERIFY" not in res.stdout


def test_the_verify_command_still_checks_any_log(tmp_path):
    """Asked for, the checks still run on any log (the verify command's contract)."""
    log = tmp_path / "plain.log"
    log.write_text("hi\n")
    res = run("verify", str(log), "--format", "json")
    assert res.returncode == 1
    names = {c["name"] for c in json.loads(res.stdout)["verify"]["checks"]}
    assert {"no_failure", "megatron_fsdp_active", "loss_finite"} <= names


# ------------------------------------------------------------------ a fragmentation fix true to the OOM's numbers


def _oom_log(tmp_path: Path, request: str, free: str, cached: str) -> Path:
    line = (f"[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {request} GiB. GPU 0 has a total "
            f"capacity of 79.15 GiB of which {free} GiB is free. Including non-PyTorch memory, this process has "
            f"77.93 GiB memory in use. Of the allocated memory 74.80 GiB is allocated by PyTorch, and {cached} GiB is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    log = tmp_path / "oom.log"
    log.write_text("[rank0]: Traceback (most recent call last):\n"
                   '[rank0]:   File "train.py", line 10, in <module>\n'
                   "[rank0]:     loss.backward()\n" + line + "\n")
    return log


def _fix_and_replay(log: Path) -> str:
    res = run("analyze", str(log), "--color", "never")
    assert res.returncode == 1, res.stderr
    return res.stdout[res.stdout.index("Fix"):res.stdout.index("MEMORY")]


def test_the_fix_does_not_say_the_cache_would_have_served_a_request_larger_than_it(tmp_path):
    """1.62 GiB cached-but-unallocated and 1.21 GiB free against a 2.32 GiB request: the MEMORY section said so
    right, but the Fix line and the replay verdict said "reserved-but-unallocated memory would have served the
    request", which 1.62 GiB could not."""
    text = _fix_and_replay(_oom_log(tmp_path, "2.32", "1.21", "1.62"))
    assert "expandable_segments:True" in text
    assert "would have served the request" not in " ".join(text.split())
    assert "together" in text


def test_the_fix_still_says_so_when_the_cache_alone_held_more_than_the_request(tmp_path):
    text = _fix_and_replay(_oom_log(tmp_path, "2.50", "1.87", "3.91"))
    assert "would have served the request" in " ".join(text.split())


# ------------------------------------------------------------------ wrapping never splits a path at its hyphen


def test_wrapped_text_never_splits_dist_packages_at_its_hyphen(tmp_path):
    """"category from IF020: ... (File "/usr/lib/python3/dist-" / "packages/torch/...")": text wrapping broke a
    path at its hyphen, so the path a user copies from the report is wrong."""
    frames = "".join(f'  File "/usr/lib/python3/dist-packages/torch/distributed/fsdp/_mod{i}.py", line {i}, in '
                     f"fn{i}\n    fn{i + 1}()\n" for i in range(3))
    log = tmp_path / "assert.log"
    log.write_text("Traceback (most recent call last):\n" + frames
                   + '  File "/usr/lib/python3/dist-packages/torch/distributed/fsdp/_fsdp_extensions.py", line 99, '
                   "in _ext_pre_load_state_dict_transform\n    assert type(tensor) is ShardedTensor\nAssertionError\n")
    for columns in range(70, 131, 5):
        out = run("analyze", str(log), "--color", "never", columns=columns).stdout
        assert not re.search(r"dist-\n", out), (columns, out)
