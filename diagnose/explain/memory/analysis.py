"""From an OOM finding (and the job's config, when we have it) to the report's ``memory`` section."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from diagnose.explain.config import ConfigView, apply_defaults
from diagnose.explain.memory import from_config as fc
from diagnose.explain.memory.options import Plan, evaluate, headroom, option_of, search
from diagnose.explain.memory.replay_check import prove
from diagnose.explain.memory.shape import reconcile
from diagnose.explain.memory.state import Layout
from diagnose.explain.memory.verdict import (
    OomNumbers,
    allocator_is_a_step,
    buys_one_allocation,
    cache_share,
    decide,
    from_facts,
    larger_than_gpu,
)
from diagnose.explain.render import fix_style, inline_fix, overrides_in_style
from diagnose.memory_types import (
    BEFORE_MODEL_BUILD,
    TRAINED_LATER,
    TRAINED_OVER,
    Breakdown,
    MemoryAnalysis,
    MemoryOption,
    MemoryPrediction,
    PhasePeaks,
)
from diagnose.model import Finding, Override, Report
from diagnose.units import fmt_gib

View = ConfigView | None  # the job's config as read, or None when the log showed none

OOM_MARK = "CUDA out of memory"
PARAM_FACT_KEYS = ("num_parameters", "parameters", "params", "num_params")


def _texts(f: Finding) -> list[str]:
    """A finding's evidence lines and text facts."""
    return [e.text for e in (f.evidence or [])] + [str(v) for v in (f.facts or {}).values() if isinstance(v, str)]


def _oom_finding(report: Report) -> Finding | None:
    root = report.root
    if root is not None and root.category == "cuda_oom":
        return root
    ooms = [f for f in report.findings if f.category == "cuda_oom"]
    if ooms:
        return next((f for f in ooms if f.role == "root"), ooms[0])
    # a generic rule (a Python exception catch-all) may hold the OOM before a specific rule exists
    ordered = ([root] if root is not None else []) + [f for f in report.findings if f is not root]
    return next((f for f in ordered if any(OOM_MARK in t for t in _texts(f))), None)


def _log_params(report: Report, view: View) -> int | None:
    """The per-rank parameter count the log printed: the config's, else the first finding fact that holds one."""
    facts = (fc._int((f.facts or {}).get(k)) for f in report.findings for k in PARAM_FACT_KEYS)
    return fc._int(fc._get(view, "launch.num_parameters")) or next((v for v in facts if v), None)


def _near(a: int | None, b: float, tol: float = 0.03) -> bool:
    return a is not None and b > 0 and abs(a - b) <= tol * b


def infer_layout(
    layout: Layout, view: View, n: OomNumbers, params: int | None, texts: list[str]
) -> tuple[Layout, list[str]]:
    """Fill what the config did not say from the OOM itself: which buffer was being allocated and what was there.

    With DDP at wrap time the request is the grad buffer (4 or 2 bytes per parameter, whole: DDP never shards it);
    if the allocated memory is already two bf16 copies of the model, the distributed optimizer's param buffer was
    allocated first (param_and_grad_buffer.py allocates ``param_data`` before ``grad_data``).
    """
    notes: list[str] = []
    if not params:
        return layout, notes
    joined = "\n".join(texts)
    strategy_known = any(fc.set_in_job(view, k) for k in (
        "ddp.use_megatron_fsdp", "dist.use_megatron_fsdp", "ddp.use_distributed_optimizer",
        "optimizer.use_distributed_optimizer"))
    grads_known = fc.set_in_job(view, "ddp.grad_reduce_in_fp32") or fc.set_in_job(view, "mixed_precision")
    if not strategy_known and "megatron_fsdp" in joined:
        layout = replace(layout, strategy="fsdp:optim_grads_params")
        notes.append("strategy inferred from the traceback: Megatron FSDP")
    elif not strategy_known and "distrib_optimizer" in joined and layout.strategy == "ddp":
        layout = replace(layout, strategy="distributed_optimizer")
        strategy_known = True
        notes.append("distributed optimizer inferred from the traceback (distrib_optimizer.py)")
    if not layout.fsdp and ("param_and_grad_buffer" in joined or "grad_data" in joined or not strategy_known):
        if not grads_known:
            if _near(n.requested, 4 * params):
                layout = replace(layout, grad_bytes=4)
                notes.append("fp32 grads inferred: the request is 4 bytes x the parameters (the grad buffer)")
            elif _near(n.requested, 2 * params) and "grad_data" in joined:
                layout = replace(layout, grad_bytes=2)
                notes.append("bf16 grads inferred: the request is 2 bytes x the parameters (the grad buffer)")
        if not strategy_known and _near(n.allocated, 4 * params):
            layout = replace(layout, strategy="distributed_optimizer")
            notes.append("distributed optimizer inferred: two bf16 copies of the model were allocated (module + "
                         "param buffer)")
    return layout, notes


