"""QA round 16 (helper qa16): a hostile user of the OOM path (overrides applied, check at scale, TUI, schemas).
Each test failed before its fix."""

from __future__ import annotations

from diagnose.checking import fix_text
from diagnose.model import Override


def test_a_megatron_lm_plan_back_to_plain_ddp_removes_the_distributed_optimizer_flag_once():
    """`check examples/mlm_args.txt --gpus 256`: the plain-DDP plan read "(remove --use-distributed-optimizer)
    (remove --use-distributed-optimizer)": ddp.* and optimizer.use_distributed_optimizer are one Megatron-LM flag."""
    plan = [Override("ddp.use_megatron_fsdp", False), Override("ddp.use_distributed_optimizer", False),
            Override("optimizer.use_distributed_optimizer", False)]
    text = fix_text(plan, mlm=True)
    assert text.count("--use-distributed-optimizer") == 1
    assert text == "(remove --use-megatron-fsdp) (remove --use-distributed-optimizer)"
    # the Bridge words keep both keys: they are two fields there
    assert fix_text(plan).count("use_distributed_optimizer=false") == 2
