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
RUN = "a." * (MAX_LINE_BYTES // 2 - 16)
DOTTED = [RUN + "b Error", RUN + "Error: x"]
LONG = MAX_LINE_BYTES - 64  # a line as long as the engine reads

LINES = {
    "CV240": ["a" * N + ".py: error: unrecognized arguments: --x",
              "a." * (N // 2) + "py: error: unrecognized arguments: --x",
              "x.py: error: unrecognized arguments: " + "a.py" * (N // 4) + "x"],
    "CV100": ["a" * N + ".py: error: "],
    "CV101": ["a" * N + ".py: error: unrecognized arguments: "],
    "EC170": ["a." * (N // 2) + ": Caught X in replica 1 on device ",
              "a" * N + ": Caught X in replica 1 on device "],
    # torch's short NCCL error form: a lazy reason before \s*$ rescanned the blanks from every position
    "PY006": ["RuntimeError: NCCL Error 3: internal error" + " " * N + "(x", "NCCL Error 5: invalid usage" + " " * N + "(x"],
    # every rule whose exception-name prefix is bounded (test_every_exception_name_prefix_is_covered keeps this
    # list whole), each with lines carrying its own anchors and margin
    "PY001": DOTTED,
    "EC002": DOTTED,
    "EC160": DOTTED + [RUN + "b Exception"],
    "PY010": [RUN + "errors.b x", RUN + "exceptions.b x", RUN + "exc.b x"],
    "PY011": ["  " + RUN + "b Error", "  " + RUN + "b Exception"],
    "PY050": [RUN + "b Error(x)", RUN + "b Exception(x)"],
    "PY012": [RUN + "b ModuleNotFoundError", RUN + "b ImportError"],
    "PY140": ["E   " + RUN + "b Error", "E   " + RUN + "b Exception"],
    "EC141": [RUN + "b ActorError: A remote actor call has failed"],
    # the loss name `[\w./-]*[Ll]oss` after a separator that is also a name character ("-", "/", "."): from every
    # start the name ran to the line's end and back looking for "oss" (round 21's tqdm form: past the limit on a 256 KiB line); bounded to 64
    "NU005": ["-" * LONG + "loss nan: 5%|", "-" * LONG + "loss nan x", "/" * LONG + "loss NaN x",
              "|" + "a" * LONG + "Loss nan|", "-" * LONG + "loss tensor (nan"],
    # the local directory ran lazily to the line's end from each " vs " trying the registered one (round 21)
    "DA252": ["Reused local directory: " + " vs a" * (LONG // 5), "Reused local directory: " + "a" * LONG],
}
_PREFIX = r"(?:[A-Za-z_]\w*\.){"


@pytest.mark.parametrize("code", sorted(LINES))
def test_a_100_kb_line_that_does_not_match_is_refused_inside_the_engines_limit(code):
    rule = CATALOGUE.by_code(code)
    assert rule is not None
    for line in LINES[code]:
        searched = 0
        for p in rule.patterns:
            if p.anchor not in line:
                continue
            searched += 1
            try:
                found = regex.search(p.regex, line, timeout=REGEX_TIMEOUT_S)
            except TimeoutError:
                pytest.fail(f"{code}: the engine would drop this rule on a 100 KB line: {p.regex}")
            assert found is None, (code, p.regex)
        # a line that carries none of the rule's anchors tests nothing
        assert searched, (code, line[-60:])


def test_every_exception_name_prefix_is_covered():
    """A new rule that reads a dotted exception name gets a long line here too."""
    with_prefix = {r.code for r in CATALOGUE.rules if any(_PREFIX in p.regex for p in r.patterns)}
    assert with_prefix <= set(LINES), sorted(with_prefix - set(LINES))


def test_the_other_exception_name_readers_refuse_a_long_dotted_line_inside_the_limit():
    """PY013's traceback_ends_with and inference's type reader carry the same prefix; the bound still reads a real
    name (torchrun's five-segment ChildFailedError)."""
    from diagnose.match.inference import _EXC_TYPE

    ends_with = CATALOGUE.by_code("PY013").context.traceback_ends_with
    assert _PREFIX in ends_with and _PREFIX in _EXC_TYPE.pattern
    for line in DOTTED + [RUN + "b"]:
        for pattern in (ends_with, _EXC_TYPE.pattern):
            try:
                regex.search(pattern, line, timeout=REGEX_TIMEOUT_S)
            except TimeoutError:
                pytest.fail(f"a 256 KiB dotted line outlasts the engine's limit: {pattern}")
    real = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
    found = _EXC_TYPE.match(real + ": x")
    assert found is not None and found.group(1) == real


def test_the_composer_progress_marker_refuses_a_long_carriage_return_line_inside_the_limit():
    """A phase marker is a capture the engine searches under the same limit: the Composer bar's unbounded bracket
    ran from every bar of a carriage-return-joined line to its end (round 22), so the marker was dropped there."""
    from diagnose.normalize.phases import CAPTURES

    bars = [c for c in CAPTURES if c.anchor == "loss/train"]
    assert bars
    for c in bars:
        try:
            assert regex.search(c.regex, "| 1/2 [a, loss/train" * (LONG // 20), timeout=REGEX_TIMEOUT_S) is None
        except TimeoutError:
            pytest.fail(f"a 256 KiB bar line outlasts the engine's limit: {c.regex}")


def test_phase_frame_patterns_stay_linear_on_a_long_function_name():
    """The phase file's frame patterns are searched (stdlib re, no time limit) in the joined ``file:function`` keys of
    a traceback, whose names the log writes: dp_wrap's ':wrap_\\w*(?i:fsdp|ddp)\\w*$' (round 23) took 70 s on a
    256 KiB name of repeated 'fsdp_' ending in '.x'; each pattern must refuse such names at once."""
    import time

    from diagnose.normalize.phase_file import load_phase_file

    n = 50_000
    keys = ["x.py:wrap_" + "fsdp_" * (n // 5) + ".x", "x.py:" + "a_" * (n // 2) + ".x",
            "/".join(["a"] * (n // 2)) + ".py:f.x", "x.py:" + "save_" * (n // 5) + ".x"]
    for frame in load_phase_file().frames:
        for key in keys:
            start = time.perf_counter()
            frame.pattern.search(key)
            assert time.perf_counter() - start < 0.5, (frame.phase, frame.pattern.pattern, key[:40])
