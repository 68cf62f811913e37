"""The memory model for CUDA OOMs: why an allocation did not fit, and which changes will.

``run(report, view, options) -> MemoryAnalysis | None`` is called by ``diagnose.explain.enrich`` and returns the
report's ``memory`` section (``diagnose.memory_types``) for the root CUDA OOM finding, or None when there is none.
Parts:
``shape`` (parameter count), ``state`` (bytes per parameter per strategy, phase peaks), ``activations``,
``verdict`` (OOM numbers and verdict), ``options`` (search and ranking), ``replay_check`` (valid by replay),
``from_config`` (reading a ConfigView), ``gpus`` (capacities), ``plan`` (the same model for ``diagnose check``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diagnose.configview import ConfigView
    from diagnose.explain.memory.analysis import analyze_oom
    from diagnose.memory_types import MemoryAnalysis
    from diagnose.model import Report

__all__ = ["run", "analyze_oom"]


def run(report: Report, view: ConfigView | None = None, options: Any = None) -> MemoryAnalysis | None:
    """The ``memory`` section for the report's (root) CUDA OOM, or None when the report has no CUDA OOM."""
    if not report.findings:  # no finding, no OOM: a clean log's run does not import the model (start-up time)
        return None
    from diagnose.explain.memory.analysis import analyze_oom

    return analyze_oom(report, view, options)


def __getattr__(name: str) -> Any:
    """``analyze_oom`` imported on first use: the package's parts (``gpus``, ``from_config``) stay light to import."""
    if name == "analyze_oom":
        from diagnose.explain.memory.analysis import analyze_oom

        return analyze_oom
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
