"""The memory picture of an OOM: a bar per component against the GPU's capacity, now and for each option.

Reads ``report.memory`` (``MemoryAnalysis``); falls back to the OOM finding's own facts when the memory model did
not run. Builds a rich ``Text`` (never markup strings).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from diagnose.memory_types import TRAINED_OVER, MemoryAnalysis, MemoryOption, MemoryPrediction
from diagnose.model import Finding, Override
from diagnose.present.memory_text import BEFORE_BUILD, count_words, log_numbers, verdict_words
from diagnose.present.safe import inert
from diagnose.present.tui.fmt import format_bytes

BAR_CELLS = 32
COMPONENTS = ("params", "grads", "main_params", "optimizer", "buffers")


def bar(value: int, capacity: int, style: str, cells: int = BAR_CELLS) -> Text:
    """``████░░░░`` of ``value`` against ``capacity``; overflow shown as a red ``▶`` past the end."""
    text = Text()
    if capacity <= 0:
        return text
    filled = min(cells, round(cells * value / capacity))
    if value > 0 and filled == 0:
        filled = 1
    text.append("█" * filled, style)
    text.append("░" * (cells - filled), "dim")
    text.append("▶" if value > capacity else "│", "bold red" if value > capacity else "dim")
    return text


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def memory_text(memory: MemoryAnalysis | None, finding: Finding | None = None) -> Text | None:
    """The memory section for an OOM finding, or None when there is nothing to show."""
    facts = finding.facts if finding is not None else {}
    capacity = (memory.gpu_capacity_bytes if memory else None) or _int(facts.get("total_bytes"))
    requested = (memory.requested_bytes if memory else None) or _int(facts.get("requested_bytes"))
    if not capacity:
        return None
    out = Text()
    out.append(f"GPU capacity {format_bytes(capacity)}", "bold")
    if requested:
        out.append(f" · tried to allocate {format_bytes(requested)}")
    if memory is None:
        return out
    out.append("\nVerdict: ", "bold")
    out.append(f"{memory.verdict} — {verdict_words(memory)}")
    current = memory.current
    if not memory.model_built:
        _now_before_build(out, memory, finding, capacity)
    if current is not None:
        _current(out, memory, current, capacity)
    if memory.options:
        out.append("\n\nOptions, cheapest first:", "bold")
        for n, option in enumerate(memory.options, 1):
            _option(out, n, option, capacity)
    return out


def _now_before_build(out: Text, memory: MemoryAnalysis, finding: Finding | None, capacity: int) -> None:
    """Before the model build (a JIT warm-up at set-up) none of its state is resident: "Now" is what the log says,
    the allocation that failed and what the process held; the model's state is drawn after, as a prediction."""
    n = log_numbers(finding)
    out.append("\n\nNow: ", "bold")
    out.append(f"{BEFORE_BUILD}: none of the model's state is on the GPU yet; what the log says")
    requested = memory.requested_bytes or n.requested
    if requested:
        _bar_row(out, "failed req", requested, capacity, "red")
    if n.in_use:
        _bar_row(out, "in use", n.in_use, capacity, "yellow")
    if n.allocated and n.allocated != n.in_use:
        _bar_row(out, "by PyTorch", n.allocated, capacity, "yellow")


def _current(out: Text, memory: MemoryAnalysis, current: MemoryPrediction, capacity: int) -> None:
    out.append("\n\nNow: " if memory.model_built else "\n\nPredicted once built: ", "bold")
    out.append(inert(current.strategy))
    out.append(f", DP={current.dp}")
    if memory.params:
        # how the count was had, in analyze's words (count_words); a count that assumed defaults says so, and the
        # WARNING (fc.assumption_warning's note, built once by the analysis) follows
        source = count_words(memory.params_source, memory.params_assumed)
        out.append(f", {memory.params / 1e9:.1f}B parameters" + (f" ({inert(source)})" if source else ""))
    if current.bytes_per_param:
        out.append(f", {current.bytes_per_param:g} bytes/param")
    for note in memory.notes:
        if memory.params_assumed and note.startswith("WARNING"):
            out.append(f"\n  {inert(note)}", "bold yellow")
    if not current.sized:
        out.append(f"\n  not drawn: {TRAINED_OVER}", "yellow")
        return
    for name in COMPONENTS:
        _bar_row(out, name, getattr(current.components, name), capacity, "magenta")
    if current.transient_bytes:  # Megatron FSDP's gathered/reduce buffers: not model state, but they count in the peak
        _bar_row(out, "transient", current.transient_bytes, capacity, "yellow")
    rows = [("total", current.model_state_bytes)]
    if current.peak_bytes != current.model_state_bytes:
        rows.append(("peak", current.peak_bytes))
    for label, value in rows:
        style = "green" if value <= capacity else "red"
        _bar_row(out, label, value, capacity, style, "bold " + style)


def _bar_row(out: Text, label: str, value: int, capacity: int, style: str, size_style: str = "") -> None:
    out.append(f"\n  {label:<12}")
    out.append_text(bar(value, capacity, style))
    out.append(f" {format_bytes(value)}", size_style)


def _option(out: Text, n: int, option: MemoryOption, capacity: int) -> None:
    need = option.peak_bytes if option.peak_bytes is not None else option.model_state_bytes + (
        option.activation_bytes or 0)
    style = "green" if option.fits else "red"
    out.append(f"\n {n}. ")
    out.append("fits " if option.fits else "no   ", "bold " + style)
    out.append_text(bar(need, capacity, style))
    out.append(f" {format_bytes(need)}")
    if option.label:
        out.append(f"  {inert(option.label)}", "bold")
    out.append(f"\n    {inert(_overrides_text(option.overrides))}")
    extra = [f"{option.gpus} GPUs"] if option.gpus else []
    if option.cost:
        extra.append(inert(option.cost))
    if extra:
        out.append(f"\n    {' · '.join(extra)}", "dim")


def _overrides_text(overrides: list[Override]) -> str:
    return " ".join(f"{o.key}={o.value}" for o in overrides) or "(as is)"
