"""The pipeline, end to end: ingest -> normalize -> match -> explain. Presenters call this and render the Report.

Each stage lives in its own package (``diagnose/ingest``, ``normalize``, ``match``, ``explain``, ``present``);
this module only wires them together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from diagnose.model import DiagnoseError, JobReport, Report


@dataclass
class AnalyzeOptions:
    rules_dirs: list[str] = field(default_factory=list)
    config_path: str | None = None  # an explicit run_config.yaml / args file
    bridge_version: str | None = None
    gpu_memory_bytes: int | None = None
    replay: bool = True  # run config replay and the memory model
    jobs: int = 1
    progress: Callable[[int, int], None] | None = None  # (bytes done, bytes total)
    backend: str = "auto"  # phase-1 scan engine: auto | hyperscan | re2 | python
    # rank per input path when the caller knows it better than the file name does (Slurm's srun -o %t)
    rank_hints: dict[str, int] = field(default_factory=dict)
    # the verify section (diagnose.explain.verify): None = only for a log without failure; True = always
    verify: bool | None = None
    strict: bool = False  # verify: a warning (a performance fallback) fails too
    # a catalogue already loaded from rules_dirs: callers analysing many jobs in one process (fleet) load it once
    catalogue: Any = None
    # a user-named input that is empty is an error (a job that died before writing), not "no failure"; Slurm's
    # follow and job views read outputs that may still be empty and keep their Slurm findings
    refuse_empty: bool = False
    select: list[str] = field(default_factory=list)  # rule codes or prefixes to run (ruff-style); empty: all
    ignore: list[str] = field(default_factory=list)  # rule codes or prefixes not to run
    include: list[str] = field(default_factory=list)  # globs: the files of a folder to read (empty: every log)
    exclude: list[str] = field(default_factory=list)  # globs: the files of a folder to skip
    # inputs of several jobs get one report each (Report.jobs); False: one report whatever the inputs hold
    split_jobs: bool = True
    # the path to show for an input opened under another name (a checked descriptor's /proc/self/fd/N, Slurm jobs)
    shown_as: dict[str, str] = field(default_factory=dict)
    # inputs refuse_unreadable(keep=True) opened and checked: read by the first analysis of the same inputs instead
    # of opening them again (the TUI), then closed by it
    opened: OpenedInputs | None = None


def analyze(inputs: list[str], options: AnalyzeOptions | None = None) -> Report:
    """Diagnose the given inputs (paths, folders, .gz, or "-" for stdin)."""
    options = options or AnalyzeOptions()
    from diagnose.ingest import open_inputs
    from diagnose.ingest.flight_recorder import find_dumps
    from diagnose.match import MatchResult, load_catalogue, scan_and_match

    catalogue = options.catalogue or load_catalogue(options.rules_dirs, strict=True)
    if options.select or options.ignore:
        catalogue.rules = select_rules(catalogue.rules, options.select, options.ignore)
    found = find_dumps(list(inputs))
    log_inputs = found.log_inputs if found.dumps else inputs
    empty: list[str] = []
    source_warnings: list[str] = []
    n_sources = 0
    groups = None
    if log_inputs:
        kept = options.opened.take(log_inputs) if options.opened is not None and not (
            options.include or options.exclude) else None
        opening = kept if kept is not None else open_inputs(log_inputs, include=options.include,
                                                                exclude=options.exclude)
        with opening as sources:
            n_sources = len(sources)
            empty = [options.shown_as.get(s.path, s.path) for s in sources if s.size == 0]
            source_warnings = list(getattr(sources, "warnings", []))
            if options.refuse_empty and empty and len(empty) == len(sources) and not found.dumps:
                raise _empty_error(empty)
            for source in sources:
                source.path = options.shown_as.get(source.path, source.path)
                if source.path in options.rank_hints:
                    source.rank_hint = options.rank_hints[source.path]
            result = scan_and_match(
                sources, catalogue, jobs=options.jobs, progress=options.progress, backend=options.backend
            )
            if options.split_jobs and len(sources) > 1 and "-" not in log_inputs and not found.dumps:
                groups = _job_groups(sources, list(log_inputs), result.report)
    else:  # only flight-recorder dumps were named
        result = MatchResult(report=Report(), blocks={})
    report = result.report
    report.warnings[:0] = catalogue.errors
    report.warnings.extend(source_warnings)
    if hint := slow_scanner_hint(options.backend, sum(i.bytes for i in report.inputs)):
        report.warnings.append(hint)
    if groups and len(groups) > MAX_JOBS:
        report.warnings.append(f"these inputs hold {len(groups)} jobs (by their job ids and failing ranks): too many "
                               f"for a report each (at most {MAX_JOBS}), diagnosed here as one; analyze them one "
                               "at a time")
    elif groups:
        return _per_job(groups, report, catalogue, options)
    if mixed := different_jobs_warning(report):
        report.warnings.append(mixed)
    if empty:
        report.warnings.append(f"{len(empty)} of {n_sources} inputs are empty (0 bytes), e.g. "
                               f"{shown(empty[0])}: those ranks wrote nothing")
    if found.dumps:
        _hang(report, found)
    from diagnose.explain.words import fit_words

    fit_words(report)  # a fix step the log itself makes needless (rerun with NCCL_DEBUG when its WARN is there)
    if options.replay:
        # the catalogue travels with the options: explain takes a category's fix from it (an allocator rule on
        # numbers that are not fragmentation)
        _enrich(report, result.blocks, options if options.catalogue is catalogue else
                dataclasses.replace(options, catalogue=catalogue))
    return report


def _hang(report: Report, found) -> None:
    """Read the flight-recorder dumps, name the rank that hung, make it the root cause over the timeouts."""
    from diagnose.ingest.flight_recorder import read_dumps
    from diagnose.match.hang import analyse_dumps
    from diagnose.match.hang_merge import merge_hang
    from diagnose.match.silent_ranks import world_size

    dumps, warnings = read_dumps(found.dumps)
    warnings = [*found.warnings, *warnings]
    if (hang := analyse_dumps(dumps, warnings, world_size=world_size(report.findings))) is not None:
        merge_hang(report, hang)
    report.warnings.extend(warnings)


SLOW_HINT_MIN_BYTES = 256 << 20
MAX_JOBS = 32  # a report per job up to this many jobs; each is a full analysis (replay and memory model included)


def slow_scanner_hint(backend: str, total_bytes: int) -> str | None:
    """One line when a large input was read by the pure-Python scanner (no Hyperscan, no RE2 installed)."""
    if total_bytes < SLOW_HINT_MIN_BYTES:
        return None
    from diagnose.match.anchors import resolve_backend

    chosen = resolve_backend(backend)
    if chosen == "auto":  # what auto falls back to when neither wheel imports
        import importlib.util

        chosen = "python" if not any(importlib.util.find_spec(m) for m in ("hyperscan", "re2")) else "fast"
    if chosen != "python":
        return None
    return (f"read {total_bytes >> 20} MiB with the pure-Python scanner: pip install google-re2 numpy (the "
            "checkout's [fast] extra: RE2; or Hyperscan where it has a wheel) makes large logs several times faster")


def select_rules(rules: list, select: list[str], ignore: list[str]) -> list:
    """``--select`` / ``--ignore``: codes or prefixes (``OOM`` is every OOM rule), as ruff reads them. A code that
    names no rule is an error with a suggestion, not a silent no-op."""
    import difflib

    codes = [r.code for r in rules]
    for given in [*select, *ignore]:
        if not any(c.startswith(given.upper()) for c in codes):
            close = difflib.get_close_matches(given.upper(), codes, n=1, cutoff=0.6)
            raise DiagnoseError(f"no rule code starts with {shown(given)!r}"
                                + (f" (did you mean {close[0]}?)" if close else " (see 'diagnose rules list')"))
    wanted = [s.upper() for s in select]
    dropped = [s.upper() for s in ignore]
    return [r for r in rules if (not wanted or any(r.code.startswith(w) for w in wanted))
            and not any(r.code.startswith(d) for d in dropped)]


def different_jobs_warning(report: Report) -> str | None:
    """Say so when the inputs look like logs of different jobs, not ranks of one: two or more files each hold
    their own failure for the same rank (or for no rank at all). Per-rank logs of one job fail on different
    ranks; two single-GPU jobs both fail on rank 0, and merging them gives one root cause for both."""
    from diagnose.match.job_split import process_of

    if len(report.inputs) < 2:
        return None
    by_path: dict[str, set] = {}
    for f in report.findings:
        paths = {process_of(e.path) for e in f.evidence}
        if len(paths) != 1:
            continue
        by_path.setdefault(paths.pop(), set()).update(f.ranks or ["?"])
    for ranks in by_path.values():
        if len(ranks) > 1:
            ranks.discard("?")  # a file with known ranks: its rank-less lines are that rank's too
    if len(by_path) < 2:
        return None
    seen: dict[object, str] = {}
    for path, ranks in by_path.items():
        for rank in ranks:
            if rank in seen and seen[rank] != path:
                who = "no rank" if rank == "?" else f"rank {rank}"
                return (f"{shown(seen[rank])} and {shown(path)} each hold their own failure for {who}: they look like "
                        f"logs of different jobs, diagnosed here as one; analyze them one at a time")
            seen[rank] = path
    return None


def _job_groups(sources, args: list[str], merged: Report):
    """The jobs in these inputs (``diagnose.match.job_split``), or None when they read as one."""
    from diagnose.ingest.job_identity import identity_of
    from diagnose.match.job_split import build_units, plan_jobs

    identities = {s.path: identity_of(s.path, s.buffer) for s in sources}
    return plan_jobs(build_units([s.path for s in sources], identities, args, merged))


def _per_job(groups, merged: Report, catalogue, options: AnalyzeOptions) -> Report:
    """Analyse each job on its own; the top level is the first failing job's report (the first job's when none
    failed) with every input and a warning naming the jobs, and ``jobs`` holds them all."""
    one = dataclasses.replace(options, split_jobs=False, refuse_empty=False, include=[], exclude=[], progress=None,
                              catalogue=catalogue, select=[], ignore=[])  # the catalogue is already selected
    names = [_job_name(g) for g in groups]
    jobs = [JobReport(label=f"job {i} of {len(groups)}: {name}", identity=g.identity, paths=g.paths,
                      report=analyze(g.paths, one)) for i, (g, name) in enumerate(zip(groups, names), 1)]
    at = next((i for i, j in enumerate(jobs) if j.report.root_cause is not None), 0)
    top = dataclasses.replace(jobs[at].report, inputs=list(merged.inputs), jobs=jobs)
    chosen = jobs[at]
    told = "; ".join(names[:4]) + (" ..." if len(names) > 4 else "")
    head = (f"these inputs hold {len(jobs)} jobs ({told}): one report per job; the top level is job {at + 1}'s")
    top.warnings = list(dict.fromkeys([head, *merged.warnings[len(catalogue.errors):], *chosen.report.warnings]))
    return top


def _job_name(group) -> str:
    """What told the job apart (``Slurm job 117``), else its first file (``a.log and 3 more files``)."""
    from diagnose.ingest.job_identity import label

    paths = group.paths
    more = len(paths) - 1
    return label(group.identity) or shown(paths[0]) + (f" and {more} more file{'s' if more > 1 else ''}"
                                                        if more else "")


class OpenedInputs:
    """Inputs opened and checked before a screen opens, kept open for the analysis that follows, so that they are
    read once (a .gz decompressed once, a folder listed once). The first ``analyze`` of the very same inputs takes
    them (``take``) and closes them when it is done, in its own thread; ``close`` closes them when no analysis took
    them. Any later analysis opens the inputs anew (a followed log has grown since)."""

    def __init__(self, inputs: list[str], opened: contextlib.ExitStack, sources: list) -> None:
        self.inputs = list(inputs)
        self.sources = sources
        self._opened = opened  # holds the entered open_inputs context
        self._state = "open"  # "open", "taken" (an analysis reads them and will close them), "closed"
        self._lock = threading.Lock()

    def take(self, inputs: list[str]) -> contextlib.AbstractContextManager[list] | None:
        """The opened sources as a context that closes them on exit, for an analysis of ``inputs``; None when
        they are other inputs or were taken or closed already."""
        with self._lock:
            if self._state != "open" or list(inputs) != self.inputs:
                return None
            self._state = "taken"
        return self._reading()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[list]:
        try:
            yield self.sources
        finally:
            self._close_if("taken")

    def close(self) -> None:
        """Close the inputs unless an analysis took them (it closes them itself)."""
        self._close_if("open")

    def _close_if(self, state: str) -> None:
        with self._lock:
            if self._state != state:
                return
            self._state = "closed"
        self._opened.close()


def refuse_unreadable(inputs: list[str], keep: bool = False) -> OpenedInputs | None:
    """Refuse, before anything is shown, what ``analyze`` refuses on reading: a binary file, a folder without logs,
    inputs that are all empty. ``tui`` calls it so a bad input is one line and exit 2 there too, not a screen of
    empty panes (qa-report-9 L6). Flight-recorder dumps and stdin are left to the reading itself.

    ``keep``: return the inputs opened (``OpenedInputs``, for ``AnalyzeOptions.opened``) instead of closing them,
    when they are exactly the log inputs named (no dump, no stdin); the caller closes what no analysis took."""
    from diagnose.ingest import open_inputs
    from diagnose.ingest.flight_recorder import find_dumps

    found = find_dumps(list(inputs))
    logs = [p for p in found.log_inputs if p != "-"]
    if found.dumps or not logs:
        return None
    with contextlib.ExitStack() as stack:
        sources = stack.enter_context(open_inputs(logs))
        if len(sources) and all(s.size == 0 for s in sources):
            raise _empty_error([s.path for s in sources])
        if keep and logs == list(inputs):
            return OpenedInputs(logs, stack.pop_all(), sources)
    return None


def _empty_error(paths: list[str]) -> Exception:
    first = "standard input" if paths[0] == "-" else shown(paths[0])
    what = f"{first} is empty" if len(paths) == 1 else f"all {len(paths)} inputs are empty"
    return DiagnoseError(f"{what} (0 bytes): nothing to diagnose (did the job die before writing its log?)")


def shown(path: str) -> str:
    from diagnose.ingest.errors import shown as _shown  # ingest is imported when a log is read, not before

    return _shown(path)


def _enrich(report: Report, blocks: dict, options: AnalyzeOptions) -> None:
    """Config, replay and memory sections; the explain stage reports its own partial failures as warnings."""
    from diagnose.explain import enrich

    try:
        enrich(report, blocks, options)
    except Exception as e:  # noqa: BLE001 - a broken explanation must never lose the diagnosis
        report.warnings.append(f"config/memory explanation failed: {type(e).__name__}: {e}")
