"""match: find what the rules catalogue says about a log, group it into findings and pick the root cause.

``scan_and_match(sources, catalogue)`` is the stage entry point (see docs/ARCHITECTURE.md); ``match_text`` does the
same on a string (rule examples, tests, the TUI's paste screen).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from diagnose.match.rules import Catalogue, load_catalogue
from diagnose.model import Block, CaptureSpec, Report

__all__ = ["MatchResult", "TextSource", "all_captures", "load_catalogue", "match_text", "scan_and_match"]

_CAPTURE_MODULES = ("diagnose.normalize.phases", "diagnose.explain.config", "diagnose.explain.verify.facts",
                    "diagnose.match.topology", "diagnose.normalize.loss_series")


@dataclass
class MatchResult:
    report: Report
    blocks: dict[str, list[Block]] = field(default_factory=dict)


@dataclass
class TextSource:
    """A source made from bytes in memory (``match_text``, tests): the fields of an ingest Source the scan reads."""

    path: str
    buffer: bytes
    rank_hint: int | None = None


def all_captures() -> list[CaptureSpec]:
    """Capture specs the later stages asked for: each module's ``CAPTURES``, imported by name (match imports no
    later stage)."""
    return [spec for name in _CAPTURE_MODULES for spec in importlib.import_module(name).CAPTURES]


def scan_and_match(
    sources: list,
    catalogue: Catalogue,
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
    captures: list[CaptureSpec] | None = None,
    backend: str = "auto",
) -> MatchResult:
    """Scan ``sources`` with ``catalogue``: findings grouped across ranks, ranked, ``root_cause`` set.

    ``jobs`` > 1 runs phase 1 of large inputs in that many forked worker processes (same answers). ``backend``
    picks the phase-1 engine: "auto", "hyperscan", "re2" or "python"; all give the same answer.
    """
    from diagnose.match.attribution import attribute_ranks
    from diagnose.match.category_fix import give_category_fixes
    from diagnose.match.cause_warning import add_cause_warning
    from diagnose.match.collective_skew import mark_collective_skew
    from diagnose.match.compiled import compile_catalogue
    from diagnose.match.engine import scan_deferring
    from diagnose.match.findings import group_hits
    from diagnose.match.flat_loss import ended_from_outside, flat_loss
    from diagnose.match.hang_at_exit import hang_at_exit
    from diagnose.match.one_host import node_confined_origin
    from diagnose.match.ranking import rank
    from diagnose.match.silent_ranks import mark_silent_ranks
    from diagnose.match.stack import decide_stack
    from diagnose.match.topology import pcie_p2p_hang
    from diagnose.match.wrapped import unwrap

    if captures is None:
        captures = all_captures()
    compiled = compile_catalogue(catalogue, captures)  # regexes compiled as lines need them
    warnings = list(compiled.warnings)
    hits, blocks, infos, deferred = scan_deferring(sources, compiled, warnings, progress=progress, backend=backend,
                                                  jobs=jobs)
    # a capture's regex is compiled when its literal is first found: one that did not compile accepted no line
    warnings.extend(f"capture {cc.spec.name}: regex does not compile ({cc.broken}); ignored"
                    for cc in compiled.captures if cc.broken)
    findings, root = rank(group_hits(unwrap(hits), catalogue.inferences))
    attribute_ranks(findings, root, frozenset(r.code for r in catalogue.rules if r.launcher == "torchrun"))
    mark_silent_ranks(findings, root)  # NCCL ranks that never reported (QA #13)
    mark_collective_skew(findings, root)  # desynced and straggling ranks
    pcie_p2p_hang(findings, root, blocks)  # an early hang over PCIe peer-to-peer only: the link
    node_confined_origin(findings, root)  # NCCL errors of a node's own on one host, consequences elsewhere
    add_cause_warning(findings, root, hits)  # the failing rank's first NCCL WARN among a root NCCL error's evidence
    completes = frozenset(r.code for r in catalogue.rules if r.completes)
    hang_at_exit(findings, root, blocks, completes)  # killed at the time limit after the work was done: a hang
    give_category_fixes(findings, catalogue)  # an inferred generic finding: the next step its category calls for
    report = Report(inputs=infos, findings=findings, root_cause=root, warnings=warnings,
                    stack=decide_stack(h.stack for h in hits))
    # the loss series (deferred captures) matters only then: a flat loss is no other cause's rival; an exploding
    # gradient norm also leads a root cause that is only the job's end (a cancel, a signal the launcher reports)
    if root is None or ended_from_outside(report.root, catalogue):
        blocks.update(deferred.blocks())
    flat_loss(report, blocks, catalogue)  # no error, and the loss never moved: the job learned nothing
    return MatchResult(report, blocks)


def match_text(
    text: str,
    catalogue: Catalogue,
    path: str = "<text>",
    captures: list[CaptureSpec] | None = None,
    backend: str = "auto",
) -> Report:
    """``scan_and_match`` on a string: the same answers as on a file with that content."""
    source = TextSource(path, text.encode("utf-8", "surrogateescape"))
    return scan_and_match([source], catalogue, captures=captures, backend=backend).report
