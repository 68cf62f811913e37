"""The fleet store: one row per job (its ``diagnose/report@1`` report and the columns the fleet report queries), in
SQLite (stdlib ``sqlite3``).

Why it is safe to kill and to share:

- WAL journal, ``busy_timeout`` 60 s, and every write in a ``BEGIN IMMEDIATE`` transaction: two scans (or a scan and
  a merge, or an epilog) on one store take turns per batch instead of failing or corrupting it; readers never block.
  Switching a new file to WAL is retried up to the same timeout: SQLite answers "database is locked" at once there,
  without waiting, while another process is switching it too (two scans creating one store at the same moment).
- A job's key is ``slurm:<cluster>:<job id>`` or ``sha256:<content hash>``; rows are written with ``INSERT OR
  IGNORE``, so a job seen twice (a rerun, two scans racing, the same shard merged twice) is stored once.
- A batch of jobs and the ``seen_files`` marks that let the next scan skip them are committed together: ``kill -9``
  loses at most the batch in flight, never a committed one, and the rerun redoes exactly what is missing.
- ``PRAGMA user_version`` is the schema version: a store from a newer diagnose is refused with one line.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import astuple, dataclass, field, fields

from diagnose.model import DiagnoseError

SCHEMA_VERSION = 1
_SQLITE_BUSY = 5  # sqlite3.h's SQLITE_BUSY, the primary code of "database is locked"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_key       TEXT PRIMARY KEY,        -- slurm:<cluster>:<job id> | sha256:<hex of the log's bytes>
    cluster       TEXT NOT NULL DEFAULT '',
    job_id        TEXT NOT NULL DEFAULT '', -- Slurm's (123, 123_7), or a number from the file name
    name          TEXT NOT NULL DEFAULT '',
    user          TEXT NOT NULL DEFAULT '',
    config        TEXT NOT NULL DEFAULT '', -- what "per-config" groups by: the job name (digits folded)
    state         TEXT NOT NULL DEFAULT '', -- Slurm's state, '' for a bare log
    exit_code     INTEGER,
    failed        INTEGER NOT NULL,         -- 1: a root cause was found or Slurm says the job ended badly
    status        TEXT NOT NULL,            -- diagnosed | unreadable | error
    problem       TEXT,                     -- why a log could not be read or diagnosed
    root_rule     TEXT,
    root_category TEXT,
    root_title    TEXT,
    signature     TEXT,                     -- the failure class: the root rule (+ exception type for catch-alls)
    nodes         TEXT NOT NULL DEFAULT '', -- comma-separated, as attributed in job_nodes
    node_count    INTEGER,
    gpus          INTEGER,
    elapsed_s     INTEGER,
    gpu_hours     REAL,                     -- gpus x elapsed; NULL when Slurm did not say
    start_ts      REAL,
    end_ts        REAL,                     -- epoch seconds: Slurm's End, or the log file's mtime
    source        TEXT NOT NULL DEFAULT '', -- the log path(s), one a line
    via           TEXT NOT NULL,            -- scan | sacct | epilog (how the job was found)
    report        BLOB,                     -- zlib-compressed report@1 JSON
    scanned_at    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS job_nodes (
    node    TEXT NOT NULL,
    job_key TEXT NOT NULL,
    blamed  INTEGER NOT NULL,               -- 1: the job failed and this node is where the root cause points
    end_ts  REAL,
    PRIMARY KEY (node, job_key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS seen_files (
    path     TEXT PRIMARY KEY,              -- a scanned log, so that a rerun skips it without reading it
    size     INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    job_key  TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS jobs_end ON jobs(end_ts);
CREATE INDEX IF NOT EXISTS jobs_signature ON jobs(signature, end_ts);
CREATE INDEX IF NOT EXISTS jobs_user ON jobs(user, end_ts);
CREATE INDEX IF NOT EXISTS jobs_config ON jobs(config, end_ts);
CREATE INDEX IF NOT EXISTS job_nodes_end ON job_nodes(end_ts);
"""


