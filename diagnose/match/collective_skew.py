"""Name the ranks whose NCCL collective sequence disagrees with the others: a desync, or a straggler.

When a collective hangs, every rank that reached it prints the watchdog timeout with the same ``SeqNum`` and
``OpType``; grouping those lines into one finding kept only the first line's numbers. The ranks that disagree are
the story:

* a rank that timed out on a different SeqNum or OpType than the majority called collectives in a different order
  (it skipped a step, took another code path, a data-dependent branch): a **desync**;
* a rank whose last *enqueued* work is below the SeqNum the others hang in never reached the collective (stuck in
  data loading, checkpoint I/O, a dead GPU): a **straggler**. Its number comes from the watchdog's progress line
  (``last enqueued work: 811``) or from the flight recorder's "Received a dump signal ... Last enqueued NCCL work"
  line, which a stuck rank still prints when another rank times out.

While grouping, each NCCL timeout finding keeps a :class:`CollectiveSummary`: value tuple -> ranks, so memory grows
with the number of distinct tuples (capped) and the ranks, never with the number of lines. After ranking,
:func:`mark_collective_skew` pools the summaries of every NCCL timeout finding, per process group, and says
something only when a small minority disagrees (as ``silent_ranks`` does, and with the same caps).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from diagnose.coerce import as_int
from diagnose.match.hang import ranks_phrase
from diagnose.match.rereading import add_paragraph
from diagnose.model import Finding, rank_runs
from diagnose.normalize.facts.nccl import last_match
from diagnose.normalize.facts.slurm import expand_task_list

NCCL_TIMEOUT = "nccl_timeout"
FACT = "collective_groups"  # kept on a finding only while ranks disagree; the summary as JSON
FACT_DESYNC = "desync"
FACT_STRAGGLERS = "stragglers"
FIELDS = ("pg", "seq_num", "op_type", "numel_in", "last_enqueued", "last_completed")
MAX_TUPLES = 64  # distinct value tuples kept per finding; later new tuples are only counted
MAX_NAMED = 64  # never name more ranks than this (silent_ranks' cap)
MAX_RANK = 1 << 17  # a rank beyond this is not believed (silent_ranks' MAX_WORLD)
MAX_CLAUSES = 3  # distinct desync tuples spelled out in the sentence

# The watchdog's own prefix: "[Rank 5] ", "[PG 0 Rank 5] ", "[PG 0 (desc) Rank 5] ", "[PG ID 1 PG GUID 3(dp) Rank 5] ".
_PREFIX = re.compile(
    r"\[(?:PG ID (?P<pgid>\d{1,9}) PG GUID [^\]\s]{1,200} |PG (?P<pg>\d{1,9}) (?:\([^)\]]{0,200}\) )?)?"
    r"Rank (?P<rank>\d{1,9})\]"
)
_OP = re.compile(r"[A-Z_]{1,40}")

Key = tuple  # (pg, seq_num, op_type, numel_in, last_enqueued, last_completed), each value or None


@dataclass
class CollectiveSummary:
    """Ranks by the collective they reported: O(distinct tuples) entries, each a set of ranks."""

    groups: dict[Key, set[int]] = field(default_factory=dict)

    def add(self, key: Key, rank: int) -> None:
        """Count ``rank`` under ``key``; a tuple new after MAX_TUPLES distinct ones is dropped."""
        if key in self.groups or len(self.groups) < MAX_TUPLES:
            self.groups.setdefault(key, set()).add(rank)


def _int(v: Any) -> int | None:
    return as_int(v, max_len=20)  # a 10,000-digit "SeqNum" is no number


def collective_key(facts: dict[str, Any], text: str) -> tuple[Key, int | None] | None:
    """The value tuple a line reports and the rank its watchdog prefix names; None when it reports no progress."""
    seq, enq = _int(facts.get("seq_num")), _int(facts.get("last_enqueued"))
    if seq is None and enq is None:
        return None
    op = facts.get("op_type")
    op = op if isinstance(op, str) and _OP.fullmatch(op) else None
    head = text.find("Watchdog caught")
    prefix = last_match(_PREFIX, text, head if head > 0 else min(len(text), 400))  # the watchdog's, before it
    pg = None
    prefix_rank = None
    if prefix is not None:
        raw_pg = prefix.group("pgid") or prefix.group("pg")
        pg = int(raw_pg) if raw_pg is not None else None
        prefix_rank = int(prefix.group("rank"))
    key = (pg, seq, op, _int(facts.get("numel_in")), enq, _int(facts.get("last_completed")))
    # The watchdog's "Rank N" is the rank in its process group: a global rank only in the default group.
    return key, (prefix_rank if pg in (None, 0) else None)


def note_hit(summary: CollectiveSummary, facts: dict[str, Any], text: str, rank: int | None) -> None:
    """Add one NCCL timeout line to ``summary`` (``rank``: the launcher's rank, else the watchdog prefix's)."""
    got = collective_key(facts, text)
    if got is None:
        return
    key, prefix_rank = got
    r = rank if rank is not None else prefix_rank
    if r is None or not 0 <= r < MAX_RANK:
        return
    summary.add(key, r)


def summary_fact(summary: CollectiveSummary) -> list[dict[str, Any]]:
    """The summary as JSON: one entry per tuple, most ranks first, ranks as runs ("0-16", "18-63")."""
    out = []
    for key, ranks in sorted(summary.groups.items(), key=lambda kv: (-len(kv[1]), repr(kv[0]))):
        entry = {name: value for name, value in zip(FIELDS, key) if value is not None}
        entry["count"] = len(ranks)
        entry["ranks"] = ",".join(rank_runs(ranks))
        out.append(entry)
    return out


# --------------------------------------------------------------------------------------------- deciding


def _entries(findings: Iterable[Finding]) -> Iterator[dict[str, Any]]:
    """The summary entries the findings carry (malformed ones skipped)."""
    for f in findings:
        entries = f.facts.get(FACT)
        for e in entries if isinstance(entries, list) else ():
            if isinstance(e, dict):
                yield e


def _pooled(findings: Iterable[Finding]) -> dict[Key, set[int]]:
    """Every NCCL timeout finding's summary merged: tuple -> ranks.

    A line without a process group in its prefix (``[Rank 5] ``: torch <= 2.2, and some progress lines of 2.3) is
    taken as the default group's, so it meets the ``[PG 0 Rank 5] `` watchdog line of the same rank."""
    pooled: dict[Key, set[int]] = {}
    for e in _entries(findings):
        key = tuple(e.get(name) for name in FIELDS)
        if key[0] is None:
            key = (0, *key[1:])
        # the ranks as summary_fact wrote them ("0-16,18"); a rank past MAX_RANK is not believed
        pooled.setdefault(key, set()).update(r for r in expand_task_list(str(e.get("ranks", ""))) if r < MAX_RANK)
    return pooled


