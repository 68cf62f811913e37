"""QA round 12 (docs/qa-report-12.md): README followed to the letter, and the config side of check and replay.

Each test failed on the tree before its fix. Output tests run the real command line (tests/cli_run.py)."""

from __future__ import annotations

from pathlib import Path

from tests.cli_run import ROOT, run, write

# Llama-3 70B's shape at TP 4, Megatron FSDP sharding everything, micro batch 1 of a global 512
LLAMA3_70B_TP4_MFSDP = "\n".join([
    "model:", "  num_layers: 80", "  hidden_size: 8192", "  ffn_hidden_size: 28672", "  num_attention_heads: 64",
    "  num_query_groups: 8", "  vocab_size: 128256", "  seq_length: 8192", "  gated_linear_unit: true",
    "  bf16: true", "  tensor_model_parallel_size: 4",
    "train:", "  micro_batch_size: 1", "  global_batch_size: 512",
    "ddp:", "  use_megatron_fsdp: true", "  data_parallel_sharding_strategy: optim_grads_params", ""])


def test_a_config_key_that_is_not_a_field_name_is_refused_not_ignored(tmp_path: Path) -> None:
    """A key under model: holding markup and escape sequences ('[bold]hidden_sise', an OSC title) is no field of
    any config dataclass, so Bridge's loader refuses it. check dropped it and said 'Validation: passes'. It must be
    one line naming the key inertly, exit 2."""
    text = (ROOT / "examples" / "run_config.yaml").read_text(encoding="utf-8")
    text = text.replace("  bf16: true\n", '  bf16: true\n  "\\x1b]0;PWN\\x07[bold]hidden_sise": 4\n')
    proc = run("check", str(write(tmp_path, "run.yaml", text)), "--gpus", "8", code=(2,))
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert "unknown key 'model.\\x1b]0;PWN\\x07[bold]hidden_sise'" in proc.stderr
    assert "\x1b" not in proc.stderr


def test_a_pipeline_plan_holds_the_micro_batches_of_its_own_data_parallel_size(tmp_path: Path) -> None:
    """Llama-3 70B at TP 4 on 512 GPUs, global batch 512, micro batch 1: as given DP is 128 (4 micro batches).
    The 'PP 8' plan (DP 16: 32 micro batches) was sized with the given 4, so pipeline stage 0 held 4 micro batches'
    activations instead of 8 (stages 0-4 equal), and check listed it as fitting at 44.7 GiB, below the same split
    with sequence parallel on. A plan must be sized with its own DP's micro batches: the same as the config that
    sets that split."""
    from dataclasses import replace

    from diagnose.explain.config.extract import load_config
    from diagnose.explain.memory import options
    from diagnose.explain.memory.from_config import (
        layout_from_config,
        scenario,
        shape_from_config,
        workload_from_config,
    )

    path = write(tmp_path, "llama70b.yaml", LLAMA3_70B_TP4_MFSDP)
    view = load_config(str(path))
    shape = shape_from_config(view)
    layout = layout_from_config(view, 512)
    work = workload_from_config(view, shape, layout)
    scn = scenario(view, shape, layout, work, 80 * 2**30)
    pp8 = replace(layout, pp=8)
    assert work is not None and pp8.dp == 16
    plan = options.evaluate(scn, "PP 8", [], pp8, work, "", 0.0)
    expected = options.evaluate(scn, "PP 8", [], pp8, replace(work, num_microbatches=32), "", 0.0)
    assert plan is not None and expected is not None
    assert plan.stage_peaks == expected.stage_peaks
    assert plan.stage_peaks[0] > plan.stage_peaks[4]  # stage 0 holds 8 micro batches, stage 4 holds 4