# Megatron FSDP's per-group buffers (param_and_grad_buffer.py ``_init_each_parameter_group_buffers``):
# wbuf = model_weight_buffer (bf16 weights), mbuf = main_weight_buffer (fp32 main weights),
# gbuf = main_grad_buffer (grads); which strategies shard each one over the DP group
_FSDP_BUFFERS = (
    (("main_grad_buffer", "gbuf"), "grad buffer", ("fsdp:optim_grads", "fsdp:optim_grads_params")),
    (("main_weight_buffer", "mbuf"), "fp32 main-weight buffer", ("fsdp:optim", "fsdp:optim_grads",
                                                                 "fsdp:optim_grads_params")),
    (("model_weight_buffer", "wbuf"), "bf16 param buffer", ("fsdp:optim_grads_params",)),
)


def _fsdp_buffer_in_frames(joined: str) -> tuple[str, tuple[str, ...]] | None:
    """The Megatron FSDP buffer the traceback shows being allocated (the last one named wins: the failing line)."""
    best, where = None, -1
    for names, label, sharded in _FSDP_BUFFERS:
        for name in names:
            i = max(joined.rfind(name + ".init_data"), joined.rfind(name + " ="))
            if i > where:
                best, where = (label, sharded), i
    return best


def _params_from_fsdp_buffer(n: OomNumbers, texts: list[str], layout: Layout,
                             view: View) -> tuple[int | None, str | None]:
    """Megatron FSDP's wrap allocates, per parameter group, the bf16 weight buffer, the fp32 main-weight buffer and
    the grad buffer; the strategy says which are sharded over the DP group. The buffer is the one the traceback's
    code line names (gbuf / mbuf / wbuf) or else the one whose size, with what was allocated before it (the module
    and the earlier buffers), explains both numbers of the OOM; its size gives the parameter count."""
    if not n.requested:  # (the caller checked: the request is the buffer's size)
        return None, None
    joined = "\n".join(texts)
    strategy = layout.strategy if layout.fsdp else "fsdp:optim_grads_params"
    grads_known = fc.set_in_job(view, "ddp.grad_reduce_in_fp32") or fc.set_in_job(view, "mixed_precision")
    g = layout.grad_bytes if grads_known else 4
    n_dp = layout.shard_group
    module = 0 if layout.meta_init else layout.param_bytes
    named = _fsdp_buffer_in_frames(joined)
    best = None
    for _names, label, sharded_in in _FSDP_BUFFERS[::-1]:  # allocation order: weights, main weights, grads
        if named is not None and named[0] != label:
            continue
        if label == "bf16 param buffer" and strategy == "fsdp:no_shard":
            continue  # no_shard keeps the module's own weights
        div = n_dp if strategy in sharded_in else 1
        per = {"grad buffer": g, "fp32 main-weight buffer": 4}.get(label, layout.param_bytes) / div
        params = int(n.requested / per)
        w = 0 if strategy == "fsdp:no_shard" else layout.param_bytes / (
            n_dp if strategy == "fsdp:optim_grads_params" else 1)
        main = 4 / (n_dp if strategy != "fsdp:no_shard" else 1)
        before = {"bf16 param buffer": module, "fp32 main-weight buffer": module + w,
                  "grad buffer": w + main + (layout.param_bytes if strategy == "fsdp:no_shard" else 0)}[label]
        err = abs(before * params - n.allocated) / max(1, n.allocated) if n.allocated else 0.0
        if best is None or err < best[0] - 1e-3:
            best = (err, params, label, per, div)
    if best is None or (named is None and best[0] > 0.1):
        return None, None
    _, params, label, per, div = best
    if label == "grad buffer":
        label = f"{'fp32' if g == 4 else 'bf16'} grad buffer"
    how = "named by the traceback" if named else "the buffer whose size explains the allocated memory"
    note = (f"parameter count inferred from the request: Megatron FSDP's {label} ({how}) holds "
            f"{per * div:g} bytes per parameter" + (f", sharded over {div} ranks" if div > 1 else "")
            + f" ({params / 1e9:.2f}B)")
    if div > 1 or (not fc.set_in_job(view, "launch.world_size") and strategy != "fsdp:no_shard"
                   and label != "bf16 param buffer"):
        note += f"; data-parallel size {layout.dp} (when it is larger the sharded buffers hold more parameters)"
    return params, note


