"""Megatron-Bridge release families and the config fields that moved between them.

Three families, by what a job's config may contain and which messages the real code prints:

- ``old``: Megatron-Bridge <= 0.4.x (the old message wordings);
- ``new``: 0.5.0 - 0.6.x (the new wordings; ``cfg.dist.use_megatron_fsdp`` and ``cfg.ddp.use_megatron_fsdp`` both
  turn Megatron FSDP on);
- ``latest``: >= 0.7.0, the branch NVIDIA's Megatron FSDP skill validates: ``DistributedInitConfig`` has no
  ``use_megatron_fsdp`` field any more, only ``cfg.ddp.use_megatron_fsdp`` enables Megatron FSDP, the FSDP/FSDP2
  exclusivity check reads ``ddp.use_megatron_fsdp`` with ``dist.use_torch_fsdp2``; MFSDP v2 is chosen with
  ``ddp.megatron_fsdp_version=2``. Message wordings are the ``new`` ones.

Evidence (docs/RELEASES.md has the citations): at Megatron-Bridge 0.7.0-dev commit 067f987df03b (2026-08-22) the
field still exists (Bridge ``DistributedInitConfig`` subclasses Megatron-LM's, ``megatron/training/config/
common_config.py`` L92 at Megatron-LM d98e8a64ddf3) and ``ConfigContainer.validate()`` reads it (config.py L1481,
L1484); the skill (evaluated 2026-11-04) documents its removal. The first release without it is taken to be 0.7.0;
a job whose release is unknown is validated as ``new`` (the newest family read in source), and a stale field then
gets a note, not a violation.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.explain.config.defaults import Version, family_of, version_range

LATEST_FROM: Version = (0, 7, 0)

FAMILY_LABELS = {
    "old": "Megatron-Bridge <= 0.4.x",
    "new": "Megatron-Bridge 0.5.0-0.6.x",
    "latest": "Megatron-Bridge >= 0.7.0",
}


@dataclass(frozen=True)
class FieldMove:
    """A config field removed in ``removed_in``; its setting now lives at ``moved_to``."""

    key: str
    moved_to: str
    removed_in: Version
    owner: str  # the dataclass that lost the field (it names it in the errors)
    source: str


FIELD_MOVES: dict[str, FieldMove] = {
    "dist.use_megatron_fsdp": FieldMove(
        key="dist.use_megatron_fsdp", moved_to="ddp.use_megatron_fsdp", removed_in=LATEST_FROM,
        owner="DistributedInitConfig",
        source="NVIDIA skill nemo-mbridge-perf-megatron-fsdp (validated branch, 2026-11-04); still present at "
               "Megatron-Bridge 067f987df03b config.py L1481 / Megatron-LM d98e8a64ddf3 common_config.py L92",
    ),
}


def release_family(version: str | None) -> str:
    """``old`` | ``new`` | ``latest`` for a version string or range; ``new`` when unknown."""
    base = family_of(version)
    if base == "old":
        return "old"
    r = version_range(version)
    if r is not None and r[0] >= LATEST_FROM:
        return "latest"
    return "new"


def assumed_release(version: str | None, framework: str | None = None) -> str:
    """One line saying which release a validation assumed and why (shown in every replay and check)."""
    if framework == "megatron-lm":
        return "Megatron-LM (message wording from its megatron-core release)"
    family = release_family(version)
    label = FAMILY_LABELS[family]
    span = version_range(version) if version else None
    if version and span is not None and span[0] == span[1]:
        return f"{label} (release {version})"
    if version:
        return f"{label} (the log allows {version}: validated as this family)"
    return (f"{label} (release unknown: validated as the newest family read in source; pass --bridge-version "
            f"0.7.0 for the branch without dist.use_megatron_fsdp)")


def field_exists(key: str, version: str | None) -> bool | None:
    """Whether ``key`` is a field of the job's release: False when it surely was removed, None when the release is
    unknown and the field was removed in some release, True otherwise."""
    move = FIELD_MOVES.get(key)
    if move is None:
        return True
    r = version_range(version)
    if r is None:
        return None
    if r[0] >= move.removed_in:
        return False
    return True if r[1] < move.removed_in else None
