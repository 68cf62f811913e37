"""The three failures the user named, from real logs captured on an H200 (../shared/real_logs), through the real
catalogue and the real CLI path: right root cause, phase, fix, and evidence pointing at the real exception line."""

from __future__ import annotations

import pytest
from conftest import REAL_LOGS

from diagnose.pipeline import AnalyzeOptions, analyze

CASES = {
    # log: (category, phase, a fix key, text of the line the root cause must point at)
    "fsdp2_pg_collection.log": ("fsdp_config", "dp_wrap", "ddp.use_megatron_fsdp",
                                "unexpected keyword argument 'pg_collection'"),
    "ddp_wrap_oom.log": ("cuda_oom", "dp_wrap", "ddp.use_megatron_fsdp", "CUDA out of memory"),
    "b062_ckpt_format_new.log": ("checkpoint_format", None, "checkpoint.ckpt_format",
                                 "AssertionError: Megatron-FSDP requires the fsdp_dtensor"),
}


def _first_line_containing(path, needle: str) -> int:
    with open(path, encoding="utf-8", errors="replace") as fh:
        for i, line in enumerate(fh, 1):
            if needle in line and "File \"" not in line:
                return i
    raise AssertionError(f"{needle!r} not in {path}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_failure_root_cause(name):
    path = REAL_LOGS / name
    if not path.exists():
        pytest.skip(f"{path} not present in this checkout")
    category, phase, fix_key, needle = CASES[name]
    report = analyze([str(path)], AnalyzeOptions(replay=False))
    root = report.root
    assert root is not None, [f.rule for f in report.findings]
    assert root.category == category, (root.rule, root.title)
    if phase is not None:
        assert root.phase == phase
    assert fix_key in {o.key for o in root.fix.overrides}
    expected_line = _first_line_containing(path, needle)
    assert expected_line in [e.line for e in root.evidence]
    assert root.first_line == expected_line
    # what torchrun printed afterwards is a consequence, not a second root
    assert all(f.role != "root" for f in report.findings[1:])
    launcher = [f for f in report.findings if f.category == "launcher" and f.severity == "error"]
    assert launcher and all(f.role == "cascade" and f.cause_of == 0 for f in launcher)
