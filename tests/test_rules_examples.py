"""Every rule's examples through the real matcher (``diagnose.match.match_text``), one test per rule code.

A ``match`` example must produce a finding of its rule with the whole built-in catalogue loaded (so a later, more
specific rule stealing the line shows up here); a ``no_match`` example must not.
"""

from __future__ import annotations

import pytest

from diagnose.ingest.slurm.findings import findings_of_scontrol
from diagnose.match import match_text
from diagnose.match.rules import Rule, load_catalogue
from diagnose.match.slurm_nodes import findings_of_scontrol_node

CATALOGUE = load_catalogue()
RULES = CATALOGUE.rules


def _codes(text: str, backend: str = "python", rule: Rule | None = None) -> list[str]:
    if rule is not None and rule.input == "slurm_job":
        return [f.rule for f in findings_of_scontrol(text)]
    if rule is not None and rule.input == "slurm_node":
        return [f.rule for f in findings_of_scontrol_node(text)]
    return [f.rule for f in match_text(text, CATALOGUE, backend=backend).findings]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_match_examples_give_the_rule(rule):
    assert rule.examples_match, f"{rule.code} has no match example"
    for n, example in enumerate(rule.examples_match, 1):
        codes = _codes(example, rule=rule)
        assert rule.code in codes, f"{rule.code} match example {n} gave {codes}: {example[:200]!r}"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_no_match_examples_do_not_give_the_rule(rule):
    assert rule.examples_no_match, f"{rule.code} has no no_match example"
    for n, example in enumerate(rule.examples_no_match, 1):
        codes = _codes(example, rule=rule)
        assert rule.code not in codes, f"{rule.code} no_match example {n} gave it: {example[:200]!r}"


@pytest.mark.parametrize("code", ["MB101", "MB111", "OOM102", "NC010", "SL007"])
def test_default_backend_agrees_on_key_rules(code):
    """The same answers with the default phase-1 engine (hyperscan/re2 when installed) as with pure Python."""
    rule = CATALOGUE.by_code(code)
    for example in rule.examples_match + rule.examples_no_match:
        assert _codes(example, "auto") == _codes(example, "python")


def test_match_text_reports_rule_metadata():
    """The finding carries the rule's category, phase, fix and the example's evidence line."""
    text = "[rank0]: TypeError: TorchFullyShardedDataParallel.__init__() got an unexpected keyword argument 'pg_collection'"
    report = match_text(text, CATALOGUE, backend="python")
    root = report.root
    assert root is not None and root.rule == "MB101"
    assert (root.category, root.phase, root.ranks) == ("fsdp_config", "dp_wrap", [0])
    assert {o.key: o.value for o in root.fix.overrides}["dist.use_torch_fsdp2"] is False
    assert root.evidence[0].line == 1
