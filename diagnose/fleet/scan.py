"""``fleet scan``: diagnose every job not yet in the store, in parallel, and store each one exactly once.

Work items are files (each log file is one job, keyed by the SHA-256 of its bytes) or Slurm jobs (keyed by cluster
and job id, from ``slurm_source``). The parent lists the items, drops those already stored (files by path + size +
mtime in ``seen_files``, Slurm jobs by key), and hands the rest to a pool of worker processes (at most ``jobs``, one
task in flight per worker plus a small queue, each worker recycled after ``MAX_TASKS_PER_CHILD`` jobs). Workers
return rows; only the parent writes, in batches of ``batch_size`` (or every ``commit_s`` seconds), each batch one
transaction.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import multiprocessing
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from diagnose.fleet.record import HOST_SCAN_LINES, JobFacts, build_record
from diagnose.fleet.slurm_source import SlurmRow, epoch, gpus_of, in_shard, job_from_row, nodes_of, placed
from diagnose.fleet.store import FleetStore, JobRecord, SeenFile, pack_report
from diagnose.ingest.slurm.parse import split_state
from diagnose.model import DiagnoseError, Report
from diagnose.pool_worker import quiet_worker_signals

LOG_SUFFIXES = (".log", ".out", ".err", ".txt", ".log.gz", ".out.gz", ".err.gz", ".txt.gz")
MAX_TASKS_PER_CHILD = 500
_JOB_ID_IN_NAME = re.compile(r"(\d+(?:_\d+)?)(?=\.[A-Za-z]+(?:\.gz)?$)")
_HEAD_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class FileItem:
    path: str
    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class SlurmItem:
    row: SlurmRow
    gpus_per_node: int
    via: str = "sacct"


Item = FileItem | SlurmItem


@dataclass(slots=True)
class ScanSummary:
    listed: int = 0  # items found (files or Slurm jobs), in this shard
    skipped: int = 0  # already in the store
    added: int = 0  # new rows
    unreadable: int = 0
    seconds: float = 0.0
    duplicates: int = 0  # files whose job another file of this scan already is (a copy, a log named twice)

    @property
    def stored_elsewhere(self) -> int:
        """Jobs not added because another writer (a scan running beside this one) stored them between this scan's
        listing and its write."""
        return max(0, self.listed - self.skipped - self.added - self.duplicates)


@dataclass(slots=True)
class ScanOptions:
    jobs: int = 1
    batch_size: int = 64
    commit_s: float = 2.0
    rules_dirs: list[str] = field(default_factory=list)
    replay: bool = False  # config replay + memory model per job: ~6x slower, rarely what a fleet view needs
    progress: Callable[[int, int], None] | None = None  # (jobs done, jobs to do)
    # called with each batch just before it is written: the seam where another writer's rows can land (tests)
    before_write: Callable[[list[JobRecord]], None] | None = None


# ------------------------------------------------------------------------------------------------ listing


def list_files(paths: Iterable[str]) -> list[FileItem]:
    """Log files named or found (recursively, sorted) in folders; a missing path is a one-line error."""
    found: dict[str, FileItem] = {}
    for path in paths:
        if os.path.isdir(path):
            for folder, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    if name.endswith(LOG_SUFFIXES) and not name.startswith("."):
                        _add(found, os.path.join(folder, name))
        elif os.path.lexists(path):
            _add(found, path)
        else:
            raise DiagnoseError(f"{path}: no such file or folder")
    return sorted(found.values(), key=lambda f: f.path)


def read_manifest(path: str) -> list[FileItem]:
    try:
        with open(path, encoding="utf-8") as fh:
            names = [line.rstrip("\n") for line in fh if line.strip()]
    except OSError as e:
        raise DiagnoseError(f"cannot read the manifest {path}: {e.strerror}") from None
    found: dict[str, FileItem] = {}
    for name in names:
        _add(found, name)
    return list(found.values())


def _add(found: dict[str, FileItem], path: str) -> None:
    path = os.path.abspath(path)
    try:
        st = os.stat(path)
        found[path] = FileItem(path, st.st_size, st.st_mtime_ns)
    except OSError:
        found[path] = FileItem(path, -1, -1)  # recorded as unreadable by the worker, never skipped silently


def shard_files(items: list[FileItem], shard: tuple[int, int] | None) -> list[FileItem]:
    """Every ``count``-th file of the sorted list from ``index``: the same split in every array task."""
    if shard is None:
        return items
    index, count = shard
    return [item for i, item in enumerate(sorted(items, key=lambda f: f.path)) if i % count == index]


def shard_rows(rows: list[SlurmRow], shard: tuple[int, int] | None) -> list[SlurmRow]:
    return [r for r in rows if in_shard(r.key, shard)]


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``I/N`` (0 <= I < N): this process takes shard I of N."""
    if text is None:
        return None
    m = re.fullmatch(r"(\d{1,6})/(\d{1,6})", text.strip())
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise DiagnoseError(f"--shard {text[:20]!r}: expected I/N with 0 <= I < N, e.g. 3/8")
    return int(m.group(1)), int(m.group(2))