@dataclass(slots=True)
class JobRecord:
    """One job as stored; ``report`` is the compressed report@1 JSON (``pack_report``)."""

    job_key: str
    failed: bool
    status: str
    via: str
    cluster: str = ""
    job_id: str = ""
    name: str = ""
    user: str = ""
    config: str = ""
    state: str = ""
    exit_code: int | None = None
    problem: str | None = None
    root_rule: str | None = None
    root_category: str | None = None
    root_title: str | None = None
    signature: str | None = None
    nodes: list[str] = field(default_factory=list)
    blamed_nodes: list[str] = field(default_factory=list)
    node_count: int | None = None
    gpus: int | None = None
    elapsed_s: int | None = None
    gpu_hours: float | None = None
    start_ts: float | None = None
    end_ts: float | None = None
    source: str = ""
    report: bytes | None = None
    scanned_at: float = 0.0


@dataclass(frozen=True, slots=True)
class SeenFile:
    path: str
    size: int
    mtime_ns: int
    job_key: str


_JOB_COLUMNS = [f.name for f in fields(JobRecord) if f.name != "blamed_nodes"]


def pack_report(report_json: str) -> bytes:
    return zlib.compress(report_json.encode("utf-8"), 6)


def _writable(path: str, folder: str) -> bool:
    """Can we write the store: its folder (SQLite's -wal/-shm files live there) and the file when it exists."""
    return os.access(folder, os.W_OK) and (not os.path.exists(path) or os.access(path, os.W_OK))


def _checkpointed(path: str) -> bool:
    """No -wal or -shm beside the store: the last writer closed it, so every committed row is in the file."""
    return not os.path.exists(path + "-wal") and not os.path.exists(path + "-shm")


