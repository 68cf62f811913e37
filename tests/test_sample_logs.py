"""Every sample log's diagnosis matches its ``<name>.expected.json`` (format: docs/ARCHITECTURE.md).

Runs the real pipeline (``diagnose.pipeline.analyze``) on each ``sample_logs/**/*.log``, including the logs the GPU
engineer captures under ``sample_logs/captured/``. Checked: the root cause's rule, category, phase and ranks,
that ``findings_include`` rules are among the findings, that ``fix_keys`` (override keys or environment variable
names) are in the root cause's fix, and, for a few logs, the exit code of ``diagnose analyze`` via the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose.model import CATEGORIES, PHASES
from diagnose.pipeline import AnalyzeOptions, analyze

SAMPLES = Path(__file__).resolve().parent.parent / "sample_logs"
LOGS = sorted(p for p in SAMPLES.rglob("*.log") if "reproduce" not in p.relative_to(SAMPLES).parts)
EXIT_CODE_VIA_CLI = {"fsdp2_pg_collection", "b062_ckpt_format_new", "ddp_wrap_oom", "clean_run", "cascade_512_ranks_oom"}


def _expected(log: Path) -> dict:
    path = log.with_name(log.name[: -len(".log")] + ".expected.json")
    assert path.is_file(), f"{log.relative_to(SAMPLES)} has no {path.name}"
    return json.loads(path.read_text(encoding="utf-8"))


def _id(p: Path) -> str:
    return str(p.relative_to(SAMPLES))


def test_there_are_enough_sample_logs():
    top = [p for p in LOGS if p.parent == SAMPLES]
    assert len(top) >= 25
    real = [p for p in top if _expected(p)["source"].startswith("real:")]
    assert len(real) >= 8


# ../shared beside the checkout (CI lays a copy there); /work/shared on the development machines.
REAL_LOGS = next(
    (d for d in (SAMPLES.parent.parent / "shared" / "real_logs", Path("/work/shared/real_logs")) if d.is_dir()),
    Path("/work/shared/real_logs"),
)
SHARED_COPIES = [
    p for p in LOGS if p.parent == SAMPLES and _expected(p)["source"].startswith("real: ../shared/real_logs/")
]


@pytest.mark.parametrize("log", SHARED_COPIES, ids=_id)
def test_real_logs_are_kept_byte_for_byte(log: Path):
    """A log tagged as a real capture from ../shared/real_logs must be that file, unedited."""
    original = REAL_LOGS / log.name
    if not original.is_file():
        pytest.skip("the shared capture folder is not on this machine (CI)")
    assert log.read_bytes() == original.read_bytes()


@pytest.mark.parametrize("log", LOGS, ids=_id)
def test_expected_file_is_well_formed(log: Path):
    exp = _expected(log)
    assert isinstance(exp.get("source"), str) and exp["source"].split(":")[0] in ("real", "synthetic")
    assert "root_cause" in exp
    root = exp["root_cause"]
    if root is not None:
        assert root["category"] in CATEGORIES
        assert root.get("phase", "unknown") in PHASES


@pytest.mark.parametrize("log", LOGS, ids=_id)
def test_sample_log_diagnosis(log: Path):
    exp = _expected(log)
    report = analyze([str(log)], AnalyzeOptions(jobs=1))
    codes = [f.rule for f in report.findings]
    want = exp["root_cause"]
    if want is None:
        assert report.root is None, f"expected no failure, got root {report.root and report.root.rule} ({codes})"
        return
    root = report.root
    assert root is not None, f"no root cause; findings: {codes}"
    summary = f"root {root.rule} {root.category}/{root.phase} ranks {root.ranks}; findings {codes}"
    if "rule" in want:
        assert root.rule == want["rule"], summary
    assert root.category == want["category"], summary
    if "phase" in want:
        assert root.phase == want["phase"], summary
    if "ranks" in want:
        assert sorted(root.ranks) == sorted(want["ranks"]), summary
    for code in exp.get("findings_include", []):
        assert code in codes, f"{code} not among the findings: {summary}"
    keys = {o.key for o in root.fix.overrides} | {e.name for e in root.fix.env}
    for key in exp.get("fix_keys", []):
        assert key in keys, f"fix of {root.rule} lacks {key}: {sorted(keys)}"
    for ev in root.evidence:
        assert ev.line >= 1 and ev.path.endswith(log.name)


@pytest.mark.parametrize("name", sorted(EXIT_CODE_VIA_CLI))
def test_exit_code_via_cli(name: str, capsys):
    from diagnose.present.cli import main

    log = SAMPLES / f"{name}.log"
    exp = _expected(log)
    rc = main(["analyze", str(log), "--format", "json", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == exp["exit_code"], out[-2000:]
    report = json.loads(out)
    if exp["root_cause"] is None:
        assert report["root_cause"] is None
    else:
        assert report["findings"][report["root_cause"]]["rule"] == exp["root_cause"]["rule"]
