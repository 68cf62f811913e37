"""CUDA / HIP out-of-memory messages of every PyTorch version, as facts (sizes in bytes).

Templates (see ../shared/knowledge/megatron-core.md section 5):

* >= 2.1: ``CUDA out of memory. Tried to allocate X. GPU g has a total capacity of T of which F is free.
  [Including non-PyTorch memory, this process has P memory in use. ][Process N has P memory in use. ]...
  [A allowed; ]Of the allocated memory A is allocated by PyTorch, [with X allocated in private pools (e.g., CUDA
  Graphs), ]and R is reserved by PyTorch but unallocated. <hint>``. 2.1 spells ``capacty``; its hint names
  max_split_size_mb; 2.2+ names ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, recent builds
  ``PYTORCH_ALLOC_CONF``.
* <= 2.0: ``CUDA out of memory. Tried to allocate X (GPU g; T total capacity; A already allocated; F free;
  [L allowed; ]R reserved in total by PyTorch) <hint>`` (before 1.4: ``R cached)``).
* ROCm: ``HIP out of memory.`` in the same templates.

The fact dict always has the same keys (None when the message does not say); tests/fact_renderers.py renders it
back to the exact message so that ``parse_cuda_oom(format_cuda_oom(f)) == f``.
"""

from __future__ import annotations

import re
from typing import Any

from diagnose.normalize.facts.sizes import SIZE_PATTERN, parse_size

S = SIZE_PATTERN

_REQUEST = re.compile(rf"(?P<device>CUDA|HIP) out of memory\. Tried to allocate (?P<req>{S})")
_EXCEPTION_NAME = re.compile(r"[A-Za-z_][\w.]{0,200}(?:Error|Exception)")


def exception_before(text: str, end: int) -> str | None:
    """The ``pkg.SomeError`` written as ``pkg.SomeError: `` right before ``end`` (linear, no regex search)."""
    head = text[:end].rstrip()
    if not head.endswith(":"):
        return None
    words = head[:-1].rsplit(None, 1)
    if not words:
        return None
    name = words[-1]
    for opener in ("[", "]"):  # "[rank0]:RuntimeError" style leftovers
        name = name.rsplit(opener, 1)[-1]
    return name if _EXCEPTION_NAME.fullmatch(name) else None


_NEW = re.compile(
    rf"\. GPU (?P<gpu>\d+) has a total (?P<cap>capacity|capacty) of (?P<total>{S}) of which (?P<free>{S}) is free\. "
)
_THIS_PROCESS = re.compile(rf"Including non-PyTorch memory, this process has (?P<used>{S}) memory in use\. ")
_OTHER_PROCESS = re.compile(rf"Process (?P<pid>\d+) has (?P<used>{S}) memory in use\. ")
_ALLOWED_NEW = re.compile(rf"(?P<allowed>{S}) allowed; ")
_ALLOCATED_NEW = re.compile(
    rf"Of the allocated memory (?P<alloc>{S}) is allocated by PyTorch, "
    rf"(?:with (?P<pool>{S}) allocated in private pools \(e\.g\., CUDA Graphs\), )?"
    rf"and (?P<unalloc>{S}) is reserved by PyTorch but unallocated\."
)
_OLD = re.compile(
    rf" \(GPU (?P<gpu>\d+); (?P<total>{S}) total capacity; (?P<alloc>{S}) already allocated; (?P<free>{S}) free; "
    rf"(?:(?P<allowed>{S}) allowed; )?(?P<reserved>{S}) (?P<rword>reserved in total by PyTorch|cached)\)"
)
_HINT_EXPANDABLE = re.compile(
    r" If reserved but unallocated memory is large try setting (?P<env>PYTORCH_(?:CUDA_)?ALLOC_CONF)="
    r"expandable_segments:True to avoid fragmentation\."
)
_HINT_SPLIT_NEW = " If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation."
_HINT_SPLIT_OLD = " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation."
_DOCS_NEW = re.compile(r"  See documentation for Memory Management  \((?P<url>[^()\s]+)\)")

KEYS = (
    "exception", "device", "template", "capacity_typo", "gpu", "requested_bytes", "total_bytes", "free_bytes",
    "process_in_use_bytes", "other_processes", "allowed_bytes", "allocated_bytes", "private_pool_bytes",
    "reserved_unallocated_bytes", "reserved_bytes", "old_reserved_word", "hint", "alloc_conf_env", "docs_url",
)


