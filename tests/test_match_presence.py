"""Phase-1 presence engines answer exactly which literals occur in a window (issue 15): the pure-Python one by
line shapes (digits and hex letters mapped, repeated lines searched once) never misses one nor invents one."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.match import anchors

LITERALS = [b"CUDA out of memory", b"nccl", b"Error", b"rank 12", b"0xdead", b"a\nb", b"\x1b", b"loss: ", b"ff"]
ENGINES = ["python"] + [e for e, mod in (("re2", "re2"), ("hyperscan", "hyperscan")) if importlib.util.find_spec(mod)]

lines = st.lists(st.sampled_from([b"rank 12 ok", b"rank 13 ok", b"ncclCommInit 0x5e", b"loss: 1.5", b"CUDA out of",
                                  b" memory", b"a", b"b", b"Err", b"or", b"\x1b[1m", b"0xdeadbeef", b"x" * 50,
                                  "caf\u00e9".encode(), b"\xff\xfe"]), max_size=40)


@settings(max_examples=150, deadline=None)
@given(windows=st.lists(lines, min_size=1, max_size=4), sep=st.sampled_from([b"\n", b"", b" "]))
def test_every_engine_reports_exactly_the_literals_present(windows, sep):
    engines = {}
    for name in ENGINES:
        e = anchors._ENGINES[name](LITERALS)
        if name == "python":
            e.MAX_SHAPES = 5  # forgets often: must not matter
        engines[name] = e
    for parts in windows:  # one engine instance over several windows: what it remembers carries over
        window = sep.join(parts)
        expected = [i for i, lit in enumerate(LITERALS) if lit in window]
        for name, e in engines.items():
            assert e.present(window) == expected, (name, window)


def test_line_filter_refuses_lookarounds_and_loosens_anchors():
    assert anchors.line_filter([r"(?<!foo)bar"]) is None
    assert anchors.line_filter([r"bar(?=baz)"]) is None
    (rx,) = anchors.line_filter([r"^Error: (?P<x>\w+)$"])
    assert rx.search("[rank3]: Error: boom")  # the prefix before the text does not stop it


def test_a_forced_scanner_is_used(monkeypatch):
    monkeypatch.setenv("DIAGNOSE_SCANNER", "python")
    assert anchors.resolve_backend("auto") == "python"
    assert anchors.resolve_backend("hyperscan") == "hyperscan"  # an explicit choice wins
    monkeypatch.setenv("DIAGNOSE_SCANNER", "bogus")
    assert anchors.resolve_backend("auto") == "auto"
    p = anchors.Phase1([b"Error"], [["Error"]], [], backend="python")
    assert p.name == "python"


@pytest.mark.parametrize("backend", ENGINES)
def test_noisy_anchor_lines_are_candidates_only_where_their_regex_can_match(backend):
    p = anchors.Phase1([b"nccl"], [[r"(?P<r>nccl[A-Z]\w*Error): (?P<d>.+)$"]], [], backend=backend)
    window = (b"x ncclCommInitRank ok\n[rank1]: ncclSystemError: boom\n[rank2]: ncclInternalError: caf\xc3\xa9\n"
              b"\x1b[1mnccl\nnccl\xff\n")
    starts, _ = p.scan(window)
    assert 0 not in starts  # the anchor is there, its regex cannot match: not a candidate
    assert window.index(b"[rank1]") in starts
    assert window.index(b"[rank2]") in starts  # not ASCII, and the text can match
    assert window.index(b"\x1b") in starts  # an escape can hide anything: kept
    assert window.index(b"nccl\xff") in starts  # invalid UTF-8 is shown as \xNN in the text: kept
