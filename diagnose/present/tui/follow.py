"""Tail mode (``diagnose tui --follow LOG``, or ``f`` in the log view): which appended lines call for a new diagnosis.

The log view shows appended lines as the ``LogIndex`` follows the file. Running the whole analysis for every new
line would be wasteful on a chatty job, so the app asks ``FailureLines`` whether the new lines hold a line that an
error rule of the catalogue matches (its anchor literal, then its regex, on the normalised line, as the engine
does), and diagnoses again once the file has been quiet for ``DEBOUNCE_S``.
"""

from __future__ import annotations

from collections.abc import Iterable

from diagnose.normalize import decode, normalize_line

DEBOUNCE_S = 1.0  # diagnose again once no line was appended for this long
MAX_WAIT_S = 10.0  # ... or after this long, on a log that never pauses
CHECK_LINES = 2000  # more new lines than this at once: diagnose again without reading them (about 0.1 ms a line)


class FailureLines:
    """The error rules' anchors and patterns of a catalogue (built-in plus ``rules_dirs``)."""

    def __init__(self, rules_dirs: list[str]) -> None:
        from diagnose.match.compiled import compile_catalogue
        from diagnose.match.rules import load_catalogue

        compiled = compile_catalogue(load_catalogue(rules_dirs), [])
        self._patterns: dict[str, list] = {}
        for cr in compiled.rules:
            if cr.rule.severity != "error":
                continue
            for pattern in cr.patterns:
                self._patterns.setdefault(pattern.anchor, []).append(pattern)

    def first(self, raw_lines: Iterable[bytes]) -> str | None:
        """The first of ``raw_lines`` an error rule matches (its normalised text), or None."""
        for raw in raw_lines:
            text = normalize_line(decode(raw)).text
            for anchor, patterns in self._patterns.items():  # (``in`` per anchor beats one regex alternation)
                if anchor in text and any(p.regex.search(text) is not None for p in patterns):
                    return text
        return None
