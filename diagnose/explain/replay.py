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
from dataclasses import dataclass, field
from typing import Any

from diagnose.explain.config.overrides import apply_overrides, is_delete, normalize_overrides
from diagnose.explain.config.view import ConfigView
from diagnose.explain.fix_search import search_fix
from diagnose.explain.render import render_fix  # the one renderer (see its docstring for the quoting)
from diagnose.explain.validate import ValidationResult, Violation
from diagnose.explain.validate import run_checks as _run_checks
from diagnose.model import Finding, Override

MAX_ROUNDS = 8
# failures the validator can reproduce (a config check prints them); others (OOM, NCCL, ...) only get their fix proven
CONFIG_CATEGORIES = {"config_validation", "fsdp_config", "checkpoint_format"}


@dataclass
class ReplayResult:
    reproduced: bool | None
    before: ValidationResult  # the config as the job had it
    fix: list[Override]
    after: ValidationResult
    added: list[Override] = field(default_factory=list)  # what the extension added to the requested fix
    requested: ValidationResult | None = None  # the config with only the requested overrides
    framework: str | None = None
    rule: str | None = None
    implied: bool = False  # the config came only from what an error message states
    category: str | None = None  # the finding's category (a CUDA OOM is no config check to reproduce)
    fits: bool | None = None  # capacity OOM: whether the fix fits per the memory model (None: not a memory question)
    fit: Any = None  # diagnose.explain.fit.CapacityFit when the fix is the memory model's option
    config_known: bool = False  # the job's own settings were read (a dump, arguments, a file), not just defaults
    gpus_per_node: int | None = None  # the job's node size (SLURM_GPUS_ON_NODE) for the launch lines; None: 8

    def render(self) -> dict[str, str]:
        return render_fix(self.fix, self.framework, self.gpus_per_node)

    @property
    def passes(self) -> bool:
        return self.after.passes

    def to_dict(self) -> dict[str, Any]:
        """The report's ``replay`` section (issue 3 schema, plus ``rule``, ``extended``, ``notes``, ``proven``)."""
        out: dict[str, Any] = {
            "reproduced": self.reproduced,
            "violations": [v.to_dict() for v in self.before.violations],
            "fix": [{"key": o.key, "value": None if is_delete(o) else o.value} for o in self.fix],
            "after_fix": {"violations": [v.to_dict() for v in self.after.violations], "passes": self.passes},
            "render": self.render(),
        }
        if self.before.assumed_release:
            out["assumed_release"] = self.before.assumed_release
        if self.rule:
            out["rule"] = self.rule
            # proven only against the job's own config; against release defaults it is not a proof
            out["proven"] = (self.passes and bool(self.fix)) if self.reproduced is not None else None
        if self.implied:
            out["implied"] = True
        out["fits"] = self.fits
        if self.category and self.category not in CONFIG_CATEGORIES:
            out["category"] = self.category
        if self.fit is not None:
            out["fit"] = self.fit.to_dict()
        if self.added:
            out["extended"] = [{"key": o.key, "value": None if is_delete(o) else o.value} for o in self.added]
        notes = [v.message for v in self.after.notes]
        if notes:
            out["notes"] = notes
        out["summary"] = describe(out, self.config_known)
        return out


def describe(section: dict[str, Any], config_known: bool = False) -> str:
    """One line for people: whether replay reproduced the failure and whether the fix is proven."""
    parts: list[str] = []
    reproduced = section.get("reproduced")
    violations = section.get("violations") or []
    if reproduced is True:
        how = " (from the settings the error states)" if section.get("implied") else ""
        parts.append(f"reproduced by replay{how}: " + violations[0]["message"] if violations
                     else f"reproduced by replay{how}")
    elif reproduced in (False, None) and section.get("category") and not violations and (
            reproduced is False or config_known):
        parts.append(f"the job's config passes validation (a {section['category']} failure is not a config check)")
    elif reproduced is False:
        parts.append("not reproduced by replay (the job's config passes these checks)"
                     if not violations else f"replay finds {len(violations)} other violation(s)")
    elif section.get("implied"):
        parts.append("config not in the log: replay checked the fix against the settings the error states")
    elif config_known:
        parts.append("replay checked the fix against the job's config (release defaults for what it does not set)")
    else:
        parts.append("config not in the log: replay checked the fix against release defaults only")
    render = (section.get("render") or {}).get("cli") or ""
    env = (section.get("render") or {}).get("env") or ""
    shown = " ".join(x for x in (render, env.replace("\n", "; ")) if x)
    if section.get("fix"):
        ok = (section.get("after_fix") or {}).get("passes")
        verdict = "proven to pass validation" if ok and reproduced is not None else (
            "passes validation" if ok else "still fails validation")
        fit = section.get("fit") or {}
        fits = section.get("fits")
        if fits is True:
            gpus = (f"needs >= {fit['gpus']} GPUs ({fit.get('layout') or 'DP ' + str(fit.get('dp') or fit['gpus'])}; "
                    f"the job ran on {fit['job_gpus']}), " if fit.get("gpus") and fit.get("job_gpus")
                    and fit["gpus"] > fit["job_gpus"] else "")
            peak = (f"predicted peak {_gib(fit.get('peak_bytes'))} per GPU of {_gib(fit.get('capacity_bytes'))}"
                    if fit.get("peak_bytes") else
                    "the reserved-but-unallocated memory would have served the request")
            verdict = f"{'valid' if ok else 'INVALID'} and fits: {gpus}{peak}"
        elif fits is None and (fit.get("notes") or []):
            verdict += f"; memory: {fit['notes'][0]}"
        elif fits is False:
            need = fit.get("peak_bytes")
            verdict = (f"{'valid' if ok else 'INVALID'} but does not fit: "
                       + (f"{_gib(need)} per GPU" if need else "the memory model finds nothing that fits")
                       + f" (GPU holds {_gib(fit.get('capacity_bytes'))})")
        parts.append(f"fix {verdict}: {shown}")
    return "; ".join(parts)


def _gib(n: Any) -> str:
    return f"{n / 1024 ** 3:.1f} GiB" if isinstance(n, (int, float)) and not isinstance(n, bool) else "?"


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
    return ReplayResult(
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
        gpus_per_node=_node_size(view),
    )


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
    from diagnose.explain.config.implied import stated_checks

    checks = stated_checks(finding)
    texts = [_plain(e.text) for e in finding.evidence] + [_plain(finding.title)]
    out = []
    for v in before.violations:
        core = _plain(v.message).rstrip(".!")
        if v.check in checks or (core and any(core in t for t in texts)):
            out.append(v)
    return out


def _matches(before: ValidationResult, finding: Finding) -> bool:
    return bool(_matching(before, finding))


def deciding_keys(finding: Finding | None) -> list[str]:
    """The keys that decide whether the validator can reproduce a finding: the settings its error message states
    (``implied``), else the keys its fix changes."""
    if finding is None:
        return []
    from diagnose.explain.config.implied import implied_view

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
    if _matches(before, finding):
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