def _calls_without_group(findings: Iterable[Finding]) -> set[tuple[Any, Any]]:
    """(SeqNum, OpType) pairs that only lines without a process group reported (torch <= 2.2 ``[Rank 5] ``).

    Each process group counts its own SeqNums, so such a timeout on another SeqNum may be another group's
    collective (a TP group's all-reduce while the data-parallel group waits), not a desync."""
    known: set[tuple[Any, Any]] = set()
    bare: set[tuple[Any, Any]] = set()
    for e in _entries(findings):
        (bare if e.get("pg") is None else known).add((e.get("seq_num"), e.get("op_type")))
    return bare - known


def _small_minority(odd: int, total: int) -> bool:
    return 0 < odd <= MAX_NAMED and odd <= max(1, total // 4) and total - odd >= 2


def _mode(values: dict[int, Any]) -> tuple[Any, int]:
    """The value most ranks hold and how many hold it (ties: the smaller value, for a stable answer)."""
    return min(Counter(values.values()).items(), key=lambda kv: (-kv[1], repr(kv[0])))


def find_stragglers(pooled: dict[Key, set[int]], pg: Any) -> dict[str, Any] | None:
    """Ranks of process group ``pg`` whose last enqueued work is below the SeqNum the majority hangs in."""
    enqueued: dict[int, int] = {}
    failing: dict[int, int] = {}
    for (kpg, seq, _op, _nin, enq, _done), ranks in pooled.items():
        if kpg != pg:
            continue
        for r in ranks:
            if enq is not None:  # the furthest a rank got: named only when every report of it is behind
                enqueued[r] = max(enq, enqueued.get(r, enq))
            if seq is not None:
                failing.setdefault(r, seq)
    if len(enqueued) < 3:
        return None
    target, _ = _mode(failing) if failing else _mode(enqueued)
    behind = sorted(r for r, e in enqueued.items() if e < target)
    if not _small_minority(len(behind), len(enqueued)):
        return None
    return {"pg": pg, "seq_num": target, "ranks": behind,
            "last_enqueued": min(enqueued[r] for r in behind), "reporting": len(enqueued)}


NEAR_SEQ = 16  # SeqNums this close are taken as one group's counter when the lines do not name the group


def _far(a: Any, b: Any) -> bool:
    return isinstance(a, int) and isinstance(b, int) and abs(a - b) > NEAR_SEQ


def find_desync(pooled: dict[Key, set[int]], pg: Any, skip: set[int],
                unknown_group: set[tuple[Any, Any]] | None = None) -> dict[str, Any] | None:
    """Ranks of ``pg`` that timed out on another SeqNum/OpType than most (``skip``: ranks already named).

    ``unknown_group``: calls reported without a process group; a rank whose every call is one of them, on a SeqNum
    far from the majority's (more than ``NEAR_SEQ`` apart), is not named: it may be waiting in another group."""
    called: dict[int, set[tuple[int, str]]] = {}
    for (kpg, seq, op, _nin, _enq, _done), ranks in pooled.items():
        if kpg != pg or seq is None or op is None:
            continue
        for r in ranks:
            called.setdefault(r, set()).add((seq, op))
    if len(called) < 3:
        return None
    holders = Counter(c for calls in called.values() for c in calls)
    (seq, op), count = min(holders.items(), key=lambda kv: (-kv[1], kv[0]))
    # A rank that also reported the majority's collective is in step (an unprefixed line of another group, say).
    unknown_group = unknown_group or set()
    odd = sorted(r for r, calls in called.items() if (seq, op) not in calls and r not in skip
                 and not all(c in unknown_group and _far(c[0], seq) for c in calls))
    if not _small_minority(len(odd), len(called)):
        return None
    others: dict[tuple[int, str], list[int]] = {}
    for r in odd:
        others.setdefault(min(called[r]), []).append(r)
    return {
        "pg": pg, "seq_num": seq, "op_type": op, "majority": count,
        "ranks": odd,
        "calls": [{"seq_num": s, "op_type": o, "ranks": rs} for (s, o), rs in sorted(others.items())],
    }


def desync_sentence(d: dict[str, Any]) -> str:
    """"rank 17 timed out on SeqNum 813 (ALLGATHER) while 63 ranks waited on SeqNum 812 (ALLREDUCE): ..."."""
    calls = d.get("calls") or []
    parts = [f"{ranks_phrase(c['ranks'])} timed out on SeqNum {c['seq_num']} ({c['op_type']})"
             for c in calls[:MAX_CLAUSES]]
    if len(calls) > MAX_CLAUSES:
        more = len(calls) - MAX_CLAUSES
        parts.append(f"{more} more rank group{'s' if more > 1 else ''} on other collectives")
    return (f"{', '.join(parts)} while {d['majority']} ranks waited on SeqNum {d['seq_num']} ({d['op_type']}): "
            "collectives were called in a different order (desync)")


def straggler_sentence(s: dict[str, Any]) -> str:
    """"rank 40 never enqueued SeqNum 812: it did not reach the collective (straggler)"."""
    ranks = s["ranks"]
    they = "it" if len(ranks) == 1 else "they"
    return (f"{ranks_phrase(ranks)} never enqueued SeqNum {s['seq_num']}: {they} did not reach the collective "
            f"(straggler)")


def skew_sentences(facts: dict[str, Any]) -> list[str]:
    """The sentences the ``stragglers`` and ``desync`` facts stand for (malformed facts say nothing)."""
    try:
        return ([straggler_sentence(s) for s in facts.get(FACT_STRAGGLERS) or []]
                + [desync_sentence(d) for d in facts.get(FACT_DESYNC) or []])
    except (TypeError, KeyError, AttributeError):
        return []


def mark_collective_skew(findings: list[Finding], root_index: int | None) -> None:
    """Name desynced and straggling ranks on the leading NCCL timeout finding; drop the summaries elsewhere.

    The leading finding is the root cause when it is an NCCL timeout (its explanation then gets the sentence),
    else the first NCCL timeout finding. ``collective_groups`` stays only on it, and only when something was named,
    so the JSON of a log where all ranks agree does not change.
    """
    timeouts = [i for i, f in enumerate(findings) if f.category == NCCL_TIMEOUT]
    pooled = _pooled(findings[i] for i in timeouts)
    unknown_group = _calls_without_group(findings[i] for i in timeouts)
    for f in findings:
        f.facts.pop(FACT, None)
    if not pooled:
        return
    pgs = sorted({k[0] for k in pooled}, key=lambda p: (not isinstance(p, int), p if isinstance(p, int) else 0))
    stragglers = [s for pg in pgs if (s := find_stragglers(pooled, pg)) is not None]
    behind = {r for s in stragglers for r in s["ranks"]}  # a straggler's own timeout on an earlier SeqNum: no desync
    desyncs = [d for pg in pgs if (d := find_desync(pooled, pg, behind, unknown_group)) is not None]
    if not stragglers and not desyncs:
        return
    lead = root_index if root_index in timeouts else timeouts[0]
    f = findings[lead]
    summary = CollectiveSummary()
    for key, ranks in pooled.items():
        for r in ranks:
            summary.add(key, r)
    f.facts[FACT] = summary_fact(summary)
    if stragglers:
        f.facts[FACT_STRAGGLERS] = stragglers
    if desyncs:
        f.facts[FACT_DESYNC] = desyncs
    if lead == root_index:
        text = " ".join(s[0].upper() + s[1:] + "." for s in skew_sentences(f.facts))
        add_paragraph(f, text)

