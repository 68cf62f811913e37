"""A collective timeout that the job's own config set below the default leads NC002's fix (qa-report-11 L4).

NC002 (a watchdog timeout early in the job, no other failure) tells the user to find the rank that was still setting
up. When the config the log printed sets ``dist.distributed_timeout_minutes`` (Megatron-LM
``--distributed-timeout-minutes``) below its default of 10 minutes in both Megatron-LM and Megatron-Bridge, the short
timeout is the first thing to change: a first step of long sequences or a slow rank outlasts it with nothing wrong.
"""

from __future__ import annotations

from typing import Any

from diagnose.model import Fix, Override, Report

KEY = "dist.distributed_timeout_minutes"
DEFAULT_MINUTES = 10  # megatron.training.arguments and Megatron-Bridge's DistributedInitConfig
_RULES = ("NC002",)


def _minutes(value: Any) -> float | None:
    try:
        minutes = float(value)
    except (TypeError, ValueError):
        return None
    return minutes if minutes > 0 else None


def short_timeout_first(report: Report, view: Any) -> None:
    """Make raising the job's own short collective timeout the headline of NC002's fix; the rule's advice stays as
    the next steps."""
    root = report.root
    if root is None or root.rule not in _RULES or view is None:
        return
    from diagnose.explain.memory.from_config import set_in_job  # here: a log without NC002 never needs the model

    if not set_in_job(view, KEY):
        return
    minutes = _minutes(view.get(KEY))
    if minutes is None or minutes >= DEFAULT_MINUTES:
        return
    shown = f"{minutes:g}"
    rule = root.fix
    steps = [f"If it still times out: {rule.summary[0].lower()}{rule.summary[1:]}"] if rule.summary else []
    root.fix = Fix(
        f"Raise the collective timeout: this job set it to {shown} minutes, below the default of {DEFAULT_MINUTES} "
        "(a first step of long sequences, or one slow rank, outlasts it with nothing else wrong)",
        "safe", [Override(KEY, DEFAULT_MINUTES)], list(rule.env), steps + list(rule.steps), list(rule.other_stacks))
