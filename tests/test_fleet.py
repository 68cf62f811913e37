"""`diagnose fleet` without a cluster: the store, the scan (idempotent, incremental, unreadable logs), faults
(kill -9 mid-scan and mid-merge, two scans at once), the report (classes, binomial node test, users, configs, JSON
schema, inert text), the array scripts and the epilog's environment. The real-cluster tests are test_fleet_slurm.py.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from math import comb
from pathlib import Path

import pytest

from diagnose.fleet.epilog import job_ref_from_env, safe_comment
from diagnose.fleet.record import config_key
from diagnose.fleet.report import build_report
from diagnose.fleet.scan import FileItem, ScanOptions, list_files, parse_shard, scan, shard_files
from diagnose.fleet.stats import binomial_sf, flag
from diagnose.fleet.store import SCHEMA_VERSION, FleetStore, JobRecord
from diagnose.fleet.submit import write_array
from diagnose.model import DiagnoseError
from diagnose.present.fleet_render import render_json, render_markdown, render_text

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_logs"
MIX = {"ddp_wrap_oom": "OOM102", "dataset_idx_missing": "DA001", "clean_run": None, "gpu_ecc_error": "HW002"}


def make_logs(folder: Path, count: int) -> dict[str, str | None]:
    """``count`` distinct log files (a sample log under a unique first line); path -> expected root rule."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(MIX)
    expected = {}
    for i in range(count):
        sample = names[i % len(names)]
        path = folder / f"job-{i}.log"
        path.write_text(f"job {i} starting\n" + (SAMPLES / f"{sample}.log").read_text())
        expected[str(path)] = MIX[sample]
    return expected


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagnose", "fleet", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=str(REPO)))


def rows(db: Path) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT job_key, source, signature, status FROM jobs ORDER BY source").fetchall()
    finally:
        con.close()


# ------------------------------------------------------------------------------------------------ store


def test_store_schema_version_wal_and_refusals(tmp_path):
    db = tmp_path / "f.db"
    with FleetStore(str(db)) as store:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        indexes = {r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"jobs_end", "jobs_signature", "jobs_user", "jobs_config", "job_nodes_end"} <= indexes
        store.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(DiagnoseError, match="newer than this diagnose"):
        FleetStore(str(db))
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    done = cli("report", "--store", str(junk))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a usable fleet store" in done.stderr
    good = tmp_path / "good.db"
    FleetStore(str(good)).close()
    done = cli("report", "--store", str(good), "-o", str(good))  # the report must never replace the store
    assert done.returncode == 2 and "is the fleet store" in done.stderr
    assert FleetStore(str(good), readonly=True).count() == 0
    done = cli("report", "--store", str(tmp_path / "missing.db"))
    assert done.returncode == 2 and "no fleet store" in done.stderr and "Traceback" not in done.stderr


def test_a_job_added_twice_is_stored_once(tmp_path):
    record = JobRecord(job_key="slurm:c:1", failed=True, status="diagnosed", via="sacct", signature="OOM102",
                       nodes=["a", "b"], blamed_nodes=["b"], end_ts=1.0)
    with FleetStore(str(tmp_path / "f.db")) as store:
        assert store.add([record]) == 1
        assert store.add([record, record]) == 0
        assert store.count() == 1
        assert store.db.execute("SELECT node, blamed FROM job_nodes ORDER BY node").fetchall() == [("a", 0), ("b", 1)]


def test_a_row_the_schema_refuses_is_an_error_not_already_stored(tmp_path):
    """Only the job's key already there makes a job "already stored"; a row that breaks the schema (a NOT NULL
    column left None) raises and stores nothing, where INSERT OR IGNORE used to drop it silently."""
    with FleetStore(str(tmp_path / "f.db")) as store:
        bad = JobRecord(job_key="slurm:c:2", failed=True, status=None, via="epilog")  # type: ignore[arg-type]
        with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
            store.add([JobRecord(job_key="slurm:c:1", failed=False, status="diagnosed", via="epilog"), bad])
        assert store.count() == 0  # the transaction: all or nothing


# ------------------------------------------------------------------------------------------------- scan


