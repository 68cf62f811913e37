"""Name the rank that hung a job, from the PyTorch flight-recorder dumps of every rank.

Each dump is one rank's ring buffer of collectives: per process group, a sequence number that counts the
collectives that rank *enqueued* (``collective_seq_id``), the op (``profiling_name``), the tensor sizes and the
Python stack that issued it. A collective finishes only when every member of the group enqueues it, so, per
group, walking the sequence numbers that all ranks' buffers still hold (the ring buffer forgets the oldest), the
first number where the ranks disagree is where the job stopped:

* members that never enqueued it (their last sequence number is lower): **stalled**; their last collective and
  the first frame outside torch say where they were last seen;
* members that enqueued another op under that number: **desync** (a different code path);
* members that enqueued the same op with other input sizes: **size mismatch** (all-to-all, scatter and gather,
  whose sizes legitimately differ per rank, are not compared);
* members with no dump at all while the others wait: **dead rank** (killed, crashed, or its node gone);
* all members entered it and none completed it: **not completed** (the collective itself is stuck: network, GPU,
  or a kernel queued before it on the stream).

Groups are compared by name; the gloo recorder keys the default group's membership under an empty name, so a
group with no ``pg_config`` membership of its own takes the widest membership when it is the default group, and
the ranks that recorded it otherwise. PyTorch's own analyzer (``torch.distributed.flight_recorder.fr_trace``)
matches the same way (by group and sequence, then op, sizes, state); it is compared with this on real dumps in
``tests/test_flight_recorder_hangs.py``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from diagnose.model import FrDump, FrEntry, HangCell, HangColumn, HangDumpInfo, HangRank, HangReport, rank_runs

MAX_GRID_COLUMNS = 8  # collectives shown around the divergence
MAX_GRID_RANKS = 1024
MAX_NAMED = 64
MAX_WORLD = 1 << 17
_NO_SIZE_CHECK = {"all_to_all", "alltoall", "alltoall_base", "_alltoall_base", "all_to_all_single", "scatter",
                  "gather", "send", "recv", "allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced"}
_TORCH_PARTS = ("/torch/distributed/", "/torch/nn/parallel/", "/torch/utils/", "/torch/_dynamo/", "/torch/autograd/")


def short_op(op: str) -> str:
    """``nccl:all_reduce`` -> ``all_reduce``."""
    return op.rsplit(":", 1)[-1] or op or "?"


def user_frame(entry: FrEntry | None) -> str | None:
    """``file.py:57 in fn`` for the innermost frame outside torch (the caller's code); None without frames."""
    if entry is None or not entry.frames:
        return None
    chosen = next((f for f in entry.frames if not any(p in f.filename for p in _TORCH_PARTS)), entry.frames[0])
    return f"{chosen.filename}:{chosen.line} in {chosen.name}"


@dataclass
class _Group:
    name: str
    desc: str
    members: list[int]
    seqs: dict[int, dict[int, FrEntry]] = field(default_factory=dict)  # rank -> seq -> entry (dumped ranks)
    completed_upto: dict[int, int] = field(default_factory=dict)  # rank -> pg_status last completed
    enqueued_upto: dict[int, int] = field(default_factory=dict)  # rank -> pg_status last enqueued


@dataclass
class _Divergence:
    group: _Group
    kind: str
    seq: int
    op: str = ""
    sizes: list[list[int]] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    culprits: list[HangRank] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    start: int = 0  # the oldest sequence number every dumped member still holds


_KIND_ORDER = {"stalled": 0, "desync": 1, "size_mismatch": 2, "dead_rank": 3, "not_completed": 4}


def analyse_dumps(dumps: list[FrDump], warnings: list[str] | None = None,
                  world_size: int | None = None) -> HangReport | None:
    """The hang the dumps show, or a ``kind="none"`` report when they agree; None without dumps.

    ``world_size`` (from the log, when it says) completes the default group's membership: a dead last rank leaves
    no dump and, with gloo's empty ``pg_config``, nothing else would say it existed."""
    if not dumps:
        return None
    by_rank = {d.rank: d for d in dumps}
    groups = _groups(by_rank, world_size)
    world = _world(by_rank, groups)
    found = [d for d in (_diverge(g, by_rank) for g in groups.values()) if d is not None]
    infos = [HangDumpInfo(path=d.path, rank=d.rank, format=d.format, version=d.version, entries=len(d.entries))
             for d in sorted(dumps, key=lambda d: d.rank)]
    notes = list(warnings or [])
    versions = sorted({d.version for d in dumps})
    if len(versions) > 1:
        notes.append(f"flight-recorder dumps of different format versions: {', '.join(versions)}")
    if not found:
        return HangReport(kind="none", summary=f"The flight-recorder dumps of {len(dumps)} rank(s) agree: every "
                          "group's ranks enqueued the same collectives and completed them.",
                          world_size=world, dumps=infos, warnings=notes)
    best = min(found, key=lambda d: (_KIND_ORDER[d.kind], -len(d.group.members), d.seq))
    g = best.group
    return HangReport(
        kind=best.kind,
        summary=_sentence(best),
        group=g.name,
        group_desc=g.desc,
        seq=best.seq,
        op=best.op,
        input_sizes=best.sizes,
        waiting_ranks=best.waiting,
        culprits=best.culprits[:MAX_NAMED],
        missing_dumps=best.missing,
        world_size=world,
        dumps=infos,
        grid=_grid(best, by_rank),
        warnings=notes,
    )


# ------------------------------------------------------------------------------------------- groups


def _default_like(name: str, desc: str) -> bool:
    return desc == "default_pg" or name in ("0", "")


def _groups(by_rank: dict[int, FrDump], world_size: int | None) -> dict[str, _Group]:
    groups: dict[str, _Group] = {}
    for rank, dump in by_rank.items():
        for e in dump.entries:
            if e.is_p2p:
                continue
            g = groups.get(e.group)
            if g is None:
                g = groups[e.group] = _Group(name=e.group, desc=e.group_desc, members=[])
            g.seqs.setdefault(rank, {})[e.seq] = e
        for name, status in dump.groups.items():
            if name in groups and status.last_completed is not None:
                groups[name].completed_upto[rank] = status.last_completed
            if name in groups and status.last_enqueued is not None:
                groups[name].enqueued_upto[rank] = status.last_enqueued
    widest = max((set(grp.ranks or ()) for d in by_rank.values() for grp in d.groups.values()), key=len, default=set())
    # global ranks are 0..world-1: the default group holds every rank up to the highest one that dumped
    widest.update(range(max(by_rank) + 1))
    if world_size and 0 < world_size <= MAX_WORLD:
        widest.update(range(world_size))
    for g in groups.values():
        members: set[int] = set()
        for d in by_rank.values():
            cfg = d.groups.get(g.name)
            if cfg is not None and cfg.ranks:
                members.update(cfg.ranks)
        if _default_like(g.name, g.desc):
            members.update(widest)
        members.update(g.seqs)  # a rank that recorded the group is a member whatever pg_config says
        g.members = sorted(members)
    return groups


def _world(by_rank: dict[int, FrDump], groups: dict[str, _Group]) -> int:
    return max(set(by_rank).union(*(g.members for g in groups.values())), default=-1) + 1


# ---------------------------------------------------------------------------------------- divergence


def _diverge(g: _Group, by_rank: dict[int, FrDump]) -> _Divergence | None:
    present = [r for r in g.members if r in by_rank]
    missing = [r for r in g.members if r not in by_rank]
    seqs = {r: g.seqs.get(r, {}) for r in present}
    lows = [min(s) for s in seqs.values() if s]
    if not lows:
        return None
    start = max(lows)  # the oldest collective every rank's ring buffer still holds
    # the last collective each rank enqueued: its buffer's, or pg_status's when the ring buffer has already
    # dropped it (a rank busy in other groups): such a rank is not behind
    last = {r: max(max(s) if s else -1, g.enqueued_upto.get(r, -1)) for r, s in seqs.items()}
    for seq in sorted({n for s in seqs.values() for n in s if n >= start}):
        here = {r: s[seq] for r, s in seqs.items() if seq in s}
        behind = [r for r in present if r not in here and last[r] < seq]
        op = _majority([e.op for _, e in sorted(here.items())])
        other_op = [r for r, e in sorted(here.items()) if e.op != op]
        same = {r: e for r, e in here.items() if e.op == op}
        sizes = _majority_sizes(same)
        size_odd = [] if short_op(op) in _NO_SIZE_CHECK else \
            [r for r, e in sorted(same.items()) if _key(e.input_sizes) != _key(sizes)]
        if not (behind or other_op or size_odd):
            continue
        kind = "stalled" if behind else "desync" if other_op else "size_mismatch"
        culprits = [_rank(r, "stalled", seqs[r], last[r]) for r in behind]
        culprits += [_rank(r, "desync", seqs[r], seq) for r in other_op]
        culprits += [_rank(r, "size_mismatch", seqs[r], seq) for r in size_odd]
        culprits += [HangRank(rank=r, role="no_dump") for r in missing]
        return _Divergence(g, kind, seq, op, sizes, sorted(same), culprits, missing, start)
    top = max(max(s) for s in seqs.values() if s)
    at_top = {r: seqs[r][top] for r in present if top in seqs[r]}
    op = _majority([e.op for _, e in sorted(at_top.items())])
    sizes = _majority_sizes({r: e for r, e in at_top.items() if e.op == op})
    if missing:
        return _Divergence(g, "dead_rank", top, op, sizes, sorted(at_top),
                           [HangRank(rank=r, role="no_dump") for r in missing], missing, start)
    if at_top and not any(_done(g, r, e) for r, e in at_top.items()):
        return _Divergence(g, "not_completed", top, op, sizes, sorted(at_top), [], [], start)
    return None


def _majority(ops: list[str]) -> str:
    return Counter(ops).most_common(1)[0][0] if ops else ""  # ties: the first (the lowest rank's)


def _key(sizes: list[list[int]]) -> tuple:
    return tuple(tuple(s) for s in sizes)


def _majority_sizes(entries: dict[int, FrEntry]) -> list[list[int]]:
    if not entries:
        return []
    keys = [_key(e.input_sizes) for _, e in sorted(entries.items())]
    return [list(s) for s in Counter(keys).most_common(1)[0][0]]


def _done(g: _Group, rank: int, e: FrEntry) -> bool:
    return e.completed or g.completed_upto.get(rank, -1) >= e.seq


def _rank(rank: int, role: str, seqs: dict[int, FrEntry], seq: int) -> HangRank:
    e = seqs.get(seq)
    return HangRank(rank=rank, role=role, last_op=short_op(e.op) if e else None, last_seq=e.seq if e else None,
                    last_sizes=e.input_sizes if e else [], frame=user_frame(e))


# ------------------------------------------------------------------------------------------ sentence


def ranks_phrase(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0-7, 9``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(rank_runs(ranks))


def _group_name(g: _Group) -> str:
    return f"group {g.name or '?'} ({g.desc})" if g.desc else f"group {g.name or '?'}"


def _sentence(d: _Divergence) -> str:
    op = f"{short_op(d.op)} #{d.seq} of {_group_name(d.group)}"
    waiting = (f"{ranks_phrase(d.waiting)} {'waits' if len(d.waiting) == 1 else 'wait'} in it" if d.waiting
               else "no rank entered it")
    odd = [c for c in d.culprits if c.role == d.kind]  # the stalled, desynced or mismatched ranks
    parts = []
    if d.kind == "stalled":
        first = odd[0]
        where = f"{first.last_op} #{first.last_seq}" if first.last_op else "nothing in this group"
        at = f" at {first.frame}" if first.frame else ""
        who = ranks_phrase([c.rank for c in odd]).capitalize()
        parts.append(f"{who} never entered {op} ({waiting}); last collective there: {where}{at}.")
    elif d.kind == "desync":
        others = ", ".join(sorted({f"{c.last_op} {c.last_sizes}" for c in odd})[:3])
        parts.append(f"Desync: {ranks_phrase([c.rank for c in odd])} called {others} as collective #{d.seq} of "
                     f"{_group_name(d.group)} where {ranks_phrase(d.waiting)} called {short_op(d.op)} {d.sizes}.")
    elif d.kind == "size_mismatch":
        sizes = ", ".join(sorted({str(c.last_sizes) for c in odd})[:3])
        parts.append(f"Size mismatch: {ranks_phrase([c.rank for c in odd])} called {op} with input sizes {sizes} "
                     f"where {ranks_phrase([r for r in d.waiting if r not in {c.rank for c in odd}])} used {d.sizes}.")
    elif d.kind == "dead_rank":
        verb = "waits" if len(d.waiting) == 1 else "wait"
        parts.append(f"{ranks_phrase(d.missing).capitalize()} left no flight-recorder dump (dead, killed, or its node "
                     f"gone) while {ranks_phrase(d.waiting)} {verb} in {op}.")
    else:
        who = f"Every rank ({ranks_phrase(d.waiting)})" if len(d.waiting) > 1 else ranks_phrase(d.waiting).capitalize()
        done = "none completed it" if len(d.waiting) > 1 else "it never completed"
        parts.append(f"{who} entered {op} and {done}: the collective itself is stuck (network, GPU, or a kernel "
                     "queued before it on the stream).")
    if d.missing and d.kind != "dead_rank":
        parts.append(f"No dump from {ranks_phrase(d.missing)}.")
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------- grid


def _grid(d: _Divergence, by_rank: dict[int, FrDump]) -> list[HangColumn]:
    g = d.group
    all_seqs = sorted({n for s in g.seqs.values() for n in s if n >= d.start})
    if d.seq in all_seqs:
        i = all_seqs.index(d.seq)
        window = all_seqs[max(0, i - (MAX_GRID_COLUMNS - 2)): i + 2]
    else:
        window = all_seqs[-MAX_GRID_COLUMNS:]
    odd = {c.rank: c.role for c in d.culprits}
    ranks = g.members[:MAX_GRID_RANKS]
    columns = []
    for seq in window:
        here = {r: s[seq] for r, s in g.seqs.items() if seq in s}
        op = _majority([e.op for _, e in sorted(here.items())])
        cells = []
        for r in ranks:
            if r not in by_rank:
                state = "no_dump"
            elif r not in here:
                state = "absent"
            elif seq == d.seq and odd.get(r) in ("desync", "size_mismatch"):
                state = odd[r]
            elif here[r].op != op:
                state = "desync"
            elif seq == d.seq and d.kind != "none":
                state = "waiting"  # entered the collective the others never matched: it cannot have finished
            else:
                state = "completed" if _done(g, r, here[r]) else "waiting"
            cells.append(HangCell(rank=r, state=state))
        columns.append(HangColumn(group=g.name, group_desc=g.desc, seq=seq, op=short_op(op), cells=cells))
    return columns
