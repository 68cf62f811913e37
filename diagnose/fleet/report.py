"""``fleet report``: what the store says about a time window, as typed rows (rendered by the present stage).

- classes: failure classes (signatures) by count, GPU-hours lost (gpus x elapsed of the failed jobs), first and
  last seen in the window, whether the class is new (never seen before the window) and its trend (first half of
  the window against the second half);
- nodes: jobs and blamed failures per node, the p-value of ``stats.TEST_NAME`` and a flag, with the
  ``scontrol update nodename=... state=drain reason=...`` line for flagged nodes (printed, never run);
- users and configs: failures per user and per job-name family, with each one's most common class;
- unreadable: jobs whose log could not be read (never skipped silently).
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from diagnose.fleet.record import config_key
from diagnose.fleet.stats import TEST_NAME, flag
from diagnose.fleet.store import FleetStore
from diagnose.model import DiagnoseError

FLEET_SCHEMA = "diagnose/fleet@1"
_AGE = re.compile(r"(\d{1,6})([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
MAX_LISTED_UNREADABLE = 50


@dataclass(slots=True)
class FailureClass:
    signature: str
    rule: str
    category: str
    title: str
    jobs: int
    gpu_hours: float
    first_seen: float
    last_seen: float
    first_half: int
    second_half: int
    new: bool
    trend: str  # new | rising | falling | steady
    example_job: str


@dataclass(slots=True)
class NodeRow:
    node: str
    jobs: int
    failed: int
    rate: float
    p_value: float
    flagged: bool
    top_signature: str | None
    drain_command: str | None


@dataclass(slots=True)
class GroupRow:
    key: str
    jobs: int
    failed: int
    rate: float
    top_signature: str | None
    top_count: int


@dataclass(slots=True)
class UnreadableJob:
    job_key: str
    job_id: str
    source: str
    problem: str


@dataclass(slots=True)
class FleetReport:
    since: str
    start: float
    end: float
    jobs: int
    failed: int
    unreadable: int
    gpu_hours_lost: float
    fleet_rate: float
    test: str
    alpha: float
    min_failures: int
    classes: list[FailureClass] = field(default_factory=list)
    nodes: list[NodeRow] = field(default_factory=list)
    users: list[GroupRow] = field(default_factory=list)
    configs: list[GroupRow] = field(default_factory=list)
    unreadable_jobs: list[UnreadableJob] = field(default_factory=list)

    @property
    def new_signatures(self) -> list[FailureClass]:
        return [c for c in self.classes if c.new]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["schema"] = FLEET_SCHEMA
        out["new_signatures"] = [c.signature for c in self.new_signatures]
        out["start"] = _iso(self.start)
        out["end"] = _iso(self.end)
        for c in out["classes"]:
            c["first_seen"], c["last_seen"] = _iso(c["first_seen"]), _iso(c["last_seen"])
        return out


def parse_age(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``2w``, ``90s`` -> seconds."""
    m = _AGE.fullmatch(text.strip())
    if not m:
        raise DiagnoseError(f"--since {text[:30]!r}: expected an age like 7d, 12h, 2w")
    return int(m.group(1)) * _UNITS[m.group(2)]