def test_scan_is_idempotent_incremental_and_keyed_by_content(tmp_path):
    expected = make_logs(tmp_path / "logs", 12)
    db = tmp_path / "f.db"
    with FleetStore(str(db)) as store:
        first = scan(store, list_files([str(tmp_path / "logs")]), ScanOptions(jobs=2, batch_size=5))
        assert (first.listed, first.skipped, first.added, first.unreadable) == (12, 0, 12, 0)
        again = scan(store, list_files([str(tmp_path / "logs")]), ScanOptions(jobs=1))
        assert (again.skipped, again.added) == (12, 0)
        # a new log: only it is diagnosed; a copy of a stored log under a new name is the same job
        (tmp_path / "logs" / "new.log").write_text("x\n" + (SAMPLES / "ddp_wrap_oom.log").read_text())
        (tmp_path / "logs" / "copy.log").write_bytes((tmp_path / "logs" / "job-0.log").read_bytes())
        third = scan(store, list_files([str(tmp_path / "logs")]), ScanOptions(jobs=1))
        assert (third.skipped, third.added) == (12, 1)
    stored = {source: sig for _, source, sig, _ in rows(db)}
    assert stored == {**expected, str(tmp_path / "logs" / "new.log"): "OOM102"}


def test_unreadable_logs_are_recorded_not_skipped(tmp_path):
    logs = tmp_path / "logs"
    make_logs(logs, 2)
    fifo = logs / "pipe.log"
    os.mkfifo(fifo)  # opening it would block forever: recorded as not a regular file
    (logs / "dangling.log").symlink_to(tmp_path / "gone.log")
    db = tmp_path / "f.db"
    with FleetStore(str(db)) as store:
        summary = scan(store, list_files([str(logs)]), ScanOptions(jobs=1))
    assert (summary.added, summary.unreadable) == (4, 2)
    bad = {source: status for _, source, _, status in rows(db) if status != "diagnosed"}
    assert bad == {str(fifo): "unreadable", str(logs / "dangling.log"): "unreadable"}
    report = build_report(FleetStore(str(db), readonly=True), since="1d")
    assert report.unreadable == 2 and {u.source for u in report.unreadable_jobs} == set(bad)
    assert "not a regular file" in " ".join(u.problem for u in report.unreadable_jobs)


def test_shards_partition_the_work():
    items = [FileItem(f"/l/{i}.log", 1, 1) for i in range(10)]
    shards = [shard_files(items, (i, 4)) for i in range(4)]
    assert sorted(f.path for s in shards for f in s) == sorted(f.path for f in items)
    assert [len(s) for s in shards] == [3, 3, 2, 2]
    assert parse_shard("3/4") == (3, 4)
    for bad in ("4/4", "-1/3", "1", "a/b"):
        with pytest.raises(DiagnoseError):
            parse_shard(bad)


# ----------------------------------------------------------------------------------------------- faults


def _wait_count(db: Path, at_least: int, proc: subprocess.Popen, limit: float = 60) -> int:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if db.exists():
            try:
                con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
                n = con.execute("SELECT count(*) FROM jobs").fetchone()[0]
                con.close()
                if n >= at_least:
                    return n
            except sqlite3.OperationalError:
                pass
        assert proc.poll() is None, "finished before it could be killed"
        time.sleep(0.01)
    raise AssertionError("no progress")


