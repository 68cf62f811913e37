"""Make the hang the flight-recorder dumps show the report's root cause, over the watchdog timeouts it caused.

Codes ``FR001``-``FR005`` are this module's (like Slurm's ``SJ`` codes, they come from data, not from log lines, so
they are not in ``rules/``). The log's root cause stays root when it explains the hang: a specific error (CUDA
OOM, hardware, a config error...), or any error printed by a rank the dumps name (the dead rank's traceback). A
timeout, a launcher's summary or a generic exception on the ranks that waited becomes a cascade of the hang, and
its lines join the hang's evidence.
"""

from __future__ import annotations

from diagnose.match.hang import ranks_phrase, short_op
from diagnose.model import Evidence, Finding, Fix, HangReport, Report, rank_runs

_GENERIC = {"nccl_timeout", "nccl_error", "launcher", "other"}
MAX_EVIDENCE = 8

_RULES = {
    "stalled": ("FR001", "fr-stalled-rank", 0.9,
                "A rank never entered the collective the others wait in. Every other member of the process group "
                "enqueued it and waited until the watchdog fired, so their logs all say 'timed out': those lines "
                "are consequences. The stalled rank was somewhere else: data loading, a checkpoint write, a "
                "Python branch the others did not take, a deadlock in its own threads, or a dead GPU. Its last "
                "recorded collective and the frame that issued it say where it was last seen.",
                ["Look at the stalled rank's log and its last frame (above): what runs after that collective on "
                 "that rank only (data loader, checkpoint, rank-conditional code)?",
                 "Take a stack of the stuck process next time (py-spy dump --pid, or TORCH_NCCL_DUMP_ON_TIMEOUT "
                 "with TORCH_FR_CPP_STACK=1) to see where it is blocked"]),
    "desync": ("FR002", "fr-collective-desync", 0.9,
               "Ranks of one process group issued different collectives under the same sequence number: they run "
               "different code paths (a data-dependent branch, a condition on the rank, a skipped step, uneven "
               "data between ranks), so the collectives are paired wrongly and the job hangs or corrupts data.",
               ["Find the branch that differs between the ranks named (the frame of their collective)",
                "Set TORCH_DISTRIBUTED_DEBUG=DETAIL on a small run to have PyTorch check collectives' "
                "consistency at each call"]),
    "size_mismatch": ("FR003", "fr-collective-size-mismatch", 0.85,
                      "Ranks called the same collective with tensors of different sizes (uneven batches, a "
                      "padding difference, a parameter shape that differs between ranks). NCCL then hangs or "
                      "reads past the buffers; gloo aborts the rank that receives more than it expects.",
                      ["Compare the shapes named: the tensor is built differently on the odd rank",
                       "TORCH_DISTRIBUTED_DEBUG=DETAIL checks the shapes of every collective on a small run"]),
    "dead_rank": ("FR004", "fr-dead-rank", 0.8,
                  "A member of the process group left no flight-recorder dump while the others wait in a "
                  "collective: it died, was killed (host OOM, a signal), or its node went away before it could "
                  "dump. Its own log or the scheduler's record says why.",
                  ["Read the named rank's log end (or dmesg / the scheduler's record for its node)"]),
    "not_completed": ("FR005", "fr-collective-not-completed", 0.7,
                      "Every member enqueued the collective and none completed it: the ranks agree, the "
                      "collective itself is stuck: the network (IB / RoCE links, NCCL transport), a GPU that "
                      "stopped responding, or a long kernel queued before the collective on the same stream.",
                      ["Check the NCCL transport (NCCL_DEBUG=INFO, link errors, ibstat) and dmesg for Xid errors",
                       "A long kernel before the collective on the same stream delays it the same way"]),
}