# ------------------------------------------------------------------------------------------------ the scan


def pending(store: FleetStore, items: list[Item]) -> tuple[list[Item], int]:
    """The items not stored yet, and how many were skipped."""
    seen = store.seen_paths()
    keys = store.job_keys() if any(isinstance(i, SlurmItem) for i in items) else set()
    todo: list[Item] = []
    for item in items:
        if isinstance(item, FileItem):
            if item.size >= 0 and seen.get(item.path) == (item.size, item.mtime_ns):
                continue
        elif item.row.key in keys:
            continue
        todo.append(item)
    return todo, len(items) - len(todo)


def scan(store: FleetStore, items: list[Item], options: ScanOptions) -> ScanSummary:
    started = time.monotonic()
    _catalogue(options.rules_dirs)  # a broken --rules file fails here, once, not in every job (forked workers share it)
    todo, skipped = pending(store, items)
    summary = ScanSummary(listed=len(items), skipped=skipped)
    batch: list[tuple[JobRecord, SeenFile | None]] = []
    last_commit = time.monotonic()

    keys: set[str] = set()

    def flush() -> None:
        nonlocal last_commit
        if batch:
            records = [r for r, _ in batch]
            if options.before_write is not None:
                options.before_write(records)
            summary.added += store.add(records, [s for _, s in batch if s is not None])
            batch.clear()
        last_commit = time.monotonic()

    if options.progress:
        options.progress(0, len(todo))
    for done, (record, seen) in enumerate(_results(todo, options), 1):
        if record.job_key in keys:
            summary.duplicates += 1
        keys.add(record.job_key)
        batch.append((record, seen))
        summary.unreadable += record.status == "unreadable"
        if len(batch) >= options.batch_size or time.monotonic() - last_commit >= options.commit_s:
            flush()
        if options.progress:
            options.progress(done, len(todo))
    flush()
    summary.seconds = time.monotonic() - started
    return summary


def _results(todo: list[Item], options: ScanOptions) -> Iterator[tuple[JobRecord, SeenFile | None]]:
    workers = max(1, min(options.jobs, len(todo)))
    if workers == 1:
        for item in todo:
            yield diagnose_item(item, options.rules_dirs, options.replay)
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    one = functools.partial(diagnose_item, rules_dirs=options.rules_dirs, replay=options.replay)
    with ctx.Pool(workers, initializer=quiet_worker_signals, maxtasksperchild=MAX_TASKS_PER_CHILD) as pool:
        yield from pool.imap_unordered(one, todo, chunksize=1)
        pool.close()  # every result is in: let the workers finish, rather than the SIGTERM that ``with`` ends with
        pool.join()


# ------------------------------------------------------------------------------------------ one job (worker)


_CATALOGUES: dict[tuple[str, ...], object] = {}  # per process: loading the rules costs ~40 ms, a small job ~20 ms


def _catalogue(rules_dirs: list[str]) -> object:
    from diagnose.match import load_catalogue

    key = tuple(rules_dirs)
    if key not in _CATALOGUES:
        _CATALOGUES[key] = load_catalogue(list(rules_dirs), strict=True)
    return _CATALOGUES[key]


def diagnose_item(item: Item, rules_dirs: list[str], replay: bool) -> tuple[JobRecord, SeenFile | None]:
    """Diagnose one job; never raises for a bad log (the row says what went wrong)."""
    from diagnose.pipeline import AnalyzeOptions

    options = AnalyzeOptions(rules_dirs=list(rules_dirs), replay=replay, catalogue=_catalogue(rules_dirs))
    if isinstance(item, FileItem):
        return _diagnose_file(item, options)
    return _diagnose_slurm(item, options), None


