"""Renderers: a fact dict printed back in the program's own words (the inverse of diagnose.normalize.facts' parsers).

Only the round-trip tests use them (``parse(render(fact)) == fact``), so they live here, not in the product.
"""

from __future__ import annotations

from typing import Any

from diagnose.normalize.facts.oom import _HINT_SPLIT_NEW, _HINT_SPLIT_OLD

_DOCS_OLD = "  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"  # max_split_size_mb hints' tail


def format_size(n: int) -> str:
    """Exactly PyTorch's format_size: fixed two decimals, binary units, ``N bytes`` up to 1024."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1048576:
        return f"{n / 1024:.2f} KiB"
    if n <= 1073741824:
        return f"{n / 1048576:.2f} MiB"
    return f"{n / 1073741824:.2f} GiB"


def format_cuda_oom(f: dict[str, Any]) -> str:
    """The message PyTorch would print for these facts (the inverse of parse_cuda_oom)."""
    parts = []
    if f.get("exception"):
        parts.append(f"{f['exception']}: ")
    parts.append(f"{f.get('device') or 'CUDA'} out of memory. Tried to allocate {format_size(f['requested_bytes'])}")
    if f.get("template") == "<=2.0":
        allowed = f"{format_size(f['allowed_bytes'])} allowed; " if f.get("allowed_bytes") is not None else ""
        word = "cached" if f.get("old_reserved_word") == "cached" else "reserved in total by PyTorch"
        parts.append(
            f" (GPU {f['gpu']}; {format_size(f['total_bytes'])} total capacity; "
            f"{format_size(f['allocated_bytes'])} already allocated; {format_size(f['free_bytes'])} free; "
            f"{allowed}{format_size(f['reserved_bytes'])} {word})"
        )
        if f.get("hint") == "max_split_size_mb":
            parts.append(_HINT_SPLIT_OLD + _DOCS_OLD)
        return "".join(parts)
    if f.get("template") != "2.1+":
        return "".join(parts)
    cap = "capacty" if f.get("capacity_typo") else "capacity"
    parts.append(
        f". GPU {f['gpu']} has a total {cap} of {format_size(f['total_bytes'])} of which "
        f"{format_size(f['free_bytes'])} is free. "
    )
    if f.get("process_in_use_bytes") is not None:
        used = format_size(f["process_in_use_bytes"])
        parts.append(f"Including non-PyTorch memory, this process has {used} memory in use. ")
    for other in f.get("other_processes") or []:
        parts.append(f"Process {other['pid']} has {format_size(other['bytes'])} memory in use. ")
    if f.get("allowed_bytes") is not None:
        parts.append(f"{format_size(f['allowed_bytes'])} allowed; ")
    if f.get("allocated_bytes") is not None and f.get("reserved_unallocated_bytes") is not None:
        pool = ""
        if f.get("private_pool_bytes") is not None:
            pool = f"with {format_size(f['private_pool_bytes'])} allocated in private pools (e.g., CUDA Graphs), "
        parts.append(
            f"Of the allocated memory {format_size(f['allocated_bytes'])} is allocated by PyTorch, {pool}"
            f"and {format_size(f['reserved_unallocated_bytes'])} is reserved by PyTorch but unallocated."
        )
    if f.get("hint") == "expandable_segments":
        env = f.get("alloc_conf_env") or "PYTORCH_CUDA_ALLOC_CONF"
        parts.append(
            f" If reserved but unallocated memory is large try setting {env}=expandable_segments:True to avoid "
            "fragmentation."
        )
        if f.get("docs_url"):
            parts.append(f"  See documentation for Memory Management  ({f['docs_url']})")
    elif f.get("hint") == "max_split_size_mb":
        parts.append(_HINT_SPLIT_NEW + _DOCS_OLD)
    return "".join(parts)


def format_cuda_error_oom(f: dict[str, Any]) -> str:
    exc = f"{f['exception']}: " if f.get("exception") else ""
    return f"{exc}{f.get('device') or 'CUDA'} error: out of memory"


def format_nccl_watchdog(f: dict[str, Any]) -> str:
    style = f.get("prefix_style")
    if style == "pg_id":
        desc = f"({f['pg_desc']})" if f.get("pg_desc") is not None else ""
        prefix = f"[PG ID {f['pg']} PG GUID {f['pg_guid']}{desc} Rank {f['rank']}] "
    elif style == "pg":
        prefix = f"[PG {f['pg']} Rank {f['rank']}] "
    elif style == "rank":
        prefix = f"[Rank {f['rank']}] "
    else:
        prefix = ""
    text = (
        f"{prefix}Watchdog caught collective operation timeout: WorkNCCL(SeqNum={f['seq_num']}, OpType={f['op_type']}, "
        f"NumelIn={f['numel_in']}, NumelOut={f['numel_out']}, Timeout(ms)={f['timeout_ms']})"
    )
    if f.get("ran_for_ms") is not None:
        text += f" ran for {f['ran_for_ms']} milliseconds before timing out."
    return text


def format_nccl_error(f: dict[str, Any]) -> list[str]:
    """The lines an NCCL error prints (first line, detail, ``Last error:`` and its line)."""
    exc = f"{f['exception']}: " if f.get("exception") else ""
    lines = [f"{exc}NCCL error in: {f['file']}:{f['line']}, {f['reason']}, NCCL version {f['version']}"]
    if f.get("code") is not None:
        lines.append(f"{f['code']}: {f['detail']}" if f.get("detail") else f"{f['code']}: ")
    if f.get("last_error") is not None:
        lines += ["Last error:", f["last_error"]]
    return lines


def _format_entry(e: dict[str, Any]) -> list[str]:
    signal = f"  ({e['signal']})" if e.get("signal") else ""
    return [
        f"[{e['index']}]:",
        f"  time      : {e['time']}",
        f"  host      : {e['host']}",
        f"  rank      : {e['rank']} (local_rank: {e['local_rank']})",
        f"  exitcode  : {e['exitcode']} (pid: {e['pid']}){signal}",
        f"  error_file: {e['error_file']}",
    ] + _format_traceback(e["traceback"])


def _format_traceback(value: Any) -> list[str]:
    first, *rest = str(value).split("\n")
    return [f"  traceback : {first}"] + [f"    {line}" for line in rest]


def format_torchrun_failure(f: dict[str, Any]) -> list[str]:
    """The summary block torch prints for these facts (border width fixed at 60)."""
    out = ["=" * 60, f"{f['script']} FAILED", "-" * 60, "Failures:"]
    if f.get("no_other_failures"):
        out.append("  <NO_OTHER_FAILURES>")
    for e in f.get("failures") or []:
        out += _format_entry(e)
    out += ["-" * 60, "Root Cause (first observed failure):"]
    if f.get("root_cause") is not None:
        out += _format_entry(f["root_cause"])
    out.append("=" * 60)
    return out


def format_torchrun_agent(f: dict[str, Any]) -> str:
    if f["event"] == "worker_failed":
        return (
            f"failed (exitcode: {f['exitcode']}) local_rank: {f['local_rank']} (pid: {f['pid']}) "
            f"of binary: {f['binary']}"
        )
    if f["event"] == "closing_signal":
        return f"Sending process {f['pid']} closing signal {f['signal']}"
    return (
        f"[{f['role']}] Worker group FAILED. {f['attempts_left']}/{f['max_restarts']} attempts left; "
        "will restart worker group"
    )
