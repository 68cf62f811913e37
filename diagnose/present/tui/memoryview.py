"""The memory picture of an OOM: a bar per component against the GPU's capacity, now and for each option.

Reads ``report.memory`` (schema in issue 4); falls back to the OOM finding's own facts when the memory model did
not run. Builds a rich ``Text`` (never markup strings).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from diagnose.model import Finding
from diagnose.present.safe import inert
from diagnose.present.tui.fmt import format_bytes

BAR_CELLS = 32
COMPONENTS = ("params", "grads", "main_params", "optimizer", "buffers")
VERDICTS = {
    "capacity": "the model state alone cannot fit on this GPU",
    "fragmentation": "memory was reserved but unallocated: fragmentation",
    "transient_peak": "a one-off buffer pushed it over the edge",
    "activations": "activations of the first iterations did not fit",
    "unknown": "the memory model could not tell why",
}


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


def _overrides_text(overrides: list[dict[str, Any]]) -> str:
    return " ".join(f"{o.get('key')}={o.get('value')}" for o in overrides if isinstance(o, dict)) or "(as is)"


def memory_text(memory: dict[str, Any] | None, finding: Finding | None = None) -> Text | None:
    """The memory section for an OOM finding, or None when there is nothing to show."""
    facts = finding.facts if finding is not None else {}
    memory = memory or {}
    capacity = _int(memory.get("gpu_capacity_bytes")) or _int(facts.get("total_bytes"))
    requested = _int(memory.get("requested_bytes")) or _int(facts.get("requested_bytes"))
    if not capacity:
        return None
    out = Text()
    out.append(f"GPU capacity {format_bytes(capacity)}", "bold")
    if requested:
        out.append(f" · tried to allocate {format_bytes(requested)}")
    verdict = memory.get("verdict")
    if verdict:
        out.append("\nVerdict: ", "bold")
        out.append(f"{verdict} — {VERDICTS.get(str(verdict), '')}".rstrip(" —"))
    current = memory.get("current") or {}
    components = current.get("components") or {}
    if current:
        params = memory.get("params")
        out.append("\n\nNow: ", "bold")
        out.append(inert(str(current.get("strategy", "?"))))
        out.append(f", DP={current.get('dp', '?')}")
        if params:
            out.append(f", {params / 1e9:.1f}B parameters ({inert(str(memory.get('params_source', '?')))})")
        if current.get("bytes_per_param"):
            out.append(f", {current['bytes_per_param']:g} bytes/param")
        if current.get("sized") is False:
            out.append("\n  not drawn: the config read from the log predicts more than the GPU holds, yet the job "
                       "trained; part of its config is not in the log", "yellow")
    if current and current.get("sized") is not False:
        for name in COMPONENTS:
            value = _int(components.get(name))
            if value is None:
                continue
            out.append(f"\n  {name:<12}")
            out.append_text(bar(value, capacity, "magenta"))
            out.append(f" {format_bytes(value)}")
        transient = _int(current.get("transient_bytes"))
        if transient:  # Megatron FSDP's gathered/reduce buffers: not model state, but they count in the peak
            out.append(f"\n  {'transient':<12}")
            out.append_text(bar(transient, capacity, "yellow"))
            out.append(f" {format_bytes(transient)}")
        total = _int(current.get("model_state_bytes"))
        if total is not None:
            style = "green" if total <= capacity else "red"
            out.append(f"\n  {'total':<12}")
            out.append_text(bar(total, capacity, style))
            out.append(f" {format_bytes(total)}", "bold " + style)
        peak = _int(current.get("peak_bytes"))
        if peak is not None and peak != total:
            style = "green" if peak <= capacity else "red"
            out.append(f"\n  {'peak':<12}")
            out.append_text(bar(peak, capacity, style))
            out.append(f" {format_bytes(peak)}", "bold " + style)
    options = memory.get("options") or []
    if options:
        out.append("\n\nOptions, cheapest first:", "bold")
        for n, option in enumerate(options, 1):
            need = _int(option.get("peak_bytes"))
            if need is None:
                need = (_int(option.get("model_state_bytes")) or 0) + (_int(option.get("activation_bytes")) or 0)
            fits = bool(option.get("fits"))
            style = "green" if fits else "red"
            out.append(f"\n {n}. ")
            out.append("fits " if fits else "no   ", "bold " + style)
            out.append_text(bar(need, capacity, style))
            out.append(f" {format_bytes(need)}")
            if option.get("label"):
                out.append(f"  {inert(str(option['label']))}", "bold")
            out.append(f"\n    {inert(_overrides_text(option.get('overrides') or []))}")
            extra = []
            if option.get("gpus"):
                extra.append(f"{option['gpus']} GPUs")
            if option.get("cost"):
                extra.append(inert(str(option["cost"])))
            if extra:
                out.append(f"\n    {' · '.join(extra)}", "dim")
    return out
