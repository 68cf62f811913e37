"""The smallest set of overrides that makes a config pass: a search, not a greedy merge.

Every violation suggests one or more fixes (alternative override sets). Taking the first fix of every violation
at once can over-fix: with ``use_megatron_fsdp`` and ``use_torch_fsdp2`` both on and ``ckpt_format:
fsdp_dtensor``, the two violations suggest "FSDP2 off" and "ckpt_format=torch_dist", and the second breaks
Megatron FSDP, whereas the first alone is the whole fix. So candidate sets are grown one suggested fix at a time
from the violations that remain after the candidate is applied, and tried fewest changed keys first (ties: the
order the checks suggest them); the first candidate that passes validation (and, when given, the memory check)
is the answer. Each candidate is proven by running the checks on the config with it applied.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from diagnose.explain.validate import ValidationResult
from diagnose.model import Override

MAX_CANDIDATES = 64  # validations per search (each is one run of the checks)
MAX_ADDED_KEYS = 8


@dataclass
class SearchResult:
    fix: list[Override]  # the requested overrides plus what the search added
    result: ValidationResult  # the checks on the config with ``fix`` applied
    tried: int  # candidates validated
    accepted: bool  # passes validation (and the memory check when given)


def _signature(fix: tuple[Override, ...]) -> frozenset[tuple[str, str]]:
    return frozenset((o.key, repr(o.value)) for o in fix)


def search_fix(
    requested: list[Override],
    first: ValidationResult,
    check: Callable[[list[Override]], ValidationResult],
    accept: Callable[[list[Override]], bool] | None = None,
    max_candidates: int = MAX_CANDIDATES,
) -> SearchResult:
    """Grow ``requested`` (never changing a key it sets) into the smallest passing set.

    ``first`` is the checks' result with ``requested`` applied; ``check`` validates a candidate; ``accept`` (the
    memory model for an OOM) must also hold for the answer. When nothing passes within the budget, the candidate
    with the fewest remaining violations (then the fewest keys) is returned with ``accepted`` False."""
    base = tuple(requested)
    order = itertools.count()
    heap: list[tuple[int, int, tuple[Override, ...], ValidationResult]] = [(0, next(order), base, first)]
    seen = {_signature(base)}
    tried = 0
    best: tuple[int, int, tuple[Override, ...], ValidationResult] | None = None
    while heap:
        added, _, fix, result = heapq.heappop(heap)
        if result.passes and (accept is None or accept(list(fix))):
            return SearchResult(list(fix), result, tried, True)
        rank = (len(result.violations), added)
        if best is None or rank < best[:2]:
            best = (rank[0], rank[1], fix, result)
        pinned = {o.key: o.value for o in fix}
        for violation in result.violations:
            for alternative in violation.fixes:
                if any(o.key in pinned and pinned[o.key] != o.value for o in alternative):
                    continue  # would undo the user's override or an earlier step of this candidate
                new = tuple(o for o in alternative if o.key not in pinned)
                if not new or len(fix) + len(new) - len(base) > MAX_ADDED_KEYS:
                    continue
                candidate = fix + new
                sig = _signature(candidate)
                if sig in seen:
                    continue
                seen.add(sig)
                if tried >= max_candidates:
                    continue
                tried += 1
                heapq.heappush(heap, (len(candidate) - len(base), next(order), candidate, check(list(candidate))))
    assert best is not None
    return SearchResult(list(best[2]), best[3], tried, False)