def test_check_says_a_plan_that_does_not_fit_is_over_the_usable_memory_not_under_the_gpu(tmp_path: Path) -> None:
    """Llama-3 70B, Megatron FSDP, TP 4 on 512 H100s: the peak, 78.55 GiB, is under the GPU's 79.11 GiB but over
    what a plan may use (the GPU less a headroom for the CUDA context, NCCL and the allocator). check said 'does NOT
    fit (peak 78.55 GiB of 79.11 GiB)': a verdict its own numbers contradict. It must compare the peak with the
    usable memory, and say what the rest is kept for."""
    import re

    path = write(tmp_path, "llama70b.yaml", LLAMA3_70B_TP4_MFSDP)
    out = " ".join(run("check", str(path), "--gpus", "512", "--gpu", "h100-80gb").stdout.split())
    m = re.search(r"As given: (fits|does NOT fit) \(peak ([\d.]+) GiB of ([\d.]+) GiB usable: ([\d.]+) GiB less "
                  r"([\d.]+) GiB for the CUDA context, NCCL and the allocator\)", out)
    assert m is not None, out[-400:]
    verdict, peak, usable, gpu, kept = m.group(1), *map(float, m.groups()[1:])
    assert abs(usable + kept - gpu) < 0.02
    assert (peak <= usable) == (verdict == "fits")


def test_bf16_grads_for_a_megatron_lm_job_are_the_flag_that_turns_them_on() -> None:
    """examples/mlm_args.txt (--bf16, no --accumulate-allreduce-grads-in-fp32): check's 'bf16 grads' plan said
    '(remove --accumulate-allreduce-grads-in-fp32)', a flag the job does not pass; Megatron-LM's arguments.py turns
    it on for --bf16 unless --grad-reduce-in-bf16 is given. The plan must name that flag."""
    out = run("check", str(ROOT / "examples" / "mlm_args.txt"), "--gpus", "8", "--gpu", "h100-80gb").stdout
    lines = out.splitlines()
    plan = next(i for i, line in enumerate(lines) if "grads reduced in bf16" in line)
    assert lines[plan - 1].split(None, 1)[1] == "--grad-reduce-in-bf16"
    assert "remove --accumulate-allreduce-grads-in-fp32" not in out


def test_an_oom_fix_the_memory_model_could_not_size_is_not_called_one_that_does_not_fit() -> None:
    """sample_logs/optimizer_step_oom.log has no parameter count and no config: the memory section says the state
    cannot be modelled, yet replay said 'fix valid but does not fit: the memory model finds nothing that fits'
    and JSON replay.fit.fits was false, with no peak. Without numbers the fit is unknown (null), and says why."""
    import json

    out = run("analyze", "--format", "json", str(ROOT / "sample_logs" / "optimizer_step_oom.log")).stdout
    report = json.loads(out)
    assert report["memory"]["params"] is None
    fit = report["replay"]["fit"]
    assert fit["peak_bytes"] is None
    assert fit["fits"] is None
    text = run("analyze", str(ROOT / "sample_logs" / "optimizer_step_oom.log")).stdout
    assert "nothing that fits" not in text and "does not fit" not in " ".join(text.split())


def test_replay_help_names_the_release_it_validates_as_by_default() -> None:
    """'replay --help' said --bridge-version defaults to 'latest', but a config with no release is validated as
    0.5.0-0.6.x (README; the output says 'release unknown'), not as the latest family (>= 0.7.0, where
    dist.use_megatron_fsdp is gone). The help must name the family replay really uses."""
    import re

    out = run("replay", str(ROOT / "examples" / "run_config.yaml")).stdout
    family = re.search(r"validated as: Megatron-Bridge (\S+) \(release unknown", out)
    assert family is not None, out[:300]
    help_text = " ".join(run("replay", "--help").stdout.split())
    assert "default: latest" not in help_text
    assert f"else {family.group(1)})" in help_text


def test_sequence_parallel_with_tp_1_is_not_a_violation_for_megatron_lm(tmp_path: Path) -> None:
    """A Megatron-LM argument list with --sequence-parallel and TP 1 (common in FSDP launch scripts): check said
    'Validation: 1 violation(s) - Cannot use sequence parallelism without tensor parallelism' and 'As given:
    INVALID'. Megatron-LM's validate_args turns sequence parallelism off when TP is 1, with a warning, before
    megatron-core's config classes see it: the job runs. A Bridge config, which has no such step, still fails."""
    args = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 "
            "--micro-batch-size 1 --global-batch-size 64 --bf16 --swiglu --vocab-size 128256 "
            "--tensor-model-parallel-size 1 --sequence-parallel --use-distributed-optimizer\n")
    out = run("check", str(write(tmp_path, "args.txt", args)), "--gpus", "8").stdout
    assert "Validation: passes" in out
    assert "INVALID" not in out
    replay = run("replay", str(write(tmp_path, "args.txt", args)), "--gpus", "8").stdout
    assert "Disabling sequence parallelism" in replay
    bridge = (ROOT / "examples" / "run_config.yaml").read_text(encoding="utf-8").replace(
        "  bf16: true\n", "  bf16: true\n  sequence_parallel: true\n")
    out = run("check", str(write(tmp_path, "run.yaml", bridge)), "--gpus", "8").stdout
    assert "Cannot use sequence parallelism without tensor parallelism" in out


