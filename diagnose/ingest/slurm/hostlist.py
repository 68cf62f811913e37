"""Slurm host lists: ``gpu[01-04,07]``, ``rack[1-2]-n[1-3]``, ``a,b`` -> one host name each, in Slurm's order.

Pure functions, never raise: a list that cannot be read gives the names it could read (a malformed part is kept
as written). ``limit`` bounds the expansion, since a range like ``n[0-999999]`` would otherwise build a million
names.
"""

from __future__ import annotations

import re

_EMPTY = ("", "None", "(null)", "None assigned")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: ``a[1,2],b`` -> ``["a[1,2]", "b"]``."""
    parts: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _bracket_values(body: str, limit: int) -> list[str] | None:
    """``01-04,07`` -> ``["01", "02", "03", "04", "07"]`` (zero padding kept); None when not a range list."""
    values: list[str] = []
    for item in body.split(","):
        m = _RANGE.fullmatch(item.strip())
        if m is None:
            return None
        lo_text, hi_text = m.group(1), m.group(2)
        lo = int(lo_text)
        hi = int(hi_text) if hi_text is not None else lo
        width = len(lo_text) if lo_text.startswith("0") else 0
        for n in range(lo, min(hi, lo + limit) + 1):
            values.append(str(n).zfill(width))
            if len(values) >= limit:
                return values
    return values


def _expand_one(name: str, limit: int) -> list[str]:
    """One host expression, possibly with several bracket groups (a cartesian product)."""
    m = re.search(r"\[([^\[\]]*)\]", name)
    if m is None:
        return [name]
    values = _bracket_values(m.group(1), limit)
    if values is None:
        return [name]
    head, tail = name[: m.start()], name[m.end() :]
    out: list[str] = []
    for v in values:
        for rest in _expand_one(tail, limit):
            out.append(head + v + rest)
            if len(out) >= limit:
                return out
    return out


def expand_hostlist(text: str | None, limit: int = 100_000) -> list[str]:
    """Every host of a Slurm node list, at most ``limit`` names."""
    s = (text or "").strip()
    if s in _EMPTY:
        return []
    hosts: list[str] = []
    for part in split_top_level(s):
        hosts.extend(_expand_one(part, limit - len(hosts)))
        if len(hosts) >= limit:
            return hosts[:limit]
    return hosts
