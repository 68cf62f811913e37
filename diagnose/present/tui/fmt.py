"""Small formatting helpers shared by the TUI widgets (no Textual import)."""

from __future__ import annotations

from collections.abc import Iterable

from diagnose.model import rank_runs
from diagnose.units import format_bytes as format_bytes  # the one byte formatter, re-exported for the widgets


def format_ranks(ranks: Iterable[int]) -> str:
    """Compress a rank list into runs: [0, 1, 2, 3, 9, 11, 12] -> "0-3, 9, 11-12"."""
    return ", ".join(rank_runs(ranks))


def compact_ranks(ranks: Iterable[int], limit: int = 40) -> str:
    """``format_ranks`` when it is short; else how many and their span: "200 ranks in 1-511"."""
    unique = sorted(set(ranks))
    full = format_ranks(unique)
    if len(full) <= limit:
        return ("rank " if len(unique) == 1 else "ranks ") + full
    return f"{len(unique)} ranks in {unique[0]}-{unique[-1]}"


def rank_phrase(ranks: list[int], hosts: list[str], count: int, limit: int = 40) -> str:
    """"ranks 0-7, 9 · 2 hosts · ×512": who saw a finding and how often (long rank sets summarised)."""
    parts: list[str] = []
    if ranks:
        parts.append(compact_ranks(ranks, limit))
    if len(hosts) > 1:
        parts.append(f"{len(hosts)} hosts")
    elif hosts:
        parts.append(hosts[0])
    if count > 1:
        parts.append(f"×{count}")
    return " · ".join(parts)
