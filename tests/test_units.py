"""The shared helpers for numbers (diagnose/coerce.py) and byte sizes (diagnose/units.py): one place each."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from diagnose.coerce import as_int
from diagnose.units import format_bytes, format_gib_short, parse_size


def test_as_int_kinds():
    assert as_int(7) == 7 and as_int(-7) == -7 and as_int(" 12 ") == 12 and as_int("-3") == -3
    assert as_int(True) is None and as_int(None) is None and as_int("1.5") is None and as_int([1]) is None
    assert as_int(4.0) is None and as_int(4.0, floats=True) == 4 and as_int(4.5, floats=True) is None
    assert as_int("-3", negative=False) is None and as_int("12", strings=False) is None
    assert as_int("1" * 21, max_len=20) is None and as_int("1" * 20, max_len=20) == int("1" * 20)


def test_as_int_never_raises_on_text_that_only_looks_like_digits():
    # the former per-module coercers raised ValueError here ("--5" passed lstrip("-"), "²" passes isdigit)
    for text in ("--5", "²", "-", "", "٣"):
        assert as_int(text) is None


@given(st.one_of(st.text(max_size=30), st.integers(), st.floats(allow_nan=True), st.booleans(), st.none()))
def test_as_int_is_total(v):
    out = as_int(v, floats=True)
    assert out is None or isinstance(out, int)


def test_sizes():
    assert parse_size("80GiB") == parse_size("80G") == parse_size("80 gib") == 80 << 30
    assert parse_size("141GB") == 141 * 10**9 and parse_size("1024") == 1024 and parse_size("2.5 MiB") == 5 << 19
    assert parse_size("80 parsecs") is None and parse_size("") is None
    assert format_bytes(145309481042) == "135.33 GiB" and format_bytes(512) == "512 B" and format_bytes(None) == "?"
    assert format_gib_short(3 << 30) == "3.0G" and format_gib_short(None) == "?"
