"""The pre-flight memory plan for ``diagnose check``: the config as given, then the alternatives worth knowing at
the same GPU count (sharding strategies, DP/TP/PP/CP splits dividing it, bf16 grads, recompute, micro batch),
each predicted per GPU and marked fits / does not fit; working changes cheapest first."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from diagnose.explain.config.overrides import apply_overrides
from diagnose.explain.config.providers import SHAPE_FIELDS, resolve, table_releases, unresolved_provider
from diagnose.explain.memory import from_config as fc
from diagnose.explain.memory import pp_layout
from diagnose.explain.memory.meta_count import available as meta_available
from diagnose.explain.memory.meta_count import exact_count
from diagnose.explain.memory.options import Plan, evaluate, option_of, prove_plan, search
from diagnose.explain.memory.shape import count_params, reconcile
from diagnose.explain.render import inline_fix, launch_commands, overrides_in_style
from diagnose.memory_types import CHECK_PLAN_KEYS, MemoryOption
from diagnose.model import DiagnoseError, Override


@dataclass
class MemoryPlan:
    """``diagnose check``'s memory section: the config as given first, then the alternatives at its GPU count."""

    capacity: int
    params: int  # whole model
    params_source: str  # "config" (analytic) | "meta" (built on the meta device)
    plans: list[MemoryOption]
    notes: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)  # values the count assumed (the config does not say)
    more_gpus: MemoryOption | None = None  # nothing fits at the GPU count: the cheapest plan on more GPUs (a note)
    framework: str | None = None  # the config's ("megatron-lm": each plan also carries its flags, ``mlm``)

    @property
    def given(self) -> MemoryOption:
        return self.plans[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_capacity_bytes": self.capacity,
            "params": self.params,
            "params_source": self.params_source,
            "params_assumed": list(self.assumed),
            "plans": [self._plan_dict(p) for p in self.plans],
            "notes": list(self.notes),
        }

    def _plan_dict(self, p: MemoryOption) -> dict[str, Any]:
        """One plan in check's JSON; for a Megatron-LM config also its change as that job's flags (``mlm``, as the
        text output prints it: Bridge words stay for what has no flag, env.* keys as exports; qa-report-19 L10)."""
        out = p.to_dict(CHECK_PLAN_KEYS)
        if self.framework == "megatron-lm":
            out["mlm"] = overrides_in_style(p.overrides, "megatron-lm")
        return out


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


def _reconcile_with_log(view: Any, shape: Any) -> tuple[Any, str | None] | None:
    """A config read from a log that also printed its parameter count (per model-parallel rank, at the job's own
    TP x PP): make the shape agree with it as the OOM analysis does, so that the plan, ``analyze`` and the TUI
    count the same model (one answer)."""
    logged = fc._int(fc._get(view, "launch.num_parameters"))
    if not logged:
        return None
    if fc._origin(view, "model.tensor_model_parallel_size") == "override":
        return None  # the user changed the split: the logged per-rank count is for another layout
    lay = fc.layout_from_config(view)
    return reconcile(shape, logged, lay.tp, lay.pp, lay.ep, lay.etp)


def fix_plan(view: Any, overrides: list, gpus: int, capacity: int) -> Plan | None:
    """The config with ``overrides`` applied, predicted per GPU like the plan's given row (same shape reading,
    same reconciliation with a logged count): what a validator's fix does to memory. None when it cannot be
    sized (no shape, or a split that does not divide the GPUs)."""
    changed = apply_overrides(view, overrides) if overrides else view
    try:
        shape = fc.shape_from_config(changed)
    except DiagnoseError:
        return None
    if shape is None:
        return None
    reconciled = _reconcile_with_log(changed, shape)
    if reconciled is not None:
        shape = reconciled[0]
    layout = fc.layout_from_config(changed, gpus)
    if gpus % layout.model_parallel:
        return None
    work = fc.workload_from_config(changed, shape, layout)
    return evaluate(fc.scenario(changed, shape, layout, work, capacity), "with the fix", [], layout, work, "", 0.0)


def _log_confirms(view: Any, shape: Any) -> bool:
    lay = fc.layout_from_config(view)
    return count_params(shape, lay.tp, lay.pp, lay.ep, lay.etp).total == fc._int(fc._get(view, "launch.num_parameters"))


def _exact_wanted() -> bool:
    return os.environ.get("DIAGNOSE_EXACT_PARAMS", "1") != "0" and meta_available()