def _params_from_grad_buffer(n: OomNumbers, phase: str, texts: list[str], layout: Layout,
                             view: View) -> tuple[int | None, str | None]:
    """No parameter count anywhere: when the failing allocation is DDP's grad buffer at wrap time (its frames say
    so), it holds one gradient per parameter, so the request gives the count (fp32 unless the config says bf16).
    The same for Megatron FSDP's buffers, through ``_params_from_fsdp_buffer``."""
    joined = "\n".join(texts)
    if phase not in ("dp_wrap", "model_build", "unknown") or not n.requested:
        return None, None
    if "megatron_fsdp" in joined:
        return _params_from_fsdp_buffer(n, texts, layout, view)
    if "_allocate_buffers_for_parameters" not in joined and "grad_data" not in joined:
        return None, None
    grads_known = fc.set_in_job(view, "ddp.grad_reduce_in_fp32") or fc.set_in_job(view, "mixed_precision")
    g = layout.grad_bytes if grads_known else 4
    params = n.requested // g
    return params, (f"parameter count inferred from the request: DDP's grad buffer holds one "
                    f"{'fp32' if g == 4 else 'bf16'} gradient per parameter ({params / 1e9:.2f}B)")


def _which_buffer(n: OomNumbers, plan: Plan, texts: Sequence[str] = ()) -> str | None:
    """Name the allocation that failed when its size is one of the model-state buffers; the traceback's code line
    decides between buffers of equal size (Megatron FSDP allocates weight, main-weight, then grad buffers)."""
    req = n.requested
    if not req:
        return None
    lay = plan.layout
    prec = "fp32" if lay.grad_bytes == 4 else "bf16"
    comps = plan.state.components
    joined = "\n".join(texts)
    grad = (comps["grads"], f"the {prec} grad buffer")
    main = (comps["main_params"], "the fp32 main-weight buffer" if lay.fsdp else "the fp32 main params")
    named = [grad, (comps["params"], "the bf16 param buffer"), main,
             (comps["optimizer"] / 2, "an Adam moment (exp_avg / exp_avg_sq)"), (comps["optimizer"], "the Adam state")]
    if "mbuf" in joined or (lay.fsdp and "gbuf" not in joined and "main_grad" not in joined):
        named = [main] + [x for x in named if x is not main]
    return next((name for size, name in named if size and _near(req, size, 0.03)), None)


def _pct(a: int | None, b: int | None) -> str:
    return "" if not a or not b else f" ({100 * a / b:.0f} % of the GPU)"


def _explain(
    verdict: str, phase: str, n: OomNumbers, plan: Plan, params: int, capacity: int, buffer: str | None
) -> str:
    billions = f"{params / 1e9:.1f}B"
    req = fmt_gib(n.requested) if n.requested else "?"
    if larger_than_gpu(n, capacity) and not buffer:
        return _too_big(n, capacity)
    if verdict == "fragmentation":
        return fragmentation_sentence(n)
    where = {"dp_wrap": "at DP wrap time", "model_build": "while building the model",
             "optimizer_step": "at the first optimizer step", "first_iteration": "in the first iteration",
             "training": "during training", "checkpoint_save": "while saving a checkpoint",
             "checkpoint_load": "while loading a checkpoint"}.get(phase, "")
    if buffer:
        head = f"{buffer[0].upper() + buffer[1:]} ({req}) of {billions} parameters did not fit in {fmt_gib(capacity)}"
    else:
        head = f"A {req} allocation did not fit in {fmt_gib(capacity)}"
    head = f"{head} {where}".rstrip() + ("" if buffer else f" (model: {billions} parameters per GPU)")
    state = plan.state
    lines = [head + "."]
    if verdict == "capacity":
        lines.append(
            f"Model state alone needs {fmt_gib(state.persistent)} per GPU with {plan.layout.strategy} on "
            f"{plan.layout.gpus} GPU(s) ({state.bytes_per_param:.1f} bytes/param): it cannot fit whatever the batch.")
    elif verdict == "activations":
        state_words = f"Model state ({fmt_gib(state.persistent)})" if phase not in BEFORE_MODEL_BUILD else \
            f"The model was not built yet: its state once built (predicted {fmt_gib(state.persistent)})"
        lines.append(f"{state_words} fits; the activations of the micro batch (~{fmt_gib(plan.activations)}) "
                     "do not.")
    elif verdict == "transient_peak":
        lines.append(f"Steady model state ({fmt_gib(state.persistent)}) fits; a one-off peak {where} "
                     f"(predicted {fmt_gib(plan.phases.peak)}) does not.")
    if n.allocated:
        lines.append(f"Already allocated by PyTorch: {fmt_gib(n.allocated)}{_pct(n.allocated, capacity)}.")
    return " ".join(lines)