def build_report(store: FleetStore, since: str = "7d", now: float | None = None, alpha: float = 0.01,
                 min_failures: int = 3) -> FleetReport:
    end = time.time() if now is None else now
    start = end - parse_age(since)
    db = store.db
    window = "end_ts >= ? AND end_ts <= ?"
    jobs, failed, unreadable, lost = db.execute(
        f"SELECT count(*), coalesce(sum(failed), 0), coalesce(sum(status = 'unreadable'), 0), "
        f"coalesce(sum(CASE WHEN failed THEN gpu_hours END), 0.0) FROM jobs WHERE {window}", (start, end),
    ).fetchone()
    report = FleetReport(since=since, start=start, end=end, jobs=jobs, failed=failed, unreadable=unreadable,
                         gpu_hours_lost=round(lost, 3), fleet_rate=0.0, test=TEST_NAME, alpha=alpha,
                         min_failures=min_failures)
    report.classes = _classes(db, start, end)
    report.nodes, report.fleet_rate = _nodes(db, start, end, alpha, min_failures)
    report.users = _groups(db, "user", start, end)
    report.configs = _groups(db, "config", start, end, fold=config_key)  # a store written before hex folding too
    report.unreadable_jobs = [
        UnreadableJob(k, j, s, p or "")
        for k, j, s, p in db.execute(
            f"SELECT job_key, job_id, source, problem FROM jobs WHERE status = 'unreadable' AND {window} "
            f"ORDER BY end_ts DESC LIMIT {MAX_LISTED_UNREADABLE}", (start, end),
        )
    ]
    return report


def _classes(db, start: float, end: float) -> list[FailureClass]:
    middle = (start + end) / 2
    rows = db.execute(
        "SELECT signature, min(root_rule), min(root_category), min(root_title), count(*), "
        "coalesce(sum(gpu_hours), 0.0), min(end_ts), max(end_ts), sum(end_ts < ?), sum(end_ts >= ?), max(job_key) "
        "FROM jobs WHERE failed = 1 AND signature IS NOT NULL AND end_ts >= ? AND end_ts <= ? "
        "GROUP BY signature", (middle, middle, start, end),
    ).fetchall()
    earlier = {
        sig for (sig,) in db.execute(
            "SELECT DISTINCT signature FROM jobs WHERE failed = 1 AND signature IS NOT NULL AND end_ts < ?", (start,)
        )
    }
    out = []
    for sig, rule, category, title, count, hours, first, last, first_half, second_half, example in rows:
        new = sig not in earlier
        out.append(FailureClass(sig, rule or "", category or "", title or "", count, round(hours, 3), first, last,
                                first_half, second_half, new, "new" if new else _trend(first_half, second_half),
                                example))
    out.sort(key=lambda c: (-c.jobs, -c.gpu_hours, c.signature))
    return out


def _trend(first_half: int, second_half: int) -> str:
    """Rising/falling when one half has at least twice the other's count and 3 more; else steady."""
    if second_half >= 2 * first_half and second_half - first_half >= 3:
        return "rising"
    if first_half >= 2 * second_half and first_half - second_half >= 3:
        return "falling"
    return "steady"


def _nodes(db, start: float, end: float, alpha: float, min_failures: int) -> tuple[list[NodeRow], float]:
    rows = db.execute(
        "SELECT node, count(*), sum(blamed) FROM job_nodes WHERE end_ts >= ? AND end_ts <= ? GROUP BY node",
        (start, end),
    ).fetchall()
    total = sum(n for _, n, _ in rows)
    blamed = sum(k for _, _, k in rows)
    rate = blamed / total if total else 0.0
    top = _top_by(db, "SELECT jn.node, j.signature, count(*) FROM job_nodes jn JOIN jobs j USING (job_key) "
                      "WHERE jn.blamed = 1 AND jn.end_ts >= ? AND jn.end_ts <= ? GROUP BY jn.node, j.signature",
                  start, end)
    out = []
    for node, n, k in rows:
        p_value, flagged = flag(k, n, rate, len(rows), alpha, min_failures)
        sig = top.get(node, (None, 0))[0]
        out.append(NodeRow(node, n, k, k / n if n else 0.0, p_value, flagged, sig,
                           drain_command(node, k, n, sig, p_value) if flagged else None))
    out.sort(key=lambda r: (not r.flagged, r.p_value, -r.failed, r.node))
    return out, rate


