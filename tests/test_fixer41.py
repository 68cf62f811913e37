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


def test_the_rules_oom_fix_is_sized_by_the_memory_model_once(monkeypatch):
    """An activations OOM (GPT-2 large on a V100) whose rule fix is full recompute: capacity_fix sized that fix to
    see whether it may lead (_refuted_rule_fix), and replay_findings sized the same fix again for its REPLAY fit.
    It is sized once and the answer passed on; the replay's fit is the same answer."""
    from diagnose.explain import fit
    from diagnose.pipeline import AnalyzeOptions, analyze

    sized: list[tuple] = []
    memory_fit = fit.memory_fit

    def counted(report, view, overrides, finding=None):
        sized.append(tuple((o.key, o.value) for o in overrides if not o.key.startswith("env.")))
        return memory_fit(report, view, overrides, finding)

    monkeypatch.setattr(fit, "memory_fit", counted)
    report = analyze([str(ROOT / "corpus" / "dev" / "e-mlm-gpt2-large-v100-oom-core-attention.log")], AnalyzeOptions())
    assert report.root is not None and report.memory is not None and report.memory.verdict == "activations"
    own = tuple((o.key, o.value) for o in report.root.fix.overrides)
    assert own and sized == [own]
    again = memory_fit(report, report.config, report.replay.fit.overrides, report.root)
    assert report.replay.fit == again


def test_a_worded_override_compares_as_its_plain_override_and_says_why_by_hand():
    """WordedOverride's hand-written __eq__ stays (a generated one compares only instances of one class): its
    docstring says exactly why, and the comparison is the plain override's, both ways, whatever the words."""
    from dataclasses import asdict

    from diagnose.model import Finding, Fix, Override, WordedOverride

    reason = WordedOverride.__eq__.__doc__ or ""
    assert "generated" in reason and "same class" in reason and "asdict" in reason
    worded = WordedOverride("ddp.grad_reduce_in_fp32", False, "(remove --accumulate-allreduce-grads-in-fp32)")
    plain = Override("ddp.grad_reduce_in_fp32", False)
    assert worded == plain and plain == worded and (worded != plain) is False and plain in [worded]
    assert worded == WordedOverride("ddp.grad_reduce_in_fp32", False, "other words")
    assert worded != Override("ddp.grad_reduce_in_fp32", True) and worded != ("ddp.grad_reduce_in_fp32", False)
    finding = Finding(rule="x", name="x", title="t", category="cuda_oom", phase="training", severity="error",
                      role="root", confidence=1.0, fix=Fix(overrides=[plain]))
    assert asdict(finding)["fix"]["overrides"] == [{"key": "ddp.grad_reduce_in_fp32", "value": False}]
