"""Prove a memory option valid by replaying it through the validator (the config engineer's API).

``prove(view, overrides)`` applies the overrides to a copy of the job's config, validates it as the job's release
would, and when the change itself trips a check that has a fix (Megatron FSDP needs ``checkpoint.ckpt_format=
fsdp_dtensor`` when the job saves, ...) extends the overrides with that fix and replays again, a few rounds at
most. Violations the job already had before the change are not blamed on the option.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnose.explain.config import ConfigView, apply_overrides
from diagnose.explain.validate import Violation, validate
from diagnose.model import Override


@dataclass
class Proof:
    overrides: list[Override]
    valid: bool | None  # None: no validator available or no config to replay
    violations: list[str] = field(default_factory=list)  # checks the option still breaks
    added: list[Override] = field(default_factory=list)  # overrides the replay had to add


def _sig(v: Violation) -> tuple[str, str]:
    return v.check, v.message


def prove(view: ConfigView | None, overrides: list[Override], bridge_version: str | None = None, rounds: int = 3,
          real_mcore: bool = False) -> Proof:
    if view is None:
        return Proof(list(overrides), None)
    try:
        baseline = {_sig(v) for v in validate(view, bridge_version, real_mcore=real_mcore)}
    except Exception:  # noqa: BLE001 - a validator failure must not break the memory report
        return Proof(list(overrides), None)
    chosen = list(overrides)
    fixed_keys = {o.key for o in chosen}
    added: list[Override] = []
    new: list[Violation] = []
    for _ in range(rounds + 1):
        try:
            found = validate(apply_overrides(view, chosen), bridge_version, real_mcore=real_mcore)
        except Exception:  # noqa: BLE001
            return Proof(chosen, None)
        new = [v for v in found if _sig(v) not in baseline]
        if not new:
            return Proof(chosen, True, [], added)
        extended = False
        for v in new:
            for fix in v.fixes:
                if any(o.key in fixed_keys and not _same(o, chosen) for o in fix):
                    continue  # this fix would undo the option itself
                for o in fix:
                    if not _same(o, chosen):
                        chosen = [c for c in chosen if c.key != o.key] + [o]
                        added.append(o)
                        extended = True
                break
        if not extended:
            break
    return Proof(chosen, False, [v.message for v in new], added)


def _same(o: Override, chosen: list[Override]) -> bool:
    return any(c.key == o.key and c.value == o.value for c in chosen)