def _empty() -> dict[str, Any]:
    return {**dict.fromkeys(KEYS), "other_processes": [], "capacity_typo": False}


def parse_cuda_oom(text: str) -> dict[str, Any] | None:
    """Facts of one OOM message line (with or without its exception name); None if it is not one."""
    at = text.find(" out of memory. Tried to allocate ")
    if at < 3:
        return None
    device_at = at - 4 if text.startswith("CUDA", at - 4) else at - 3
    head = _REQUEST.match(text, device_at)
    if head is None:
        return None
    out = _empty()
    out["exception"] = exception_before(text, device_at)
    out["device"] = head.group("device")
    out["requested_bytes"] = parse_size(head.group("req"))
    rest = text[head.end() :]
    new = _NEW.match(rest)
    if new is not None:
        _parse_new(out, new, rest)
    else:
        old = _OLD.match(rest)
        if old is None:
            out["template"] = "unknown"
            return out
        _parse_old(out, old, rest)
    return out


def _parse_new(out: dict[str, Any], m: re.Match, rest: str) -> None:
    out["template"] = "2.1+"
    out["capacity_typo"] = m.group("cap") == "capacty"
    out["gpu"] = int(m.group("gpu"))
    out["total_bytes"] = parse_size(m.group("total"))
    out["free_bytes"] = parse_size(m.group("free"))
    pos = m.end()
    others: list[dict[str, int]] = []
    while True:  # "this process has" (once) and "Process N has" sentences, in any order
        this = _THIS_PROCESS.match(rest, pos) if out["process_in_use_bytes"] is None else None
        if this is not None:
            out["process_in_use_bytes"] = parse_size(this.group("used"))
            pos = this.end()
            continue
        other = _OTHER_PROCESS.match(rest, pos)
        if other is None:
            break
        others.append({"pid": int(other.group("pid")), "bytes": parse_size(other.group("used")) or 0})
        pos = other.end()
    out["other_processes"] = others
    allowed = _ALLOWED_NEW.match(rest, pos)
    if allowed is not None:
        out["allowed_bytes"] = parse_size(allowed.group("allowed"))
        pos = allowed.end()
    alloc = _ALLOCATED_NEW.match(rest, pos)
    if alloc is not None:
        out["allocated_bytes"] = parse_size(alloc.group("alloc"))
        out["private_pool_bytes"] = parse_size(alloc.group("pool")) if alloc.group("pool") else None
        out["reserved_unallocated_bytes"] = parse_size(alloc.group("unalloc"))
        out["reserved_bytes"] = (out["allocated_bytes"] or 0) + (out["reserved_unallocated_bytes"] or 0)
        pos = alloc.end()
    hint = _HINT_EXPANDABLE.match(rest, pos)
    if hint is not None:
        out["hint"] = "expandable_segments"
        out["alloc_conf_env"] = hint.group("env")
        docs = _DOCS_NEW.match(rest, hint.end())
        if docs is not None:
            out["docs_url"] = docs.group("url")
    elif rest.startswith(_HINT_SPLIT_NEW, pos):
        out["hint"] = "max_split_size_mb"


def _parse_old(out: dict[str, Any], m: re.Match, rest: str) -> None:
    out["template"] = "<=2.0"
    out["gpu"] = int(m.group("gpu"))
    out["total_bytes"] = parse_size(m.group("total"))
    out["allocated_bytes"] = parse_size(m.group("alloc"))
    out["free_bytes"] = parse_size(m.group("free"))
    out["allowed_bytes"] = parse_size(m.group("allowed")) if m.group("allowed") else None
    out["reserved_bytes"] = parse_size(m.group("reserved"))
    out["old_reserved_word"] = "cached" if m.group("rword") == "cached" else None
    if out["reserved_bytes"] is not None and out["allocated_bytes"] is not None:
        out["reserved_unallocated_bytes"] = max(0, out["reserved_bytes"] - out["allocated_bytes"])
    if rest.startswith(_HINT_SPLIT_OLD, m.end()):
        out["hint"] = "max_split_size_mb"


def parse_cuda_error_oom(text: str) -> dict[str, Any] | None:
    """``RuntimeError: CUDA error: out of memory`` (a non-allocator OOM: cuBLAS/NCCL/kernel launch)."""
    at = text.find(" error: out of memory")
    if at < 3:
        return None
    for device in ("CUDA", "HIP"):
        if text.startswith(device, at - len(device)):
            start = at - len(device)
            return {"exception": exception_before(text, start), "device": device, "kind": "cuda_error"}
    return None
