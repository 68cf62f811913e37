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


def test_optimizer_step_oom_inside_the_distributed_optimizer_does_not_suggest_turning_it_on():
    text = ("Traceback (most recent call last):\n"
            '  File "/opt/megatron/core/optimizer/distrib_optimizer.py", line 2350, in step\n'
            "    update_successful, grad_norm, num_zeros = super().step()\n"
            '  File "/usr/lib/python3/dist-packages/torch/optim/adam.py", line 160, in _init_group\n'
            "    state[\"exp_avg\"] = torch.zeros_like(p, memory_format=torch.preserve_format)\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 3 has a total capacity of "
            "79.10 GiB of which 1.05 GiB is free.\n")
    root = match_text(text, CATALOGUE).root
    assert root.rule == "OOM111" and root.phase == "optimizer_step"
    assert "ddp.use_distributed_optimizer" not in {o.key for o in root.fix.overrides}


def test_megatron_fsdp_version_error_gets_the_version_fix_not_the_sharding_fix():
    text = ('Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
            "ValueError: Unsupported megatron_fsdp_version: 3\n")
    root = match_text(text, CATALOGUE).root
    assert root.rule == "MB145"
    assert [(o.key, o.value) for o in root.fix.overrides] == [("ddp.megatron_fsdp_version", 1)]


def test_fsdp_dtensor_not_available_phase_follows_save_or_load():
    save = "RuntimeError: Megatron FSDP is required but not available for saving FSDP DTensor checkpoints.\n"
    load = "RuntimeError: Megatron FSDP is required but not available for loading FSDP DTensor checkpoints.\n"
    assert match_text(save, CATALOGUE).root.phase == "checkpoint_save"
    assert match_text(load, CATALOGUE).root.phase == "checkpoint_load"
