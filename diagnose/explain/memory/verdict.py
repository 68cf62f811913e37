"""The numbers of a CUDA OOM message, and a verdict on why the allocation failed.

Numbers come from the engine's facts on the OOM finding; when a fact is missing we read it from the finding's
evidence line with the one CUDA-OOM parser, ``diagnose.normalize.facts.oom`` (every PyTorch wording). Verdicts:

- ``fragmentation``: the free memory plus the cached-but-unallocated memory would have held the request, but no
  single free block did (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), and would have left room after it
  (FRAGMENTATION_MARGIN of the GPU: on a nearly full GPU the setting buys one allocation, so another verdict leads),
  with the cache's unallocated part a real share of what PyTorch reserved (FRAGMENTED_SHARE: a few GiB idle in a
  GPU's worth of reserved memory is the allocator's ordinary slack, and the job's demand is the story);
- ``capacity``: the model state the job needs at that phase cannot fit the GPU at all, whatever the batch, or the
  one allocation asked for is larger than the whole GPU (no allocator setting or sharding of the model state helps);
- ``activations``: the model state fits; the forward/backward activations of the micro batch do not;
- ``transient_peak``: the steady state fits but a one-off buffer did not (wrap-time copies, the lazily created
  optimizer state at the first step, checkpoint staging, all-gather prefetch, fp32 logits);
- ``unknown``: not enough numbers or config to say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diagnose.normalize.facts.oom import parse_cuda_oom
from diagnose.units import parse_size

VERDICTS = ("capacity", "fragmentation", "transient_peak", "activations", "unknown")

# fact names the engine's OOM parser may use, in order of preference
_KEYS = {
    "requested": ("requested_bytes", "requested", "tried_to_allocate_bytes", "tried_to_allocate", "alloc_bytes"),
    "capacity": ("capacity_bytes", "total_capacity_bytes", "capacity", "total_capacity", "total_bytes"),
    "free": ("free_bytes", "free"),
    "in_use": ("in_use_bytes", "process_in_use_bytes", "process_bytes", "in_use", "this_process_bytes"),
    "allocated": ("allocated_bytes", "allocated_by_pytorch_bytes", "allocated", "pytorch_allocated_bytes"),
    "reserved_unallocated": ("reserved_unallocated_bytes", "reserved_but_unallocated_bytes", "reserved_unallocated",
                             "unallocated_bytes"),
    "reserved": ("reserved_bytes", "reserved_total_bytes", "reserved"),
}


@dataclass
class OomNumbers:
    requested: int | None = None
    capacity: int | None = None
    free: int | None = None
    in_use: int | None = None
    allocated: int | None = None
    reserved_unallocated: int | None = None

    @property
    def known(self) -> bool:
        return self.requested is not None and self.capacity is not None


def _size(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    return parse_size(str(value))  # None: a fact we cannot read is a fact we do not have


def from_text(text: str) -> OomNumbers:
    """The numbers of an OOM message (an evidence line), read by normalize's CUDA-OOM parser."""
    f = parse_cuda_oom(text)
    if f is None or f["template"] not in ("2.1+", "<=2.0") or f["total_bytes"] is None:
        return OomNumbers()
    # PyTorch <= 2.0 prints no per-process figure: what it reserved is what it held
    in_use = f["reserved_bytes"] if f["template"] == "<=2.0" else f["process_in_use_bytes"]
    return OomNumbers(
        f["requested_bytes"], f["total_bytes"], f["free_bytes"], in_use, f["allocated_bytes"],
        f["reserved_unallocated_bytes"],
    )


def from_facts(facts: dict[str, Any], texts: Sequence[str] = ()) -> OomNumbers:
    out = OomNumbers()
    for name, keys in _KEYS.items():
        if name == "reserved":
            continue
        for k in keys:
            if k in facts and _size(facts[k]) is not None:
                setattr(out, name, _size(facts[k]))
                break
    if out.reserved_unallocated is None and out.allocated is not None:
        for k in _KEYS["reserved"]:
            reserved = _size(facts.get(k))
            if reserved is not None:
                out.reserved_unallocated = max(0, reserved - out.allocated)
                break
    if not out.known or out.free is None:
        for text in texts:
            parsed = from_text(text)
            if parsed.known:
                for name in ("requested", "capacity", "free", "in_use", "allocated", "reserved_unallocated"):
                    if getattr(out, name) is None:
                        setattr(out, name, getattr(parsed, name))
                break
    return out


# What fragmentation must leave once the request is served, as a share of the GPU: expandable segments that buy
# one allocation on a nearly full GPU only move the OOM to the next one. Measured on dev's 207 cuda_oom logs
# (fixer37): of 114 given the fragmentation verdict, the threads that named fragmentation or the allocator left
# 3.7 % to 77 % of the GPU after the request; the three whose threads said otherwise (qa-report-9 L1: a fixed
# loader, a smaller LoRA rank, TP 2) left 0.9 %, 1.9 % and 1.7 %.
FRAGMENTATION_MARGIN = 0.03


