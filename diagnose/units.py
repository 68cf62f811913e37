"""Byte sizes for people, shared by every stage: the formatters and the parser of sizes a user types.

One place for each: ``format_bytes`` ("135.33 GiB", binary units with two decimals, as PyTorch prints them),
``format_gib_short`` ("135.3G", table columns) and ``parse_size`` ("80GiB", "80G" and "80 gib" are binary, "141GB"
decimal, a bare number is bytes). PyTorch's own message format (``N bytes`` up to 1024, exact round trip) is
``diagnose.normalize.facts.sizes``, which reads log text only.
"""

from __future__ import annotations

import math
import re

MIB = 1 << 20
GIB = 1 << 30

_UNITS = {
    "": 1,
    "b": 1,
    "bytes": 1,
    "k": 1 << 10,
    "kb": 1000,
    "kib": 1 << 10,
    "m": MIB,
    "mb": 1000**2,
    "mib": MIB,
    "g": GIB,
    "gb": 1000**3,
    "gib": GIB,
    "t": 1 << 40,
    "tb": 1000**4,
    "tib": 1 << 40,
}
SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")  # a number and its unit


def parse_size(text: str) -> int | None:
    """``"80GiB"``, ``"80G"`` (binary), ``"141GB"`` (decimal), ``"20.00 MiB"``, ``"1024"`` -> bytes (rounded to the
    nearest byte); None when it is not a size."""
    m = SIZE.match(text)
    if m is None or m.group(2).lower() not in _UNITS:
        return None
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    return int(round(value)) if math.isfinite(value) else None  # 400 digits are float("inf"): not a size


def format_bytes(n: int | float | None) -> str:
    """Human size in binary units, as PyTorch prints them: ``145309481042`` -> ``"135.33 GiB"``; ``"?"`` for None."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def fmt_gib(n: int | float | None, places: int = 2) -> str:
    """GiB with ``places`` decimals, for sentences: ``"135.33 GiB"``; ``"?"`` for None."""
    return "?" if n is None else f"{n / GIB:.{places}f} GiB"


def format_gib_short(n: int | float | None) -> str:
    """GiB with one decimal and no space, for table columns: ``"135.3G"``; ``"?"`` for None."""
    return "?" if n is None else f"{n / GIB:.1f}G"
