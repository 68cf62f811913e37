"""The job's nodes as Slurm sees them now (``scontrol show node``) as findings, and when a bad node is the root cause.

A node that Slurm took out of service (DOWN, DRAIN, FAIL, NOT_RESPONDING, a reboot asked for...) with a Reason is
evidence the log does not carry: a health check found a failing GPU or NIC, slurmd could not kill the job's
processes, the node rebooted. Which finding a Reason gives is data: the catalogue's ``input = "slurm_node"`` rules
(``rules/76_slurm_node.toml``), the last rule in catalogue order whose ``node_states_any`` and ``node_reason_any``
both hold wins, as for log lines (generic rules first, specific ones after).

When the Reason was set matters (its ``[user@time]`` stamp against the job's start and end, both slurmctld's local
time):

* ``during`` the job, or ``after`` it within ``RIGHT_AFTER_S`` (a health check that runs every few minutes, slurmd
  failing to kill the job's processes at its end): the node went bad while it ran the job. Such a finding may be the
  root cause (``merge_node_findings``).
* ``later`` than that: shown, with how long after the job it was set; the node may have failed after the job.
* ``before`` the job started: the node was already flagged while it ran the job, a weaker clue; shown, never root.
* ``unknown`` (no stamp, or the job's times unknown): shown, never root.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from datetime import datetime

import regex

from diagnose.inert import inert, shorten
from diagnose.ingest.slurm.parse import NodeRecord, format_duration, parse_scontrol_nodes
from diagnose.match.rules import Rule, load_catalogue
from diagnose.model import Evidence, Finding, Report

# The State words of a node Slurm took out of service or lost; with a Reason such a node is evidence.
OUT_OF_SERVICE = frozenset({"DOWN", "DRAIN", "FAIL", "FAILING", "NOT_RESPONDING", "INVAL", "INVALID_REG", "REBOOT"})
RIGHT_AFTER_S = 3600  # a Reason set this long after the job ended still tells about the job's run
# How much a finding's confidence keeps when the Reason's time does not put it in the job's run
TIMING_FACTOR = {"during": 1.0, "after": 1.0, "later": 0.7, "unknown": 0.7, "before": 0.5}
# The log's root-cause categories a node that went bad explains: communication failures, a rank's (launcher's)
# death, Slurm's own record of the failure, a generic error. A specific cause of the log's own (a CUDA OOM, a config
# error, a hardware line of its own) stays the root cause.
EXPLAINED_BY_A_BAD_NODE = frozenset({"nccl_error", "nccl_timeout", "launcher", "slurm", "other"})
# Slurm job states that have a cause of their own, which a bad node does not explain
STATES_OF_THEIR_OWN = frozenset({"PREEMPTED", "DEADLINE", "OUT_OF_MEMORY"})
NODE_PLACEHOLDER = "NODENAME"  # in a rule's fix: the node's name
MAX_TITLE_REASON = 160
MAX_EVIDENCE = 600


@dataclass(frozen=True, slots=True)
class NodeTiming:
    when: str  # "during", "after", "later", "before" or "unknown"
    seconds: int | None = None  # from the job's start (during, before) or end (after, later), always >= 0

    def phrase(self, reason_time: str = "") -> str:
        """When the Reason was set, in words: ``during the job, 01:02:03 after it started``."""
        span = format_duration(self.seconds) if self.seconds is not None else ""
        return {
            "during": f"during the job, {span} after it started",
            "after": f"{span} after the job ended",
            "later": f"{span} after the job ended; the node may have failed after the job",
            "before": f"{span} before the job started; a weaker clue, the node was already out of service",
        }.get(self.when, f"at {reason_time}" if reason_time else "")


def _time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat((text or "").strip())
    except ValueError:
        return None


def node_timing(reason_time: str, job_start: str, job_end: str) -> NodeTiming:
    """Where the Reason's stamp falls against the job's run (a running job's end is open)."""
    stamp, start, end = _time(reason_time), _time(job_start), _time(job_end)
    if stamp is None or start is None:
        return NodeTiming("unknown")
    if stamp < start:
        return NodeTiming("before", int((start - stamp).total_seconds()))
    if end is None or stamp <= end:
        return NodeTiming("during", int((stamp - start).total_seconds()))
    after = int((stamp - end).total_seconds())
    return NodeTiming("after" if after <= RIGHT_AFTER_S else "later", after)


def out_of_service(record: NodeRecord) -> bool:
    """Slurm took the node out of service (or lost it) and says why."""
    return bool(record.reason) and bool(record.state.words & OUT_OF_SERVICE)


@functools.lru_cache(maxsize=1)
def _node_rules() -> tuple[Rule, ...]:
    return tuple(r for r in load_catalogue().rules if r.input == "slurm_node")


def rule_for(record: NodeRecord, rules: tuple[Rule, ...] | None = None) -> Rule | None:
    """The last slurm_node rule (catalogue order) whose states and Reason patterns hold for an out-of-service node."""
    if not out_of_service(record):
        return None
    for rule in reversed(rules if rules is not None else _node_rules()):
        if rule.node_states_any and not record.state.words & set(rule.node_states_any):
            continue
        if rule.node_reason_any and not any(regex.search(p, record.reason) for p in rule.node_reason_any):
            continue
        return rule
    return None


def node_findings(records: list[NodeRecord], job_start: str = "", job_end: str = "") -> list[Finding]:
    """A finding for each of the job's nodes that is out of service with a Reason, in the job's node order.

    Its role is the rule's when the Reason was set during the job or right after it, else context; the merge decides
    which one (if any) becomes the root cause.
    """
    out: list[Finding] = []
    for record in records:
        rule = rule_for(record)
        if rule is not None:
            out.append(_finding(record, rule, node_timing(record.reason_time, job_start, job_end)))
    return out


def findings_of_scontrol_node(text: str) -> list[Finding]:
    """The findings of ``scontrol show node`` output, without a job: how the slurm_node rules' examples are run."""
    records, _ = parse_scontrol_nodes(text)
    return node_findings(records)


def _finding(record: NodeRecord, rule: Rule, timing: NodeTiming) -> Finding:
    name = record.name
    stamp = f" [{record.reason_user}@{record.reason_time}]" if record.reason_time else ""
    who = f"set by {record.reason_user} " if record.reason_user else "set "
    when = timing.phrase(record.reason_time)
    title = f"Node {name} {record.state.text}: {shorten(record.reason, MAX_TITLE_REASON)}"
    if when:
        title += f" ({who}{when})"
    text = f"NodeName={name} State={record.state.text} Reason={record.reason}{stamp}"
    strong = timing.when in ("during", "after")
    fix = copy.deepcopy(rule.fix)
    fix.summary = fix.summary.replace(NODE_PLACEHOLDER, name)
    fix.steps = [step.replace(NODE_PLACEHOLDER, name) for step in fix.steps]
    return Finding(
        rule=rule.code,
        name=rule.slug,
        title=inert(title),
        category=rule.category,
        phase="unknown",
        severity=rule.severity,  # type: ignore[arg-type]
        role=rule.role if strong else "context",  # type: ignore[arg-type]
        confidence=round(rule.confidence * TIMING_FACTOR[timing.when], 3),
        hosts=[name],
        first_line=record.line,
        evidence=[Evidence(f"scontrol-node:{name}", record.line, shorten(inert(text), MAX_EVIDENCE))],
        explanation=rule.explanation,
        fix=fix,
        facts={
            "node": name,
            "state": record.state.text,
            "reason": record.reason,
            "reason_user": record.reason_user or None,
            "reason_time": record.reason_time or None,
            "timing": timing.when,
            "seconds_from_job": timing.seconds,
        },
    )


def node_explains(root: Finding | None) -> bool:
    """Would a node that went bad during the job account for the report's current root cause?"""
    if root is None:
        return True
    if root.category not in EXPLAINED_BY_A_BAD_NODE:
        return False
    return root.facts.get("state") not in STATES_OF_THEIR_OWN


def merge_node_findings(report: Report, findings: list[Finding]) -> None:
    """Add the node findings to ``report`` in place; the first node that went bad during (or right after) the job
    becomes the root cause when its rule can lead and the report's root is one a bad node explains (the old root
    and its consequences become the node's consequences). Every other node finding is context."""
    if not findings:
        return
    leaders = [f for f in findings if f.role == "root" and f.severity == "error"]
    earliest = min(leaders, key=lambda f: f.facts["reason_time"] or "", default=None)
    lead = earliest if earliest is not None and node_explains(report.root) else None
    others = [f for f in findings if f is not lead]
    for f in others:
        f.role = "context"
        f.cause_of = None
    if lead is None:
        report.findings.extend(others)
        return
    report.lead_with(lead, others)
