"""Tell the jobs apart when one ``analyze`` names logs of several jobs (issue 19, item 6).

A *unit* is one process's output: a file, or a torchrun ``stdout``/``stderr`` pair. Units are grouped into jobs
from what the logs carry (``diagnose.ingest.job_identity``: Slurm job id, torchrun run id, master, world size)
and, across the inputs the user named, from their failures: two named inputs that each hold their own failure
for the same rank (two single-GPU jobs both dying on rank 0) are two jobs.

Where it cannot tell, it keeps one report: per-rank files of one job, a ``stdout``/``stderr`` pair, and files of
one folder that conflict only by their failing ranks (per-node logs of one job look the same) stay together; the
pipeline's different-jobs warning still says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from diagnose.ingest.job_identity import JOINING_KEYS, conflict, shares_a_join
from diagnose.model import Report

NO_RANK = "?"


@dataclass
class Unit:
    key: str  # the file, or the folder of a stdout/stderr pair
    arg: int  # which user-named input it came from
    paths: list[str] = field(default_factory=list)
    identity: dict[str, str] = field(default_factory=dict)
    failure_ranks: set = field(default_factory=set)


@dataclass
class JobGroup:
    """Units of one job; its identity and failing ranks are kept merged as units join (a folder of thousands of
    per-rank logs must not cost a pass over the group per file)."""

    units: list[Unit] = field(default_factory=list)
    identity: dict[str, str] = field(default_factory=dict)
    failure_ranks: set = field(default_factory=set)

    def add(self, unit: Unit) -> None:
        self.units.append(unit)
        for k, v in unit.identity.items():
            self.identity.setdefault(k, v)
        self.failure_ranks |= unit.failure_ranks

    def absorb(self, other: JobGroup) -> None:
        for unit in other.units:
            self.add(unit)

    @property
    def paths(self) -> list[str]:
        return [p for u in self.units for p in u.paths]


def process_of(path: str) -> str:
    """torchrun --log-dir writes one process's stdout and stderr side by side: one process, one key."""
    stem = os.path.basename(path).split(".", 1)[0]
    return os.path.dirname(path) if stem in ("stdout", "stderr") else path


def arg_of(path: str, args: list[str]) -> int:
    """Index of the user-named input a file came from (itself, or a folder above it)."""
    norm = os.path.normpath(path)
    for i, a in enumerate(args):
        top = os.path.normpath(a)
        if norm == top or norm.startswith(top.rstrip(os.sep) + os.sep):
            return i
    return len(args)


def build_units(paths: list[str], identities: dict[str, dict[str, str]], args: list[str],
                report: Report) -> list[Unit]:
    units: dict[str, Unit] = {}
    for path in paths:
        key = process_of(path)
        unit = units.setdefault(key, Unit(key=key, arg=arg_of(path, args)))
        unit.paths.append(path)
        for k, v in identities.get(path, {}).items():
            unit.identity.setdefault(k, v)
    for f in report.findings:
        keys = {process_of(e.path) for e in f.evidence}
        if len(keys) == 1 and (k := keys.pop()) in units:
            units[k].failure_ranks.update(f.ranks or [NO_RANK])
    for unit in units.values():
        if len(unit.failure_ranks) > 1:
            unit.failure_ranks.discard(NO_RANK)  # a file with known ranks: its rank-less lines are that rank's too
    return list(units.values())


def _fits(group: JobGroup, unit_identity: dict[str, str]) -> bool:
    return conflict(group.identity, unit_identity) is None


def _has_join(identity: dict[str, str]) -> bool:
    return any(k in identity for k in JOINING_KEYS)


def _split_one_input(units: list[Unit]) -> list[JobGroup]:
    """The units of one named input (a folder): apart only where their identities disagree."""
    joined: list[JobGroup] = []
    rest: list[JobGroup] = []
    for u in units:
        if _has_join(u.identity):
            home = next((g for g in joined if shares_a_join(g.identity, u.identity) and _fits(g, u.identity)), None)
            if home is None:
                joined.append(home := JobGroup())
        else:
            home = next((g for g in rest if _fits(g, u.identity)), None)
            if home is None:
                rest.append(home := JobGroup())
        home.add(u)
    if len(joined) <= 1:  # one job id (or none): files that name none are that job's other ranks
        groups = joined[:]
        for g in rest:
            target = next((t for t in groups if _fits(t, g.identity)), None)
            if target is None:
                groups.append(g)
            else:
                target.absorb(g)
        return groups
    return joined + rest


def plan_jobs(units: list[Unit]) -> list[JobGroup] | None:
    """The jobs, in input order, or None when the inputs read as one job (today's single report)."""
    by_arg: dict[int, list[Unit]] = {}
    for u in units:
        by_arg.setdefault(u.arg, []).append(u)
    groups: list[JobGroup] = []
    for arg in sorted(by_arg):
        for g in _split_one_input(by_arg[arg]):
            home = next((t for t in groups if shares_a_join(t.identity, g.identity) and _fits(t, g.identity)), None)
            if home is None:
                # no shared job id: it joins the one job it can belong to (one side names no job id, nothing
                # disagrees, no rank fails in both); with two or more candidates it cannot tell: its own job
                fits = [t for t in groups if _fits(t, g.identity) and not t.failure_ranks & g.failure_ranks
                        and not (_has_join(t.identity) and _has_join(g.identity))]
                home = fits[0] if len(fits) == 1 else None
            if home is None:
                groups.append(g)
            else:
                home.absorb(g)
    if len(groups) < 2:
        return None
    order = {u.key: i for i, u in enumerate(units)}
    return sorted(groups, key=lambda g: min(order[u.key] for u in g.units))  # by each job's first file