def _too_big(n: OomNumbers, capacity: int) -> str:
    return (f"One allocation of {fmt_gib(n.requested)} was asked for on a GPU of {fmt_gib(capacity)} in total: "
            "a single tensor larger than the whole GPU. No allocator setting (expandable_segments), fragmentation "
            "fix or sharding of the model state can help; check what sizes this tensor: sequence length / "
            "max_position_embeddings, micro batch, vocabulary or a shape read from the wrong field.")


def _over_capacity(current: Plan, capacity: int) -> str | None:
    """What the model predicts above the GPU of a job that trained: "state" (the persistent model state), "peak"
    (a step's peak: wrap, first optimizer step or training), or None."""
    if current.state.persistent > capacity:
        return "state"
    return "peak" if current.peak > capacity else None


def _likely_inputs(over: str, view: View, work: Any, world_known: bool, assumed: list[str]) -> list[str]:
    """The model's inputs the log does not give and that size what it over-predicts (one phrase each), most likely
    first. A Megatron-LM argument list is complete by itself: an absent flag is what ran."""
    out = [] if world_known else ["the data-parallel size (the world size is not in the log; modelled as 1)"]
    complete = view is not None and getattr(view, "framework", None) == "megatron-lm"
    if over == "state":
        out.append("sharding and parallel sizes (not all in the log)")
    elif work is not None:
        if not complete and not any(fc.set_in_job(view, k) for k in ("model.seq_length", "dataset.seq_length",
                                                                      "mlm.seq_length")):
            out.append(f"the sequence length (not in the log; {work.seq_length:,} assumed)")
        if not complete and not fc.set_in_job(view, "model.recompute_granularity"):
            out.append("activation recompute (not in the log; none assumed)")
        if not complete and not fc.set_in_job(view, "train.micro_batch_size"):
            out.append(f"the micro batch size (not in the log; {work.micro_batch_size} assumed)")
        if work.attention != "flash":
            out.append("the attention implementation (sized keeping the a*s^2 scores)")
    if assumed:
        out.append("the parameter count's assumed values (see the WARNING)")
    return out


