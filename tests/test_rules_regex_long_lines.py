"""Patterns that once backtracked on a long line (review of stop 32): each is searched in 100 KB lines that carry its
anchor but do not match, as a log's tensor dump or progress line can. The engine gives a search 1 s
(compiled.REGEX_TIMEOUT_S) and drops the rule on that line past it; these must stay far below."""

from __future__ import annotations

import time

import pytest
import regex

from diagnose.match import load_catalogue

CATALOGUE = load_catalogue()
N = 100_000

LINES = {
    "CV240": ["a" * N + ".py: error: unrecognized arguments: --x",
              "a." * (N // 2) + "py: error: unrecognized arguments: --x",
              "x.py: error: unrecognized arguments: " + "a.py" * (N // 4) + "x"],
    "CV100": ["a" * N + ".py: error: "],
    "CV101": ["a" * N + ".py: error: unrecognized arguments: "],
    "EC170": ["a." * (N // 2) + ": Caught X in replica 1 on device ",
              "a" * N + ": Caught X in replica 1 on device "],
}


@pytest.mark.parametrize("code", sorted(LINES))
def test_a_100_kb_line_that_does_not_match_is_refused_quickly(code):
    rule = CATALOGUE.by_code(code)
    assert rule is not None
    for line in LINES[code]:
        for p in rule.patterns:
            if p.anchor not in line:
                continue
            start = time.perf_counter()
            regex.search(p.regex, line, timeout=5)
            assert time.perf_counter() - start < 0.25, (code, p.regex)
