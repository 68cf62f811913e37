"""Patterns that once backtracked on a long line (review of stop 32): each is searched in 100 KB lines that carry its
anchor but do not match, as a log's tensor dump or progress line can. The engine gives a search
compiled.REGEX_TIMEOUT_S and drops the rule on that line past it: each search here runs under that same limit and
must finish inside it (before the review these took 75 s; now milliseconds), so the rule keeps its line."""

from __future__ import annotations

import pytest
import regex

from diagnose.match import load_catalogue
from diagnose.match.anchors import MAX_LINE_BYTES
from diagnose.match.compiled import REGEX_TIMEOUT_S

CATALOGUE = load_catalogue()
N = 100_000
# a dotted run as long as the engine reads of one line: the exception-name prefix `(?:name\.)*` backtracked through
# every segment (2 s at this length, past the engine's limit); bounded to 16 segments it is refused at once
DOTTED = ["a." * (MAX_LINE_BYTES // 2 - 8) + "b Error", "a." * (MAX_LINE_BYTES // 2 - 8) + "Error: x"]

LINES = {
    "CV240": ["a" * N + ".py: error: unrecognized arguments: --x",
              "a." * (N // 2) + "py: error: unrecognized arguments: --x",
              "x.py: error: unrecognized arguments: " + "a.py" * (N // 4) + "x"],
    "CV100": ["a" * N + ".py: error: "],
    "CV101": ["a" * N + ".py: error: unrecognized arguments: "],
    "EC170": ["a." * (N // 2) + ": Caught X in replica 1 on device ",
              "a" * N + ": Caught X in replica 1 on device "],
    "PY001": DOTTED,
    "EC002": DOTTED,
    "EC160": DOTTED,
}


@pytest.mark.parametrize("code", sorted(LINES))
def test_a_100_kb_line_that_does_not_match_is_refused_inside_the_engines_limit(code):
    rule = CATALOGUE.by_code(code)
    assert rule is not None
    for line in LINES[code]:
        for p in rule.patterns:
            if p.anchor not in line:
                continue
            try:
                found = regex.search(p.regex, line, timeout=REGEX_TIMEOUT_S)
            except TimeoutError:
                pytest.fail(f"{code}: the engine would drop this rule on a 100 KB line: {p.regex}")
            assert found is None, (code, p.regex)
