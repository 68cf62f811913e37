"""fixer42: qa-report-13's leftovers L3, L6, L7, L4."""

from __future__ import annotations

from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"


def test_headline_fix_words_the_sharding_plan_in_a_sentence():
    """L3: ddp_wrap_oom's headline fix put the plan table's short label ("fsdp:optim_grads_params on 8 GPUs")
    inside a sentence; it reads in words, the sharding value being the one its override sets."""
    from diagnose.pipeline import analyze

    report = analyze([str(SAMPLES / "ddp_wrap_oom.log")])
    summary = report.root.shown_fix.summary
    assert "fsdp:" not in summary
    assert "Megatron FSDP, sharding optim_grads_params, on 8 GPUs" in summary
    assert summary.startswith("needs >= 8 GPUs")
    # the label itself (the options list, the JSON, check's table) keeps its short name
    assert report.replay.fit.label == "fsdp:optim_grads_params on 8 GPUs"


def test_worded_label():
    from diagnose.explain.memory.options import worded_label

    assert worded_label("fsdp:optim_grads_params + bf16 grads on 16 GPUs") == \
        "Megatron FSDP, sharding optim_grads_params, with bf16 grads, on 16 GPUs"
    assert worded_label("distributed_optimizer on 4 GPUs") == "the distributed optimizer on 4 GPUs"
    assert worded_label("fsdp:optim_grads") == "Megatron FSDP, sharding optim_grads"
    assert worded_label("micro batch 2 + selective recompute") == "micro batch 2 + selective recompute"


THC_OOM = """\
THCudaCheck FAIL file=/opt/conda/conda-bld/pytorch_1532579245307/work/aten/src/THC/generic/THCStorage.cu line=58 error=2 : out of memory
Traceback (most recent call last):
  File "train_model.py", line 247, in train
    outputs = model(inputs)
  File "/opt/conda/lib/python3.6/site-packages/torch/nn/modules/conv.py", line 301, in forward
    self.padding, self.dilation, self.groups)
RuntimeError: cuda runtime error (2) : out of memory at /opt/conda/conda-bld/pytorch_1532579245307/work/aten/src/THC/generic/THCStorage.cu:58
"""


def test_thc_cuda_runtime_error_2_is_a_cuda_oom_rule():
    """L6: PyTorch 0.4's THC wording of a CUDA OOM has its own rule (it was PY001, the category only inferred)."""
    from diagnose.match import match_text
    from diagnose.match.rules import load_catalogue

    root = match_text(THC_OOM, load_catalogue()).root
    assert root is not None and root.rule == "OOM004"
    assert root.category == "cuda_oom" and root.basis == "rule"
    assert "batch" in root.fix.summary


DCP_SIZE_MISMATCH = """\
Traceback (most recent call last): (RANK 0)
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/checkpoint/state_dict_loader.py", line 218, in local_step
    local_plan = planner.create_local_plan()
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/checkpoint/default_planner.py", line 364, in create_default_local_load_plan
    raise ValueError(
ValueError: Size mismatch between saved torch.Size([257152, 2048]) and current: torch.Size([131661824]) for fsdp_checkpoint.model.embed_tokens.weight
"""

HYBRID_1D_MESH = """\
Traceback (most recent call last):
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py", line 454, in __init__
    _init_process_group_state(
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/fsdp/_init_utils.py", line 175, in _init_process_group_state_for_hybrid_shard
    raise ValueError(
ValueError: Expected device_mesh to have ndim=2 but got 1
"""


def test_dcp_load_planner_size_mismatch_is_a_checkpoint_format_rule():
    """L7: DCP's load planner refusing a tensor's size (it was PY001, the fix generic) is CK021, at load."""
    from diagnose.match import match_text
    from diagnose.match.rules import load_catalogue

    root = match_text(DCP_SIZE_MISMATCH, load_catalogue()).root
    assert root is not None and root.rule == "CK021"
    assert (root.category, root.phase, root.basis) == ("checkpoint_format", "checkpoint_load", "rule")
    assert root.facts.get("saved") == "torch.Size([257152, 2048])"
    assert "use_orig_params=True" in " ".join(root.fix.steps)


def test_fsdp_hybrid_shard_with_a_1d_mesh_is_an_fsdp_config_rule():
    """L7: FSDP's hybrid sharding given a 1-D device mesh (it was PY001) is MB243, at DP wrap."""
    from diagnose.match import match_text
    from diagnose.match.rules import load_catalogue

    root = match_text(HYBRID_1D_MESH, load_catalogue()).root
    assert root is not None and root.rule == "MB243"
    assert (root.category, root.phase, root.basis) == ("fsdp_config", "dp_wrap", "rule")
    assert "2-D" in root.fix.summary and "full" in root.fix.summary


def test_a_plan_that_changes_the_global_batch_carries_the_value() -> None:
    """L4: check examples/run_config.yaml --gpus 8 with micro batch 4 of a global 16: the Megatron FSDP plan keeps
    DP 8 and micro batch 4; its cost said it changes train.global_batch_size (16 is not divisible by 32) but its
    overrides carried no value (replay extends a plan only for violations the plan itself causes)."""
    from diagnose.checking import CheckRequest, check
    from diagnose.explain.memory.gpus import GIB

    root = Path(__file__).resolve().parents[1]
    result = check(CheckRequest(str(root / "examples" / "run_config.yaml"), 8, 80 * GIB,
                                ["train.micro_batch_size=4", "train.global_batch_size=16"]))
    changing = [p for p in result.memory.plans[1:] if "changes train.global_batch_size" in p.cost]
    assert changing
    for p in changing:
        values = [o.value for o in p.overrides if o.key == "train.global_batch_size"]
        assert values and values[0] % (4 * p.dp) == 0, (p.label, p.cost, p.overrides)
        assert p.valid is not False
    fsdp = next(p for p in changing if p.strategy == "fsdp:optim_grads_params" and p.dp == 8)
    assert any(o.key == "train.global_batch_size" and o.value == 32 for o in fsdp.overrides)
    assert "16 -> 32" in fsdp.cost
