"""Which Megatron-Bridge release wrote a log: inferred from wording and file layout when not printed.

Each clue narrows the release range; an explicit version line wins. The result is a range string that
``defaults.version_range`` reads (``"0.4.2"``, ``">=0.5.0"``, ``"<=0.4.x"``, ``"0.3.0-0.4.2"``).
Sources: ../shared/knowledge/megatron-bridge.md §1.4 (messages per release), §2.1 (``_ddp_wrap`` location),
§3.1 (config printing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from diagnose.explain.config.defaults import version_range

# (substring, release range, why)
CLUES: tuple[tuple[str, str, str], ...] = (
    ("Configuration Summary (Non-Default Values vs Megatron Core)", ">=0.3.1", "Configuration Summary block"),
    ("------- Task Configuration -------", "<=0.3.0", "Task Configuration YAML banner"),
    ("Using use_megatron_fsdp and use_torch_fsdp2 at the same time is not supported", "<=0.4.x",
     "old FSDP exclusion wording"),
    ("use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive", ">=0.5.0", "new FSDP exclusion wording"),
    ("Megatron FSDP only supports fsdp_dtensor checkpoint format", "<=0.4.x", "old checkpoint-format wording"),
    ("Megatron-FSDP requires the fsdp_dtensor checkpointing format!", ">=0.5.0", "new checkpoint-format wording"),
    ("FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.", ">=0.5.0", "CUDA_DEVICE_MAX_CONNECTIONS assert"),
    ("average_in_collective is not supported with Megatron FSDP, setting to True", "<=0.3.x",
     "0.1-0.3 average_in_collective print"),
    ("average_in_collective is not supported with NCCL symmetric registration, setting to False", "0.4.0-0.4.x",
     "0.4 average_in_collective print"),
    ("average_in_collective not supported with NCCL symmetric registration. Deactivating", ">=0.5.0",
     "0.5+ average_in_collective print"),
    ("megatron/bridge/models/common/unimodal.py", "0.4.0-0.4.x", "_ddp_wrap in models/common/unimodal.py"),
    ("unexpected keyword argument 'pg_collection'", "0.3.0-0.4.2", "FSDP2 pg_collection TypeError"),
)
_BRIDGE_VERSION = re.compile(r"megatron[-_.]bridge(?:\s*(?:version)?\s*[:=]=?\s*|\s+v?)(\d+\.\d+(?:\.\d+)?)", re.I)
_MCORE_VERSION = re.compile(r"megatron[-_.]core(?:\s*(?:version)?\s*[:=]=?\s*|\s+v?)(\d+\.\d+(?:\.\d+)?)", re.I)


def infer_version(texts: Iterable[str]) -> tuple[str | None, str | None, list[str]]:
    """(bridge release range or exact version, megatron-core version, clues used) from log texts."""
    exact: str | None = None
    mcore: str | None = None
    ranges: list[tuple[str, str]] = []
    for text in texts:
        if exact is None:
            m = _BRIDGE_VERSION.search(text)
            if m:
                exact = m.group(1)
        if mcore is None:
            m = _MCORE_VERSION.search(text)
            if m:
                mcore = m.group(1)
        for needle, rng, why in CLUES:
            if needle in text and (rng, why) not in ranges:
                ranges.append((rng, why))
    if exact:
        return exact, mcore, [f"megatron-bridge {exact} printed"]
    combined: list[str] = []
    used: list[str] = []
    for rng, why in ranges:
        trial = ",".join(combined + [rng])
        r = version_range(trial)
        if r is not None and r[0] <= r[1]:
            combined.append(rng)
            used.append(why)
    if not combined and mcore:
        # Releases were paired: megatron-core <= 0.17 shipped with Bridge <= 0.4.x, >= 0.18 with Bridge >= 0.5.
        parts = [int(p) for p in mcore.split(".")[:2]]
        combined.append("<=0.4.x" if tuple(parts) <= (0, 17) else ">=0.5.0")
        used.append(f"megatron-core {mcore} (release pairing)")
    return (_simplify(",".join(combined)) if combined else None), mcore, used


def _simplify(spec: str) -> str:
    r = version_range(spec)
    if r is None:
        return spec
    lo, hi = r
    fmt = lambda v: ".".join("x" if p == 999 else str(p) for p in v)  # noqa: E731
    if lo == hi:
        return fmt(lo)
    if lo == (0, 0, 0):
        return f"<={fmt(hi)}"
    if hi[0] >= 999:
        return f">={fmt(lo)}"
    return f"{fmt(lo)}-{fmt(hi)}"
