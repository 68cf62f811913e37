"""Slurm facts from job output: ``slurmstepd`` banners, cgroup oom-kill events and ``srun: error:`` task lines.

Formats (../shared/knowledge/megatron-core.md section 7)::

    slurmstepd: error: *** JOB 123 ON node01 CANCELLED AT 2026-01-01T12:00:00 DUE TO TIME LIMIT ***
    slurmstepd: error: *** STEP 123.0 ON node01 CANCELLED AT ... DUE TO PREEMPTION | NODE FAILURE, SEE ... ***
    slurmstepd: error: *** STEP 123.0 ON node01 CANCELLED AT ... DUE to SIGNAL Terminated ***   (>= 25.05)
    slurmstepd: error: *** JOB 123 ON node01 FAILED (non-zero exit code or other failure mode) ***
    slurmstepd: error: Detected 1 oom-kill event(s) in StepId=123.0. Some of your processes may have been ...
    slurmstepd: error: Detected 1 oom_kill event in StepId=123.batch. Some of the step tasks have been OOM Killed.
    srun: error: node01: tasks 0-7: Killed
    srun: error: node01: task 3: Exited with exit code 1
"""

from __future__ import annotations

import re
from typing import Any

_BANNER = re.compile(
    r"\*\*\* (?P<kind>JOB|STEP) (?P<id>[\w.+-]+) ON (?P<node>\S+) "
    r"(?:(?P<cancelled>CANCELLED) AT (?P<time>\S+)(?: DUE [Tt][Oo] (?P<reason>.*?))?"
    r"|(?P<failed>FAILED)(?: \((?P<why>[^)]*)\))?)"
    r" \*\*\*"
)
_REASONS = {
    "TIME LIMIT": "time_limit",
    "PREEMPTION": "preemption",
    "NODE FAILURE": "node_failure",
    "JOB REQUEUE": "requeue",
    "TASK FAILURE": "task_failure",
}
_OOM_KILL = re.compile(
    r"Detected (?P<n>\d+) oom[-_]kill event(?:\(s\)|s)? in (?:StepId=)?(?P<step>[\w.]+?)(?: cgroup)?\. "
    r"(?P<tail>Some of your processes may have been killed by the cgroup out-of-memory handler\.|"
    r"Some of the step tasks have been OOM Killed\.)?"
)
_REASON_LINE = re.compile(r"\*\*\* REASON: (?P<reason>.*?) \*\*\*")


def _split_step(ident: str) -> tuple[str, str | None]:
    job, _, step = ident.partition(".")
    return job, (step or None)


def parse_slurmstepd(text: str) -> dict[str, Any] | None:
    m = _BANNER.search(text)
    if m is not None:
        job, step = _split_step(m.group("id"))
        reason_text = m.group("reason")
        reason = signal = None
        if reason_text:
            key = reason_text.split(",")[0].strip()
            if key.upper().startswith("SIGNAL "):
                reason, signal = "signal", key[7:].strip()
            else:
                reason = _REASONS.get(key, key.lower().replace(" ", "_"))
        return {
            "event": "cancelled" if m.group("cancelled") else "failed",
            "entity": m.group("kind"),
            "job_id": job,
            "step": step,
            "node": m.group("node"),
            "time": m.group("time"),
            "reason": reason,
            "signal": signal,
        }
    m = _OOM_KILL.search(text)
    if m is not None:
        job, step = _split_step(m.group("step"))
        return {"event": "oom_kill", "count": int(m.group("n")), "job_id": job, "step": step}
    m = _REASON_LINE.search(text)
    if m is not None:
        return {"event": "reason", "reason_text": m.group("reason")}
    return None


_SRUN = re.compile(
    r"srun: error: (?P<node>[^\s:]+): tasks? (?P<tasks>[\d,\-\[\] ]+?): (?P<what>.+?)\s*$"
)
_EXIT = re.compile(r"Exited with exit code (?P<code>\d+)")


def expand_task_list(text: str) -> list[int]:
    """``0-3,7`` -> [0, 1, 2, 3, 7] (bounded: at most 1,000,000 tasks)."""
    out: list[int] = []
    for part in text.replace("[", "").replace("]", "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            continue
        start, end = int(lo), int(hi) if hi else int(lo)
        if end < start or len(out) + end - start > 1_000_000:
            continue
        out.extend(range(start, end + 1))
    return out


def parse_srun_error(text: str) -> dict[str, Any] | None:
    m = _SRUN.search(text)
    if m is None:
        return None
    what = m.group("what")
    exit_m = _EXIT.match(what)
    core = what.endswith("(core dumped)")
    signal_name = None
    if exit_m is None and what != "Out Of Memory":
        signal_name = what[: -len("(core dumped)")].strip() if core else what
    return {
        "node": m.group("node"),
        "tasks": expand_task_list(m.group("tasks")),
        "tasks_text": m.group("tasks"),
        "exit_code": int(exit_m.group("code")) if exit_m else None,
        "signal_name": signal_name,
        "core_dumped": core,
        "out_of_memory": what == "Out Of Memory",
    }
