"""What the readings that run after ranking (silent_ranks, collective_skew, topology, one_host) do to the root they
re-read: add a paragraph to its explanation, or read it as the hardware's fault with the evidence that says so."""

from __future__ import annotations

from diagnose.model import Finding


def add_paragraph(f: Finding, text: str) -> None:
    """Append ``text`` to the finding's explanation as a paragraph of its own."""
    f.explanation = f"{f.explanation.rstrip()}\n\n{text}" if f.explanation else text


def read_as_hardware(f: Finding, detail: str, paragraph: str, confidence: float) -> None:
    """Make ``f`` a hardware finding inferred from other evidence than its own line (``detail``: what decided it),
    no more confident than ``confidence``, and say why in a paragraph of its explanation."""
    f.category = "hardware"
    f.basis = "inferred"
    f.basis_detail = detail
    f.confidence = min(f.confidence, confidence)
    add_paragraph(f, paragraph)
