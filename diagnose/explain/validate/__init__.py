"""The validator: Megatron-Bridge's ``ConfigContainer.validate()`` and ``_ddp_wrap`` checks, mirrored per release.

``validate(view, bridge_version=None) -> list[Violation]`` returns what would make the job fail (hard errors),
in a stable order; ``run_checks`` also returns the notes (settings the real code silently auto-fixes and prints).
With ``real_mcore=True`` (the default) and megatron-core importable, megatron-core's own
``DistributedDataParallelConfig``, ``OptimizerConfig`` and ``TransformerConfig`` are built from the view and what
their ``__post_init__`` raises is added as violations with check names ``mcore:<Class>``; a duplicate of a
mirrored check with the same message is dropped.

Release families (``diagnose.explain.config.releases``): "old" (Megatron-Bridge <= 0.4.x), "new" (0.5.0-0.6.x, also
used when the release is unknown) and "latest" (>= 0.7.0: no ``dist.use_megatron_fsdp``); every result says which
it assumed (``assumed_release``).
"""

from __future__ import annotations

from diagnose.configview import ConfigView
from diagnose.explain.config.releases import assumed_release
from diagnose.explain.validate import checks_fsdp as _checks_fsdp  # noqa: F401 - registers checks
from diagnose.explain.validate import checks_keys as _checks_keys  # noqa: F401 - registers checks
from diagnose.explain.validate import checks_moe as _checks_moe  # noqa: F401 - registers checks
from diagnose.explain.validate import checks_parallel as _checks_parallel  # noqa: F401 - registers checks
from diagnose.explain.validate import checks_pipeline as _checks_pipeline  # noqa: F401 - registers checks
from diagnose.explain.validate import checks_precision as _checks_precision  # noqa: F401 - registers checks
from diagnose.explain.validate.registry import CHECKS, CheckContext, make_context
from diagnose.explained import ValidationResult, Violation

__all__ = ["Violation", "ValidationResult", "validate", "run_checks", "CHECKS", "CheckContext", "BACKGROUND"]


BACKGROUND = "background"  # real_mcore=BACKGROUND: megatron-core's answer if cached, else computed in the background


def run_checks(view: ConfigView, bridge_version: str | None = None,
               real_mcore: bool | str = True) -> ValidationResult:
    """Run every registered check for the view's framework (and the real megatron-core classes if asked; with
    ``BACKGROUND`` only when their answer for this config is cached: see ``mcore.check_with_mcore``)."""
    ctx = make_context(view, bridge_version)
    result = ValidationResult(family=ctx.family,
                              assumed_release=assumed_release(ctx.version_text, ctx.framework))
    for spec in CHECKS:
        if ctx.framework not in spec.frameworks:
            continue
        for v in spec.fn(ctx):
            v.source = v.source or spec.source
            (result.notes if v.kind == "note" else result.violations).append(v)
    if real_mcore:
        from diagnose.explain.validate import mcore

        found = mcore.check_with_mcore(view, wait=real_mcore != BACKGROUND)
        if found is not None:
            result.mcore_checked = True
            mirrored = {v.message for v in result.violations}
            result.violations.extend(v for v in found if v.message not in mirrored)
    return result


def validate(view: ConfigView, bridge_version: str | None = None,
             real_mcore: bool | str = True) -> list[Violation]:
    """The hard violations the job's config (as in ``view``) would hit, for ``bridge_version`` (default: the
    view's version, else the latest family). Never raises on odd values; unknown values skip their checks."""
    return run_checks(view, bridge_version, real_mcore).violations
