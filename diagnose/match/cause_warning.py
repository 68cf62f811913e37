"""The NCCL WARN that carries the cause of a root NCCL error, shown among its evidence.

A ``DistBackendError: NCCL error in: ..., remote process exited or there was a network error`` (NC013), an
``unhandled system error`` (PY006) or a watchdog's abort says what torch saw; the reason is in the ``NCCL WARN``
line NCCL printed on the same rank before it (``socketProgress: Connection closed by remote peer``, ``Call to
connect returned Connection refused``, ``NET/IB : Got completion with error``). Every WARN line is a hit of its
own (PY007, or the specific rule that reads its words), context next to the error, so the reader had to look for it
among the other findings. Here the first such line of the failing rank joins the root's evidence, just before the
root's own first line (the lines stay in the order the log printed them).

The failing rank is where the root's first line came from: the same input file and, when both lines tell them, the
same rank and the same host (one file of two nodes' interleaved output holds both nodes' warnings). Lines a rule
reads as harmless (PY009, severity info) are not warnings here. Runs after ranking, on the chosen root only, and only
when the root's line is an NCCL error that is not itself a WARN line. NCCL 2.2 and earlier printed ``WARN`` without
the ``NCCL`` word (``host:pid:tid [dev] file:line WARN message``): those lines are warnings here too.
"""

from __future__ import annotations

from diagnose.match.engine import Hit
from diagnose.match.findings import evidence_of
from diagnose.model import Finding
from diagnose.normalize.facts.nccl import is_nccl_warn

FACT = "nccl_warning_line"  # the line number of the warning added to the evidence


def _names_nccl(text: str) -> bool:
    return "nccl" in text.lower()


def add_cause_warning(findings: list[Finding], root_index: int | None, hits: list[Hit]) -> None:
    """Put the failing rank's first ``NCCL WARN`` line before the root NCCL error among the root's evidence."""
    if root_index is None:
        return
    root = findings[root_index]
    first = next((h for h in hits if h.rule.rule.code == root.rule and h.line.lineno == root.first_line
                  and any(e.path == h.line.path and e.line == h.line.lineno for e in root.evidence)), None)
    if first is None or is_nccl_warn(first.line.text) or not _names_nccl(first.line.text):
        return
    line = first.line
    warnings = [h.line for h in hits if h.line.path == line.path and h.line.lineno < line.lineno
                and is_nccl_warn(h.line.text) and h.rule.rule.severity != "info"
                and (h.rank is None or first.rank is None or h.rank == first.rank)
                and (not h.line.host or not line.host or h.line.host == line.host)]
    if not warnings:
        return
    warning = min(warnings, key=lambda w: w.lineno)
    if any(e.path == warning.path and e.line == warning.lineno for e in root.evidence):
        return
    at = next((i for i, e in enumerate(root.evidence) if e.path == line.path and e.line == line.lineno),
              len(root.evidence))
    root.evidence.insert(at, evidence_of(warning))
    root.facts.setdefault(FACT, warning.lineno)
