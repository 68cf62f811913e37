"""``diagnose verify``: did a run that finished really train with Megatron FSDP, as NVIDIA's Megatron FSDP skill
defines success? Every check reads the log's own lines (``facts``) and the config recovered from it, and says
``pass``, ``fail``, ``warn`` (it worked, with a performance-relevant fallback), ``unknown`` (the log does not say)
or ``skip`` (does not apply: e.g. FSDP-only settings when FSDP was not active), with the evidence line it decided on.

Checks, in order:
- ``no_failure``: the log shows no failure (the analyze root cause);
- ``megatron_fsdp_active``: the wrapper built is Megatron FSDP (the module that logged ``Setting up
  DistributedDataParallel``); "FSDP requested in the config but DistributedDataParallel built" is a fail naming both
  lines; reports the sharding strategy (from the wrapper's config repr) and the DP size;
- ``sharding_strategy``: ``optim_grads_params`` (the skill's setting) or a warn;
- ``loss_finite``: an iteration line reached the run's last iteration and no loss was NaN/Inf;
- ``checkpoint_fsdp_dtensor``: a checkpoint was saved, in ``fsdp_dtensor`` (no checkpoint-format assertion);
- ``te_apex``: Transformer Engine / Apex present (warn when megatron-core fell back);
- ``cuda_device_max_connections``: FSDP with TP/CP on Hopper or older wants different values (warn);
- ``keep_fp8_transpose_cache`` and ``average_in_collective``: off under Megatron FSDP (warn).
``VerifyResult.passes`` is True when no check fails or is unknown (warnings do not fail; ``strict`` makes them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnose.explain.verify import facts as facts  # noqa: PLC0414 - the capture specs' module
from diagnose.model import Block, Evidence, Report

VERIFY_SCHEMA = "diagnose/verify@1"
VERDICTS = ("pass", "fail", "warn", "unknown", "skip")


@dataclass
class Check:
    name: str
    title: str
    verdict: str  # pass | fail | warn | unknown | skip
    detail: str
    evidence: list[Evidence] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "verdict": self.verdict, "detail": self.detail,
                "evidence": [{"path": e.path, "line": e.line, "text": e.text} for e in self.evidence]}


@dataclass
class VerifyResult:
    checks: list[Check] = field(default_factory=list)
    wrapper: str | None = None  # "megatron_fsdp" | "ddp" | None (no wrapper line: Torch FSDP2 logs none)
    sharding_strategy: str | None = None
    dp_size: int | None = None
    last_iteration: int | None = None
    train_iters: int | None = None
    checkpoint_format: str | None = None
    release: str = ""
    strict: bool = False

    @property
    def passes(self) -> bool:
        bad = {"fail", "unknown", "warn"} if self.strict else {"fail", "unknown"}
        return not any(c.verdict in bad for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.verdict == "fail"]

    def to_dict(self) -> dict[str, Any]:
        counts = {v: sum(c.verdict == v for c in self.checks) for v in VERDICTS}
        return {
            "passes": self.passes,
            "failed": self.failed,
            "counts": counts,
            "run": {"wrapper": self.wrapper, "sharding_strategy": self.sharding_strategy, "dp_size": self.dp_size,
                    "last_iteration": self.last_iteration, "train_iters": self.train_iters,
                    "checkpoint_format": self.checkpoint_format},
            "assumed_release": self.release,
            "checks": [c.to_dict() for c in self.checks],
        }


def verify(report: Report, blocks: dict[str, list[Block]] | None, view: Any = None,
           strict: bool = False) -> VerifyResult:
    """Run every check on one scanned log (its report, captured blocks and config view)."""
    from diagnose.explain.verify.checks import CHECKS, Facts

    f = Facts.collect(report, blocks or {}, view)
    result = VerifyResult(strict=strict, release=f.release)
    for fn in CHECKS:
        result.checks.append(fn(f))
    result.wrapper, result.sharding_strategy, result.dp_size = f.wrapper, f.strategy, f.dp_size
    result.last_iteration, result.train_iters = f.last_iteration, f.train_iters
    result.checkpoint_format = f.saved_format
    return result

