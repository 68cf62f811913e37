"""qa-report-8 L6: a collective timeout's step names the knob of every stack it lists, Lightning's too: the
strategy's ``timeout`` (``DDPStrategy(timeout=timedelta(...))``, which Lightning passes to init_process_group;
FSDPStrategy takes the same argument), as read in Lightning's source (lightning_fabric/strategies/ddp.py)."""

from __future__ import annotations

import pytest

from diagnose.match import match_text


def _watchdog(seq: int, numel: int) -> str:
    return (f"[E ProcessGroupNCCL.cpp:475] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL("
            f"SeqNum={seq}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=1800000) ran for "
            "1801214 milliseconds before timing out.\n")


@pytest.mark.parametrize("seq, numel, rule", [(17, 1, "NC002"), (52000, 1048576, "NC001")])
def test_the_timeout_step_names_lightnings_strategy_timeout(builtin_catalogue, seq, numel, rule):
    report = match_text(_watchdog(seq, numel), builtin_catalogue)
    root = report.root
    assert root is not None and root.rule == rule
    step = next(s for s in root.fix.steps if "collective timeout" in s)
    assert "DDPStrategy(timeout=timedelta(" in step
    assert "ddp_timeout" in step and "--distributed-timeout-minutes" in step  # the other stacks' knobs stay