# Sizes the count multiplies: one given as 0 or negative was read as absent (a seq_length of 0 became 4,096, a
# vocab_size of -1 became 32,000, silently), and one past any model's (hidden_size 1e26) printed a table of
# 45-digit figures. A size past 2**31 (int32, what the kernels index) is a typo, not a model.
_SIZE_KEYS = ("model.hidden_size", "model.num_attention_heads", "model.ffn_hidden_size", "model.num_query_groups",
              "model.kv_channels", "model.seq_length", "dataset.seq_length", "mlm.seq_length", "model.vocab_size",
              "tokenizer.vocab_size", "mlm.vocab_size", "model.padded_vocab_size", "train.micro_batch_size",
              "train.global_batch_size")
_UPPER_ONLY = ("model.num_moe_experts", "model.moe_ffn_hidden_size")  # 0 may stand for a dense model
MAX_SIZE = 2**31


def written_as(view: Any, key: str, value: Any) -> str:
    """``key=value`` as the user wrote it: a Megatron-LM argument list's flag (``--seq-length 0``) when the value
    came from one (the list is read into Bridge keys, and ``--seq-length`` fills both ``model.seq_length`` and
    ``dataset.seq_length``), else the Bridge key (a YAML config, a ``--set``)."""
    from diagnose.explain.config.mlm_args import BRIDGE_TO_MLM

    origin = view.origin(key) if hasattr(view, "origin") else None
    name = BRIDGE_TO_MLM.get(key) if getattr(view, "framework", None) == "megatron-lm" else None
    if name is None or origin in (None, "override", "default"):
        return f"{key}={value!r}"
    return f"--{name.replace('_', '-')} {value!r}"


class NoModelShape(DiagnoseError):
    """The config names no model (an overrides-only YAML): memory cannot be planned, validation still can."""


def size_problems(view: Any, validated_below_one: Iterable[str] = ()) -> list[str]:
    """Each size the config gives as zero, negative or past ``MAX_SIZE`` (a fractional or non-number value is
    the loader's to refuse), named as the user wrote it (``written_as``), each once. Keys in ``validated_below_one``
    are left to the validator when below one: its violation says where upstream divides by them, which a one-line
    refusal would hide."""
    skip = set(validated_below_one)
    bad: list[str] = []
    for key in _SIZE_KEYS + _UPPER_ONLY:
        value = fc._get(view, key)
        if value is None or isinstance(value, bool):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            continue
        if number != number:
            continue
        if number < 1 and key not in _UPPER_ONLY:
            if key in skip:
                continue
            said = f"{written_as(view, key, value)} is not a positive integer"
        elif number > MAX_SIZE:
            said = f"{written_as(view, key, value)} is larger than any model uses (at most {MAX_SIZE:,})"
        else:
            continue
        if said not in bad:
            bad.append(said)
    return bad


def _on_gpus(prove: Any, gpus: int) -> Any:
    """``prove`` of a plan on ``gpus`` GPUs rather than the count the config is checked on (a TP 8 plan is no
    violation on 8 GPUs); the world size is the plan's, not an override of its own."""
    def proved(overrides: list[Override]) -> Any:
        proof = prove([*overrides, Override("launch.world_size", gpus)])
        proof.overrides = [o for o in proof.overrides if o.key != "launch.world_size"]
        return proof
    return proved