class FleetStore:
    """A fleet store file. ``FleetStore(path)`` creates it (and its schema) when missing."""

    def __init__(self, path: str, readonly: bool = False, timeout_s: float = 60.0) -> None:
        self.path = path
        if readonly and not os.path.exists(path):
            raise DiagnoseError(f"no fleet store at {path} (run 'diagnose fleet scan' first)")
        if os.path.isdir(path):  # SQLite's answer was "disk I/O error" (report) or "unable to open" (scan)
            raise DiagnoseError(f"{path} is a folder, not a fleet store: name the store's file (e.g. "
                                f"{os.path.join(path, 'fleet.db')})")
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise DiagnoseError(f"cannot create the fleet store {path}: folder {folder} does not exist")
        try:
            self._connect(readonly, timeout_s)
        except sqlite3.DatabaseError as e:
            if not readonly and not _writable(path, folder):
                raise DiagnoseError(
                    (f"{path} cannot be written (a read-only file, folder or mount): 'diagnose fleet report' can "
                     "read it; scan into a store you can write") if os.path.exists(path)
                    else f"cannot create the fleet store {path}: folder {folder} is not writable (a read-only "
                         "folder or mount)") from None
            if not (readonly and _checkpointed(path) and not _writable(path, folder)):
                raise DiagnoseError(f"{path} is not a usable fleet store: {e}") from None
            # A WAL store whose folder we cannot write (a read-only mount, root's store read by a user) and which
            # has no -wal/-shm beside it (closed cleanly: every row is in the file): SQLite cannot create the -shm
            # a WAL reader needs, but the file alone is the whole store, so it is read as immutable.
            try:
                self._connect(readonly, timeout_s, immutable=True)
            except sqlite3.DatabaseError as e2:
                raise DiagnoseError(f"{path} is not a usable fleet store: {e2}") from None

    def _connect(self, readonly: bool, timeout_s: float, immutable: bool = False) -> None:
        target = self.path
        if readonly:
            target = f"file:{urllib.parse.quote(os.path.abspath(self.path))}?mode=ro" + ("&immutable=1" * immutable)
        self.db = sqlite3.connect(target, uri=readonly, timeout=timeout_s, isolation_level=None)
        self.db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        self._setup(readonly, timeout_s)

    def _setup(self, readonly: bool, timeout_s: float) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise DiagnoseError(
                f"{self.path} has fleet store schema {version}, newer than this diagnose's {SCHEMA_VERSION}: upgrade"
            )
        if readonly:
            if version != SCHEMA_VERSION:
                raise DiagnoseError(f"{self.path} is not a fleet store (schema version {version})")
            return
        if self._journal_mode_wal(timeout_s).lower() != "wal":
            raise DiagnoseError(f"{self.path}: SQLite refused WAL mode (a network file system?)")
        self.db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: a commit survives a killed process
        if version == 0:
            with self.transaction():
                if self.db.execute("PRAGMA user_version").fetchone()[0] == 0:  # another process may have won
                    has_tables = self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                    if has_tables:
                        raise DiagnoseError(f"{self.path} is an SQLite file but not a fleet store")
                    for statement in _SCHEMA.split(";\n"):
                        if statement.strip():
                            self.db.execute(statement)
                    self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        else:
            self._probe_writable()

    def _probe_writable(self) -> None:
        """Rewrite the schema version (same value) once: a store that cannot be written (a read-only file, folder
        or mount, an immutable file) is refused before the scan analyses anything, not with SQLite's "attempt to
        write a readonly database" as an internal error after it."""
        try:
            with self.transaction():
                self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.OperationalError as e:
            if getattr(e, "sqlite_errorname", "") == "SQLITE_READONLY" or "readonly" in str(e):
                raise DiagnoseError(f"{self.path} cannot be written (a read-only file, folder or mount): "
                                    f"'diagnose fleet report' can read it; scan into a store you can write") from None
            raise

    def _journal_mode_wal(self, timeout_s: float) -> str:
        """``PRAGMA journal_mode = WAL``, retried while another connection's lock makes it fail. Two processes
        creating one store both switch the new file: the one that finds the other holding the write lock gets
        "database is locked" at once (waiting could deadlock, so SQLite does not consult busy_timeout there)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return str(self.db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as e:
                code = getattr(e, "sqlite_errorcode", None)
                busy = (code & 0xFF) == _SQLITE_BUSY if isinstance(code, int) else "locked" in str(e)
                if not busy or time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> FleetStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE``: the write lock is taken at once (waiting up to busy_timeout), never mid-way."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # ------------------------------------------------------------------------------------------ writes

    def add(self, records: Iterable[JobRecord], seen: Iterable[SeenFile] = ()) -> int:
        """Store the jobs not stored yet, and the files' marks, in one transaction; return how many were new."""
        added = 0
        placeholders = ",".join("?" for _ in _JOB_COLUMNS)
        with self.transaction() as db:
            for r in records:
                values = [",".join(r.nodes) if c == "nodes" else getattr(r, c) for c in _JOB_COLUMNS]
                values[_JOB_COLUMNS.index("failed")] = int(r.failed)
                # only an already stored job is skipped: OR IGNORE would also drop a row that breaks NOT NULL,
                # silently, and the caller would report it "already stored"
                cur = db.execute(
                    f"INSERT INTO jobs ({','.join(_JOB_COLUMNS)}) VALUES ({placeholders}) "
                    "ON CONFLICT(job_key) DO NOTHING", values
                )
                if cur.rowcount:
                    added += 1
                    blamed = set(r.blamed_nodes)
                    db.executemany(
                        "INSERT OR IGNORE INTO job_nodes (node, job_key, blamed, end_ts) VALUES (?, ?, ?, ?)",
                        [(n, r.job_key, int(n in blamed), r.end_ts) for n in dict.fromkeys(r.nodes)],
                    )
            db.executemany(
                "INSERT OR REPLACE INTO seen_files (path, size, mtime_ns, job_key) VALUES (?, ?, ?, ?)",
                [astuple(s) for s in seen],
            )
        return added

    def merge_from(self, shard_path: str) -> int:
        """Fold another store (a shard) into this one in one transaction; return how many jobs were new."""
        shard = FleetStore(shard_path, readonly=True)  # validates the shard's schema version
        shard.close()
        self.db.execute("ATTACH DATABASE ? AS shard", (shard_path,))  # exists: checked just above
        try:
            with self.transaction() as db:
                before = db.execute("SELECT count(*) FROM jobs").fetchone()[0]
                cols = ",".join(_JOB_COLUMNS)
                db.execute(f"INSERT OR IGNORE INTO jobs ({cols}) SELECT {cols} FROM shard.jobs")
                db.execute("INSERT OR IGNORE INTO job_nodes SELECT * FROM shard.job_nodes")
                db.execute("INSERT OR REPLACE INTO seen_files SELECT * FROM shard.seen_files")
                after = db.execute("SELECT count(*) FROM jobs").fetchone()[0]
        finally:
            self.db.execute("DETACH DATABASE shard")
        return after - before

    # ------------------------------------------------------------------------------------------- reads

    def seen_paths(self) -> dict[str, tuple[int, int]]:
        return {p: (s, m) for p, s, m in self.db.execute("SELECT path, size, mtime_ns FROM seen_files")}

    def job_keys(self) -> set[str]:
        return {k for (k,) in self.db.execute("SELECT job_key FROM jobs")}

    def count(self) -> int:
        return self.db.execute("SELECT count(*) FROM jobs").fetchone()[0]
