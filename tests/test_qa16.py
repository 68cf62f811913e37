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


def test_replay_does_not_quote_the_memory_prediction_the_memory_section_calls_unsizable():
    """`analyze -v sample_logs/cascade_512_ranks_oom.log`: MEMORY said the config read "predicts more than the GPU
    holds, yet the job trained" (not sized), while REPLAY, from the same prediction, said "fix valid but does not
    fit: 164.5 GiB per GPU" of the expandable-segments fix. One report, two answers."""
    from pathlib import Path

    from diagnose.pipeline import analyze

    report = analyze([str(Path(__file__).resolve().parents[1] / "sample_logs" / "cascade_512_ranks_oom.log")])
    assert report.memory is not None and report.memory.current is not None
    assert report.memory.current.sized is False
    fit = report.replay.fit
    assert fit is not None and fit.fits is None and fit.peak_bytes is None
    assert any("yet the job trained" in n for n in fit.notes)


def test_megatron_lms_nccl_user_buffer_flag_is_use_nccl_ub_both_ways():
    """MB134's fix (ddp.nccl_ub=false) on a Megatron-LM job read "(remove --nccl-ub)": Megatron-LM has no such flag,
    its flag is --use-nccl-ub (dest nccl_ub); and an argument list with --use-nccl-ub was not read as ddp.nccl_ub,
    so replay never saw the expandable_segments conflict."""
    from diagnose.explain.config.mlm_args import parse_arg_list
    from diagnose.explain.render import mlm_flag

    assert mlm_flag(Override("ddp.nccl_ub", False)) == "(remove --use-nccl-ub)"
    assert mlm_flag(Override("ddp.nccl_ub", True)) == "--use-nccl-ub"
    view = parse_arg_list(["--use-megatron-fsdp", "--use-nccl-ub"], "test")
    assert view.get("ddp.nccl_ub") is True


def test_the_json_carries_the_megatron_lm_flags_the_text_report_shows():
    """`analyze sample_logs/mfsdp_optim_grads_buffer_oom.log`: a Megatron-LM job (its traceback through
    megatron/training) whose log printed only the DDP config: the text's fix is "Megatron-LM --data-parallel-sharding-
    strategy optim_grads_params --init-model-with-meta-device", but `-f json`'s replay.render had no "mlm" form, only
    the Bridge words the job cannot use."""
    import json

    from tests.cli_run import ROOT, run

    out = run("analyze", "-f", "json", str(ROOT / "sample_logs" / "mfsdp_optim_grads_buffer_oom.log")).stdout
    report = json.loads(out)
    assert report["stack"] == "megatron-lm"
    assert report["replay"]["render"]["mlm"] == \
        "--data-parallel-sharding-strategy optim_grads_params --init-model-with-meta-device"
    text = run("analyze", str(ROOT / "sample_logs" / "mfsdp_optim_grads_buffer_oom.log")).stdout
    assert report["replay"]["render"]["mlm"] in text


def test_a_recompute_plan_on_a_fully_sharded_job_names_what_it_changes():
    """`check examples/run_config.yaml --gpus 8 --set <Megatron FSDP, optim_grads_params>`: the plan
    ddp.grad_reduce_in_fp32=false + full recompute was costed "Megatron FSDP, everything sharded (ZeRO-3) ...;
    recompute every layer": the sharding was already the job's, and the bf16 grads it turns on went unnamed."""
    import json

    from tests.cli_run import ROOT, run

    sets = ["ddp.use_megatron_fsdp=true", "ddp.data_parallel_sharding_strategy=optim_grads_params",
            "checkpoint.ckpt_format=fsdp_dtensor", "model.init_model_with_meta_device=true"]
    args = [a for s in sets for a in ("--set", s)]
    out = run("check", str(ROOT / "examples" / "run_config.yaml"), "--gpus", "8", "--gpu", "h100-80gb", *args,
              "-f", "json").stdout
    plans = json.loads(out)["memory"]["plans"]
    plan = next(p for p in plans if {o["key"] for o in p["overrides"]} ==
                {"ddp.grad_reduce_in_fp32", "model.recompute_granularity", "model.recompute_method",
                 "model.recompute_num_layers"})
    assert "Megatron FSDP" not in plan["cost"] and "sharding" not in plan["label"]
    assert "grads in bf16" in plan["cost"] and "recompute every layer" in plan["cost"]


