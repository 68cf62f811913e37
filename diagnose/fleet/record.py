"""From one job's diagnosis (a Report, and Slurm's facts when the job came from Slurm) to the row the store keeps."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

from diagnose.fleet.store import JobRecord, pack_report
from diagnose.model import Report

# Slurm states that mean the job did not end well by themselves (COMPLETED with a non-zero exit counts too)
BAD_STATES = frozenset(
    {"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "CANCELLED", "BOOT_FAIL", "DEADLINE"}
)
_EXCEPTION = re.compile(r"\b([A-Z][A-Za-z0-9_]*(?:Error|Exception|Interrupt|Exit))\b")
_DIGITS = re.compile(r"[\d#]+")  # '#': a digit folded already (config keys stored by an earlier release)
_PARTS = re.compile(r"([-_])")  # a job name's parts; the separators are kept
_HEXISH = re.compile(r"(?=[0-9a-fA-F#]*[\d#])[0-9a-fA-F#]{4,}")  # >= 4 hex characters, one of them a digit
_WORD_NUMBER = re.compile(r"[a-fA-F]+[\d#]+")  # letters then digits: a word with a number (bf16, a100)
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
HOST_SCAN_LINES = 200  # hosts are read from the first lines of a log (launcher prefixes), not from all of it


@dataclass(slots=True)
class JobFacts:
    """What is known about a job besides its log: from Slurm, or from the file."""

    job_key: str
    via: str
    cluster: str = ""
    job_id: str = ""
    name: str = ""
    user: str = ""
    state: str = ""
    exit_code: int | None = None
    derived_exit_code: int | None = None
    nodes: list[str] = field(default_factory=list)
    gpus: int | None = None
    elapsed_s: int | None = None
    start_ts: float | None = None
    end_ts: float | None = None
    source: str = ""


# JobFacts fields the stored row keeps as they are (nodes are cleaned and end_ts filled in first)
_AS_IS = ("job_key", "via", "cluster", "job_id", "name", "user", "state", "exit_code", "gpus", "elapsed_s", "start_ts",
          "source")


def signature(report: Report) -> str | None:
    """The failure class: the root cause's rule; for a catch-all rule (category "other") plus the exception type,
    so that a ValueError and a KeyError in user code are two classes, not one."""
    root = report.root
    if root is None:
        return None
    head = root.headline_evidence
    if root.category == "other" and head is not None and (m := _EXCEPTION.search(head.text)):
        return f"{root.rule}:{m.group(1)}"
    return root.rule


def config_key(name: str) -> str:
    """Jobs of one configuration share a name up to numbers (run-17, run-18) and generated ids (a hex suffix:
    fleet-mix-3-9a4bb, job-1f3c2d7): digits are folded to '#', and so is a whole dash/underscore-separated part that
    looks like hex: at least 4 hex characters with at least one digit (qa-report-17 L6). Words stay: a part with no
    digit (``deadbeef``, ``cafe``, ``added``: an all-letter hex word is never folded, at the cost of an id that
    happens to have no digit), and a word with a number, letters then digits (``bf16``, ``a100``), has only its
    digits folded (``bf#``). '#' counts as a digit, so a key folded before (digits only) folds the same again."""
    return "".join(_fold_part(part) for part in _PARTS.split(name))[:200]


def _fold_part(part: str) -> str:
    if _HEXISH.fullmatch(part) and not _WORD_NUMBER.fullmatch(part):
        return "#"
    return _DIGITS.sub("#", part)


def clean_hosts(names: list[str]) -> list[str]:
    """Host names that look like host names (anything else from a log is dropped), in first-seen order."""
    return [h for h in dict.fromkeys(names) if _HOST.fullmatch(h)]


def failed(report: Report, facts: JobFacts) -> bool:
    if report.root_cause is not None:
        return True
    return facts.state in BAD_STATES or bool(facts.exit_code) or bool(facts.derived_exit_code)


def build_record(report: Report, facts: JobFacts, log_hosts: list[str], status: str = "diagnosed",
                 problem: str | None = None) -> JobRecord:
    """The stored row. Nodes: the hosts the log names (launcher prefixes, and the root cause's hosts) when it names
    any, else Slurm's node list. A failed job blames the hosts its root cause names, else all of its nodes."""
    root = report.root
    root_hosts = clean_hosts(list(root.hosts)) if root is not None else []
    nodes = clean_hosts(log_hosts + root_hosts) or clean_hosts(facts.nodes)
    is_failed = failed(report, facts)
    blamed = ([h for h in root_hosts if h in nodes] or nodes) if is_failed else []
    gpu_hours = None
    if facts.gpus is not None and facts.elapsed_s is not None:
        gpu_hours = facts.gpus * facts.elapsed_s / 3600.0
    as_is = {name: getattr(facts, name) for name in _AS_IS}
    return JobRecord(
        **as_is,
        failed=is_failed,
        status=status,
        config=config_key(facts.name),
        problem=problem,
        root_rule=root.rule if root else (f"state:{facts.state}" if is_failed and facts.state else None),
        root_category=root.category if root else ("slurm" if is_failed else None),
        root_title=root.title if root else (f"Slurm state {facts.state}" if is_failed and facts.state else None),
        signature=signature(report) or (f"state:{facts.state}" if is_failed and facts.state else None),
        nodes=nodes,
        blamed_nodes=blamed,
        node_count=len(facts.nodes) or None,
        gpu_hours=gpu_hours,
        end_ts=facts.end_ts or time.time(),  # never NULL: the report's window needs a time
        report=pack_report(json.dumps(report.to_dict(), ensure_ascii=True, default=str)),
        scanned_at=time.time(),
    )
