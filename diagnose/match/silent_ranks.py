"""Name the ranks that did NOT report an NCCL watchdog timeout: they are the likely culprits.

When a collective hangs, every rank that reached it times out and says so; the rank that never reached it (stuck in
a data loader, a checkpoint load, a dead GPU, a process killed without a trace) is the one that stays silent. If
ranks "0-7, 9" of a 10-rank job report the timeout, rank 8 is the one to look at.

The world size is the ``world_size`` fact of any finding when the log states it, else the highest rank seen in any
finding + 1 (so only gaps below the highest rank can be named). Work is O(world size) with a hard cap, and nothing is
said when the silent ranks are not a small minority (a log holding only some ranks' output would otherwise make
every absent rank a "culprit").
"""

from __future__ import annotations

from diagnose.coerce import as_int
from diagnose.match.hang import ranks_phrase
from diagnose.match.rereading import add_paragraph
from diagnose.model import Finding

NCCL_TIMEOUT = "nccl_timeout"
MAX_WORLD = 1 << 17  # beyond this a world_size fact is not believed (and the set difference stays cheap)
MAX_SILENT = 64  # never name more ranks than this
FACT = "silent_ranks"


def world_size(findings: list[Finding]) -> int | None:
    """The job's world size: a stated ``world_size`` fact wins, else the highest rank seen + 1."""
    stated = [w for f in findings if (w := as_int(f.facts.get("world_size"))) is not None and 0 < w <= MAX_WORLD]
    highest = max((r for f in findings for r in f.ranks if isinstance(r, int) and 0 <= r < MAX_WORLD), default=None)
    if stated:
        w = max(stated)
        return w if highest is None or highest < w else highest + 1
    return None if highest is None else highest + 1


def silent_ranks(reported: set[int], world: int) -> list[int]:
    """Ranks in ``range(world)`` missing from ``reported``, or ``[]`` when they are not a small minority."""
    if world <= 1 or world > MAX_WORLD or len(reported) < 2:
        return []
    missing = [r for r in range(world) if r not in reported]
    if not missing or len(missing) > MAX_SILENT or len(missing) > max(1, len(reported) // 4):
        return []
    return missing


def silent_sentence(ranks: list[int]) -> str:
    """"rank 8 did not report the timeout: it is the likely culprit (stuck, or died without a trace)"."""
    they = "it is the likely culprit" if len(ranks) == 1 else "they are the likely culprits"
    return f"{ranks_phrase(ranks)} did not report the timeout: {they} (stuck, or died without a trace)"


def mark_silent_ranks(findings: list[Finding], root_index: int | None) -> None:
    """Add ``facts["silent_ranks"]`` to the leading NCCL timeout finding when some ranks stayed silent.

    The leading one is the root cause when it is an NCCL timeout (its explanation then says which rank to look at),
    else the first NCCL timeout finding. Ranks are pooled over every NCCL timeout finding (two wordings of the
    watchdog line are still one timeout).
    """
    timeouts = [i for i, f in enumerate(findings) if f.category == NCCL_TIMEOUT and f.ranks]
    if not timeouts:
        return
    reported = {r for i in timeouts for r in findings[i].ranks if isinstance(r, int)}
    world = world_size(findings)
    missing = silent_ranks(reported, world) if world is not None else []
    if not missing:
        return
    lead = root_index if root_index in timeouts else timeouts[0]
    f = findings[lead]
    f.facts[FACT] = missing
    if lead == root_index:
        sentence = silent_sentence(missing)
        sentence = sentence[0].upper() + sentence[1:] + ("; look at its log first." if len(missing) == 1
                                                         else "; look at their logs first.")
        add_paragraph(f, sentence)
