"""QA round 18 (helper qa18): every override diagnose prints, checked against Megatron-LM's argparse
(megatron/training/arguments.py) and Megatron-Bridge's config dataclasses. Each test failed before its fix."""

from __future__ import annotations

import re

import pytest
from cli_run import ROOT, run, write

from diagnose.explain.render import mlm_flag
from diagnose.model import Override

# A Megatron-LM job (pretrain_gpt.py) that turned activation offloading on with the only flag that does it,
# --cpu-offloading-num-layers, together with pipeline parallelism: TransformerConfig refuses the pair.
MLM_CPU_OFFLOAD_PP = """\
+ torchrun --nproc_per_node=2 pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 8 \
--pipeline-model-parallel-size 2 --cpu-offloading-num-layers 1 --bf16
[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/megatron-lm/pretrain_gpt.py", line 300, in <module>
[rank0]:     pretrain(
[rank0]:   File "/workspace/megatron-lm/megatron/training/training.py", line 600, in pretrain
[rank0]:     model, optimizer, opt_param_scheduler = setup_model_and_optimizer(
[rank0]:   File "/workspace/megatron-lm/megatron/training/arguments.py", line 1500, in core_transformer_config_from_args
[rank0]:     config = config_class(**kw_args)
[rank0]:   File "/usr/lib/python3.12/site-packages/megatron/core/transformer/transformer_config.py", line 1200, in \
__post_init__
[rank0]:     raise ValueError(
[rank0]: ValueError: Currently there is no support for Pipeline parallelism with CPU offloading
"""


def test_megatron_lm_job_is_told_to_remove_the_cpu_offloading_flag_it_passed(tmp_path):
    """The fix said "Megatron-LM (remove --cpu-offloading)": Megatron-LM has no such flag (cpu_offloading is set by
    validate_args when --cpu-offloading-num-layers is above 0), so the user had nothing to remove."""
    log = write(tmp_path, "mlm_cpu_offload_pp.log", MLM_CPU_OFFLOAD_PP)
    out = run("analyze", str(log)).stdout
    assert "Megatron-LM (remove --cpu-offloading-num-layers)" in out, out
    assert "--cpu-offloading)" not in out


@pytest.mark.parametrize(("key", "value", "flag"), [
    # each flag below is one argparse accepts in Megatron-LM's arguments.py; before, the dump's name was printed
    ("checkpoint.fully_parallel_load", True, "--ckpt-fully-parallel-load"),  # was --fully-parallel-load
    ("model.fp4", "e2m1", "--fp4-format e2m1"),  # was --fp4
    ("model.num_layers_in_first_pipeline_stage", 3, "--decoder-first-pipeline-num-layers 3"),
    ("model.num_layers_in_last_pipeline_stage", 2, "--decoder-last-pipeline-num-layers 2"),
    ("model.virtual_pipeline_model_parallel_size", 2, "--num-virtual-stages-per-pipeline-rank 2"),
    ("model.virtual_pipeline_model_parallel_size", None,
     "(remove --num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank)"),
    ("model.cpu_offloading", False, "(remove --cpu-offloading-num-layers)"),
    ("model.cpu_offloading", True, ""),  # no flag turns it on alone: the Bridge words stay
    ("model.params_dtype", "bf16", ""),  # set by --bf16/--fp16, there is no --params-dtype
    ("model.apply_rope_fusion", None, ""),  # only --no-rope-fusion exists
    # Bridge keys a rule's fix names whose flag exists but was not in the table (the Bridge words stood alone)
    ("model.fp8_param", False, "(remove --fp8-param-gather)"),
    ("model.defer_embedding_wgrad_compute", False, "(remove --defer-embedding-wgrad-compute)"),
    ("optimizer.overlap_param_gather_with_optimizer_step", False,
     "(remove --overlap-param-gather-with-optimizer-step)"),
    ("comm_overlap.overlap_moe_expert_parallel_comm", False, "(remove --overlap-moe-expert-parallel-comm)"),
])
def test_megatron_lm_flag_of_each_override_is_one_arguments_py_defines(key, value, flag):
    assert mlm_flag(Override(key, value)) == flag


