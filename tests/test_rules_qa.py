"""Rules fixed after the QA report: MB101's versions text (QA #12), Bridge #1971/#2022 update_successful (QA #18)."""

from __future__ import annotations

from diagnose.match import match_text
from diagnose.match.rules import load_catalogue

CATALOGUE = load_catalogue()

MB1971 = """Setting rerun_state_machine.current_iteration to 0...
Starting training loop at iteration 0
[rank18]: Traceback (most recent call last):
[rank18]:   File "/opt/Megatron-Bridge/src/megatron/bridge/training/pretrain.py", line 134, in _pretrain
[rank18]:     train(
[rank18]:   File "/opt/Megatron-Bridge/src/megatron/bridge/training/train.py", line 338, in train
[rank18]:     ) = train_step(
[rank18]:         ^^^^^^^^^^^
[rank18]:   File "/opt/Megatron-Bridge/src/megatron/bridge/training/train.py", line 682, in train_step
[rank18]:     assert update_successful
[rank18]: AssertionError
"""


def _rule(code: str):
    return next(r for r in CATALOGUE.rules if r.code == code)


def test_mb101_does_not_invent_a_megatron_core_bound():
    rule = _rule("MB101")
    text = " ".join([rule.versions, rule.doc, rule.explanation])
    assert "megatron-core <= 0.17" not in text
    assert ">= 0.5.0" in rule.versions
    assert "never taken" in rule.doc


def test_bridge_train_step_update_successful_assert_is_mb144_not_generic():
    report = match_text(MB1971, CATALOGUE)
    root = report.root
    assert root.rule == "MB144" and root.category == "fsdp_config" and root.ranks == [18]
    assert "ddp.megatron_fsdp_use_decoupled_grad=true" in root.fix.summary
    assert any("1971" in link for link in _rule("MB144").links)


def test_a_bare_assertion_elsewhere_stays_generic():
    text = MB1971.replace("assert update_successful", "assert args.micro_batch_size > 0")
    assert match_text(text, CATALOGUE).root.rule == "PY002"