def _diagnose_file(item: FileItem, options) -> tuple[JobRecord, SeenFile | None]:
    from diagnose.pipeline import analyze

    base = os.path.basename(item.path)
    m = _JOB_ID_IN_NAME.search(base)
    facts = JobFacts(job_key="", via="scan", job_id=m.group(1) if m else "", name=_name_of(base),
                     end_ts=item.mtime_ns / 1e9 if item.mtime_ns >= 0 else None, source=item.path)
    try:
        if not stat.S_ISREG(os.stat(item.path).st_mode):  # a FIFO or device would block or never end
            raise OSError(0, "not a regular file")
        if (why := _foreign_link(item.path)) is not None:
            raise OSError(0, why)
        digest = _sha256(item.path)
    except OSError as e:
        facts.job_key = f"unreadable:{item.path}"
        return _unreadable(facts, f"cannot read {item.path}: {e.strerror or e}"), None
    facts.job_key = f"sha256:{digest}"
    try:
        report = analyze([item.path], options)
    except (DiagnoseError, OSError) as e:
        return _unreadable(facts, str(e)), None
    record = build_record(report, facts, log_hosts(item.path))
    return record, SeenFile(item.path, item.size, item.mtime_ns, facts.job_key)


def _foreign_link(path: str) -> str | None:
    """As root, a log that is a symlink is read only when the link's owner owns the file it points to (or the link
    is root's): a user's ``job.log -> /etc/shadow`` in a scanned folder would otherwise put lines root alone may
    read into the store, which other users read (the rule of the kernel's protected_symlinks, and of
    ingest/slurm/owner.py for a job's output)."""
    if os.geteuid() != 0:
        return None
    link = os.lstat(path)
    if not stat.S_ISLNK(link.st_mode) or link.st_uid == 0:
        return None
    target = os.stat(path)
    if target.st_uid == link.st_uid:
        return None
    return (f"not read: a symlink owned by uid {link.st_uid} to a file owned by uid {target.st_uid} (as root, a link "
            "is followed only to its owner's own file)")


def _diagnose_slurm(item: SlurmItem, options) -> JobRecord:
    from diagnose.ingest.slurm import lookup_job
    from diagnose.slurm_diagnosis import diagnose_job

    row = item.row
    facts = JobFacts(
        job_key=row.key, via=item.via, cluster=row.get("Cluster"), job_id=row.job_id, name=row.get("JobName"),
        user=row.get("User"), nodes=nodes_of(row), gpus=gpus_of(row, item.gpus_per_node),
        state=split_state(row.get("State"))[0],
        start_ts=epoch(row.get("Start")), end_ts=epoch(row.get("End")),
    )
    try:
        job = job_from_row(row)
        if not placed(job):  # the bulk row could not place the output: ask Slurm about this job alone
            with contextlib.suppress(DiagnoseError):
                job = lookup_job(job.ref, settle_s=1.0, max_task_files=16)
        facts.state, facts.exit_code = job.state, job.exit.code
        facts.derived_exit_code = job.derived_exit.code
        facts.elapsed_s = job.elapsed_s
        facts.start_ts, facts.end_ts = epoch(job.start) or facts.start_ts, epoch(job.end) or facts.end_ts
        facts.source = "\n".join(p for p, _ in job.analysis_inputs)
        report = diagnose_job(job.ref, options, job=job).report
    except (DiagnoseError, OSError) as e:
        return _unreadable(facts, str(e))
    hosts = log_hosts(job.analysis_inputs[0][0]) if job.analysis_inputs else []
    status = "diagnosed" if job.analysis_inputs else "unreadable"
    problems = job.notes or [f"{o.stream} file {o.path}: {o.problem}" for o in job.outputs if o.problem]
    problem = None if job.analysis_inputs else "; ".join(problems) or "Slurm has no record of the job's output"
    return build_record(report, facts, hosts, status=status, problem=problem)


def _unreadable(facts: JobFacts, problem: str) -> JobRecord:
    from diagnose.fleet.record import failed

    return JobRecord(
        job_key=facts.job_key, failed=failed(Report(), facts), status="unreadable", via=facts.via,
        cluster=facts.cluster, job_id=facts.job_id, name=facts.name, user=facts.user, state=facts.state,
        exit_code=facts.exit_code, problem=problem[:500], nodes=list(facts.nodes), end_ts=facts.end_ts or time.time(),
        source=facts.source, report=pack_report('{"schema": "diagnose/report@1", "unreadable": true}'),
        scanned_at=time.time(),
    )


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _name_of(base: str) -> str:
    return re.sub(r"(\.[A-Za-z]+)?(\.gz)?$", "", base)


def log_hosts(path: str) -> list[str]:
    """Hosts named by the launcher prefixes (pdsh ``host:``, ``[host:3]:``) in the first lines of a log."""
    from diagnose.normalize import decode, normalize_line

    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD_BYTES)
    except OSError:
        return []
    if path.endswith(".gz"):
        return []
    hosts: list[str] = []
    for lineno, line in enumerate(decode(head).splitlines()[:HOST_SCAN_LINES], 1):
        host = normalize_line(line, path, lineno).host
        if host and host not in hosts:
            hosts.append(host)
    return hosts
