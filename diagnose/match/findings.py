"""Group hits into findings: the same rule (and the same matched text, numbers masked) across ranks and hosts.

A finding keeps the count, the sorted ranks and hosts, the first line, a few evidence lines with exact line numbers
(text made inert), the explanation and fix from the rule, and the facts of its first hit (later hits only fill
keys the first one lacked). NCCL timeout findings also keep which ranks reported which SeqNum/OpType/progress
(``collective_skew``), bounded by distinct values, so the ranks that disagree can be named after ranking.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from diagnose.inert import inert, shorten
from diagnose.match import collective_skew
from diagnose.match.attribution import task_ids
from diagnose.match.category_fix import RAISED_AT, RAISING_PACKAGE
from diagnose.match.engine import Hit
from diagnose.match.inference import infer, innermost_frame, package_of, raised_at
from diagnose.match.rules import Inference
from diagnose.model import Evidence, Finding, Implies, LogLine
from diagnose.normalize import collapse_carriage_returns

EVIDENCE_KEPT = 3
# merge_adjacent: the lines of one message shown after its first line, and the later values kept of a fact the first
# line has too (``<key>_more``); a longer run of lines still counts as one message
MERGED_KEPT = 2
EVIDENCE_CHARS = 500
MAX_GROUPS = 500  # distinct findings; beyond it, hits join their rule's first finding
MAX_TASK_NODES = 1_000_000  # srun task ids remembered per finding (expand_task_list's own bound)
RELAY_WINDOW = 200  # merge_relays: how many lines from a wrapper's report of a command's failure its own error may be
RERAISE_WINDOW = 400  # merge_reraised: how many lines after an exception its re-raise with more words may be
RERAISE_MIN_CHARS = 12  # merge_reraised: a shorter message ("", "0", "boom") proves no relation by being a prefix


@dataclass
class Group:
    finding: Finding
    first_hit: Hit
    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    collective: collective_skew.CollectiveSummary | None = None  # NCCL timeouts: ranks by SeqNum/OpType/progress
    merged: int = 0  # lines of the message merge_adjacent showed after the first line


def evidence_of(line: LogLine) -> Evidence:
    """The line as the user sees it in a terminal (ANSI and ``\\r`` rewrites resolved), made inert."""
    return Evidence(line.path, line.lineno, shorten(inert(collapse_carriage_returns(line.raw)), EVIDENCE_CHARS))


def group_hits(hits: list[Hit], inferences: list[Inference] | None = None) -> list[Group]:
    """Findings from hits; a generic finding's category is inferred from its first hit's evidence."""
    groups: dict[str, Group] = {}
    first_by_rule: dict[str, Group] = {}
    for hit in hits:
        g = groups.get(hit.key)
        if g is None and len(groups) >= MAX_GROUPS:
            g = first_by_rule.get(hit.rule.rule.code)
        if g is None:
            g = Group(_new_finding(hit, inferences or []), hit)
            groups[hit.key] = g
            first_by_rule.setdefault(hit.rule.rule.code, g)
        else:
            _add(g, hit)
            if _frameless_first(g, hit):
                # the first line carried no traceback (an NCCL watchdog's report of a sticky CUDA error, with C++
                # frames only): the first later one of the same finding that does is read as a human reads it
                _infer_category(g.finding, hit, inferences or [])
        if hit.rank is not None:
            g.ranks.add(hit.rank)
        if hit.line.host:
            g.hosts.add(hit.line.host)
        _note_srun_tasks(g.finding, hit.facts)
        if hit.rule.rule.category == collective_skew.NCCL_TIMEOUT:
            if g.collective is None:
                g.collective = collective_skew.CollectiveSummary()
            collective_skew.note_hit(g.collective, hit.facts, hit.line.text, hit.rank)
    out = merge_reraised(merge_relays(merge_adjacent(list(groups.values()))))
    for g in out:
        g.finding.ranks = sorted(g.ranks)
        g.finding.hosts = sorted(g.hosts)
        if g.collective is not None and g.collective.groups:
            g.finding.facts[collective_skew.FACT] = collective_skew.summary_fact(g.collective)
    return out


def _note_srun_tasks(f: Finding, facts: dict) -> None:
    """Remember which node each srun task ran on, from this hit's own facts (a rule's named groups keep srun's
    text, e.g. "0-3,8"; the ``srun_error`` parser gives a list), so that no line is lost to the evidence limit."""
    node = facts.get("node")
    if not isinstance(node, str) or not node:
        return
    for t in task_ids(facts.get("tasks")):
        if len(f.task_nodes) >= MAX_TASK_NODES:
            return
        f.task_nodes.setdefault(t, node)


def _new_finding(hit: Hit, inferences: list[Inference]) -> Finding:
    rule = hit.rule.rule
    evidence = [evidence_of(hit.line)]
    for extra in hit.extra_evidence:
        if extra.lineno > 0:
            evidence.insert(0, evidence_of(extra))
    evidence.extend(evidence_of(d) for d in hit.details)  # where the line's cause is spelt out, under it
    implies = _implies_of(hit)
    finding = Finding(
        rule=rule.code,
        name=rule.slug,
        title=rule.title,
        category=rule.category,
        phase=hit.phase,
        severity=rule.severity,  # type: ignore[arg-type]
        role=rule.role,  # type: ignore[arg-type]  # the final role is set by ranking
        confidence=rule.confidence,
        count=1,
        first_line=hit.line.lineno,
        evidence=evidence,
        explanation=rule.explanation,
        fix=copy.deepcopy(rule.fix),
        facts=dict(hit.facts),
        implies=implies,
        implied_lines=[hit.line.lineno] if implies is not None else [],
        fault_on=rule.fault_on_of(hit.pattern),
    )
    if rule.tier == "catchall":
        finding.basis = "catchall"
    if rule.tier == "generic":
        _infer_category(finding, hit, inferences)
    return finding


def _infer_category(finding: Finding, hit: Hit, inferences: list[Inference]) -> None:
    """A generic finding's category from one hit's evidence, when an [[infer]] table reads it."""
    rule = hit.rule.rule
    # its own frames first (what raised it, and where); those of the exceptions it caused when they tell nothing
    own = hit.frames[hit.outer_frames:]
    exc_type = str(hit.facts.get("exc_type") or "")
    inferred = infer(inferences, rule.code, hit.line.text, own, hit.phase, hit.release, exc_type)
    if inferred is None and hit.outer_frames:
        inferred = infer(inferences, rule.code, hit.line.text, hit.frames, hit.phase, hit.release, exc_type)
    if inferred is not None:
        finding.category = inferred.inference.category
        finding.confidence = max(finding.confidence, inferred.inference.confidence)
        finding.basis = "inferred"
        finding.basis_detail = inferred.basis
        frame = innermost_frame(own) or innermost_frame(hit.frames)
        if where := raised_at(frame):  # the category's fix names it (match/category_fix.py)
            finding.facts.setdefault(RAISED_AT, where)
            if package := package_of(frame):
                finding.facts.setdefault(RAISING_PACKAGE, package)
        if finding.phase == "unknown" and inferred.inference.phase_when_unknown:
            finding.phase = inferred.inference.phase_when_unknown


def _frameless_first(g: Group, hit: Hit) -> bool:
    """An error of a generic rule not inferred yet whose first hit had no frames, and this hit has some. Context
    lines (EC001's one-line summary before a traceback) are left alone: the frames found before a later one of them
    are another rank's traceback, not its own."""
    rule = hit.rule.rule
    return (rule.tier == "generic" and rule.severity == "error" and g.finding.basis != "inferred"
            and not g.first_hit.frames and bool(hit.frames))


def _implies_of(hit: Hit) -> Implies | None:
    """The rule's [rule.implies] when the pattern that matched the finding's first line states it."""
    implies = hit.rule.rule.implies
    if implies is None or (implies.patterns and hit.pattern not in implies.patterns):
        return None
    return implies


def _add(g: Group, hit: Hit) -> None:
    f = g.finding
    f.count += 1
    if len(f.evidence) < EVIDENCE_KEPT + len(g.first_hit.extra_evidence) + len(g.first_hit.details):
        f.evidence.append(evidence_of(hit.line))
        if f.implies is not None and _implies_of(hit) is f.implies:
            f.implied_lines.append(hit.line.lineno)
    for k, v in hit.facts.items():
        f.facts.setdefault(k, v)
    if f.phase == "unknown" and hit.phase != "unknown":
        f.phase = hit.phase


def merge_adjacent(groups: list[Group]) -> list[Group]:
    """One finding for one message that a rule reads on consecutive lines: findings of the same rule whose first
    lines are adjacent in one file, with the same category and phase and as many hits each (every time the message
    was printed, both of its lines were), are one failure said twice, not two. Their patterns' named groups differ,
    so grouping kept them apart (PY006 reads torch's "NCCL error in: ..., unhandled cuda error" and NCCL's own
    "ncclUnhandledCudaError: Call to CUDA function failed." printed under it: qa-report-8 L5). The first keeps
    the count and its facts, fills the keys it lacks from the other, keeps a value the other reads differently for a
    key both have (``<key>_more``: the same pattern on both lines), and shows the other's first line beside its own;
    a longer run merges into the first, showing and keeping at most MERGED_KEPT more lines and values."""
    by_start = {(g.first_hit.line.path, g.first_hit.line.lineno): g for g in groups}
    absorbed: set[int] = set()
    for g in sorted(groups, key=lambda g: (g.first_hit.line.path, g.first_hit.line.lineno)):
        if id(g) in absorbed:
            continue
        line = g.first_hit.line
        nxt = by_start.get((line.path, line.lineno + 1))
        while nxt is not None and nxt is not g and _same_meaning(g, nxt):
            _absorb(g, nxt)
            absorbed.add(id(nxt))
            line = nxt.first_hit.line
            nxt = by_start.get((line.path, line.lineno + 1))
    return [g for g in groups if id(g) not in absorbed]


def by_position(g: Group) -> tuple[int, int]:
    return g.first_hit.source_index, g.first_hit.line.lineno


def _relays(g: Group) -> bool:
    patterns = g.first_hit.rule.rule.patterns
    n = g.first_hit.pattern
    return 0 < n <= len(patterns) and patterns[n - 1].relays


def merge_relays(groups: list[Group]) -> list[Group]:
    """One finding for a command's failure told twice: a wrapper's report that the command failed, without its reason
    (a pattern with ``relays = true``: ``CalledProcessError: Command 'sbatch ...' returned non-zero exit status 1``),
    and the command's own error that another pattern of the same rule reads in the same input within RELAY_WINDOW
    lines, before it (the stderr a job manager printed) or after it (the user's rerun by hand): ``sbatch: error:
    ... Invalid account or account/partition combination specified``. The nearest such line's finding absorbs the
    wrapper's: its line leads the evidence (the headline's line) and its facts (the reason) are the finding's; the
    merged finding keeps the earlier line's place in time, so its ranking against other findings does not move."""
    relayed = [g for g in groups if _relays(g)]
    if not relayed:
        return groups
    own = [g for g in groups if not _relays(g)]
    gone: set[int] = set()
    for w in relayed:
        wl = w.first_hit.line
        near = [g for g in own
                if g.finding.rule == w.finding.rule and g.first_hit.source_index == w.first_hit.source_index
                and abs(g.first_hit.line.lineno - wl.lineno) <= RELAY_WINDOW]
        if not near:
            continue
        r = min(near, key=lambda g: (abs(g.first_hit.line.lineno - wl.lineno), g.first_hit.line.lineno))
        f, o = r.finding, w.finding
        seen = {(e.path, e.line) for e in f.evidence}
        f.evidence.extend(e for e in o.evidence if (e.path, e.line) not in seen)
        f.count += o.count
        for k, v in o.facts.items():
            if f.facts.get(k) is None:
                f.facts[k] = v
        for t, node in o.task_nodes.items():
            f.task_nodes.setdefault(t, node)
        if by_position(w) < by_position(r):
            r.first_hit = w.first_hit  # the wrapper's line came first: the failure's place in time is its line's
        r.ranks |= w.ranks
        r.hosts |= w.hosts
        gone.add(id(w))
    return [g for g in groups if id(g) not in gone]


def _message(g: Group) -> str:
    m = g.finding.facts.get("message")
    return m.strip() if isinstance(m, str) else ""


def _reraise_of(a: Group, b: Group) -> bool:
    """``b`` is ``a`` raised again with words added: the same rule, process and count, later in the same input, and
    its message is ``a``'s with more after it (megatron-core's ``build_module`` re-raises ``type(e)(f"{e} when
    instantiating {name}")`` at every level of a model's spec, so one failed assert prints four tracebacks)."""
    fa, fb = a.finding, b.finding
    ma, mb = _message(a), _message(b)
    la, lb = a.first_hit.line, b.first_hit.line
    return (fa.rule == fb.rule and fa.count == fb.count and a.ranks == b.ranks and a.hosts == b.hosts
            and a.first_hit.source_index == b.first_hit.source_index and la.stream == lb.stream
            and 0 < lb.lineno - la.lineno <= RERAISE_WINDOW
            and len(ma) >= RERAISE_MIN_CHARS and len(mb) > len(ma) and mb.startswith(ma))


def merge_reraised(groups: list[Group]) -> list[Group]:
    """One finding for one exception re-raised with context appended to its message (see ``_reraise_of``): the
    first keeps its place, line and count; the last re-raise's line is shown beside it and fills the facts the first
    lacked (the outermost traceback's ``raised_at``); when only a re-raise's frames told its category, the finding
    takes that reading. A chain of re-raises is absorbed into its first exception."""
    ordered = sorted(groups, key=by_position)
    gone: set[int] = set()
    for i, a in enumerate(ordered):
        if id(a) in gone:
            continue
        chain = [b for b in ordered[i + 1:] if id(b) not in gone and _reraise_of(a, b)]
        for b in chain:
            if a.finding.basis != "inferred" and b.finding.basis == "inferred":
                fa, fb = a.finding, b.finding
                fa.category, fa.basis, fa.basis_detail = fb.category, fb.basis, fb.basis_detail
                fa.confidence = max(fa.confidence, fb.confidence)
            gone.add(id(b))
        if chain:
            _absorb(a, chain[-1])
            for b in chain[:-1]:
                for k, v in b.finding.facts.items():
                    a.finding.facts.setdefault(k, v)
    return [g for g in groups if id(g) not in gone]


def _same_meaning(a: Group, b: Group) -> bool:
    """One message only if one process printed both lines (the same stream, a prefix of the same shape): two
    processes' messages on adjacent lines of an interleaved log are two failures (pod a's FileNotFoundError beside
    pod b's PermissionError; host gn-201's NCCL line beside gn-202's)."""
    fa, fb = a.finding, b.finding
    return (fa.rule == fb.rule and fa.category == fb.category and fa.phase == fb.phase and fa.count == fb.count
            and a.collective is None and b.collective is None
            and a.first_hit.line.stream == b.first_hit.line.stream
            and _prefix_shape(a.first_hit.line) == _prefix_shape(b.first_hit.line))


_DIGITS = re.compile(r"\d")


def _prefix_shape(line: LogLine) -> str:
    """The transport prefix normalisation removed from the line (``[pod/a-0 out] ``, a glog header), its digits
    masked: one process's consecutive lines differ there only in numbers (a timestamp, a thread id)."""
    head = line.raw[: len(line.raw) - len(line.text)] if line.raw.endswith(line.text) else line.raw
    return _DIGITS.sub("0", head)


def _absorb(g: Group, other: Group) -> None:
    f, o = g.finding, other.finding
    seen = {(e.path, e.line) for e in f.evidence}
    extra = [e for e in o.evidence if (e.path, e.line) not in seen][:1]
    if extra and g.merged < MERGED_KEPT:  # the other line of the message, after the lines already shown
        at = next((i + 1 for i, e in enumerate(f.evidence) if e.line == f.first_line), len(f.evidence))
        f.evidence.insert(at + g.merged, extra[0])
        g.merged += 1
    for k, v in o.facts.items():
        if k not in f.facts or f.facts[k] is None:
            f.facts[k] = v
        elif v is not None and v != f.facts[k]:
            # a line read by the same pattern: its value is kept beside the first line's, not dropped
            more = f.facts.setdefault(f"{k}_more", [])
            if isinstance(more, list) and v not in more and len(more) < MERGED_KEPT:
                more.append(v)
    for t, node in o.task_nodes.items():
        f.task_nodes.setdefault(t, node)
    g.ranks |= other.ranks
    g.hosts |= other.hosts
