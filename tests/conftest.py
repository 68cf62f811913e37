"""Shared fixtures: the built-in catalogue (loaded once), a factory for small in-test rules, the local Slurm cluster."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagnose.match import match_text
from diagnose.match.rules import Catalogue, load_catalogue, parse_rule
from diagnose.model import Finding, LogLine, Report
from diagnose.normalize import normalize_line
from diagnose.normalize.phases import CAPTURES as PHASE_CAPTURES
from diagnose.pipeline import AnalyzeOptions, analyze

REPO = Path(__file__).resolve().parents[1]
# a short CUDA OOM traceback of the job's own script: an error that a detector of a training signal (a flat loss, an
# exploding grad norm) must leave the root cause (test_match_flat_loss, test_match_grad_norm)
CUDA_OOM_TRACEBACK = [
    "Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 1.02 GiB is free."]
REAL_LOGS = Path(__file__).resolve().parents[2] / "shared" / "real_logs"
SLURM_LOCAL_DIR = Path(os.environ.get("SLURM_LOCAL_DIR", "/tmp/slurm-local"))
# the memory benchmark's record readers (predict_state, predict_activations), which the calibration tests share
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "memory_calibration"))


@pytest.fixture(scope="session")
def builtin_catalogue() -> Catalogue:
    return load_catalogue()


def root_finding(catalogue: Catalogue, lines: list[str]) -> Finding:
    """The finding ``match_text`` picks as the root cause of one log made of ``lines`` (there must be one)."""
    report = match_text("\n".join(lines) + "\n", catalogue)
    assert report.root_cause is not None
    return report.findings[report.root_cause]


def analyzed(tmp_path: Path, text: str) -> Report:
    """The whole pipeline (``analyze``, no replay) on a log file holding ``text``."""
    path = tmp_path / "job.log"
    path.write_text(text)
    return analyze([str(path)], AnalyzeOptions(replay=False))


def analyzed_root(tmp_path: Path, text: str) -> Finding:
    """The root cause ``analyze`` reports for a log file holding ``text`` (there must be one)."""
    return next(f for f in analyzed(tmp_path, text).findings if f.role == "root")


def phase_markers(text: str, path: str = "job.log") -> list[tuple[str, LogLine]]:
    """What the scanner collects with the phase CAPTURES: (capture name, line) for each line a marker matches."""
    out = []
    for i, raw in enumerate(text.splitlines()):
        line = normalize_line(raw, path, i + 1)
        out.extend((spec.name, line) for spec in PHASE_CAPTURES
                   if spec.anchor in line.text and (spec.regex is None or re.search(spec.regex, line.text)))
    return out


def lines_after(texts: list[str]) -> list[LogLine]:
    """``texts`` as the log lines a crash report printed after its first line (they start at line 2)."""
    return [LogLine(path="x.log", lineno=i + 2, raw=t, text=t) for i, t in enumerate(texts)]


def make_rule(code: str, anchor: str, regex: str, **fields):
    """A rule built through the real schema parser (so tests exercise the same validation as TOML files)."""
    source = fields.pop("source", "test")
    raw = {
        "code": code,
        "slug": code.lower(),
        "title": fields.pop("title", f"Rule {code}"),
        "category": fields.pop("category", "other"),
        "phase": fields.pop("phase", "training"),
        "role": fields.pop("role", "root"),
        "severity": fields.pop("severity", "error"),
        "explanation": fields.pop("explanation", f"explanation of {code}"),
        "patterns": [{"anchor": anchor, "regex": regex}],
    }
    raw.update(fields)
    return parse_rule(raw, source)


def make_catalogue(*rules) -> Catalogue:
    rules = list(rules)
    for i, r in enumerate(rules):
        r.order = i
    return Catalogue(rules)


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory):
    """Each test session (each xdist worker) gets its own diagnose cache, so no test reads a count cached by
    another run or by the user's own ~/.cache/diagnose; subprocesses inherit it through the environment."""
    import os

    previous = os.environ.get("DIAGNOSE_CACHE_DIR")
    os.environ["DIAGNOSE_CACHE_DIR"] = str(tmp_path_factory.mktemp("diagnose-cache"))
    yield
    if previous is None:
        os.environ.pop("DIAGNOSE_CACHE_DIR", None)
    else:
        os.environ["DIAGNOSE_CACHE_DIR"] = previous


