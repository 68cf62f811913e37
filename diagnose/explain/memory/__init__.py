"""The memory model for CUDA OOMs: why an allocation did not fit, and which changes will.

``run(report, view, options) -> MemoryAnalysis | None`` is called by ``diagnose.explain.enrich`` and returns the
report's ``memory`` section (``diagnose.memory_types``) for the root CUDA OOM finding, or None when there is none.
Parts:
``shape`` (parameter count), ``state`` (bytes per parameter per strategy, phase peaks), ``activations``,
``verdict`` (OOM numbers and verdict), ``options`` (search and ranking), ``replay_check`` (valid by replay),
``from_config`` (reading a ConfigView), ``gpus`` (capacities), ``plan`` (the same model for ``diagnose check``).
"""

from __future__ import annotations

from typing import Any

from diagnose.configview import ConfigView
from diagnose.explain.memory.analysis import analyze_oom
from diagnose.memory_types import MemoryAnalysis
from diagnose.model import Report

__all__ = ["run", "analyze_oom"]


def run(report: Report, view: ConfigView | None = None, options: Any = None) -> MemoryAnalysis | None:
    """The ``memory`` section for the report's (root) CUDA OOM, or None when the report has no CUDA OOM."""
    return analyze_oom(report, view, options)
