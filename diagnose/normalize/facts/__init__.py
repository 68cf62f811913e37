"""Structured facts from the lines a rule matched. ``PARSERS[name]`` is what a rule's ``parser = "name"`` runs.

Every parser has the same signature::

    parser(line: LogLine | str, context: Sequence[LogLine | str] = ()) -> dict | None

``line`` is the evidence line (a LogLine, or its normalised text); ``context`` is the lines of the same stream that
follow it (the block the engine captured, e.g. the ChildFailedError summary or an NCCL error's ``Last error:``),
possibly empty. It returns a plain dict (sizes as ints in bytes, times in ms as their names say) or None when the
line is not in that parser's format. A parser never raises: bad input gives None.

The renderers that print a fact back in the program's own words live in tests/fact_renderers.py (only the tests use
them): parsing a rendered fact gives the fact back.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from diagnose.model import LogLine
from diagnose.normalize.facts.nccl import (
    parse_nccl_error,
    parse_nccl_warn,
    parse_nccl_watchdog,
    parse_nccl_watchdog_status,
)
from diagnose.normalize.facts.oom import parse_cuda_error_oom, parse_cuda_oom
from diagnose.normalize.facts.slurm import parse_slurmstepd, parse_srun_error
from diagnose.normalize.facts.torchrun import parse_torchrun_agent, parse_torchrun_failure

Parser = Callable[..., "dict[str, Any] | None"]

_EXCEPTION = re.compile(r"\s{0,8}(?P<type>[A-Za-z_][\w.]{0,255}): ?(?P<msg>.*)$")


def _text(item: LogLine | str | Any) -> str:
    return item.text if isinstance(item, LogLine) else str(item)


def _safe(fn: Callable[[str, list[str]], dict[str, Any] | None]) -> Parser:
    def parser(line: LogLine | str, context: Sequence[LogLine | str] = ()) -> dict[str, Any] | None:
        try:
            return fn(_text(line), [_text(c) for c in (context or ())])
        except Exception:  # noqa: BLE001 - a parser must never break the scan
            return None

    parser.__name__ = fn.__name__
    parser.__doc__ = fn.__doc__
    return parser


def _python_exception(text: str, context: list[str]) -> dict[str, Any] | None:
    """``pkg.module.SomeError: message`` -> {"exception": ..., "message": ...} (message continues in context)."""
    m = _EXCEPTION.match(text)
    if m is None:
        return None
    return {"exception": m.group("type"), "message": m.group("msg").strip()}


def _torchrun_failure(text: str, context: list[str]) -> dict[str, Any] | None:
    return parse_torchrun_failure([text, *context])


PARSERS: dict[str, Parser] = {
    "cuda_oom": _safe(lambda t, c: parse_cuda_oom(t)),
    "cuda_error_oom": _safe(lambda t, c: parse_cuda_error_oom(t)),
    "nccl_watchdog": _safe(lambda t, c: parse_nccl_watchdog(t)),
    "nccl_watchdog_status": _safe(lambda t, c: parse_nccl_watchdog_status(t)),
    "nccl_error": _safe(parse_nccl_error),
    "nccl_warn": _safe(lambda t, c: parse_nccl_warn(t)),
    "torchrun_failure": _safe(_torchrun_failure),
    "torchrun_agent": _safe(lambda t, c: parse_torchrun_agent(t)),
    "slurmstepd": _safe(lambda t, c: parse_slurmstepd(t)),
    "srun_error": _safe(lambda t, c: parse_srun_error(t)),
    "python_exception": _safe(_python_exception),
}


def _register_late() -> None:
    """Parsers defined in sibling modules that import this package (phase markers)."""
    try:
        from diagnose.normalize.phases import parse_iteration
    except Exception:  # noqa: BLE001 - phases is optional for the fact parsers
        return
    PARSERS["megatron_iteration"] = _safe(lambda t, c: parse_iteration(t))


_register_late()
