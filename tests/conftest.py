"""Shared fixtures: the built-in catalogue (loaded once) and a factory for small in-test rules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from diagnose.match import match_text
from diagnose.match.rules import Catalogue, load_catalogue, parse_rule
from diagnose.model import Finding

REAL_LOGS = Path(__file__).resolve().parents[2] / "shared" / "real_logs"
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


def make_rule(code: str, anchor: str, regex: str, **fields):
    """A rule built through the real schema parser (so tests exercise the same validation as TOML files)."""
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
    return parse_rule(raw, fields.get("source", "test"))


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


def pytest_collection_modifyitems(config, items):
    """Tests on the one local Slurm cluster share its queue and accounting: run them on one xdist worker, one after
    the other (scripts/test.sh passes --dist loadgroup). Run side by side, the fleet tests' 320-job arrays held the
    other tests' jobs in the queue past their timeouts and their sacct windows counted each other's jobs."""
    for item in items:
        if item.get_closest_marker("slurm") is not None:
            item.add_marker(pytest.mark.xdist_group("slurm-cluster"))