def memory_plan(view: Any, gpus: int, capacity: int, prove=None, max_plans: int = 14) -> MemoryPlan:
    sizes = size_problems(view)
    if sizes:
        raise DiagnoseError("cannot plan memory: " + "; ".join(sizes))
    shape = fc.shape_from_config(view)
    if shape is None:
        bad = []
        for key in ("model.num_layers", "model.hidden_size", "model.num_attention_heads"):
            value = fc._get(view, key)
            if value is not None and (fc._int(value) or 0) < 1:
                bad.append(f"{written_as(view, key, value)} is not a positive integer")
            elif key == "model.num_layers" and value is not None and (fc._int(value) or 0) > fc.MAX_LAYERS:
                bad.append(f"{written_as(view, key, value)} is more layers than any model has "
                           f"(at most {fc.MAX_LAYERS:,})")
        if bad:
            raise DiagnoseError("cannot plan memory: " + "; ".join(bad))
        named = getattr(view, "model_target", None)
        read = resolve(named, getattr(view, "version", None)) if named is not None else None
        if read is not None:
            missing = [f"model.{f}" for f in SHAPE_FIELDS if not fc._get(view, f"model.{f}")]
            raise DiagnoseError(f"the model's provider {read.short} ({read.source}) does not set "
                                f"{', '.join(missing)} itself (that release takes them from the Hugging Face "
                                "config): give them in the config")
        target = unresolved_provider(view)
        if target is not None:
            releases = table_releases()
            raise DiagnoseError(
                f"the model's shape is in its provider {target}, which diagnose could not read (not a provider of "
                f"Megatron-Bridge {releases[0] if releases else '?'}..{releases[-1] if releases else '?'} and "
                "megatron-bridge is not installed here): give model.num_layers, model.hidden_size and "
                "model.num_attention_heads (and its vocab, GLU and embedding settings), or install megatron-bridge")
        raise NoModelShape("the config has no model shape (model.num_layers, model.hidden_size, "
                           "model.num_attention_heads): cannot plan memory")
    layout = fc.layout_from_config(view, gpus)
    reconciled = _reconcile_with_log(view, shape)
    shape, reconcile_note = reconciled if reconciled is not None else (shape, None)
    layout_note = f"{gpus} GPUs are not divisible by TP x PP x CP = {layout.model_parallel}" if (
        gpus % layout.model_parallel) else ""
    work = fc.workload_from_config(view, shape, layout)
    scn = fc.scenario(view, shape, layout, work, capacity)
    analytic = count_params(shape).total
    params, source = analytic, "config"
    notes = [note for note in (layout_note, reconcile_note) if note]
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
    alternatives = search(
        scn, "unknown", same_gpus_only=True, prove=prove, keep_fitting=max_plans, keep_other=max_plans
    )
    fitting = [p for p in alternatives if p.fits]
    other = [p for p in alternatives if not p.fits]
    plans = [given] + (fitting + other)[: max_plans - 1]
    if layout_note:
        notes.append("the config as given is invalid (its data-parallel size is not a whole number)" + (
            "; the plans below use TP x PP splits that divide the GPU count" if len(plans) > 1 else ""))
    notes += layout_notes(view, shape, layout.pp)
    if (attention := fc.attention_note(view, work)) is not None:
        notes.append(attention)
    if shape.hybrid_pattern:
        notes.append("hybrid model: parameters counted per layer type from the pattern; the activations of its "
                     "Mamba and MLP-only layers are estimated as transformer layers (not calibrated)")
    note = stage_note(given)
    if note:
        notes.append("as given, " + note)
    wider: MemoryOption | None = None
    if not given.fits and not fitting:
        more: Plan | None = None
        for candidate in [p for p in search(scn, "unknown", prove=None) if p.fits and p.layout.gpus > gpus][:5]:
            if prove is not None:
                # extended and checked as the table's plans are, on its own GPU count (Megatron FSDP's --ckpt-format
                # fsdp_dtensor: a Megatron-LM job fails validate_args without it); one refused is passed over
                prove_plan(scn, candidate, _on_gpus(prove, candidate.layout.gpus))
            if candidate.valid is not False:
                more = candidate
                break
        if more is not None:
            # in the config's words: a Megatron-LM argument list's flags
            change = (overrides_in_style(more.overrides, "megatron-lm")
                      if getattr(view, "framework", None) == "megatron-lm" else inline_fix(more.overrides))
            notes.append(f"nothing fits on {gpus} GPUs; the cheapest that fits needs {more.layout.gpus} GPUs: "
                         f"{change or more.label} (peak {more.peak / 2**30:.1f} GiB)")
            node = view.get("launch.gpus_per_node")
            launch = launch_commands(more.layout.gpus, node if isinstance(node, int) else None)
            notes.append(f"launch on {more.layout.gpus} GPUs: {launch['torchrun']}; or {launch['srun']}")
            wider = option_of(more, scn.global_batch_size)
    # a count the log confirms (its own parameter line, per rank) assumes nothing
    assumed = [] if reconciled is not None and _log_confirms(view, shape) else fc.count_assumptions(view)
    if assumed:
        # a provider already named has given what it sets: what is left is the config's to give
        notes.insert(0, fc.assumption_warning(assumed, getattr(view, "model_target", None) is not None))
    options = [option_of(p, scn.global_batch_size) for p in plans]
    return MemoryPlan(capacity, params, source, options, notes, assumed, wider,
                      framework=getattr(view, "framework", None))