def _slack(n: OomNumbers) -> int | None:
    """Reserved-but-unallocated plus free memory, when the request could have come out of it at all (the allocator
    setting's whole reach), with a real share of the GPU cached (>= 1 %, >= 256 MiB, >= a quarter of the request):
    a few hundred MiB of slack on a full GPU is not fragmentation."""
    if n.requested is None or n.reserved_unallocated is None:
        return None
    slack = n.reserved_unallocated + (n.free or 0)
    floor = max(n.requested // 4, 256 << 20, (n.capacity or 0) // 100)
    return slack if slack >= n.requested and n.reserved_unallocated >= floor else None


def _leaves_room(n: OomNumbers, slack: int) -> bool:
    """Once the request is served from ``slack``, at least FRAGMENTATION_MARGIN of the GPU is left (without a
    capacity: the slack is at least twice the request)."""
    requested = n.requested or 0
    if n.capacity:
        return slack - requested >= FRAGMENTATION_MARGIN * n.capacity
    return slack >= 2 * requested


# The share of PyTorch's reserved memory (allocated + reserved-but-unallocated) that must sit unallocated for the
# OOM to read as fragmentation. Measured on dev's 199 cuda_oom logs whose message gives the numbers (fixer39): the
# threads that named fragmentation or the allocator as the answer had 11 % to 88 % unallocated (palm-gemini 11 %,
# primerl 22 %, qwen3 graph capture 24 %, litgpt 40 %, nemo-rl packed sequences 88 %); those whose answer was a
# memory lever (qa-report-11 L1, qa-report-10 L2: baichuan2 13B on one A100, the NeMo-Aligner gather, xtuner's
# InternLM2 20B, DeepSpeed's leaked 16-bit state dict) had 4.8 % to 8.2 %.
FRAGMENTED_SHARE = 0.10


def cache_share(n: OomNumbers) -> float | None:
    """Reserved-but-unallocated memory as a share of all PyTorch reserved (None without the numbers)."""
    if n.reserved_unallocated is None or n.allocated is None:
        return None
    reserved = n.allocated + n.reserved_unallocated
    return n.reserved_unallocated / reserved if reserved > 0 else None


def _large_share(n: OomNumbers) -> bool:
    share = cache_share(n)
    return share is None or share >= FRAGMENTED_SHARE  # without an allocated figure the share cannot be judged


def fragmented(n: OomNumbers) -> bool:
    """Enough memory was cached and free together, just not in one block, it would leave room after the request,
    and the unallocated cache is a real share of what PyTorch reserved: the allocator setting is the fix."""
    slack = _slack(n)
    return slack is not None and _leaves_room(n, slack) and _large_share(n)


def small_cache_share(n: OomNumbers) -> bool:
    """Cached and free memory exceeded the request with room left, but the unallocated cache is a small share of
    what PyTorch reserved (under FRAGMENTED_SHARE): the allocator setting is a step, the memory lever the fix."""
    slack = _slack(n)
    return slack is not None and _leaves_room(n, slack) and not _large_share(n)


def allocator_is_a_step(n: OomNumbers) -> bool:
    """The allocator setting could reach the request but the numbers do not say fragmentation (a nearly full GPU,
    or a small unallocated share): it is a step of the fix, not its headline."""
    return buys_one_allocation(n) or small_cache_share(n)


def buys_one_allocation(n: OomNumbers) -> bool:
    """Cached and free memory together exceeded the request, but serving it would leave under FRAGMENTATION_MARGIN
    of the GPU: expandable segments may get this allocation through, and the next one fails (a nearly full GPU,
    whose fix is the memory lever; qa-report-9 L1)."""
    slack = _slack(n)
    return slack is not None and not _leaves_room(n, slack)


def larger_than_gpu(n: OomNumbers, capacity: int | None = None) -> bool:
    """The single allocation asked for more than the GPU's total memory."""
    cap = capacity or n.capacity
    return bool(n.requested and cap and n.requested > cap)


def decide(
    n: OomNumbers,
    phase: str,
    state_bytes: int | None,
    phase_peak: int | None,
    activation_bytes: int | None,
    capacity: int | None,
) -> str:
    """One verdict from the numbers, the phase and the model's prediction (any may be None)."""
    cap = capacity or n.capacity
    if larger_than_gpu(n, cap):
        return "capacity"  # one tensor bigger than the whole GPU: nothing else on the GPU matters
    if cap is not None and state_bytes is not None and state_bytes > cap:
        return "capacity"  # no allocator setting makes the model state fit
    if fragmented(n):
        return "fragmentation"
    if cap is None:
        return "unknown"
    if phase in ("model_build", "dp_wrap"):
        if phase_peak is not None:
            return "capacity" if phase_peak > cap else "transient_peak"
        return "capacity" if state_bytes is None else "transient_peak"
    if phase in ("optimizer_step", "checkpoint_save", "checkpoint_load"):
        return "transient_peak" if state_bytes is not None or phase != "optimizer_step" else "capacity"
    if activation_bytes is not None and state_bytes is not None:
        if state_bytes + activation_bytes > cap or activation_bytes > state_bytes * 0.25:
            return "activations"
        return "transient_peak"
    if phase in ("first_iteration", "training", "eval") and state_bytes is not None:
        return "activations"
    return "unknown"