def drain_command(node: str, failed: int, jobs: int, signature: str | None, p_value: float) -> str | None:
    """The line an admin would run; None for a name that is not a plain host name (never quoted into a shell)."""
    if not _NODE_NAME.fullmatch(node):
        return None
    reason = f"diagnose fleet: {failed}/{jobs} jobs failed" + (f", mostly {signature}" if signature else "")
    reason += f" (binomial p={p_value:.1e})"
    return f"scontrol update nodename={node} state=drain reason={shlex.quote(reason)}"


def _groups(db, column: str, start: float, end: float, fold: Callable[[str], str] | None = None) -> list[GroupRow]:
    """Jobs, failures and the most common failure class per value of ``column``; ``fold`` maps stored values onto
    one group each (config keys stored before a fold rule existed join the rows of keys stored after it)."""
    same: Callable[[str], str] = fold or (lambda key: key)
    counts: dict[str, list[int]] = {}
    for key, n, k in db.execute(
        f"SELECT {column}, count(*), sum(failed) FROM jobs WHERE {column} != '' AND end_ts >= ? AND end_ts <= ? "
        f"GROUP BY {column}", (start, end),
    ):
        row = counts.setdefault(same(key), [0, 0])
        row[0] += n
        row[1] += k or 0
    per_sig: dict[tuple[str, str], int] = {}
    for key, sig, count in db.execute(
        f"SELECT {column}, signature, count(*) FROM jobs WHERE failed = 1 AND signature IS NOT NULL "
        f"AND {column} != '' AND end_ts >= ? AND end_ts <= ? GROUP BY {column}, signature", (start, end),
    ):
        per_sig[(same(key), sig)] = per_sig.get((same(key), sig), 0) + count
    top = _top_of((key, sig, count) for (key, sig), count in per_sig.items())
    out = [GroupRow(key, n, k, k / n if n else 0.0, *top.get(key, (None, 0))) for key, (n, k) in counts.items()]
    out.sort(key=lambda g: (-g.failed, -g.jobs, g.key))
    return out


def _top_by(db, sql: str, start: float, end: float) -> dict[str, tuple[str, int]]:
    return _top_of(db.execute(sql, (start, end)))


def _top_of(rows: Iterable[tuple[str, str, int]]) -> dict[str, tuple[str, int]]:
    """The most common signature per key of ``(key, signature, count)`` rows (ties: the greater signature)."""
    best: dict[str, tuple[str, int]] = {}
    for key, sig, count in rows:
        if key not in best or (count, sig) > (best[key][1], best[key][0]):
            best[key] = (sig, count)
    return best


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass(slots=True)
class JobRow:
    """One stored job, for the TUI's job list."""

    job_key: str
    job_id: str
    name: str
    user: str
    state: str
    signature: str | None
    title: str | None
    end_ts: float
    status: str
    sources: list[str]


MAX_LISTED_JOBS = 2000


def list_jobs(store: FleetStore, since: str = "7d", signature: str | None = None, node: str | None = None,
              failed_only: bool = True, now: float | None = None) -> list[JobRow]:
    """The window's jobs (newest first, at most MAX_LISTED_JOBS), of one class and/or one node when asked."""
    end = time.time() if now is None else now
    start = end - parse_age(since)
    sql = ("SELECT j.job_key, j.job_id, j.name, j.user, j.state, j.signature, j.root_title, j.end_ts, j.status, "
           "j.source FROM jobs j WHERE j.end_ts >= ? AND j.end_ts <= ?")
    params: list[Any] = [start, end]
    if failed_only:
        sql += " AND j.failed = 1"
    if signature is not None:
        sql += " AND j.signature = ?"
        params.append(signature)
    if node is not None:
        sql += " AND j.job_key IN (SELECT job_key FROM job_nodes WHERE node = ?)"
        params.append(node)
    sql += f" ORDER BY j.end_ts DESC LIMIT {MAX_LISTED_JOBS}"
    return [JobRow(k, i, n, u, st, sig, t, e, status, [s for s in (src or "").split("\n") if s])
            for k, i, n, u, st, sig, t, e, status, src in store.db.execute(sql, params)]
