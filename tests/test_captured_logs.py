"""The real captures are complete, honest about where they come from, and machine-neutral.

sample_logs/captured/ holds the captures that diagnose gets right (their diagnoses are checked by
tests/test_sample_logs.py); sample_logs/reproduce/pending/ holds real captures whose expected diagnosis (what really
happened) the tool does not reach yet, kept out of test_sample_logs until it does (then `git mv` them to captured/).
This file checks the capture side of both: every log has its sidecar (versions, command, what really happened) and
expected diagnosis, only the path prefixes listed by the harness were rewritten, and the rewrite keeps every other
byte.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAPTURED = ROOT / "sample_logs" / "captured"
PENDING = ROOT / "sample_logs" / "reproduce" / "pending"
LOGS = sorted(CAPTURED.glob("*.log")) + sorted(PENDING.glob("*.log"))


def _finish_module():
    spec = importlib.util.spec_from_file_location("capture_finish", ROOT / "sample_logs" / "reproduce" / "finish.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FINISH = _finish_module()


def _expected(log: Path) -> dict:
    return json.loads(log.with_name(log.stem + ".expected.json").read_text())


def test_at_least_twelve_real_failures_in_captured():
    captured = sorted(CAPTURED.glob("*.log"))
    assert len([p for p in captured if _expected(p)["root_cause"] is not None]) >= 12


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_sidecar_says_what_ran_and_what_happened(log: Path):
    meta = json.loads(log.with_name(log.stem + ".meta.json").read_text())
    assert meta["name"] == log.stem
    for key in ("machine", "python", "torch", "megatron_core", "megatron_bridge", "command", "what_happened"):
        assert isinstance(meta.get(key), str) and meta[key], key
    assert meta["megatron_core"][0].isdigit() and meta["megatron_bridge"][0].isdigit()
    assert "bridge_run.py" in meta["command"]
    assert len(meta["what_happened"]) > 40
    assert isinstance(meta["exit_status"], int)
    # The capture's exit status and its expected diagnosis agree: a run that failed has a root cause.
    expected = _expected(log)
    assert expected["source"].startswith("real: captured on ")
    assert (meta["exit_status"] == 0) == (expected["root_cause"] is None)


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_no_machine_specific_prefix_is_left(log: Path):
    text = log.read_bytes().decode("latin-1")
    for old, _ in FINISH.REWRITES:
        assert old not in text, f"{old} left in {log.name}"
    assert "/work/main" not in text


def test_captures_table_matches_the_folder():
    assert {p.stem for p in LOGS} == set(FINISH.CAPTURES)


def test_rewrite_changes_prefixes_only():
    raw = (
        '  File "/tmp/site_new/megatron/bridge/training/config.py", line 1100, in _validate\n'
        '  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/run.py", line 990\n'
        '  File "/work/main/sample_logs/reproduce/bridge_run.py", line 144, in main\n'
        "saving checkpoint at iteration 3 to /tmp/ckfull in torch_dist format \xe9\x00\n"
    )
    out = FINISH.rewrite(raw)
    assert '"/opt/venv/lib/python3.12/site-packages/megatron/bridge/training/config.py", line 1100' in out
    assert '"/opt/venv/lib/python3.12/site-packages/torch/distributed/run.py", line 990' in out
    assert '"/workspace/bridge_run.py", line 144, in main' in out
    assert out.endswith("to /tmp/ckfull in torch_dist format \xe9\x00\n")
    # Nothing but the prefixes changed: removing them from both sides gives the same text.
    strip = raw
    for old, _ in FINISH.REWRITES:
        strip = strip.replace(old, "")
    stripped_out = out.replace("/opt/venv/lib/python3.12/site-packages/", "").replace("/workspace/", "")
    assert stripped_out == strip
