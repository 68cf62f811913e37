"""A job that finished its work and was then killed at its time limit: it hung on the way out.

How a person reads it: Slurm cancelled the job DUE TO TIME LIMIT, but the log above says the training loop had
already done its work (Megatron's iteration line reached its total, ``iteration 50/ 50``; or the program's own
end-of-work line, a ``completes`` rule such as the Trainer's "Training completed"), no checkpoint save was left
unfinished, and nothing was printed for many minutes before the kill. A job that runs out of time is killed mid-way;
this one had nothing left to do but exit, and did not: a rank hung in its teardown (a collective or a communicator
destroy that a peer never joined), and the time limit only ended the hang. The time limit is the consequence; the
hang is the failure, read as this catalogue reads a hang with no other signal (``nccl_timeout``).

Only the root cause is re-read, and only when it is a time-limit kill and nothing else was chosen before it (an
error printed before the kill already leads). The evidence is captured by other stages and read here by name:
``verify.iteration`` (first and last Megatron iteration line), ``verify.saving`` / ``verify.saved`` (the last save
begun and finished), from diagnose.explain.verify.facts (match imports no later stage; tests/test_match_hang_at_exit.py
fails if a name changes).
"""

from __future__ import annotations

import re

from diagnose.match.ranking import time_of
from diagnose.match.rereading import add_paragraph
from diagnose.model import Block, Finding, Fix, LogLine

ITERATION = "verify.iteration"
SAVING = "verify.saving"
SAVED = "verify.saved"
TIME_LIMIT = "time_limit"  # the reason fact of a Slurm cancellation at the time limit (SL003's slurmstepd parser)
HANG_CATEGORY = "nccl_timeout"
CONFIDENCE = 0.6  # inferred from where the log stops, not from a line that names the hang
# Between the last line of work and the kill: a run that printed its last iteration a minute before the limit may
# still have been saving or evaluating; one silent for this long was hung (NCCL's default timeout is 10 minutes).
MIN_SILENCE_S = 600.0
_ITERATION = re.compile(r"iteration\s+(?P<n>\d{1,12})\s*/\s*(?P<total>\d{1,12})")


def _last_line(blocks: dict[str, list[Block]], name: str) -> LogLine | None:
    found = blocks.get(name) or []
    lines = [b.lines[0] for b in found if b.lines]
    return max(lines, key=lambda ln: (ln.path, ln.lineno)) if lines else None


def _before(path: str, lineno: int, kill: Finding) -> bool:
    """Line ``lineno`` of ``path`` came before the kill's line: in the same file by position; in another file it
    cannot be later than the kill that ended the job (a file of another job attempt is not told apart)."""
    where = kill.evidence[0] if kill.evidence else None
    return where is None or path != where.path or lineno < where.line


def _last_iteration(blocks: dict[str, list[Block]], kill: Finding) -> LogLine | None:
    """Megatron's last iteration line, when it reached the run's total before the kill."""
    line = _last_line(blocks, ITERATION)
    if line is None or not _before(line.path, line.lineno, kill):
        return None
    m = _ITERATION.search(line.text)
    if m is None or int(m.group("total")) == 0 or m.group("n") != m.group("total"):
        return None
    return line


def _completion(findings: list[Finding], completes: frozenset[str], kill: Finding) -> Finding | None:
    """The last finding of a rule that says the program completed its work, printed before the kill."""
    done = [f for f in findings if f.rule in completes and f.evidence]
    done = [f for f in done if _before(f.evidence[0].path, f.evidence[0].line, kill)]
    return done[-1] if done else None


def _save_unfinished(blocks: dict[str, list[Block]], after: LogLine) -> bool:
    """A checkpoint save began after the last work line and no save finished after it: killed mid-save, not hung."""
    saving = _last_line(blocks, SAVING)
    if saving is None or saving.path != after.path or saving.lineno < after.lineno:
        return False
    saved = _last_line(blocks, SAVED)
    return saved is None or saved.path != saving.path or saved.lineno < saving.lineno


def _silent_long_enough(last: LogLine | None, kill: Finding) -> bool:
    """The kill came at least MIN_SILENCE_S after the last work line, when both carry a time (else: not known, yes)."""
    t_last = time_of(last.timestamp) if last is not None else None
    t_kill = time_of(kill.facts.get("time") if isinstance(kill.facts.get("time"), str) else None)
    if t_last is None or t_kill is None or (t_last < 86400 * 400) != (t_kill < 86400 * 400):
        return True
    return t_kill - t_last >= MIN_SILENCE_S


def hang_at_exit(findings: list[Finding], root_index: int | None, blocks: dict[str, list[Block]],
                 completes: frozenset[str]) -> None:
    """Re-read a time-limit root as a hang when the log says the job had finished its work before the kill.

    ``completes``: the codes of the catalogue's ``completes = true`` rules."""
    if root_index is None:
        return
    kill = findings[root_index]
    if kill.category != "slurm" or kill.facts.get("reason") != TIME_LIMIT:
        return
    iteration = _last_iteration(blocks, kill)
    done = _completion(findings, completes, kill)
    if iteration is not None:
        total = _ITERATION.search(iteration.text)["total"]  # type: ignore[index]
        work, what = iteration, f"the training loop reached its last iteration (iteration {total}/{total})"
    elif done is not None:
        work, what = None, f"the program reported that it completed its work ({done.rule}: {done.title})"
    else:
        return
    if work is not None and (_save_unfinished(blocks, work) or not _silent_long_enough(work, kill)):
        return
    where = f"line {work.lineno}" if work is not None else f"line {done.first_line}"  # type: ignore[union-attr]
    kill.category = HANG_CATEGORY
    kill.basis = "inferred"
    kill.basis_detail = f"{what} at {where}, before the time limit: the job hung at exit"
    kill.confidence = min(kill.confidence, CONFIDENCE)
    kill.title = f"{kill.title} after the job finished its work: it hung at exit"
    kill.fix = Fix(summary="Find the rank that did not exit; a longer time limit does not help", safety="manual",
                   steps=["py-spy dump --pid <pid> on each rank of a hung run shows where it waits",
                          "export TORCH_NCCL_DUMP_ON_TIMEOUT=1 for the flight recorder's view of the collective",
                          "call torch.distributed.destroy_process_group() on every rank before the script exits"])
    add_paragraph(kill, (
        f"Here {what} ({where}) before Slurm's time limit struck: the job had nothing left to do but exit. It did "
        "not run out of time; it hung on the way out (a rank stuck in a collective or a communicator teardown that "
        "a peer never joined), and the time limit only ended the hang. Find the rank that did not exit (py-spy dump "
        "of the live processes, TORCH_NCCL_DUMP_ON_TIMEOUT=1 for the flight recorder); a longer --time does not "
        "help."))
