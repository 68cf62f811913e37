"""fixer41: the known leftovers of stop 39 (code quality: each fact in one place).

Each test failed on the tree before its fix."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_oom190s_words_for_a_demand_oom_are_the_rules_data_not_code():
    """OOM190's title and Why for an OOM whose numbers say demand, not fragmentation, were written in
    diagnose/explain/__init__.py. A message is taught once, in rules/: they are the rule's [rule.numbers_say_demand]
    table, and the finding says what that table says."""
    import inspect

    import diagnose.explain as explain
    from diagnose.match.rules import load_catalogue
    from diagnose.pipeline import AnalyzeOptions, analyze

    rule = load_catalogue().by_code("OOM190")
    assert rule is not None and rule.numbers_say_demand is not None
    title, why = rule.numbers_say_demand.title, rule.numbers_say_demand.explanation
    assert "not fragmentation" in title and "{numbers}" in why
    assert "not fragmentation" not in inspect.getsource(explain)
    log = ROOT / "corpus" / "dev" / "ck-thunder-litgpt-fsdp-8gpu-activation-checkpointing-regression-oom-backward.log"
    root = analyze([str(log)], AnalyzeOptions()).root
    assert root is not None and root.rule == "OOM190"
    assert root.title == title
    lead = why.split("{numbers}")[0].strip()
    assert " ".join(root.explanation.split()).startswith(" ".join(lead.split()))
    assert "Free memory first" in root.explanation
