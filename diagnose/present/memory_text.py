"""The memory model's answer in words, for people: the -v MEMORY section of the text report and the memory details
of the markdown report. Read from the typed ``MemoryAnalysis``; sizes in GiB; plain strings, made inert by the
caller (labels and notes may carry config values).
"""

from __future__ import annotations

from diagnose.explain.memory.verdict import OomNumbers, from_facts
from diagnose.explain.render import inline_fix
from diagnose.memory_types import (
    TRAINED_LATER,
    TRAINED_OVER,
    Breakdown,
    MemoryAnalysis,
    MemoryOption,
    MemoryPrediction,
)
from diagnose.model import Finding
from diagnose.units import fmt_gib

VERDICTS = {
    "capacity": "the model state alone cannot fit on this GPU",
    "fragmentation": "memory was reserved but unallocated: fragmentation",
    "transient_peak": "a one-off buffer pushed it over the edge",
    "activations": "activations of the first iterations did not fit",
    "unknown": "the memory model could not tell why",
}
STRATEGIES = {
    "ddp": "plain DDP",
    "distributed_optimizer": "the distributed optimizer",
    "fsdp:no_shard": "Megatron FSDP without sharding",
    "fsdp:optim": "Megatron FSDP sharding the optimizer state",
    "fsdp:optim_grads": "Megatron FSDP sharding optimizer state and grads",
    "fsdp:optim_grads_params": "Megatron FSDP sharding everything",
}
PHASES = {"dp_wrap": "at DP wrap time", "model_build": "while building the model",
          "optimizer_step": "at the first optimizer step", "first_iteration": "in the first iteration",
          "training": "during training", "eval": "during evaluation", "checkpoint_save": "while saving a checkpoint",
          "checkpoint_load": "while loading a checkpoint"}
PARAMS_SOURCES = {"log": "as the log states", "config": "counted from the config's shape",
                  "meta": "built by megatron-core on the meta device from the config"}


def verdict_words(memory: MemoryAnalysis) -> str:
    """The verdict in words, as ``analyze -v`` and the TUI both say it. A job that trained although the config read
    predicts more than the GPU holds (``current`` not sized) fitted its first iterations: the OOM came later, and
    the numbers' own verdict follows where they give one."""
    words = VERDICTS.get(memory.verdict, memory.verdict)
    if memory.current is not None and not memory.current.sized:
        return TRAINED_LATER + ("" if memory.verdict == "unknown" else f"; from the OOM's numbers: {words}")
    if memory.verdict == "activations" and memory.phase in ("training", "eval"):
        return "activations did not fit after iterations that did (a longer or larger batch, or evaluation)"
    return words


def batch_change_words(plan: MemoryOption) -> str:
    """What ``check`` and the TUI add after naming the cheapest plan that fits when it changes the global batch
    size (sets it to another value than the config's): plans that change it rank after every plan that keeps it,
    so none that keeps it fits ("" otherwise, and for a plan that restates the config's value)."""
    new = plan.new_global_batch
    return "" if new is None else (f" It changes the global batch size to {new}, a tuned hyper-parameter (numerics, "
                                   "LR schedule): no valid plan that keeps it fits on this GPU count.")


def count_words(source: str | None, assumed: list[str]) -> str:
    """How a parameter count was had, as ``analyze`` and ``check`` both say it ("" when unknown); a count that
    assumed values the config does not give says so (the WARNING note names them)."""
    words = PARAMS_SOURCES.get(source or "", source or "")
    return words + (", with ASSUMED values: see the WARNING below" if words and assumed else "")


PARTS = (("params", "weights"), ("grads", "grads"), ("main_params", "fp32 main weights"),
         ("optimizer", "optimizer state"), ("fp8", "FP8 weight copies"), ("cuda_graphs", "CUDA graph buffers"))


def memory_lines(memory: MemoryAnalysis, finding: Finding | None = None) -> list[tuple[str, bool]]:
    """The section after its lead sentence (``memory.explanation``): ``(line, is_command)`` pairs, nested lines
    indented with spaces; a command line (a change to paste) is never wrapped. ``finding``: the OOM the analysis
    explains, whose figures say what was in use when the model was not built yet."""
    return [(line, line.startswith(COMMAND)) for line in _lines(memory, finding)]


COMMAND = "     change: "
BEFORE_BUILD = "at set-up, phase init, before the model was built"


def log_numbers(finding: Finding | None) -> OomNumbers:
    """What the OOM message itself says (requested, in use, allocated by PyTorch), from the finding's facts and
    evidence lines; empty without a finding."""
    if finding is None:
        return OomNumbers()
    return from_facts(finding.facts or {}, [e.text for e in finding.evidence or []])


