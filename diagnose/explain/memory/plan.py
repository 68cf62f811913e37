"""The pre-flight memory plan for ``diagnose check``: the config as given, then the alternatives worth knowing at
the same GPU count (sharding strategies, DP/TP/PP/CP splits dividing it, bf16 grads, recompute, micro batch),
each predicted per GPU and marked fits / does not fit; working changes cheapest first."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from diagnose.explain.memory import from_config as fc
from diagnose.explain.memory import pp_layout
from diagnose.explain.memory.meta_count import available as meta_available
from diagnose.explain.memory.meta_count import exact_count
from diagnose.explain.memory.options import Plan, Scenario, evaluate, search
from diagnose.explain.memory.shape import count_params
from diagnose.model import DiagnoseError


@dataclass
class MemoryPlan:
    capacity: int
    params: int  # whole model
    params_source: str  # "config" (analytic) | "meta" (built on the meta device)
    plans: list[Plan]
    notes: list[str] = field(default_factory=list)

    @property
    def given(self) -> Plan:
        return self.plans[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_capacity_bytes": self.capacity,
            "params": self.params,
            "params_source": self.params_source,
            "plans": [plan_dict(p) for p in self.plans],
            "notes": list(self.notes),
        }


def plan_dict(p: Plan) -> dict[str, Any]:
    return {
        "overrides": [{"key": o.key, "value": o.value} for o in p.overrides],
        "strategy": p.layout.strategy,
        "dp": p.layout.dp,
        "tp": p.layout.tp,
        "pp": p.layout.pp,
        "cp": p.layout.cp,
        "bytes_per_param": round(p.state.bytes_per_param, 3),
        "model_state_bytes": p.state.persistent,
        "transient_bytes": p.state.transient,
        "activation_bytes": int(p.activations or 0),
        "peak_bytes": p.peak,
        "fits": p.fits,
        "cost": p.cost,
        "label": p.label,
        "components": dict(p.state.components),
        "valid": p.valid,
        **_stage_fields(p),
    }


def _stage_fields(p: Plan) -> dict[str, Any]:
    """With pipeline parallelism: which stage peaks (by pipeline rank) and every stage's peak."""
    if p.layout.pp <= 1 or not p.stage_peaks:
        return {}
    return {"worst_stage": p.stage, "stage_peak_bytes": list(p.stage_peaks)}


def stage_note(p: Plan) -> str | None:
    """One sentence naming the worst pipeline stage when the stages' peaks differ."""
    if p.layout.pp <= 1 or not p.stages_differ:
        return None
    n = len(p.stage_peaks)
    where = "the first" if p.stage == 0 else "the last" if p.stage == n - 1 else "a middle"
    peaks = " / ".join(f"{b / 2**30:.1f}" for b in p.stage_peaks)
    return (f"pipeline stages differ: the peak is on stage {p.stage} of 0..{n - 1} ({where} stage), "
            f"{p.peak / 2**30:.1f} GiB; per stage (GiB): {peaks}")


def layout_notes(view: Any, shape: Any, pp: int) -> list[str]:
    """What the memory model made of ``pipeline_model_parallel_layout``: the decoder layers it puts on each
    pipeline rank, or why it is not used (then the stages follow the usual split)."""
    problem = fc.pipeline_layout_problem(view, shape)
    if problem:
        return [f"{problem}: megatron-core would refuse it; the memory per stage below ignores it"]
    stages = shape.layout_for(pp)
    if stages is None:
        return []
    vpp = len(stages) // max(1, pp)
    chunks = " (virtual stages joined by +)" if vpp > 1 else ""
    return [f"pipeline_model_parallel_layout: decoder layers per pipeline rank{chunks}: "
            f"{pp_layout.describe(stages, max(1, pp))}"]


def _exact_wanted() -> bool:
    return os.environ.get("DIAGNOSE_EXACT_PARAMS", "1") != "0" and meta_available()


def memory_plan(view: Any, gpus: int, capacity: int, prove=None, max_plans: int = 14) -> MemoryPlan:
    shape = fc.shape_from_config(view)
    if shape is None:
        bad = []
        for key in ("model.num_layers", "model.hidden_size", "model.num_attention_heads"):
            value = fc._get(view, key)
            if value is not None and (fc._int(value) or 0) < 1:
                bad.append(f"{key}={value!r} is not a positive integer")
        if bad:
            raise DiagnoseError("cannot plan memory: " + "; ".join(bad))
        raise DiagnoseError("the config has no model shape (model.num_layers, model.hidden_size, "
                            "model.num_attention_heads): cannot plan memory")
    layout = fc.layout_from_config(view, gpus)
    if gpus % layout.model_parallel:
        layout_note = (f"{gpus} GPUs are not divisible by TP x PP x CP = {layout.model_parallel}")
    else:
        layout_note = ""
    work = fc.workload_from_config(view, shape, layout)
    scn = Scenario(shape, layout, work, capacity, view=view,
                   saves_checkpoints=bool(fc._get(view, "checkpoint.save") or fc._get(view, "checkpoint.load")),
                   global_batch_size=fc._int(fc._get(view, "train.global_batch_size")))
    analytic = count_params(shape).total
    params, source, notes = analytic, "config", []
    if layout_note:
        notes.append(layout_note)
    if _exact_wanted():
        exact = exact_count(shape)
        if exact is not None:
            source = "meta"
            if exact != analytic:
                notes.append(f"analytic count {analytic:,} differs from the meta-device build {exact:,}")
            params = exact
    given = evaluate(scn, "as given", [], layout, work, "", 0.0)
    if given is None:
        raise DiagnoseError("cannot evaluate the config's memory")
    if layout_note:
        # not a configuration that can run: its row is shown for reference only, the alternatives are valid splits
        given.valid = False
        given.violations = [layout_note]
        notes.append("the config as given is invalid (its data-parallel size is not a whole number); the plans "
                     "below use TP x PP splits that divide the GPU count")
    alternatives = search(
        scn, "unknown", same_gpus_only=True, prove=prove, keep_fitting=max_plans, keep_other=max_plans
    )
    fitting = [p for p in alternatives if p.fits]
    other = [p for p in alternatives if not p.fits]
    plans = [given] + (fitting + other)[: max_plans - 1]
    notes += layout_notes(view, shape, layout.pp)
    if (attention := fc.attention_note(view, work)) is not None:
        notes.append(attention)
    note = stage_note(given)
    if note:
        notes.append("as given, " + note)
    if not given.fits and not fitting:
        more = next((p for p in search(scn, "unknown", prove=None) if p.fits and p.layout.gpus > gpus), None)
        if more is not None:
            from diagnose.explain.render import inline_fix

            change = inline_fix(more.overrides)
            notes.append(f"nothing fits on {gpus} GPUs; the cheapest that fits needs {more.layout.gpus} GPUs: "
                         f"{change or more.label} (peak {more.peak / 2**30:.1f} GiB)")
    return MemoryPlan(capacity, params, source, plans, notes)