def test_the_big_log_generator_takes_a_size_as_head_and_dd_write_it(tmp_path):
    """`python benchmarks/gen_log.py --size 500M OUT` ended in a ValueError traceback; only 500MiB/500MB worked."""
    import subprocess
    import sys

    from tests.cli_run import ROOT

    out = tmp_path / "big.log"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_log.py"), "--size", "1M", "--ranks", "16",
                           str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert abs(out.stat().st_size - (1 << 20)) < (1 << 16)


def test_replay_of_the_fix_analyze_proposed_sizes_it_as_analyze_did():
    """`analyze -v sample_logs/ddp_wrap_oom.log`: the fix (Megatron FSDP optim_grads_params, meta init,
    ckpt_format=fsdp_dtensor) on 8 GPUs, predicted peak 93.0 GiB. `replay LOG --gpus 8 --set` of exactly that fix
    said 84.6 GiB (the number of the bf16-grads option: the re-prediction lost the fp32 grads inferred from the
    request, and ckpt_format kept it from matching the option), and 84.6 again without meta init."""
    import json

    from tests.cli_run import ROOT, run

    log = str(ROOT / "sample_logs" / "ddp_wrap_oom.log")
    report = json.loads(run("analyze", "-f", "json", log).stdout)
    fit = report["replay"]["fit"]
    keys = [o for o in report["replay"]["fix"] if not o["key"].startswith("launch.")]
    assert fit["fits"] is True and fit["gpus"] == 8
    def sets(overrides):
        return [a for o in overrides for a in ("--set", f"{o['key']}={json.dumps(o['value']).strip(chr(34))}")]

    again = json.loads(run("replay", log, "--gpus", "8", *sets(keys), "-f", "json").stdout)["replay"]["fit"]
    assert again["fits"] is True and again["peak_bytes"] == fit["peak_bytes"]
    # a re-predicted variant keeps the job's fp32 grads: above the bf16-grads option's peak
    bf16 = next(o for o in report["memory"]["options"] if o["gpus"] == 8 and
                any(x["key"] == "ddp.grad_reduce_in_fp32" for x in o["overrides"]))
    no_meta = sets([o for o in keys if o["key"] != "model.init_model_with_meta_device"])
    other = json.loads(run("replay", log, "--gpus", "8", *no_meta, "-f", "json").stdout)["replay"]["fit"]
    assert other["peak_bytes"] > bf16["peak_bytes"]


def test_replay_set_of_the_allocator_fix_of_a_fragmentation_oom_fits_as_analyze_said():
    """`analyze sample_logs/oom_fragmentation.log` and `replay LOG`: "fits: reserved-but-unallocated memory would
    have served the request"; `replay LOG --set env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, the same
    fix typed by hand: "activations unknown ... only the model state was sized, so this is not a fit"."""
    import json

    from tests.cli_run import ROOT, run

    log = str(ROOT / "sample_logs" / "oom_fragmentation.log")
    proposed = json.loads(run("replay", log, "-f", "json").stdout)["replay"]["fit"]
    typed = json.loads(run("replay", log, "--set", "env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                           "-f", "json").stdout)["replay"]["fit"]
    assert proposed["fits"] is True
    assert typed["fits"] is True and typed["notes"] == proposed["notes"]
    other = json.loads(run("replay", log, "--set", "env.NCCL_DEBUG=INFO", "-f", "json").stdout)["replay"]["fit"]
    assert other["fits"] is not True  # another env line is not the allocator fix
