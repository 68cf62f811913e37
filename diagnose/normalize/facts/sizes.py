"""Memory sizes as PyTorch prints them (``c10::CachingAllocator::format_size``) read back in bytes."""

from __future__ import annotations

import re

_UNITS = {
    "bytes": 1,
    "byte": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
SIZE_PATTERN = r"\d+(?:\.\d+)?\s?(?:bytes|byte|[KMGT]i?B|B)"
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s?([A-Za-z]+)")


def parse_size(text: str) -> int | None:
    """``"20.00 MiB"`` -> 20971520. None when it is not a size."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        return None
    unit = _UNITS.get(m.group(2).lower())
    if unit is None:
        return None
    return int(round(float(m.group(1)) * unit))