def _mlm_tp2_job_with_max_connections_1(tmp_path):
    """The sample Megatron-LM DDP-wrap OOM as a TP 2 job whose launch script exported CUDA_DEVICE_MAX_CONNECTIONS=1
    (what Megatron-LM asks of TP > 1 on Hopper without FSDP)."""
    from cli_run import ROOT

    text = (ROOT / "sample_logs" / "mlm_ddp_wrap_oom_torch20.log").read_text(encoding="utf-8")
    text = (text.replace("--tensor-model-parallel-size 1", "--tensor-model-parallel-size 2")
            .replace("tensor_model_parallel_size ...................... 1",
                     "tensor_model_parallel_size ...................... 2")
            .replace("data_parallel_size .............................. 8",
                     "data_parallel_size .............................. 4"))
    return write(tmp_path, "mlm_tp2.log", "+ export CUDA_DEVICE_MAX_CONNECTIONS=1\n" + text)


def test_fsdp_fix_shows_the_environment_replay_needed_for_it_to_pass(tmp_path):
    """Replay extended the Megatron FSDP fix with CUDA_DEVICE_MAX_CONNECTIONS=32 (Megatron-LM's validate_args and
    Bridge's assert "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."), but the Fix block and -q showed only
    the flags: pasted as shown, the job fails that assert before training."""
    log = _mlm_tp2_job_with_max_connections_1(tmp_path)
    quiet = run("analyze", "-q", str(log)).stdout
    assert "fix: --use-megatron-fsdp" in quiet, quiet
    assert "fix: export CUDA_DEVICE_MAX_CONNECTIONS=32" in quiet, quiet
    full = run("analyze", str(log)).stdout
    assert "Env         export CUDA_DEVICE_MAX_CONNECTIONS=32" in full, full


def test_replay_sentence_separates_the_exports_from_the_flags(tmp_path):
    """The replay sentence read "... --ckpt-format fsdp_dtensor export CUDA_DEVICE_MAX_CONNECTIONS=32": one command
    line in which `export` is an argument of the training script."""
    import json

    report = json.loads(run("analyze", "-f", "json", str(_mlm_tp2_job_with_max_connections_1(tmp_path))).stdout)
    summary = report["replay"]["summary"]
    assert "--ckpt-format fsdp_dtensor; export CUDA_DEVICE_MAX_CONNECTIONS=32" in summary, summary


def test_memory_sentence_names_a_megatron_lm_job_s_flags_like_its_fix():
    """MEMORY's "Cheapest change" gave a Megatron-LM job Bridge keys (ddp.use_megatron_fsdp=true ...) beside a Fix
    of flags: not something pretrain_gpt.py takes."""
    import json

    report = json.loads(run("analyze", "-f", "json", "sample_logs/mlm_ddp_wrap_oom_torch20.log").stdout)
    said = report["memory"]["explanation"]
    assert "Cheapest change" in said and "--use-megatron-fsdp --data-parallel-sharding-strategy" in said, said
    assert "ddp.use_megatron_fsdp=true" not in said, said


def test_check_s_wider_plan_for_a_megatron_lm_argument_list_is_flags_that_pass_validate_args():
    """`check examples/mlm_args.txt --gpus 2`: "the cheapest that fits needs 16 GPUs: ddp.use_megatron_fsdp=true
    ddp.data_parallel_sharding_strategy=optim_grads_params model.init_model_with_meta_device=true": Bridge keys for
    a Megatron-LM argument list, and without --ckpt-format fsdp_dtensor, which Megatron-LM's validate_args demands
    of every Megatron FSDP run (the table's plans, proven by replay, had it)."""
    out = " ".join(run("check", "examples/mlm_args.txt", "--gpus", "2", "--gpu", "a100-40gb").stdout.split())
    said = out[out.index("the cheapest that fits needs"):].split("(peak")[0]
    assert "--use-megatron-fsdp" in said and "--ckpt-format fsdp_dtensor" in said, said
    assert "ddp.use_megatron_fsdp" not in said, said


