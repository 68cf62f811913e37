"""Integers out of loosely typed values (facts from log lines, JSON sections, config values), in one place.

Facts are strings when a rule's named group caught them and ints when a parser did; JSON numbers may be floats.
``as_int`` never raises: whatever is not an integer of the kind asked for is None.
"""

from __future__ import annotations

from typing import Any


def as_int(
    v: Any, *, floats: bool = False, strings: bool = True, negative: bool = True, max_len: int | None = None
) -> int | None:
    """``v`` as an int, or None. Booleans are never numbers. ``floats``: a float with an integral value counts;
    ``strings``: a string of ASCII digits (after stripping; a leading "-" when ``negative``) counts, at most
    ``max_len`` characters long; ``negative`` applies to strings only (an int is returned as it is)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if floats and v.is_integer() else None
    if strings and isinstance(v, str):
        s = v.strip()
        digits = s[1:] if negative and s.startswith("-") else s
        if digits.isascii() and digits.isdigit() and (max_len is None or len(s) <= max_len):
            return int(s)
    return None