def test_check_on_an_overrides_only_yaml_names_the_command_that_still_validates_it(tmp_path: Path) -> None:
    """qa-report-12 L4 (fixed after the round, lead): a YAML of train:/ddp: overrides names no model, so check
    cannot plan memory and refused in one line that left the user nowhere. The line now says what to give or to
    run, and the command it names validates the same file (the global-batch violation, exit 1)."""
    config = write(tmp_path, "ovr.yaml", "train:\n  global_batch_size: 100\n  micro_batch_size: 3\n"
                                         "ddp:\n  use_megatron_fsdp: true\n")
    proc = run("check", str(config), "--gpus", "64", code=(2,))
    assert proc.stderr.count("\n") == 1
    assert "no model shape" in proc.stderr
    assert f"diagnose replay {config} --gpus 64" in proc.stderr
    named = run("replay", str(config), "--gpus", "64", code=(1,))
    assert "global_batch_divisible" in named.stdout


def test_the_headline_fix_of_an_activation_oom_is_one_its_own_replay_says_fits() -> None:
    """qa-report-12 L1 (fixed after the round, lead): README's -q example led with the rule's
    train.micro_batch_size=1, which the REPLAY section then called 'valid but does not fit' (134.5 GiB of 134.2
    usable). A fix the memory model refutes no longer leads when an option fits: the cheapest that does."""
    proc = run("analyze", str(ROOT / "sample_logs" / "b042_first_iter_oom.log"), "-v", code=(1,))
    assert "fix: train.micro_batch_size=2 model.recompute_granularity=selective" in run(
        "analyze", "-q", str(ROOT / "sample_logs" / "b042_first_iter_oom.log"), code=(1,)).stdout
    replay = proc.stdout.split("\nREPLAY\n", 1)[1].split("\nMEMORY\n", 1)[0]
    assert "fix valid and fits" in replay and "does not fit: 134" not in replay
    assert "the rule's own fix (train.micro_batch_size=1) does not fit" in " ".join(replay.split())


def test_a_yaml_tag_the_loader_does_not_honour_is_named_not_dropped(tmp_path: Path) -> None:
    """qa-report-12 L6: 'num_layers: !custom 32' was loaded inert (the tag dropped, nothing run) and check then said
    "value '32' of type 'str' could not be converted to Integer", which hid the tag. Megatron-Bridge's loader
    (yaml.safe_load) refuses a tag it does not know, so check and replay must say which key holds which tag, in one
    line, still running nothing the tag names. A log's task YAML stays inert and silent."""
    from diagnose.explain.config.safe_yaml import safe_load

    text = (ROOT / "examples" / "run_config.yaml").read_text(encoding="utf-8")
    assert "  num_layers: 32\n" in text
    for tag, shown in (("!custom", "!custom"), ("!!python/name:os.system", "!!python/name:os.system")):
        config = write(tmp_path, "run.yaml", text.replace("  num_layers: 32\n", f"  num_layers: {tag} 32\n"))
        for command in (("check", str(config), "--gpus", "8"), ("replay", str(config))):
            proc = run(*command, code=(2,))
            assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
            assert "could not be converted" not in proc.stderr
            assert f"model.num_layers: YAML tag '{shown}'" in proc.stderr
            assert "Megatron-Bridge's loader" in proc.stderr and "refuse" in proc.stderr
    assert safe_load("model:\n  num_layers: !custom 32\n") == {"model": {"num_layers": "32"}}  # a log: silent