def _explain_trained(verdict: str, phase: str, n: OomNumbers, params: int, capacity: int, world_known: bool,
                     over: str = "state", predicted: int = 0, likely: Sequence[str] = ()) -> str:
    """The job trained (or reached a checkpoint save), so its model state and its first steps fitted, although the
    config read from the log predicts more than the GPU (``over``: its "state" or a step's "peak" of ``predicted``
    bytes): say what the numbers show without presenting the assumed layout as fact."""
    where = {"checkpoint_save": "while saving a checkpoint", "training": "during training",
             "eval": "during evaluation"}.get(phase, "")
    req = fmt_gib(n.requested) if n.requested else "?"
    text = f"A {req} allocation did not fit in {fmt_gib(capacity)} {where}".rstrip() + "."
    if n.allocated:
        text += f" Already allocated by PyTorch: {fmt_gib(n.allocated)}{_pct(n.allocated, capacity)}."
    if over == "peak":
        text += (f" The config read from the log predicts a peak of {fmt_gib(predicted)} per GPU ({params / 1e9:.1f}B "
                 f"parameters), yet the job trained: the model's inputs are incomplete or wrong"
                 + (f" (likely: {'; '.join(likely)})" if likely else "") + f". {TRAINED_LATER[0].upper()}"
                 f"{TRAINED_LATER[1:]}.")
    else:
        dp = "" if world_known else " (the data-parallel size is not in the log)"
        text += (f" The job had trained, so its model state ({params / 1e9:.1f}B parameters) fitted{dp}; the state "
                 "cannot be sized from the log alone.")
    if verdict == "transient_peak" and phase == "checkpoint_save":
        text += (" Saving stages copies of the local optimizer / main-param shards on the GPU before they go to the "
                 "host: a one-off peak. Leave headroom for it (a little more sharding or a smaller micro batch), set "
                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or save with fewer tensors in flight.")
    elif verdict == "transient_peak":
        text += " A one-off peak above the steady state did not fit."
    elif verdict == "activations":
        text += " The activations of the micro batch are the likely growth (micro batch, recompute)."
    return text


SERVED = "reserved-but-unallocated memory would have served the request"
TOGETHER = "reserved-but-unallocated and free memory together exceeded the request, though not in one block"


def fragmentation_reason(finding: Finding) -> str:
    """The fix's short reason for a fragmentation OOM, true to the numbers as ``fragmentation_sentence`` is: the
    cache alone would have served the request only when its unallocated part is at least the request."""
    n = from_facts(finding.facts or {}, _texts(finding))
    return SERVED if (n.reserved_unallocated or 0) >= (n.requested or 0) else TOGETHER


def fragmentation_sentence(n: OomNumbers) -> str:
    """What the numbers say of a fragmentation OOM, and no more: the cache alone held more than the request only
    when its unallocated part is larger; otherwise only cache and free memory together did (issue 19: the old
    sentence said the cache could have served a request it could not)."""
    cached, free, req = n.reserved_unallocated or 0, n.free or 0, n.requested or 0
    if cached >= req:
        head = (f"{fmt_gib(cached)} was cached by PyTorch but unallocated, more than the {fmt_gib(req)} request, "
                "but in blocks too small for it")
    else:
        head = (f"{fmt_gib(cached)} cached by PyTorch but unallocated and {fmt_gib(free)} free add up to more than "
                f"the {fmt_gib(req)} request, but neither held it in one block")
    return head + ". Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (not with ddp.nccl_ub on torch < 2.11)."


def _left_after(n: OomNumbers) -> tuple[int, int, int, int, str]:
    """Cached-but-unallocated, free, requested and left-after-the-request bytes of a nearly full GPU, and the left
    part as a share of the GPU ("0.9 % of the GPU", "" without a capacity): the words of the two texts below."""
    cached, free, req, cap = n.reserved_unallocated or 0, n.free or 0, n.requested or 0, n.capacity or 0
    left = max(0, cached + free - req)
    return cached, free, req, left, (f"{100 * left / cap:.1f} % of the GPU" if cap else "")


def one_allocation_sentence(n: OomNumbers) -> str:
    """A nearly full GPU whose cached and free memory exceeded the request (``buys_one_allocation``): what the
    allocator setting would leave, so it reads as a step, not the fix (qa-report-9 L1)."""
    cached, free, req, left, share = _left_after(n)
    share = f" ({share})" if share else ""
    return (f"Cached-but-unallocated ({fmt_gib(cached)}) and free ({fmt_gib(free)}) memory exceeded the "
            f"{fmt_gib(req)} request, but would leave only {fmt_gib(left)}{share} after it: "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True may get this allocation through, and the next one "
            "fails. Free memory first.")


def small_share_sentence(n: OomNumbers) -> str:
    """Cached and free memory exceeded the request, but the unallocated cache is a small share of what PyTorch
    reserved (``small_cache_share``): the demand is the story, the allocator setting a step (qa-report-11 L1)."""
    cached, allocated = n.reserved_unallocated or 0, n.allocated or 0
    share = cache_share(n) or 0.0
    return (f"Only {fmt_gib(cached)} of the {fmt_gib(cached + allocated)} PyTorch reserved ({100 * share:.1f} %) was "
            f"cached but unallocated, against {fmt_gib(allocated)} allocated: not fragmentation but demand. "
            "Lower memory per GPU first; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is a step.")


def step_sentence(n: OomNumbers) -> str:
    """What the numbers say when the allocator setting is a step, not the fix (``allocator_is_a_step``)."""
    return one_allocation_sentence(n) if buys_one_allocation(n) else small_share_sentence(n)


def numbers_of(finding: Finding) -> OomNumbers:
    """The OOM numbers of a finding (its facts, else its evidence lines)."""
    return from_facts(finding.facts or {}, _texts(finding))


def allocator_step(finding: Finding) -> str | None:
    """The allocator setting as a step of the fix when the numbers do not say fragmentation
    (``allocator_is_a_step``: a nearly full GPU, or a small unallocated share), else None."""
    n = from_facts(finding.facts or {}, _texts(finding))
    if not allocator_is_a_step(n):
        return None
    if not buys_one_allocation(n):
        return (f"Then PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (safe) against fragmentation: only "
                f"{fmt_gib(n.reserved_unallocated or 0)} ({100 * (cache_share(n) or 0.0):.1f} % of what PyTorch "
                "reserved) was cached but unallocated")
    _, _, req, left, share = _left_after(n)
    share = f", {share}" if share else ""
    return (f"Then PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (safe) against fragmentation: alone it would "
            f"leave {fmt_gib(left)}{share}, after this {fmt_gib(req)} allocation")


def _numbers_only(verdict: str, phase: str, n: OomNumbers, capacity: int | None, megatron: bool = True) -> str:
    """What the OOM numbers alone say, when neither a parameter count nor a model shape is known. ``megatron``:
    whether the job's fix is written in Megatron's words (render.fix_style, from the stack match decided): a job of
    another stack (DeepSpeed, HF Trainer, plain PyTorch) is told of sharding in words it has (ZeRO, FSDP), not of the
    distributed optimizer or Megatron FSDP (qa-report-8 L4)."""
    if capacity and larger_than_gpu(n, capacity):
        return _too_big(n, capacity)
    if verdict == "fragmentation":
        return fragmentation_sentence(n)
    if not n.requested or not capacity:
        return ""
    text = f"A {fmt_gib(n.requested)} allocation did not fit in {fmt_gib(capacity)}"
    if n.allocated:
        text += f" with {fmt_gib(n.allocated)} already allocated by PyTorch{_pct(n.allocated, capacity)}"
    text += ". Without a parameter count or the model's shape the state cannot be modelled"
    sharding = "the distributed optimizer or Megatron FSDP" if megatron else "ZeRO or FSDP"
    why = {
        ("capacity", "optimizer_step"): "at the first optimizer step Adam's fp32 state is created (8 bytes per "
                                        f"parameter, sharded over DP with {sharding}): what was already allocated "
                                        "leaves no room for it",
        ("capacity", "dp_wrap"): "at DP wrap time the grad / param buffers are allocated while the model's weights "
                                 "are still there: shard them ("
                                 + ("distributed optimizer, Megatron FSDP" if megatron else "ZeRO, FSDP")
                                 + ") or use more GPUs",
        ("capacity", "model_build"): "the model's weights alone do not fit while it is built: "
                                     + ("more TP/PP, or meta-device init with Megatron FSDP" if megatron else
                                        "shard them over more GPUs (ZeRO-3, FSDP), or build them on the meta "
                                        "device and shard before they are materialized"),
    }.get((verdict, phase))
    return text + (f"; {why}." if why else ".")


def _expandable_segments_option(n: OomNumbers, layout: Layout) -> MemoryOption:
    return MemoryOption(
        overrides=[Override("env.PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")], label="expandable segments",
        cost="none; not with ddp.nccl_ub on torch < 2.11 (megatron-core raises)", strategy=layout.strategy,
        gpus=layout.gpus, dp=layout.dp, tp=layout.tp, pp=layout.pp, cp=layout.cp,
        model_state_bytes=n.allocated or 0, transient_bytes=None, activation_bytes=None,
        peak_bytes=n.in_use or n.allocated, fits=True)


def _prediction(current: Plan, layout: Layout, world_known: bool, capacity: int, sized: bool) -> MemoryPrediction:
    """The job as configured, per GPU."""
    ph = current.phases
    staged = layout.pp > 1 and bool(current.stage_peaks)
    return MemoryPrediction(
        strategy=layout.strategy, dp=layout.dp, dp_known=world_known, gpus=layout.gpus,
        grad_dtype="fp32" if layout.grad_bytes == 4 else "bf16",
        bytes_per_param=round(current.state.bytes_per_param, 3), model_state_bytes=current.state.persistent,
        transient_bytes=current.state.transient, components=Breakdown(**current.state.components),
        activation_bytes=current.activations,
        phase_peaks=PhasePeaks(ph.wrap_peak, ph.after_wrap, ph.first_step_peak, ph.steady_peak, ph.checkpoint_peak),
        peak_bytes=current.peak, usable_bytes=capacity - headroom(capacity), sized=sized,
        worst_stage=current.stage if staged else None, stage_peak_bytes=list(current.stage_peaks) if staged else [])


def _replay_view(view: View, layout: Layout) -> ConfigView:
    """Write the inferred layout into a copy of the view (release defaults when the log showed no config) so
    replay validates the job as it ran."""
    out = view.copy() if view is not None else apply_defaults(ConfigView())
    pairs: dict[str, Any] = {
        "ddp.use_distributed_optimizer": layout.strategy != "ddp",
        "optimizer.use_distributed_optimizer": layout.strategy != "ddp",
        "ddp.grad_reduce_in_fp32": layout.grad_bytes == 4,
    }
    if layout.fsdp:
        pairs["ddp.use_megatron_fsdp"] = True
        pairs["ddp.data_parallel_sharding_strategy"] = layout.strategy.split(":", 1)[1]
    for key, value in pairs.items():
        if not fc.set_in_job(out, key):
            out.set(key, value, "inferred")
    return out


def _world_from_ranks(report: Report, view: View) -> int | None:
    """The world size a per-rank log shows (highest rank + 1) when the config does not state one.

    Used only when it is a multiple of TP x PP x CP: a 2048-rank job whose config gives TP 2, PP 16 was modelled
    on 32 GPUs (DP 1, nothing sharded). Ranks that never wrote a line make it a lower bound, so DP is never
    overstated."""
    if fc.set_in_job(view, "launch.world_size"):
        return None
    top = max((r for f in report.findings for r in (f.ranks or ()) if isinstance(r, int)),
              default=None)
    if top is None:
        return None
    split, world = fc.layout_from_config(view).model_parallel, top + 1
    return None if world <= split or world % split else world


def analyze_oom(report: Report, view: View = None, options: Any = None,
                search_options: bool = True) -> MemoryAnalysis | None:
    """The report's ``memory`` section for the root CUDA OOM. ``search_options=False``: only the verdict and the
    config's own prediction (``current``), e.g. to check a fix by re-running the same model on the changed config."""
    finding = _oom_finding(report)
    if finding is None:
        return None
    texts = _texts(finding)
    n = from_facts(finding.facts or {}, texts)
    capacity = getattr(options, "gpu_memory_bytes", None) or n.capacity
    if n.capacity and capacity and capacity != n.capacity and abs(capacity - n.capacity) > 0.02 * n.capacity:
        # the OOM message states the job's GPU: a --gpu-memory far from it is a mistake, not a what-if
        report.warnings.append(f"--gpu-memory ({capacity / (1 << 30):.2f} GiB) ignored: the OOM message says this "
                               f"GPU has a total capacity of {n.capacity / (1 << 30):.2f} GiB")
        capacity = n.capacity
    phase = finding.phase or "unknown"
    shape = fc.shape_from_config(view)
    log_params = _log_params(report, view)
    world_from_ranks = _world_from_ranks(report, view)
    layout = fc.layout_from_config(view, world_from_ranks)
    inferred_note = None
    if not log_params and shape is None:
        log_params, inferred_note = _params_from_grad_buffer(n, phase, texts, layout, view)
    layout, notes = infer_layout(layout, view, n, log_params, texts)
    if inferred_note:
        notes.insert(0, inferred_note)
    if shape is not None and log_params:
        shape, changed = reconcile(shape, log_params, layout.tp, layout.pp, layout.ep, layout.etp)
        if changed:
            notes.append(changed)
    work = fc.workload_from_config(view, shape, layout) if shape is not None else None
    if (attention := fc.attention_note(view, work)) is not None:
        notes.append(attention)
    params_source = "log" if log_params else "config"
    # a count from the shape assumes what the config does not say, as check's of the same config does
    assumed = fc.count_assumptions(view) if shape is not None and not log_params else []
    if assumed:
        notes.insert(0, fc.assumption_warning(assumed, getattr(view, "model_target", None) is not None))
    scn = fc.scenario(view, shape, layout, work, capacity or 0, log_params=log_params)
    out = MemoryAnalysis(capacity, n.requested, "unknown", log_params,
                         params_source if (log_params or shape) else None, phase, notes=notes,
                         params_assumed=assumed)
    if shape is not None and log_params:
        from_shape = scn.count(layout)
        if from_shape is not None and abs(from_shape.total - log_params) > 0.01 * log_params:
            notes.append(f"the config's shape gives {from_shape.total:,} parameters per rank, the log "
                         f"{log_params:,}: scaled to the log")
            scn.scale = log_params / from_shape.total
    current = evaluate(scn, "as configured", [], layout, work, "", 0.0) if (capacity or 0) > 0 else None
    if current is None:
        if (capacity or 0) > 0 and shape is None and not log_params:
            notes.append("no parameter count in the log and no model shape in the config")
        out.verdict = decide(n, phase, None, None, None, capacity) if capacity else "unknown"
        out.explanation = _numbers_only(out.verdict, phase, n, capacity,
                                        megatron=fix_style(report.framework, report.stack) != "neutral")
        if out.verdict == "fragmentation":
            out.options = [_expandable_segments_option(n, layout)]
        elif allocator_is_a_step(n):
            out.explanation = f"{out.explanation} {step_sentence(n)}".strip()
        return out
    assert capacity is not None  # the plan above is evaluated only with a capacity
    params = log_params or current.state.params
    out.params = params
    phase_peak = {"dp_wrap": current.phases.wrap_peak, "model_build": current.phases.wrap_peak,
                  "optimizer_step": current.phases.first_step_peak,
                  "checkpoint_save": current.phases.checkpoint_peak,
                  "checkpoint_load": current.phases.checkpoint_peak}.get(phase, current.phases.peak)
    # a job that trains, or saves a checkpoint (Megatron saves after training iterations), had its model state
    # allocated and fitting: a model that says otherwise is missing part of the config (sharding, DP size)
    trained = phase in ("training", "eval", "checkpoint_save")
    world_known = fc.set_in_job(view, "launch.world_size") or world_from_ranks is not None
    # the job ran iterations, so its state and its first steps did fit: a model that predicts more than the GPU
    # (state or step peak) read an incomplete or wrong config; judge by the numbers alone
    over = _over_capacity(current, capacity) if trained else None
    state_unexplained = over is not None
    state_for_verdict = None if state_unexplained else current.state.persistent
    verdict = decide(n, phase, state_for_verdict, phase_peak, current.activations, capacity)
    out.verdict = verdict
    buffer = _which_buffer(n, current, texts)
    likely = _likely_inputs(over, view, work, bool(world_known), assumed) if over else []
    if over is not None:
        out.explanation = _explain_trained(verdict, phase, n, params, capacity, bool(world_known), over,
                                           current.peak, likely)
    else:
        out.explanation = _explain(verdict, phase, n, current, params, capacity, buffer)
    out.request_is = buffer
    # sized=False: what the log shows of the config cannot be what ran, so it is never drawn as fact
    out.current = _prediction(current, layout, bool(world_known), capacity, sized=not state_unexplained)
    replay_view = _replay_view(view, layout)
    if world_from_ranks is not None:
        replay_view.set("launch.world_size", world_from_ranks, "inferred")  # plans' splits checked on these GPUs
    bridge_version = getattr(options, "bridge_version", None)
    plans: list[Plan] = []
    if state_unexplained:
        # options sized from a state the job demonstrably did not have would be guesses presented as predictions
        if verdict == "fragmentation":
            out.options = [_expandable_segments_option(n, layout)]
        over_what, size = ("model state", current.state.persistent) if over == "state" else ("peak", current.peak)
        notes.append(f"{TRAINED_OVER} (predicted {over_what} {fmt_gib(size)} per GPU, the GPU holds "
                     f"{fmt_gib(capacity)})" + (f"; likely: {'; '.join(likely)}" if likely else ""))
    elif search_options:
        plans = search(scn, verdict, prove=lambda ovs: prove(replay_view, ovs, bridge_version))
        out.options = [option_of(p, scn.global_batch_size) for p in plans]
    if current.activations is None:
        notes.append("activations not sized (the log gives the parameter count, not the model's shape): "
                     "'fits' below means the model state and its buffers fit, not yet a training step")
    if world_from_ranks is not None:
        notes.append(f"world size {world_from_ranks} from the highest rank in the log (not stated by it): "
                     f"data-parallel size {layout.dp}")
    elif not world_known:
        notes.append("the world size is not in the log: the data-parallel size is unknown (modelled as 1)")
    if verdict != "fragmentation" and allocator_is_a_step(n):
        out.explanation = f"{out.explanation} {step_sentence(n)}".strip()
    best = next((p for p in plans if p.fits and p.valid is not False), None)
    if best is not None and verdict != "fragmentation":
        # in the job's words, as its Fix and replay's sentence (a Megatron-LM job's flags; qa-report-8 L8)
        style = fix_style(report.framework, report.stack)
        change = inline_fix(best.overrides) if style != "megatron-lm" else overrides_in_style(best.overrides, style)
        gpus = "" if best.layout.gpus == layout.gpus else f" on {best.layout.gpus} GPUs"
        what = ("in which the model state fits", "peak", "; activations not counted") \
            if current.activations is None else ("that fits", "peak", "")
        out.explanation += (f" Cheapest change {what[0]}{gpus}: {change or best.label} "
                            f"(predicted {what[1]} {fmt_gib(best.peak)}{what[2]}).")
    return out
