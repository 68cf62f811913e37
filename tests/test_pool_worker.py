"""Pool workers forked from a command that catches SIGTERM (present/supervise.py) must not inherit that handler: the
pool's own shutdown SIGTERMs its workers, and an inherited handler turned it into a ``Terminated`` exception in each
worker (a stray line on stderr; a worker stopped mid-write can hang the pool: a fleet scan did, in CI)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = textwrap.dedent("""
    import multiprocessing, signal, sys, time
    from diagnose.present.supervise import _catch_sigterm
    from diagnose.pool_worker import quiet_worker_signals

    def handlers(_):
        return (signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, signal.getsignal(signal.SIGINT) is signal.SIG_IGN)

    def nap(_):
        time.sleep(30)

    _catch_sigterm()  # the command's own handler, as every diagnose command installs it
    init = quiet_worker_signals if sys.argv[1] == "quiet" else None
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2, initializer=init) as pool:
        print(pool.map(handlers, range(2)), flush=True)
        pool.map_async(nap, range(2))
        time.sleep(0.5)  # both workers are inside a task when the block ends: Pool.terminate SIGTERMs them
    print("done", flush=True)
""")


def _run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_commands_sigterm_handler_raised_in_the_pools_workers():
    """The defect as it was: without the initializer the workers carry the handler and die with Terminated."""
    done = _run("inherited")
    assert "done" in done.stdout
    assert "[(False, False), (False, False)]" in done.stdout
    assert "Terminated" in done.stderr


@pytest.mark.parametrize("attempt", range(2))
def test_pool_workers_take_sigterms_default_and_leave_sigint_to_the_parent(attempt):
    done = _run("quiet")
    assert done.returncode == 0, done.stderr
    assert "[(True, True), (True, True)]" in done.stdout and "done" in done.stdout
    assert "Terminated" not in done.stderr


def test_the_fleet_scan_and_the_parallel_scan_use_it():
    for path in ("diagnose/fleet/scan.py", "diagnose/match/parallel.py"):
        text = (ROOT / path).read_text(encoding="utf-8")
        assert "initializer=quiet_worker_signals" in text and "pool.join()" in text, path
