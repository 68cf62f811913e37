"""The fix for a capacity OOM: the memory model's first option that fits, replayed through the validator.

A rule's fix for a capacity OOM (``shard with Megatron FSDP``) is only a direction: on the GPUs the job had it may
still not fit (36B parameters at 18 bytes/param on one GPU). When the memory model (``report.memory``, issue 4) says
the verdict is ``capacity``, the fix the user copies becomes its first option that fits, with the GPU count it
needs (``launch.world_size``, rendered as a comment, never as a Bridge override), and replay says both "valid" and
"fits". When no option fits, the rule's fix stays and replay says "valid but does not fit: N GiB per GPU".
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from diagnose.explain.config.overrides import apply_overrides
from diagnose.explain.memory import analyze_oom
from diagnose.explain.memory.analysis import fragmentation_reason
from diagnose.explain.memory.from_config import set_in_job
from diagnose.explain.memory.options import worded_label
from diagnose.explain.render import inline_fix
from diagnose.explained import CapacityFit, ReplayResult
from diagnose.memory_types import TRAINED_OVER, MemoryAnalysis, MemoryOption, MemoryPrediction
from diagnose.model import DELETE, EnvVar, Finding, Fix, Override, Report
from diagnose.units import GIB, fmt_gib

# STATE_ONLY_FIT, one rule for the fix chosen from the options (capacity_fix) and any fix sized by memory_fit: a
# fit whose activations are not sized is a fit only when the memory verdict is ``capacity`` (the model state is
# what did not fit, so a layout that holds it answers the OOM), and then every word that says "fits" says the
# activations are not counted (CapacityFit.model_state_only). Under any other verdict it is not sized (fits None).
STATE_ONLY_NOTE = ("activations not sized (no model shape in the config): the model state and its buffers fit; the "
                   "activations of a training step are not counted")


def _positive(v: int | None) -> int | None:
    return v if v is not None and v > 0 else None


def rule_fix_fit(report: Report, view: Any) -> CapacityFit | None:
    """The memory model's answer for the root CUDA OOM's own rule fix, where ``capacity_fix`` asks for it (a verdict
    other than ``capacity`` or ``fragmentation``: the rule's fix leads unless it is sized and does not fit); None
    elsewhere. Sized once: ``capacity_fix`` reads it, and replay's memory check of the same fix reuses it
    (``memory_fit_of``)."""
    memory, root = report.memory, report.root
    if memory is None or root is None or memory.verdict in ("capacity", "fragmentation"):
        return None
    return memory_fit(report, view, list(root.fix.overrides), root)


def capacity_fix(report: Report, view: Any, rule_fit: CapacityFit | None) -> CapacityFit | None:
    """The fix to replay for the root CUDA OOM when the memory verdict is ``capacity`` (or ``fragmentation``: the
    allocator setting leads), or when the rule's own fix is sized and does not fit; None otherwise. ``rule_fit``:
    ``rule_fix_fit``'s answer (None is an answer too: the rule's fix was not sized, and is not sized again)."""
    memory = report.memory
    root = report.root
    if memory is None or root is None or root.category != "cuda_oom":
        return None
    if memory.verdict == "fragmentation":
        return _fragmentation_fix(root, memory)
    refuted = ""
    if memory.verdict != "capacity":
        refuted = _refuted_rule_fix(root, rule_fit)
        if not refuted:
            return None
    current = memory.current
    job_gpus = _positive(current.gpus) if current else None
    usable = _positive(current.usable_bytes) if current else None
    capacity = _positive(memory.gpu_capacity_bytes)
    state_only_ok = memory.verdict == "capacity"  # the model state is what did not fit (STATE_ONLY_FIT)
    best = next((o for o in memory.options if o.fits and o.valid is not False and o.overrides
                 and (o.activation_bytes is not None or state_only_ok)
                 and not (capacity and (o.peak_bytes or 0) > capacity)), None)  # never a contradicted fit
    if best is not None:
        overrides = list(best.overrides)
        keys = {o.key for o in overrides}
        notes: list[str] = []
        fsdp_on = any(o.key == "ddp.use_megatron_fsdp" and o.value is True for o in overrides)
        if fsdp_on and "checkpoint.ckpt_format" not in keys and not set_in_job(view, "checkpoint.save") \
                and view is not None and view.get("checkpoint.ckpt_format") != "fsdp_dtensor":
            # whether the job saves checkpoints is not in the log; Megatron FSDP saves only fsdp_dtensor
            overrides.append(Override("checkpoint.ckpt_format", "fsdp_dtensor"))
            notes.append("checkpoint.ckpt_format=fsdp_dtensor: Megatron FSDP saves and loads only that format")
        if refuted:
            notes.append(refuted)
        state_only = best.activation_bytes is None
        if state_only:
            notes.append(STATE_ONLY_NOTE)
        gpus = _positive(best.gpus)
        if gpus and job_gpus and gpus > job_gpus:
            overrides.append(Override("launch.world_size", gpus))
        return CapacityFit(root, overrides, True, gpus, _positive(best.dp), job_gpus, _positive(best.peak_bytes),
                           capacity, usable, best.label, best.cost, notes, layout=_layout(best),
                           model_state_only=state_only)
    if refuted:
        return None  # nothing fits either: the rule's fix stays, and its replay says it does not fit
    # nothing fits: keep the rule's fix, say how much it needs per GPU
    own = list(root.fix.overrides) + [Override(f"env.{e.name}", e.value) for e in root.fix.env]
    if not own:
        return None
    peak = _peak_of(own, memory.options, job_gpus)
    if peak is None and current is None and not memory.options:
        # nothing was sized (no parameter count, no model shape): "nothing fits" would be a claim without numbers
        return CapacityFit(root, own, None, job_gpus, None, job_gpus, None, capacity, usable, root.fix.summary, "",
                           ["not sized: no parameter count in the log and no model shape in the config"])
    return CapacityFit(root, own, False, job_gpus, None, job_gpus, peak, capacity, usable,
                       root.fix.summary, "")


def _layout(option: MemoryOption) -> str:
    parts = [f"{name} {n}" for name, n in (("TP", option.tp), ("PP", option.pp), ("CP", option.cp)) if n > 1]
    return " x ".join(parts + ([f"DP {option.dp}"] if option.dp > 0 else []))


def _fragmentation_fix(root: Finding, memory: MemoryAnalysis) -> CapacityFit | None:
    """Reserved-but-unallocated memory would have served the request: the allocator setting is the fix, the rule's
    sharding advice is what to try if it still does not fit."""
    option = next((o for o in memory.options if any(x.key == "env.PYTORCH_CUDA_ALLOC_CONF" for x in o.overrides)),
                  None)
    if option is None:
        return None
    current = memory.current
    reason = fragmentation_reason(root)
    return CapacityFit(root, list(option.overrides), option.fits, _positive(option.gpus), _positive(option.dp),
                       _positive(current.gpus) if current else None, None, _positive(memory.gpu_capacity_bytes),
                       _positive(current.usable_bytes) if current else None, option.label or "expandable segments",
                       option.cost, [f"fragmentation: {reason}"], fragmentation=True, reason=reason)


def _refuted_rule_fix(root: Finding, verdict: CapacityFit | None) -> str:
    """Why the rule's own fix cannot lead when the memory model sizes it (``verdict``, from ``rule_fix_fit``) and
    finds it does not fit (an ``activations`` OOM whose micro batch 1 still overflows): a note naming it, for the
    fitting option that leads instead. "" when the rule has no fix to size, or its fix fits or cannot be sized (it
    then stays)."""
    own = list(root.fix.overrides)
    if verdict is None or verdict.fits is not False or not verdict.peak_bytes:
        return ""
    usable = f" of {fmt_gib(verdict.usable_bytes, 2)} usable" if verdict.usable_bytes else ""
    return (f"the rule's own fix ({inline_fix(own)}) does not fit by the same memory model: predicted peak "
            f"{fmt_gib(verdict.peak_bytes, 2)}{usable}")


def _peak_of(fix: list[Override], options: list[MemoryOption], job_gpus: int | None) -> int | None:
    """The memory model's peak for the rule's fix on the job's GPUs: the option with the same overrides (else the
    smallest peak any option on those GPUs reaches: the fix cannot do better than the model's best)."""
    pinned = {o.key: o.value for o in fix}
    same_gpus = [o for o in options if job_gpus is None or _positive(o.gpus) in (None, job_gpus)]
    for o in same_gpus:
        if o.overrides and all(pinned.get(x.key, object()) == x.value for x in o.overrides):
            return _positive(o.peak_bytes)
    peaks = [p for p in (_positive(o.peak_bytes) for o in same_gpus) if p]
    return min(peaks) if peaks else None


