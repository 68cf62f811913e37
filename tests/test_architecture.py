"""The pipeline is the architecture (docs/ARCHITECTURE.md): ingest -> normalize -> match -> explain -> orchestrate
(pipeline.py, checking.py, slurm_*.py) -> present. A stage never imports a later one, read from the source (every import
statement, lazy ones inside functions too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "diagnose"
ORDER = ["ingest", "normalize", "match", "explain", "orchestrate", "present"]
# the orchestration layer: modules beside the stage packages that wire the stages for the commands and screens
ORCHESTRATION = ("pipeline", "checking", "slurm_diagnosis", "slurm_follow")
# Known edges that go the other way, each with its reason; a new one fails this test until it is justified here.
ALLOWED = {
    # the Slurm job rules (SJ001-SJ012) are catalogue rules: ingest/slurm/findings.py reads them, lazily
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
    if len(parts) < 2 or parts[0] != "diagnose":
        return None
    return "orchestrate" if parts[1] in ORCHESTRATION else parts[1]


def _files(stage: str) -> list[Path]:
    if stage == "orchestrate":
        return [PACKAGE / f"{name}.py" for name in ORCHESTRATION]
    return sorted((PACKAGE / stage).rglob("*.py"))


@pytest.mark.parametrize("stage", ORDER)
def test_no_stage_imports_a_later_stage(stage):
    later = set(ORDER[ORDER.index(stage) + 1:])
    bad = sorted(
        f"{path.relative_to(PACKAGE)} imports {module}"
        for path in _files(stage)
        for module in _imports(path)
        if _stage(module) in later and (stage, _stage(module)) not in ALLOWED
    )
    assert not bad, bad


def test_commands_and_screens_wire_no_stage_for_check_and_replay():
    """check, replay and the TUI plan screen only parse arguments, call the orchestration layer (diagnose.checking)
    and render (issue 17: four places wired the stages, the plan screen through a private helper of the check
    command)."""
    fit = {f"diagnose.explain.fit.{f}" for f in ("capacity_fix", "apply_fit", "memory_fit", "apply_memory_fit")}
    wiring = fit | {"diagnose.explain.replay.replay", "diagnose.explain.memory.plan.memory_plan",
                    "diagnose.explain.memory.plan.fix_plan", "diagnose.explain.memory.replay_check.prove",
                    "diagnose.explain.config.apply_defaults", "diagnose.explain.config.apply_overrides",
                    "diagnose.match.scan_and_match", "diagnose.ingest.open_inputs", "diagnose.present.commands.check."}
    screens = ["commands/check.py", "commands/replay.py", "commands/tui.py", "tui/plan.py"]
    used = {name: _imported_names(PACKAGE / "present" / name) for name in screens}
    bad = sorted(f"{name} imports {n}" for name, names in used.items() for n in names
                 if any(n == w or (w.endswith(".") and n.startswith(w)) for w in wiring)
                 and not (name == "commands/tui.py" and n.endswith(".capacity_from_args")))  # argument parsing
    assert not bad, bad
    assert all(any(n.startswith("diagnose.checking.") for n in used[name]) for name in screens)


def _imported_names(path: Path) -> set[str]:
    """``module.name`` for every ``from module import name`` in the file."""
    return {f"{node.module}.{a.name}" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and node.module for a in node.names}


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
