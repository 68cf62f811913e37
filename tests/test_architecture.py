"""The pipeline is the architecture (docs/ARCHITECTURE.md): ingest -> normalize -> match -> explain -> present. A
stage never imports a later one, read from the source (every import statement, lazy ones inside functions too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "diagnose"
ORDER = ["ingest", "normalize", "match", "explain", "present"]
# Known edges that go the other way, each with its reason; a new one fails this test until it is justified here.
ALLOWED = {
    # the Slurm job rules (SJ001-SJ011) are catalogue rules: ingest/slurm/findings.py reads them, lazily
    ("ingest", "match"),
}


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "diagnose" else None


@pytest.mark.parametrize("stage", ORDER)
def test_no_stage_imports_a_later_stage(stage):
    later = set(ORDER[ORDER.index(stage) + 1:])
    bad = sorted(
        f"{path.relative_to(PACKAGE)} imports {module}"
        for path in (PACKAGE / stage).rglob("*.py")
        for module in _imports(path)
        if _stage(module) in later and (stage, _stage(module)) not in ALLOWED
    )
    assert not bad, bad


def test_the_neutral_text_module_is_the_one_match_uses():
    """Making log text inert is knowledge every stage needs; it lives outside present (issue 17: match re-parsed
    its own evidence through a presenter module)."""
    assert "diagnose.inert" in _imports(PACKAGE / "match" / "findings.py")
    assert not any(m.startswith("diagnose.present") for m in _imports(PACKAGE / "match" / "findings.py"))


@pytest.mark.parametrize("name", ["model.py", "configview.py", "explained.py"])
def test_the_report_types_import_no_stage(name):
    """Report.config / replay / verify are typed objects (issue 17): ConfigView, ReplayResult, VerifyResult live in
    stage-neutral modules that every stage may import, so they import no stage themselves."""
    assert not sorted(m for m in _imports(PACKAGE / name) if _stage(m) in ORDER)


def test_report_sections_are_typed_not_dicts():
    import typing

    from diagnose.configview import ConfigView
    from diagnose.explained import ReplayResult, VerifyResult
    from diagnose.memory_types import MemoryAnalysis
    from diagnose.model import Finding, FindingReplay, Fix, Report

    hints = typing.get_type_hints(Report, localns={"ConfigView": ConfigView, "ReplayResult": ReplayResult,
                                                   "VerifyResult": VerifyResult, "MemoryAnalysis": MemoryAnalysis})
    assert hints["config"] == ConfigView | None and hints["memory"] == MemoryAnalysis | None
    assert hints["replay"] == ReplayResult | None and hints["verify"] == VerifyResult | None
    finding = typing.get_type_hints(Finding)
    assert finding["replay"] == FindingReplay | None and finding["proven_fix"] == Fix | None
