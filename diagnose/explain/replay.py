"""Replay: run the job's config through the validator, apply a fix, prove it passes, extend it if it trips.

``replay(view, overrides, ...)``:
1. validate the config as the job had it; ``reproduced`` says whether that reproduces the failure
   (the finding's message is among the violations), or None when the job's config is unknown;
2. apply the overrides and validate again;
3. while violations remain (e.g. turning on Megatron FSDP with ``checkpoint.save`` set and ``ckpt_format`` still
   ``torch_dist``), search the smallest set of the violations' suggested fixes that passes, fewest keys first
   (``fix_search``; never undoing a key already in the fix), bounded by ``max_rounds`` x 8 validations;
4. render the final set as a Bridge CLI override line, Python recipe lines, YAML and, for Megatron-LM jobs, flags,
   through ``diagnose.explain.render`` (the one renderer every presenter uses; it documents the quoting).
   ``env.*`` keys are launch-script lines only (``render["env"]``: export/unset; a comment in the Python and YAML
   forms), never ``cfg.env_vars`` (Bridge applies those with ``os.environ.setdefault``: an export wins).
   ``launch.world_size`` (GPUs a fix needs) is ``render["launch"]`` and a comment line, never a Bridge override.

Beyond issue 3's schema the section carries ``rule``, ``proven``, ``implied`` (the reproduction rests on settings
the error message states), ``fits`` (bool | None: for a CUDA OOM whose memory verdict is capacity or
fragmentation, whether the fix fits per the memory model; see ``diagnose.explain.fit``) with ``fit`` (gpus, dp,
layout, job_gpus, peak_bytes, capacity_bytes, label, cost), ``extended``, ``notes`` and ``summary``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from diagnose.configview import ConfigView
from diagnose.explain.config.implied import implied_view, stated_checks
from diagnose.explain.config.overrides import apply_overrides, normalize_overrides
from diagnose.explain.fix_search import search_fix
from diagnose.explain.render import render_fix  # the one renderer (see its docstring for the quoting)
from diagnose.explain.validate import ValidationResult, Violation
from diagnose.explain.validate import run_checks as _run_checks
from diagnose.explained import ReplayResult
from diagnose.model import Finding, Override

MAX_ROUNDS = 8


def replay(
    view: ConfigView,
    overrides: Iterable[Override | str] | Mapping[str, Any] | None = None,
    bridge_version: str | None = None,
    finding: Finding | None = None,
    extend: bool = True,
    max_rounds: int = MAX_ROUNDS,
    real_mcore: bool | str = True,
    accept: Callable[[list[Override]], bool] | None = None,
) -> ReplayResult:
    """``real_mcore``: also build megatron-core's config classes (when importable and the job's config is known;
    importing megatron-core costs seconds, so callers on a hot path may turn it off). ``accept``: a further test
    the fix must pass (the memory model, for an OOM). A fix that does not pass is extended by the smallest set of
    the violations' suggested fixes that passes (``fix_search``), never by undoing a requested key."""
    version = bridge_version or view.version
    real_mcore = real_mcore if view.config_known else False

    def run_checks(v: ConfigView, ver: str | None) -> ValidationResult:
        return _run_checks(v, ver, real_mcore=real_mcore)

    before = run_checks(view, version)
    fix = _dedupe(normalize_overrides(overrides))
    after = run_checks(apply_overrides(view, fix), version) if fix else before
    requested = after
    added: list[Override] = []
    if extend and (not after.passes or (accept is not None and not accept(fix))):
        found = search_fix(fix, after, lambda ovs: run_checks(apply_overrides(view, ovs), version), accept,
                           max_candidates=max_rounds * 8)
        added = found.fix[len(fix):]
        fix, after = found.fix, found.result
    result = ReplayResult(
        reproduced=_reproduced(view, before, finding),
        before=before,
        fix=fix,
        after=after,
        added=added,
        requested=requested,
        framework=view.framework,
        implied=_implied(view, finding, before),
        rule=finding.rule if finding is not None else None,
        category=finding.category if finding is not None else None,
        config_known=view.config_known,
        rendered=render_fix(fix, view.framework, _node_size(view)),
    )
    migrated, replaced, _ = result.migrated_fix()
    if replaced:
        result.migrated_rendered = render_fix(migrated, view.framework, _node_size(view))
    return result


def _node_size(view: ConfigView) -> int | None:
    """GPUs on one of the job's nodes, when the log says it (SLURM_GPUS_ON_NODE); how many the job used per node
    (nproc_per_node) is not the node's size."""
    value = view.get("launch.gpus_per_node")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _dedupe(overrides: list[Override]) -> list[Override]:
    last: dict[str, Override] = {}
    for o in overrides:
        last.pop(o.key, None)
        last[o.key] = o
    return list(last.values())


def _plain(text: str) -> str:
    return " ".join(text.replace("`", "").lower().split())


def _matching(before: ValidationResult, finding: Finding) -> list[Violation]:
    """The violations that print the finding's own message (evidence or title, any release's wording)."""
    checks = stated_checks(finding)
    texts = [_plain(e.text) for e in finding.evidence] + [_plain(finding.title)]
    out = []
    for v in before.violations:
        core = _plain(v.message).rstrip(".!")
        if v.check in checks or (core and any(core in t for t in texts)):
            out.append(v)
    return out


def deciding_keys(finding: Finding | None) -> list[str]:
    """The keys that decide whether the validator can reproduce a finding: the settings its error message states
    (``implied``), else the keys its fix changes."""
    if finding is None:
        return []
    stated = list(implied_view([finding]).values)
    if stated:
        return stated
    return [o.key for o in finding.fix.overrides] + [f"env.{e.name}" for e in finding.fix.env]


def _from_job(view: ConfigView, key: str) -> bool:
    origin = view.origin(key)
    return bool(origin) and origin not in ("default", "override")


def _reproduced(view: ConfigView, before: ValidationResult, finding: Finding | None) -> bool | None:
    """True: the validator prints the finding's message on the job's (or the error-implied) settings. False only
    when the keys that decide it are the job's own (log, file, or stated by the error); None when they are release
    defaults (the config is not in the log): replay cannot say either way."""
    if finding is None:
        return bool(before.violations) if view.config_known else None
    if _matching(before, finding):
        return True
    keys = deciding_keys(finding)
    if keys:
        return False if all(_from_job(view, k) for k in keys) else None
    return False if view.config_known else None


def _implied(view: ConfigView, finding: Finding | None, before: ValidationResult | None = None) -> bool:
    """The settings replay relied on came (in part) from the error message rather than a config dump: the keys of
    the violations that reproduce the finding, else the keys that decide it."""
    matched = _matching(before, finding) if before is not None and finding is not None else []
    keys = [k for v in matched for k in v.keys] or deciding_keys(finding)
    if keys:
        return any((view.origin(k) or "").startswith("implied:") for k in keys)
    return not view.config_known and any(v.origin.startswith("implied:") for v in view.values.values())
