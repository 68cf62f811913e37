"""The catalogue and capture specs compiled for scanning: regexes, the anchor table, which rules hang off which anchor.

Regexes are compiled with the ``regex`` module (it can time out a search: a user's catastrophic regex is reported,
named, and switched off instead of hanging the tool). A rule whose regex does not compile is skipped with a
warning; it never stops the scan.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field

import regex
from regex import Pattern as RegexPattern  # a class field below is named `regex`

from diagnose.match.anchors import loosen
from diagnose.match.rules import Catalogue, Context, Rule
from diagnose.model import CaptureSpec

NO_CONTEXT = Context()  # a rule with no [rule.context] conditions

REGEX_TIMEOUT_S = 1.0  # per search; only a pathological pattern comes near it


@dataclass(slots=True)
class CompiledPattern:
    """A rule pattern; its regex is compiled on first use (a small log needs a handful of the catalogue's 900)."""

    anchor: str
    source: str
    _rx: RegexPattern | None = None

    @property
    def regex(self) -> RegexPattern:
        rx = self._rx
        if rx is None:
            rx = self._rx = regex.compile(self.source)
        return rx


@dataclass(slots=True)
class CompiledRule:
    index: int  # position in ``Compiled.rules`` (= catalogue order among the rules that compiled)
    rule: Rule
    patterns: list[CompiledPattern]
    has_context: bool
    disabled: bool = False  # set when a search timed out
    # context.traceback_ends_with: what the line ending a traceback whose header the rule matched must match
    traceback_end: CompiledPattern | None = None
    # evidence.following: the lines after the matched one that join its evidence (rules.EvidenceSpec)
    following: CompiledPattern | None = None
    preceding: CompiledPattern | None = None  # evidence.preceding: the lines before it that join its evidence


FILTER_AFTER = 16  # lines a capture checks before its loosened filters are compiled (see CompiledCapture)


@dataclass(slots=True)
class CompiledCapture:
    """A capture spec and its regexes, compiled on first use: a capture's literal is searched first, and a small log
    holds few of the 140 literals (compiling all three regexes of every capture cost ~0.1 s per start).

    The two loosened forms of the regex (``loose``, ``window_rx``) only reject lines early: a line they let through is
    still judged by ``accepts``. A capture whose literal is on a few lines checks them faster than it compiles
    them, so they are compiled once it has checked ``FILTER_AFTER`` lines (the answers are the same either way)."""

    spec: CaptureSpec
    literal: bytes  # the anchor as UTF-8: captures are found by byte search, not in phase 1
    _built: bool = False
    _regex: RegexPattern | None = None
    _checked: int = 0  # lines may_accept_raw was asked about
    _filters_built: bool = False
    _loose: RegexPattern | None = None  # the regex loosened for the raw line (a cheap necessary condition)
    _window_rx: re.Pattern[bytes] | None = None  # loosened, on one line's bytes, in ASCII windows: a cheap reject
    broken: str = ""  # why the spec's regex does not compile (the capture then accepts no line)

    def _build(self) -> None:
        self._built = True
        spec = self.spec
        if not spec.regex:
            return
        try:
            self._regex = regex.compile(spec.regex)
        except (regex.error, TypeError, ValueError) as e:
            self.broken = str(e) or type(e).__name__

    def _build_filters(self) -> None:
        self._filters_built = True
        if self.regex is None:  # no regex, or one that does not compile: nothing to loosen
            return
        loosened = loosen(self.spec.regex or "")
        if loosened is not None:
            with contextlib.suppress(regex.error, TypeError, ValueError):
                self._loose = regex.compile(loosened)
            with contextlib.suppress(re.error, ValueError):
                self._window_rx = re.compile(loosened.encode("ascii"))

    @property
    def regex(self) -> RegexPattern | None:
        if not self._built:
            self._build()
        return self._regex

    @property
    def loose(self) -> RegexPattern | None:
        """The loosened regex, once the capture has checked ``FILTER_AFTER`` lines (None before: no early reject)."""
        if not self._filters_built:
            if self._checked < FILTER_AFTER:
                return None
            self._build_filters()
        return self._loose

    @property
    def window_rx(self) -> re.Pattern[bytes] | None:
        """The loosened regex on bytes, once the capture has checked ``FILTER_AFTER`` lines (None before)."""
        if not self._filters_built:
            if self._checked < FILTER_AFTER:
                return None
            self._build_filters()
        return self._window_rx

    def accepts(self, text: str) -> bool:
        """Does a normalised line qualify (anchor present, regex matches if any)?"""
        if self.spec.anchor not in text:
            return False
        rx = self.regex
        if self.broken:
            return False
        return rx is None or rx.search(text) is not None

    def may_accept_raw(self, raw: str) -> bool:
        """False only when the line cannot qualify: the loosened regex fails on the raw line (no ANSI/CR in it)."""
        loose = self.loose
        self._checked += 1
        if loose is None or "\x1b" in raw or "\r" in raw or "\x9b" in raw:
            return True
        return loose.search(raw) is not None


@dataclass
class Compiled:
    rules: list[CompiledRule]
    captures: list[CompiledCapture]
    anchors: list[str]  # distinct anchor strings of the rules' patterns
    literals: list[bytes]  # the anchors as UTF-8 bytes
    anchor_patterns: list[list[str]]  # anchor index -> the regexes of the patterns having that anchor
    rules_by_anchor: list[tuple[int, ...]]  # anchor index -> indices of rules having a pattern with that anchor
    warnings: list[str] = field(default_factory=list)
    # an [[infer]] table reads ``release_named``: only then does a generic hit look up the release the log named
    # before it (inference.release_named_before searches back up to RELEASE_LOOKBACK_BYTES)
    reads_releases: bool = False


def compile_catalogue(catalogue: Catalogue, captures: list[CaptureSpec] | None = None) -> Compiled:
    """Each rule's regex is compiled on first use (``load_catalogue`` checked every regex it read, or read it from
    a file cached after that check; a rule built otherwise whose regex fails is switched off with a warning then)."""
    warnings: list[str] = []
    anchor_index: dict[str, int] = {}
    rules_by_anchor: list[list[int]] = []
    anchor_patterns: list[list[str]] = []  # anchor index -> the distinct regexes having it

    def anchor_id(a: str) -> int:
        if a not in anchor_index:
            anchor_index[a] = len(anchor_index)
            rules_by_anchor.append([])
            anchor_patterns.append([])
        return anchor_index[a]

    compiled_rules: list[CompiledRule] = []
    for rule in catalogue.rules:
        if rule.input != "log":  # a slurm_job rule reads a job's Slurm record, never a line
            continue
        patterns = [CompiledPattern(rp.anchor, rp.regex) for rp in rule.patterns]
        cr = CompiledRule(
            index=len(compiled_rules),
            rule=rule,
            patterns=patterns,
            # any condition set (a Context unlike the default one), so a new condition needs no entry here
            has_context=rule.context != NO_CONTEXT or any(rp.levels_any for rp in rule.patterns),
            traceback_end=(CompiledPattern("", rule.context.traceback_ends_with)
                           if rule.context.traceback_ends_with else None),
            following=CompiledPattern("", rule.evidence.following) if rule.evidence.following else None,
            preceding=CompiledPattern("", rule.evidence.preceding) if rule.evidence.preceding else None,
        )
        compiled_rules.append(cr)
        for p in patterns:
            i = anchor_id(p.anchor)
            if cr.index not in rules_by_anchor[i]:
                rules_by_anchor[i].append(cr.index)
            if p.source not in anchor_patterns[i]:
                anchor_patterns[i].append(p.source)

    compiled_captures: list[CompiledCapture] = []
    for spec in captures or []:
        if not spec.anchor:
            warnings.append(f"capture {spec.name}: empty anchor; ignored")
            continue
        # compiled on first use (CompiledCapture); the built-in captures' regexes are checked by ``rules lint``
        # and tests/test_perf46.py
        compiled_captures.append(CompiledCapture(spec, spec.anchor.encode("utf-8")))

    anchors = list(anchor_index)
    return Compiled(
        rules=compiled_rules,
        captures=compiled_captures,
        anchors=anchors,
        literals=[a.encode("utf-8") for a in anchors],
        anchor_patterns=anchor_patterns,
        rules_by_anchor=[tuple(sorted(x, reverse=True)) for x in rules_by_anchor],
        warnings=warnings,
        reads_releases=any(inf.release_named is not None for inf in catalogue.inferences),
    )
