"""Turning printed values back into Python values, without eval.

Values reach us as Python ``repr``/``str`` (Configuration Summary, Megatron-LM argument dump, dataclass reprs) or
as Hydra/YAML scalars (``key=value`` overrides). Only plain literals are decoded: booleans, None/null, numbers,
quoted strings, ``torch.<dtype>`` (kept as the dtype name) and flat lists of those. Anything else stays the raw
string: it is shown, never interpreted.
"""

from __future__ import annotations

import re
from typing import Any

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_DTYPE = re.compile(r"torch\.(\w+)")
_MAX_LIST = 4096

TRUE_WORDS = {"true", "yes", "on"}
FALSE_WORDS = {"false", "no", "off"}
NULL_WORDS = {"none", "null", "~", ""}


def parse_scalar(text: str) -> Any:
    """Decode one printed value (``True``, ``'fsdp_dtensor'``, ``3e-05``, ``torch.bfloat16``, ``[1, 2]``)."""
    s = text.strip()
    low = s.lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    if low in NULL_WORDS:
        return None
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    if _INT.fullmatch(s):
        try:
            return int(s)
        except ValueError:  # pragma: no cover - absurdly long digit strings
            return s
    if _FLOAT.fullmatch(s):
        return float(s)
    m = _DTYPE.fullmatch(s)
    if m:
        return m.group(1)
    if len(s) >= 2 and s[0] == "[" and s[-1] == "]" and len(s) <= _MAX_LIST:
        inner = s[1:-1].strip()
        if not inner:
            return []
        if not any(c in inner for c in "[](){}"):
            return [parse_scalar(part) for part in inner.split(",")]
    return s


def as_bool(value: Any) -> bool:
    """Truthiness of a config value as the real code would see it (``"false"`` strings are False)."""
    if isinstance(value, str):
        low = value.strip().lower()
        return not (low in FALSE_WORDS or low in NULL_WORDS or low == "0")
    return bool(value)


def as_int(value: Any, default: int | None = None) -> int | None:
    if isinstance(value, bool) or value is None:
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INT.fullmatch(value.strip()):
        return int(value.strip())
    return default