def config_view(values: dict, framework: str = "megatron-bridge"):
    """A Megatron-Bridge config as a file would give it (every value from ``file:cfg``), with release defaults."""
    from diagnose.explain.config import ConfigView, apply_defaults

    view = ConfigView(framework=framework)
    for k, v in values.items():
        view.set(k, v, "file:cfg")
    return apply_defaults(view)


def render_to_string(report, color: str = "never", width: int = 100, detail: str = "verbose") -> str:
    """The text report as ``diagnose analyze`` prints it, at ``width`` columns."""
    import io

    from diagnose.present.text import make_console, render

    buf = io.StringIO()
    render(report, make_console(buf, color, width), detail)
    return buf.getvalue()


def wait_for_file(folder: Path, deadline_s: float = 30.0) -> None:
    """Wait until something non-empty is written under ``folder`` (a worker spooling its input)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if any(p.is_file() and p.stat().st_size > 0 for p in folder.rglob("*")):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing was spooled into {folder}")


async def settle(pilot, until, seconds: float = 20) -> None:
    """Let a Textual app run (Pilot) until ``until()`` holds, failing after ``seconds``."""
    for _ in range(int(seconds / 0.1)):
        await pilot.pause(0.1)
        if until():
            return
    raise AssertionError("timed out")


def pytest_collection_modifyitems(config, items):
    """Tests on the one local Slurm cluster share its queue and accounting: run them on one xdist worker, one after
    the other (scripts/test.sh passes --dist loadgroup). Run side by side, the fleet tests' 320-job arrays held the
    other tests' jobs in the queue past their timeouts and their sacct windows counted each other's jobs."""
    for item in items:
        if item.get_closest_marker("slurm") is not None:
            item.add_marker(pytest.mark.xdist_group("slurm-cluster"))


def slurm_unavailable(reason: str):
    """Skip a test that needs the local Slurm cluster, except in CI (CI=1), where it must run: fail."""
    if os.environ.get("CI"):
        pytest.fail(f"the local Slurm cluster is required in CI: {reason}")
    pytest.skip(reason)


def local_slurm_env(honour_skip: bool = True) -> dict[str, str]:
    """The environment for Slurm commands and ``python -m diagnose`` on the project's local cluster, after
    ``scripts/slurm-local.sh up`` (idempotent; the cluster is left running: .ci/run or the user stops it).
    ``honour_skip=False``: run even with DIAGNOSE_SKIP_SLURM=1, as tests/test_slurm_cluster.py always has."""
    if honour_skip and os.environ.get("DIAGNOSE_SKIP_SLURM") == "1":
        pytest.skip("DIAGNOSE_SKIP_SLURM=1")
    if os.geteuid() != 0:
        slurm_unavailable("scripts/slurm-local.sh needs root")
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        slurm_unavailable("no apt-get to install Slurm and Slurm is not installed")
    env = dict(os.environ, SLURM_LOCAL_MIN_JOB_AGE="60")
    up = subprocess.run(["bash", str(REPO / "scripts" / "slurm-local.sh"), "up"], env=env, capture_output=True,
                        text=True, timeout=900)
    if up.returncode != 0:
        slurm_unavailable(f"slurm-local.sh up failed: {up.stderr.strip().splitlines()[-1:]}")
    env["SLURM_CONF"] = str(SLURM_LOCAL_DIR / "etc" / "slurm.conf")
    env["PYTHONPATH"] = str(REPO)
    for name in ("SBATCH_OUTPUT", "SBATCH_ERROR", "DIAGNOSE_SKIP_SLURM"):
        env.pop(name, None)
    return env