def test_kill_9_mid_scan_loses_nothing_committed_and_a_rerun_completes(tmp_path):
    expected = make_logs(tmp_path / "logs", 150)
    db = tmp_path / "f.db"
    argv = [sys.executable, "-m", "diagnose", "fleet", "scan", str(tmp_path / "logs"), "--store", str(db),
            "--jobs", "1", "--batch", "5", "--no-progress"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    committed = _wait_count(db, 20, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    after_kill = rows(db)
    assert committed <= len(after_kill) < len(expected)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    done = cli("scan", str(tmp_path / "logs"), "--store", str(db), "--jobs", "1", "--no-progress")
    assert f"{len(after_kill)} already stored, {len(expected) - len(after_kill)} added" in done.stderr
    final = rows(db)
    assert {source: sig for _, source, sig, _ in final} == expected
    assert len({k for k, *_ in final}) == len(expected)
    assert set(after_kill) <= set(final)


SHARD_ROWS = 2000


def _shard(path: Path, index: int, size: int) -> None:
    with FleetStore(str(path)) as store:
        store.add([JobRecord(job_key=f"slurm:c:{index}_{i}", failed=i % 3 == 0, status="diagnosed", via="sacct",
                             signature="OOM102" if i % 3 == 0 else None, nodes=[f"n{i % 7}"], end_ts=float(i),
                             report=os.urandom(64)) for i in range(size)])


def test_kill_9_mid_merge_keeps_whole_shards_and_a_rerun_completes(tmp_path):
    shards = [tmp_path / f"shard-{i}.db" for i in range(20)]
    for i, shard in enumerate(shards):
        _shard(shard, i, SHARD_ROWS)
    total = 20 * SHARD_ROWS
    db = tmp_path / "merged.db"
    proc = subprocess.Popen([sys.executable, "-m", "diagnose", "fleet", "merge", "--store", str(db),
                             *map(str, shards)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = _wait_count(db, 1, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    keys = [k for (k,) in con.execute("SELECT job_key FROM jobs")]
    con.close()
    assert seen <= len(keys) < total
    per_shard = {}
    for k in keys:
        shard = k.split(":")[2].split("_")[0]
        per_shard[shard] = per_shard.get(shard, 0) + 1
    assert set(per_shard.values()) == {SHARD_ROWS}  # a shard is merged whole or not at all
    done = cli("merge", "--store", str(db), *map(str, shards))
    assert done.returncode == 0, done.stderr
    with FleetStore(str(db), readonly=True) as store:
        assert store.count() == total
        assert store.db.execute("SELECT count(*) FROM job_nodes").fetchone()[0] == total


def test_two_scans_at_once_store_each_job_once(tmp_path):
    expected = make_logs(tmp_path / "logs", 60)
    db = tmp_path / "f.db"
    argv = [sys.executable, "-m", "diagnose", "fleet", "scan", str(tmp_path / "logs"), "--store", str(db),
            "--jobs", "1", "--batch", "3", "--no-progress"]
    procs = [subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    final = rows(db)
    assert len(final) == len({k for k, *_ in final}) == len(expected)
    assert {source: sig for _, source, sig, _ in final} == expected
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    """The lock a scan holds on a new store's file while it switches it to WAL (a write transaction)."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return holder


def test_a_new_store_waits_for_another_processs_lock_to_switch_to_wal(tmp_path, monkeypatch):
    """SQLite fails `PRAGMA journal_mode = WAL` at once ("database is locked", busy_timeout not consulted) while
    another connection holds the write lock it takes for the same switch: two scans creating one store at the same
    moment failed that way (54 and 94 rounds of 300 in stress loops of two processes). The store retries until its
    timeout; here the lock is let go at the store's first pause, so the store must have retried to open."""
    import diagnose.fleet.store as store_module

    path = tmp_path / "f.db"
    holder = _hold_write_lock(path)
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        if not pauses:
            holder.execute("COMMIT")
        pauses.append(seconds)

    monkeypatch.setattr(store_module, "time", type("Clock", (), {"monotonic": time.monotonic, "sleep": pause}), raising=False)
    try:
        store = FleetStore(str(path), timeout_s=30)
    finally:
        holder.close()
    assert pauses, "the store opened without meeting the lock"
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.count() == 0 and store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.close()


def test_a_store_locked_past_its_timeout_is_one_error(tmp_path):
    path = tmp_path / "f.db"
    holder = _hold_write_lock(path)
    try:
        with pytest.raises(DiagnoseError, match=r"is not a usable fleet store: database is locked$"):
            FleetStore(str(path), timeout_s=0.2)
    finally:
        holder.close()


# ----------------------------------------------------------------------------------------------- report


def test_binomial_tail_is_exact_and_the_flag_is_bonferroni_bounded():
    for k, n, p in [(3, 10, 0.1), (0, 5, 0.3), (5, 5, 0.5), (12, 40, 0.2), (1, 1, 0.2)]:
        exact = sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))
        assert binomial_sf(k, n, p) == pytest.approx(exact, rel=1e-9, abs=1e-15)
    p_value, flagged = flag(8, 10, 0.2, tested=1, alpha=0.01, min_failures=3)
    assert flagged and p_value < 1e-3
    # the same node among 1000 tested is no longer far enough out
    assert not flag(8, 10, 0.2, tested=1000, alpha=0.01, min_failures=3)[1]
    assert not flag(2, 2, 0.01, tested=1, alpha=0.01, min_failures=3)[1]  # two failures never drain a node


def _record(key: str, end: float, sig: str | None, node: str, user: str = "alice", name: str = "train-7b-12",
            gpu_hours: float | None = 1.0) -> JobRecord:
    return JobRecord(job_key=key, failed=sig is not None, status="diagnosed", via="sacct", signature=sig,
                     root_rule=sig, root_category="x" if sig else None, root_title=f"title of {sig}" if sig else None,
                     nodes=[node], blamed_nodes=[node] if sig else [], end_ts=end, user=user, name=name,
                     config=config_key(name), gpu_hours=gpu_hours, job_id=key.split(":")[-1])


def test_report_classes_trend_new_nodes_users_configs(tmp_path):
    now = 1_800_000_000.0
    day = 86400.0
    records = [_record("k:old", now - 30 * day, "NC001", "n1")]  # seen before the window: not new
    i = 0
    for d in range(7):
        for _ in range(10):  # healthy jobs everywhere
            records.append(_record(f"k:{i}", now - d * day - 60, None, f"n{i % 10}"))
            i += 1
    # a bad node: 12 HW002 failures
    records.extend(_record(f"k:hw{j}", now - (j % 7) * day - 30, "HW002", "n7", user="bob", name="pretrain-70b")
                   for j in range(12))
    # a rising OOM class: all in the last days
    records.extend(_record(f"k:oom{j}", now - 3600 * (j + 1), "OOM102", f"n{j}", gpu_hours=2.5) for j in range(6))
    records.append(_record("k:nc", now - 2 * day, "NC001", "n2"))
    with FleetStore(str(tmp_path / "f.db")) as store:
        store.add(records)
        report = build_report(store, since="7d", now=now)
    assert report.jobs == 70 + 12 + 6 + 1 and report.failed == 19
    classes = {c.signature: c for c in report.classes}
    assert [c.signature for c in report.classes] == ["HW002", "OOM102", "NC001"]
    assert classes["OOM102"].gpu_hours == pytest.approx(15.0) and classes["OOM102"].trend == "new"
    assert classes["NC001"].new is False and classes["NC001"].trend == "steady"
    assert [c.signature for c in report.new_signatures] == ["HW002", "OOM102"]
    assert report.gpu_hours_lost == pytest.approx(12 + 15 + 1)
    flagged = [n for n in report.nodes if n.flagged]
    assert [n.node for n in flagged] == ["n7"] and flagged[0].failed == 12 and flagged[0].top_signature == "HW002"
    assert flagged[0].drain_command == (
        "scontrol update nodename=n7 state=drain reason='diagnose fleet: 12/19 jobs failed, mostly HW002 "
        f"(binomial p={flagged[0].p_value:.1e})'"
    )
    users = {g.key: g for g in report.users}
    assert users["bob"].failed == 12 and users["bob"].top_signature == "HW002"
    assert {g.key for g in report.configs} == {"train-#b-#", "pretrain-#b"}
    import jsonschema

    schema = json.loads((REPO / "schemas" / "fleet-1.schema.json").read_text())
    jsonschema.validate(json.loads(render_json(report)), schema)
    text = render_text(report)
    assert "scontrol update nodename=n7 state=drain" in text and "HW002" in text
    assert "| HW002 | 12 |" in render_markdown(report)


def test_report_keeps_hostile_names_inert(tmp_path):
    now = 1_800_000_000.0
    evil = "run\x1b[2J\x1b]0;pwned\x07[bold]x[/bold]|`rm -rf`"
    with FleetStore(str(tmp_path / "f.db")) as store:
        store.add([_record(f"k:{i}", now - 60, "OOM102", "n;reboot", user="u", name=evil) for i in range(5)])
        report = build_report(store, since="1d", now=now)
    for out in (render_text(report), render_markdown(report), render_json(report)):
        assert "\x1b" not in out and "\x07" not in out
    assert all(n.drain_command is None for n in report.nodes)  # "n;reboot" is not a host name: no command


# ------------------------------------------------------------------------------------------- submit, epilog


def test_write_array_freezes_the_work_and_quotes_it(tmp_path):
    logs = tmp_path / "logs"
    make_logs(logs, 5)
    plan = write_array(str(tmp_path / "run"), str(tmp_path / "my store.db"), 4, files=list_files([str(logs)]),
                       sbatch_args=["--partition=cpu"])
    script = Path(plan.array_script).read_text()
    assert "#SBATCH --array=0-3\n" in script and "#SBATCH --partition=cpu\n" in script
    assert '--shard "$SLURM_ARRAY_TASK_ID/4"' in script
    assert len((tmp_path / "run" / "manifest.txt").read_text().splitlines()) == 5
    assert "'" + str(tmp_path / "my store.db") + "'" in Path(plan.merge_script).read_text()
    assert subprocess.run(["bash", "-n", plan.array_script]).returncode == 0
    with pytest.raises(DiagnoseError):
        write_array(str(tmp_path / "run"), "s.db", 4, files=[], sbatch_args=["--wrap=x; rm -rf /"])
    with pytest.raises(DiagnoseError):
        write_array(str(tmp_path / "run 2"), "s.db", 4, files=[])
    done = cli("submit", str(logs), "--tasks", "2", "--run-dir", str(tmp_path / "dry"), "--dry-run")
    assert done.returncode == 0 and "(2 tasks)" in done.stdout


def test_epilog_environment_and_comment():
    assert job_ref_from_env({"SLURM_JOB_ID": "1234"}).slurm_id == "1234"
    assert job_ref_from_env({"SLURM_JOB_ID": "1240", "SLURM_ARRAY_JOB_ID": "1234",
                             "SLURM_ARRAY_TASK_ID": "6"}).slurm_id == "1234_6"
    with pytest.raises(DiagnoseError):
        job_ref_from_env({"SLURM_JOB_ID": "12; reboot"})
    with pytest.raises(DiagnoseError):
        job_ref_from_env({})
    assert safe_comment("diagnose: [OOM102] CUDA OOM\x1b[31m `x` $(y)") == "diagnose: [OOM102] CUDA OOM?[31m ?x? ?(y)"
    assert len(safe_comment("x" * 1000)) == 200
    # an epilog never fails (a failing per-node epilog drains the node)
    done = cli("epilog", "--store", "/nonexistent/dir/f.db")
    assert done.returncode == 0 and "diagnose fleet epilog:" in done.stderr


def test_fleet_schema_is_valid_and_printed_by_the_schema_command(capsys):
    from jsonschema import Draft202012Validator

    from diagnose.present.cli import main

    text = (REPO / "schemas" / "fleet-1.schema.json").read_text(encoding="utf-8")
    Draft202012Validator.check_schema(json.loads(text))
    assert main(["schema", "fleet"]) == 0
    assert capsys.readouterr().out == text


def test_progress_line_says_rate_and_eta():
    import io

    from diagnose.present.commands.fleet import ProgressLine

    out = io.StringIO()
    progress = ProgressLine(out, interval=0)
    progress.started -= 10  # 10 s ago
    progress(50, 200)
    progress(200, 200)
    first, last = out.getvalue().splitlines()
    assert first.startswith("fleet scan: 50/200 jobs (25%), 5.0 jobs/s, ETA 0:3")  # 150 jobs left at 5/s: ~30 s
    assert last.startswith("fleet scan: 200/200 jobs (100%)") and "elapsed" in last


def test_bulk_sacct_rows_place_outputs_and_count_gpus(tmp_path):
    from diagnose.fleet.slurm_source import FIELDS, gpus_of, job_from_row, list_ended_jobs, placed
    from diagnose.ingest.slurm.commands import CommandResult

    (tmp_path / "train-7b-41_3.out").write_text("log\n")
    header = FIELDS.replace(",", "|")
    lines = [
        header,
        f"41_3|44|prod|train-7b|alice|FAILED|1:0|0:0|2026-12-01T10:00:00|2026-12-01T12:00:00|7200|2|gpu[01-02]|"
        f"billing=16,cpu=16,gres/gpu=16,node=2|billing=16,cpu=16,gres/gpu=16,node=2|{tmp_path}|"
        "sbatch -o %x-%A_%a.out --array=0-9 train.sh --lr 1",
        f"45|45|prod|eval|bob|CANCELLED by 0|0:15|0:0|2026-12-01T10:00:00|2026-12-01T10:05:00|300|1|gpu03|"
        f"billing=8,cpu=8,node=1|billing=8,cpu=8,node=1|{tmp_path}|sbatch eval.sh",
        f"46_[5-9]|46|prod|train|alice|CANCELLED by 0|0:0|0:0|None|2026-12-01T10:00:00|0|0|None assigned|||{tmp_path}|",
    ]
    seen: list[list[str]] = []

    def runner(argv, timeout=30):
        seen.append(argv)
        return CommandResult(argv, 0, "\n".join(lines) + "\n", "")

    rows = list_ended_jobs("2026-12-01T00:00:00", "2026-12-02T00:00:00", name="train-7b", runner=runner)
    assert "--name=train-7b" in seen[0] and "--allusers" in seen[0] and "-X" in seen[0]
    assert [r.job_id for r in rows] == ["41_3", "45"]  # the pending array's placeholder row is left out
    assert rows[0].key == "slurm:prod:41_3"
    job = job_from_row(rows[0])
    assert (job.state, job.exit.code, job.elapsed_s, job.array_task_id) == ("FAILED", 1, 7200, 3)
    assert job.outputs[0].path == str(tmp_path / "train-7b-41_3.out") and placed(job)
    # AllocTRES's GPUs; a TRES list naming no GPU is a CPU job, 0 as in `slurm --failed` (qa-report-15 L7)
    assert gpus_of(rows[0], 8) == 16 and gpus_of(rows[1], 8) == 0
    other = job_from_row(rows[1])  # no -o: the default name, not there, so the worker would ask Slurm
    assert other.state == "CANCELLED" and other.outputs[0].path == str(tmp_path / "slurm-45.out")
    assert not placed(other)
    with pytest.raises(DiagnoseError):
        list_ended_jobs("a", "b", name="x; rm", runner=runner)


def test_epilog_takes_a_completing_job_final_state():
    from diagnose.fleet.epilog import settle_state
    from diagnose.ingest.slurm.job import SlurmJob
    from diagnose.ingest.slurm.jobid import parse_job_id
    from diagnose.ingest.slurm.parse import parse_exit_code

    def job(reason: str = "", exit_code: str = "0:0") -> SlurmJob:
        j = SlurmJob(ref=parse_job_id("7"), job_id="7", state="COMPLETING", reason=reason)
        j.exit = parse_exit_code(exit_code)
        return j

    cases = [(job(exit_code="1:0"), {"SLURM_JOB_EXIT_CODE2": "1:0"}, "FAILED"),
             (job(), {"SLURM_JOB_EXIT_CODE2": "0:0"}, "COMPLETED"),
             (job(), {"SLURM_JOB_EXIT_CODE2": "0:9"}, "FAILED"),
             (job(reason="TimeLimit", exit_code="0:15"), {}, "TIMEOUT")]
    for j, env, state in cases:
        settle_state(j, env)
        assert j.state == state and "COMPLETING" in j.notes[-1]
    done = SlurmJob(ref=parse_job_id("8"), job_id="8", state="CANCELLED")
    settle_state(done, {"SLURM_JOB_EXIT_CODE2": "1:0"})
    assert done.state == "CANCELLED" and not done.notes
