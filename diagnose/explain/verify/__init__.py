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

from diagnose.configview import ConfigView
from diagnose.explain.verify import facts as facts  # noqa: PLC0414 - the capture specs' module
from diagnose.explained import Check, VerifyResult
from diagnose.model import Block, Report

__all__ = ["Check", "VerifyResult", "facts", "verify"]


def verify(report: Report, blocks: dict[str, list[Block]] | None, view: ConfigView | None = None,
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
    result.megatron_fsdp_run = f.fsdp or f.fsdp_requested()[0]
    return result