def hang_finding(hang: HangReport, log_root: Finding | None) -> Finding | None:
    if hang.kind not in _RULES:
        return None
    code, slug, confidence, explanation, steps = _RULES[hang.kind]
    named = sorted({c.rank for c in hang.culprits} | set(hang.missing_dumps))
    by_rank = {d.rank: d.path for d in hang.dumps}
    evidence = []
    for c in hang.culprits[:MAX_EVIDENCE]:
        if c.role == "no_dump":
            continue
        where = f" at {c.frame}" if c.frame else ""
        evidence.append(Evidence(path=by_rank.get(c.rank, ""), line=0,
                                 text=f"rank {c.rank} ({c.role}): last collective {c.last_op} #{c.last_seq} "
                                      f"{c.last_sizes}{where}"))
    if hang.waiting_ranks:
        evidence.append(Evidence(path=by_rank.get(hang.waiting_ranks[0], ""), line=0,
                                 text=f"{ranks_phrase(hang.waiting_ranks)} entered {hang.op} #{hang.seq} of group "
                                      f"{hang.group} ({hang.group_desc}) {hang.input_sizes}"))
    if log_root is not None:
        evidence.extend(log_root.evidence[: max(0, MAX_EVIDENCE - len(evidence))])
    facts = {
        "source": "flight_recorder",
        "kind": hang.kind,
        "group": hang.group,
        "group_desc": hang.group_desc,
        "seq": hang.seq,
        "op": hang.op,
        "waiting_ranks": ", ".join(rank_runs(hang.waiting_ranks)),
    }
    if log_root is not None:
        facts["log_root"] = log_root.rule
        for key in ("silent_ranks", "desync", "stragglers"):
            if key in log_root.facts:
                facts[f"log_{key}"] = log_root.facts[key]
    return Finding(
        rule=code,
        name=slug,
        title=_title(hang),
        category="nccl_timeout",
        phase=log_root.phase if log_root is not None and log_root.category in _GENERIC else "unknown",
        severity="error",
        role="root",
        confidence=confidence,
        ranks=named,
        first_line=0,
        evidence=evidence,
        explanation=f"{hang.summary}\n\n{explanation}",
        fix=Fix(summary="Find why the named rank(s) diverged; the other ranks' timeouts are consequences",
                safety="manual", steps=list(steps)),
        facts=facts,
    )


def _title(hang: HangReport) -> str:
    """A short headline per kind (the summary sentence is the explanation's first paragraph)."""
    op = f"{short_op(hang.op or '')} #{hang.seq}"
    odd = ranks_phrase([c.rank for c in hang.culprits if c.role != "no_dump"])
    if hang.kind == "stalled":
        return f"Hang: {odd} never entered {op}, which the others wait in"
    if hang.kind == "desync":
        other = sorted({c.last_op or "?" for c in hang.culprits if c.role == "desync"})
        return f"Hang: desync, {odd} called {', '.join(other)} where the others called {op}"
    if hang.kind == "size_mismatch":
        return f"Hang: size mismatch, {odd} called {op} with other tensor sizes"
    if hang.kind == "dead_rank":
        return f"Hang: {ranks_phrase(hang.missing_dumps)} left no dump while the others wait in {op}"
    return f"Hang: {op} was entered and never completed"


def explains(log_root: Finding, hang: HangReport) -> bool:
    """Does the log's root cause account for the hang (rather than being one of its consequences)?

    A specific error (OOM, hardware, config...) does, unless it is on ranks the dumps do not name. A generic one
    (an uncaught exception, a C++ abort, a launcher's summary) does only for a stalled or dead rank and only when
    it was printed by the named ranks alone: the dead rank's own traceback. After a desync or a size mismatch the
    aborts and exceptions are what the mismatch caused. A timeout never does."""
    if log_root.severity != "error":
        return False
    named = {c.rank for c in hang.culprits} | set(hang.missing_dumps)
    ranks = set(log_root.ranks)
    if log_root.category not in _GENERIC:
        return not ranks or bool(ranks & named) or hang.kind == "not_completed"
    if log_root.category == "nccl_timeout" or hang.kind not in ("stalled", "dead_rank"):
        return False
    return bool(ranks) and ranks <= named


def merge_hang(report: Report, hang: HangReport | None) -> None:
    """Attach the hang section and, when it names one, its finding (root or cascade) in place."""
    if hang is None:
        return
    report.hang = hang
    log_root = report.root
    finding = hang_finding(hang, log_root)
    if finding is None:
        return
    if log_root is not None and explains(log_root, hang):
        finding.role = "cascade"
        finding.cause_of = report.root_cause
        report.findings.append(finding)
        return
    report.lead_with(finding)
    for f in report.findings[1:]:
        if f.category == "nccl_timeout":  # the timeouts the hang explains, wherever they were ranked
            f.role = "cascade"
            f.cause_of = 0