def now_before_build(memory: MemoryAnalysis, finding: Finding | None) -> str:
    """The "Now" sentence of an OOM before the model build: what is known, no model state claimed resident."""
    n = log_numbers(finding)
    requested = memory.requested_bytes or n.requested
    bits = [f"Now ({BEFORE_BUILD}): none of the model's state is on the GPU yet"]
    if requested:
        bits.append(f"the allocation that failed: {fmt_gib(requested)}")
    if n.in_use:
        held = f"in use by the process, as the log says: {fmt_gib(n.in_use)}"
        if n.allocated:
            held += f" ({fmt_gib(n.allocated)} allocated by PyTorch)"
        bits.append(held)
    elif n.allocated:
        bits.append(f"allocated by PyTorch, as the log says: {fmt_gib(n.allocated)}")
    return "; ".join(bits) + "."


def _lines(memory: MemoryAnalysis, finding: Finding | None = None) -> list[str]:
    lines = [f"Verdict: {verdict_words(memory)}."]
    gpu = _gpu_line(memory)
    if gpu:
        lines.append(gpu)
    if memory.params:
        source = count_words(memory.params_source, memory.params_assumed)
        lines.append(f"Model: {memory.params / 1e9:.2f}B parameters per GPU" + (f" ({source})." if source else "."))
    if not memory.model_built:
        lines.append(now_before_build(memory, finding))
    if memory.current is not None:
        lines += _prediction_lines(memory.current, memory.model_built)
    if memory.options:
        lines.append("Options, cheapest first:")
        for n, option in enumerate(memory.options, 1):
            lines += _option_lines(n, option)
    if memory.notes:
        lines.append("Notes:")
        lines += [f"  - {note}" for note in memory.notes]
    return lines


def _gpu_line(memory: MemoryAnalysis) -> str:
    bits = []
    if memory.gpu_capacity_bytes:
        usable = memory.current.usable_bytes if memory.current is not None else None
        bits.append(f"GPU of {fmt_gib(memory.gpu_capacity_bytes)}"
                    + (f" ({fmt_gib(usable)} usable by the model)" if usable else ""))
    if memory.requested_bytes:
        what = f" ({memory.request_is})" if memory.request_is else ""
        bits.append(f"the failing request: {fmt_gib(memory.requested_bytes)}{what}")
    where = PHASES.get(memory.phase)
    return "; ".join(bits) + (f" {where}." if where and bits else "." if bits else "")


def _prediction_lines(p: MemoryPrediction, built: bool = True) -> list[str]:
    dp = f"data-parallel size {p.dp}" + ("" if p.dp_known else ", not stated by the log")
    head = "As configured" if built else "Predicted once the model is built, as configured"
    lines = [f"{head}: {STRATEGIES.get(p.strategy, p.strategy)}, {p.grad_dtype} grads, on {p.gpus} "
             f"GPU{'s' if p.gpus != 1 else ''} ({dp})."]
    if not p.sized:
        lines.append(f"  Not sized: {TRAINED_OVER}.")
        return lines
    lines.append(f"  Model state per GPU: {fmt_gib(p.model_state_bytes)} ({p.bytes_per_param:g} bytes per "
                 f"parameter): {_parts(p.components)}.")
    if p.transient_bytes:
        lines.append(f"  Megatron FSDP buffers in flight: {fmt_gib(p.transient_bytes)}.")
    lines.append("  Activations: " + ("not sized (no model shape)." if p.activation_bytes is None
                                      else f"{fmt_gib(p.activation_bytes)}."))
    ph = p.phase_peaks
    lines.append(f"  Predicted: {fmt_gib(ph.dp_wrap)} at DP wrap time, {fmt_gib(ph.optimizer_step)} at the first "
                 f"optimizer step, {fmt_gib(ph.training)} in training (peak {fmt_gib(p.peak_bytes)}); "
                 f"{fmt_gib(ph.checkpoint)} while saving a checkpoint.")
    if p.worst_stage is not None:
        lines.append(f"  Pipeline stages (GiB): {' / '.join(f'{b / 2**30:.1f}' for b in p.stage_peak_bytes)}; "
                     f"the peak is on stage {p.worst_stage}.")
    return lines


def _parts(b: Breakdown) -> str:
    return ", ".join(f"{name} {fmt_gib(getattr(b, key))}" for key, name in PARTS
                     if getattr(b, key) or key not in ("fp8", "cuda_graphs"))


def _option_lines(n: int, o: MemoryOption) -> list[str]:
    verdict = "fits" if o.fits else "does not fit"
    if o.valid is False:
        verdict += ", but the validator refuses it"
    peak = f", predicted peak {fmt_gib(o.peak_bytes)}" if o.peak_bytes else ""
    lines = [f"  {n}. {o.label}: {verdict}{peak}."]
    change = inline_fix(o.overrides)
    if change:
        lines.append(COMMAND + change)
    if o.cost:
        lines.append(f"     cost: {o.cost}")
    return lines


def usable_words(capacity: int) -> str:
    """``75.95 GiB usable: 79.11 GiB less 3.16 GiB for ...``: what a plan's peak is held to (options.headroom)."""
    from diagnose.explain.memory.options import headroom

    kept = headroom(capacity)
    return (f"{fmt_gib(capacity - kept)} usable: {fmt_gib(capacity)} less {fmt_gib(kept)} for the CUDA context, "
            "NCCL and the allocator")
