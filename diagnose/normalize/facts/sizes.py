"""Memory sizes as PyTorch prints them (``c10::CachingAllocator::format_size``) and back, in bytes."""

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


def format_size(n: int) -> str:
    """Exactly PyTorch's format_size: fixed two decimals, binary units, ``N bytes`` up to 1024."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1048576:
        return f"{n / 1024:.2f} KiB"
    if n <= 1073741824:
        return f"{n / 1048576:.2f} MiB"
    return f"{n / 1073741824:.2f} GiB"