def apply_fit(result: ReplayResult, fit: CapacityFit) -> None:
    """Record the fit on the replay result and, when it fits, give the finding the proven, fitting set as its
    ``proven_fix`` (its ``fix`` stays the rule's)."""
    result.fit = fit
    result.fits = fit.fits
    if not fit.fits:
        return
    rule = fit.finding.fix
    # the environment replay needed for the fix to pass (an FSDP fix for a job that exported
    # CUDA_DEVICE_MAX_CONNECTIONS=1: Megatron-LM's and Bridge's validation refuse it) is part of what was proven
    env = list(rule.env) + [EnvVar(o.key[4:], str(o.value)) for o in result.fix
                            if o.key.startswith("env.") and o.value is not DELETE and o.value is not None
                            and all(e.name != o.key[4:] for e in rule.env)]
    proven = Fix(rule.summary, rule.safety, [o for o in result.fix if not o.key.startswith(("env.", "launch."))],
                 env, list(rule.steps), list(rule.other_stacks))
    if fit.fragmentation:
        rule_fix = inline_fix(rule.overrides)
        if rule_fix:
            proven.steps.insert(0, f"If it still does not fit: {rule_fix}")
        if rule.summary:
            proven.steps.append(f"Rule's advice: {rule.summary}")
        proven.env = [EnvVar(o.key[4:], str(o.value)) for o in result.fix if o.key.startswith("env.")]
        proven.safety = "safe"  # an allocator setting: no change to numerics or speed
        proven.summary = (f"Fragmentation: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                          f"({fit.reason or 'reserved-but-unallocated memory would have served the request'})")
    else:
        head = (f"needs >= {fit.gpus} GPUs ({fit.layout or f'DP {fit.dp or fit.gpus}'}; the job ran on "
                f"{fit.job_gpus}): " if fit.more_gpus else "")
        proven.summary = f"{head}{worded_label(fit.label)} ({fit.peak_text})"
        if fit.cost and f"cost: {fit.cost}" not in proven.steps:
            proven.steps.insert(0, f"cost: {fit.cost}")
    fit.finding.proven_fix = proven


# what the memory model does not read: a fix's env.* lines, and the checkpoint keys Megatron FSDP adds
# (checkpoint.ckpt_format=fsdp_dtensor); a fix with them is the memory option without them (one answer: analyze's
# option sized ddp_wrap_oom's fix at 93.0 GiB on 8 GPUs, replay --gpus 8 of it with ckpt_format re-predicted 84.6)
_UNSIZED = ("env.", "checkpoint.")

# keys that change how the model is split: the log's per-rank parameter count no longer applies to the new layout
_LAYOUT_KEYS = ("model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
                "model.context_parallel_size", "model.expert_model_parallel_size",
                "model.expert_tensor_parallel_size", "model.virtual_pipeline_model_parallel_size",
                "model.pipeline_model_parallel_layout", "launch.world_size")


def memory_fit(report: Report, view: Any, overrides: list[Override], finding: Finding | None = None) -> \
        CapacityFit | None:
    """Whether ``overrides`` (any fix: the rule's, a validator's, the user's ``--set``) fits, by the same memory
    model as the report's ``memory`` section (one answer): the option with the same overrides when the model
    listed it, else the model re-run on the config with the fix applied. None when the report has no memory
    section for a CUDA OOM. ``fits`` is None, with a note saying why, when it cannot be sized: the activations are
    unknown (never "fits" without them), or the fix changes the parallel layout and the model listed no such
    option (the log's per-rank parameter count is for the job's layout)."""
    memory = report.memory
    root = finding or report.root
    if memory is None or root is None or root.category != "cuda_oom" or not overrides:
        return None
    capacity = _positive(memory.gpu_capacity_bytes)
    job_gpus = _positive(memory.current.gpus) if memory.current else None
    pinned = {o.key: o.value for o in overrides}
    sized = {k: v for k, v in pinned.items() if not k.startswith(_UNSIZED)}
    whole = {k: v for k, v in pinned.items() if not k.startswith("checkpoint.")}
    if memory.verdict == "fragmentation":
        # the allocator setting analyze proves for a fragmentation OOM: `replay --set` of it said "activations
        # unknown ... not a fit" where analyze and `replay LOG` said it fits (the same fit, one answer)
        frag = _fragmentation_fix(root, memory)
        if frag is not None and {o.key: o.value for o in frag.overrides} == whole:
            return replace(frag, overrides=list(overrides))
    for option in memory.options:
        listed = {o.key: o.value for o in option.overrides if not o.key.startswith("checkpoint.")}
        # the option's config keys (the fix may add env lines), or the whole option
        if option.overrides and listed in (sized, whole):
            return _from_prediction(root, overrides, option, capacity, job_gpus, memory.verdict)
    if any(k in pinned for k in _LAYOUT_KEYS):
        return CapacityFit(root, overrides, None, job_gpus, None, job_gpus, None, capacity,
                           _positive(memory.current.usable_bytes) if memory.current else None,
                           notes=["not sized: the fix changes the parallel layout and the memory model lists no "
                                  "option with it (see the memory options)"])
    changed = apply_overrides(view, [o for o in overrides if not o.key.startswith("env.")])
    current = memory.current
    if current is not None and "ddp.grad_reduce_in_fp32" not in pinned and not set_in_job(
            view, "ddp.grad_reduce_in_fp32"):
        # the grads' precision the memory section found (inferred from the request where the log did not say it):
        # re-predicting from the config alone fell back to the release default (ddp_wrap_oom: fp32 grads inferred,
        # analyze sized the fix at 93.0 GiB, replay --set of the same fix at 84.6 GiB, the bf16-grad number)
        changed.set("ddp.grad_reduce_in_fp32", current.grad_dtype == "fp32", "inferred")
    redo = analyze_oom(report, changed, SimpleNamespace(gpu_memory_bytes=capacity), search_options=False)
    if redo is None or redo.current is None:
        return CapacityFit(root, overrides, None, job_gpus, None, job_gpus, None, capacity, None,
                           notes=["not sized: the memory model has no prediction for this config"])
    if not redo.current.sized:
        # the job trained, yet the config read predicts more than the GPU holds: the memory section says "not
        # sized", so replay must not quote that prediction as "does not fit: N GiB" (qa-report-16)
        return CapacityFit(root, overrides, None, job_gpus, None, job_gpus, None, capacity,
                           _positive(redo.current.usable_bytes),
                           notes=[f"not sized: {TRAINED_OVER}"])
    return _from_prediction(root, overrides, redo.current, capacity, job_gpus, memory.verdict)


def memory_fit_of(report: Report, view: Any, fix: list[Override], finding: Finding,
                  rule_fit: CapacityFit | None) -> CapacityFit | None:
    """``memory_fit`` of a replayed ``fix``; ``rule_fit`` (``rule_fix_fit``'s answer) when ``fix`` sets the same
    config keys to the same values as the rule's fix that was sized (its ``env.*`` are not sized): not sized twice."""
    if rule_fit is not None and rule_fit.finding is finding and _config_part(fix) == _config_part(rule_fit.overrides):
        return replace(rule_fit, overrides=list(fix))
    return memory_fit(report, view, fix, finding)


def _config_part(fix: list[Override]) -> list[tuple[str, type, Any]]:
    """What ``memory_fit`` sizes of a fix: its config overrides in order (type included: 1 is not True)."""
    return [(o.key, type(o.value), o.value) for o in fix if not o.key.startswith("env.")]


def _from_prediction(root: Finding, overrides: list[Override], pred: MemoryOption | MemoryPrediction,
                     capacity: int | None, job_gpus: int | None, verdict: str | None = None) -> CapacityFit:
    """A listed option (its own ``fits``) or the job re-predicted with the fix (fits when its peak stays under
    the usable memory). Without activations, STATE_ONLY_FIT decides."""
    peak = _positive(pred.peak_bytes)
    usable = (None if isinstance(pred, MemoryOption) else _positive(pred.usable_bytes)) or (
        capacity - max(2 * GIB, capacity // 25) if capacity else None)
    if isinstance(pred, MemoryOption):
        fits: bool | None = pred.fits
        label, cost, layout = pred.label, pred.cost, _layout(pred)
    else:
        fits = None if peak is None or usable is None else peak <= usable
        label, cost, layout = "", "", f"DP {pred.dp}" if pred.dp > 0 else ""
    notes: list[str] = []
    state_only = bool(fits) and not pred.activation_bytes
    if state_only and verdict == "capacity":
        notes.append(STATE_ONLY_NOTE)
    elif state_only:
        fits, state_only = None, False  # the state fits, but the OOM was not the state: nothing says the rest does
        notes.append("activations unknown (the config gives no model shape or workload): only the model state was "
                     "sized, so this is not a fit")
    return CapacityFit(root, overrides, fits, _positive(pred.gpus) or job_gpus, _positive(pred.dp), job_gpus, peak,
                       capacity, usable, label, cost, notes, layout=layout, model_state_only=state_only)


def apply_memory_fit(result: ReplayResult, fit: CapacityFit | None) -> None:
    """Record a memory check on a replay result without changing the finding's fix (``apply_fit`` does that for
    the capacity fix chosen from the options)."""
    if fit is None:
        return
    result.fit = fit
    result.fits = fit.fits