def test_check_s_wider_plan_is_proven_on_its_own_gpu_count():
    """Proving the wider plan on the GPUs the config is checked on would refuse every split that needs more GPUs
    (TP 8 on 1 GPU): the plan stays the one the memory model found."""
    out = " ".join(run("check", "examples/run_config.yaml", "--gpus", "1", "--gpu", "a100-40gb").stdout.split())
    assert "the cheapest that fits needs 8 GPUs: model.tensor_model_parallel_size=8" in out, out


def test_an_argument_list_with_the_flags_fixes_print_is_read_into_the_same_bridge_keys():
    """qa-report-18 L3: the flags a fix prints for fp4, the uneven first/last stage and VPP were not read back from
    an argument list (they became mlm.* keys), so `check` on such a list did not see the job's own values."""
    from diagnose.explain.config.mlm_args import parse_arg_list, parse_args_dump
    from diagnose.model import LogLine

    view = parse_arg_list(["--fp4-format", "e2m1", "--decoder-first-pipeline-num-layers", "3",
                           "--decoder-last-pipeline-num-layers", "5", "--num-virtual-stages-per-pipeline-rank", "2"],
                          "args")
    assert view.get("model.fp4") == "e2m1"
    assert view.get("model.num_layers_in_first_pipeline_stage") == 3
    assert view.get("model.num_layers_in_last_pipeline_stage") == 5
    assert view.get("model.virtual_pipeline_model_parallel_size") == 2
    assert not any(k.startswith("mlm.") for k in view.values)
    # a dump prints the flag's dest and the value validate_args computed; the computed one stands
    dump = ["------------------------ arguments ------------------------",
            "  num_virtual_stages_per_pipeline_rank ............ None",
            "  virtual_pipeline_model_parallel_size ............ 4",
            "-------------------- end of arguments ---------------------"]
    lines = [LogLine(path="x.log", lineno=i + 1, raw=t, text=t) for i, t in enumerate(dump)]
    assert parse_args_dump(lines).get("model.virtual_pipeline_model_parallel_size") == 4


def test_check_says_fsdp_plans_of_a_tp_job_need_the_max_connections_export_changed():
    """qa-report-18 L2: `check` of a TP 2 Megatron-LM argument list offered Megatron FSDP plans that pass
    validate_args only with CUDA_DEVICE_MAX_CONNECTIONS unset or > 1, while that job (TP 2, no FSDP) must export 1
    before Blackwell; nothing said so. A note names exactly the FSDP plans; with the variable given, replay extends
    each such plan with the export instead (`; export ...`, not run into the flags), and the note is not needed."""
    out = " ".join(run("check", str(ROOT / "examples" / "mlm_args.txt"), "--gpus", "8").stdout.split())
    rows = re.findall(r"(?:^| )(\d+) (fsdp:\w+|dist-opt|ddp) \d+/\d+/\d+/\d+ ", out)
    fsdp = [n for n, strategy in rows if strategy.startswith("fsdp:")]
    assert fsdp and len(fsdp) < len(rows)
    assert (f"plans that turn Megatron FSDP on ({', '.join('#' + n for n in fsdp)}) also need "
            "CUDA_DEVICE_MAX_CONNECTIONS unset or > 1") in out
    given = run("check", str(ROOT / "examples" / "mlm_args.txt"), "--gpus", "8",
                "--set", "CUDA_DEVICE_MAX_CONNECTIONS=1").stdout
    assert "also need CUDA_DEVICE_MAX_CONNECTIONS" not in given
    assert "--ckpt-format fsdp_dtensor; export CUDA_DEVICE_MAX_CONNECTIONS=32" in given
    assert "fsdp_dtensor export" not in given
