"""Fixer 48: the OOM path's items left by qa-report-16 (L1, L3) and the TUI memory view's words. Each test failed
before its fix; output is read through the real command line (tests/cli_run.py)."""

from __future__ import annotations

from pathlib import Path

from tests.cli_run import ROOT, run, write

# A synthetic log (made here, not a real job's): sample_logs/b042_first_iter_oom.log turned into a 70B-class Bridge
# Megatron FSDP optim_grads job on 256 GPUs (TP 4, sequence parallel, no recompute) that logged iteration 1 and
# then hit a CUDA OOM in backward. The config read predicts a ~113 GiB step peak on an 80 GB GPU, yet it trained.
_SHAPE = {"  ffn_hidden_size: 14336": "  ffn_hidden_size: 28672", "  hidden_size: 4096": "  hidden_size: 8192",
          "  num_attention_heads: 32": "  num_attention_heads: 64", "  num_layers: 8  ": "  num_layers: 80  ",
          "  num_query_groups: 32": "  num_query_groups: 8",
          "  recompute_modules: ['core_attn']  (Mcore default: None)\n": "",
          "  transformer_impl: 'local'  (Mcore default: 'transformer_engine')\n":
              "  tensor_model_parallel_size: 4  (Mcore default: 1)\n  sequence_parallel: True  (Mcore default: False)\n",
          "  data_parallel_sharding_strategy: 'optim_grads_params'": "  data_parallel_sharding_strategy: 'optim_grads'",
          "  global_batch_size: 256": "  global_batch_size: 512", "  micro_batch_size: 256": "  micro_batch_size: 1",
          "  vocab_size: 32000": "  vocab_size: 128256", "  fp8_recipe: 'tensorwise'  (Mcore default: 'delayed')\n": "",
          "  fp8_recipe: 'tensorwise'  (Mcore default: None)\n": ""}
_TAIL = """\
> initialized tensor model parallel with size 4
> initialized pipeline model parallel with size 1
 [2026-12-07 10:01:02] iteration        1/    6000 | consumed samples:          512 | elapsed time per iteration (ms): 41234.5 | learning rate: 6.000000E-07 | global batch size:   512 | lm loss: 1.193411E+01 |
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/venv/lib/python3.12/site-packages/megatron/bridge/training/train.py", line 610, in train_step
[rank0]:     losses_reduced = forward_backward_func(
[rank0]:   File "/opt/venv/lib/python3.12/site-packages/megatron/core/pipeline_parallel/schedules.py", line 620, in forward_backward_no_pipelining
[rank0]:     backward_step(input_tensor, output_tensor, output_tensor_grad, model_type, config)
[rank0]:   File "/opt/venv/lib/python3.12/site-packages/torch/autograd/__init__.py", line 353, in backward
[rank0]:     _engine_run_backward(
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.98 GiB is free. Including non-PyTorch memory, this process has 77.12 GiB memory in use. Of the allocated memory 74.02 GiB is allocated by PyTorch, and 1.40 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
"""


def trained_then_oom_log(tmp_path: Path) -> Path:
    lines = (ROOT / "sample_logs" / "b042_first_iter_oom.log").read_text(encoding="utf-8").split("\n")
    body = "\n".join(lines[24:231])
    for old, new in _SHAPE.items():
        assert old in body, old
        body = body.replace(old, new)
    text = "\n".join(["SLURM_NTASKS=256", "SLURM_NNODES=32", "SLURM_NTASKS_PER_NODE=8", *lines[16:24], body, _TAIL])
    return write(tmp_path, "fsdp256_trained.log", text)


def _memory(out: str) -> str:
    return out.split("\nMEMORY\n", 1)[1]


def test_a_job_that_trained_is_never_told_its_first_iterations_did_not_fit(tmp_path):
    """qa-report-16 L1: the log shows iteration 1 completed, the model predicts a 113 GiB step peak on a 79 GiB GPU
    (model state 27 GiB fits). MEMORY said "Verdict: activations of the first iterations did not fit" and "Cheapest
    change that fits: optim_grads_params": the log proves the first iterations fitted, so the model's inputs are
    incomplete or wrong and the OOM came later."""
    out = run("analyze", "-v", str(trained_then_oom_log(tmp_path))).stdout
    memory = _memory(out)
    assert "first iterations did not fit" not in out
    assert "Cheapest change" not in memory and "Options, cheapest first" not in memory
    assert "this OOM came later" in memory
    assert "the model's inputs are incomplete or wrong" in memory
    # the likely culprit it knows: recompute is not in the log (none assumed), the count assumed defaults
    assert "activation recompute (not in the log; none assumed)" in " ".join(memory.split())
    assert "predicted peak 113." in " ".join(memory.split())
    # replay quotes no prediction the memory section calls wrong
    replay = out.split("\nREPLAY\n", 1)[1].split("\nMEMORY\n", 1)[0]
    assert "does not fit: 113" not in replay and "not sized" in replay


def test_cascade_512_says_the_same_words_as_a_trained_peak_over_capacity():
    """The persistent state over capacity (cascade_512) and a step peak over capacity say one wording: the note,
    the "Not sized" line, replay's note and the verdict line."""
    out = run("analyze", "-v", str(ROOT / "sample_logs" / "cascade_512_ranks_oom.log")).stdout
    flat = " ".join(_memory(out).split())
    assert "Verdict: the job's first iterations fitted (the log shows them completed), so this OOM came later" in flat
    assert "(predicted model state 131.56 GiB per GPU, the GPU holds 79.10 GiB); likely: sharding" in flat
    assert flat.count("yet the job trained (the log shows completed iterations): the model's inputs are "
                      "incomplete or wrong") == 2


def test_the_activations_verdict_of_a_job_that_trained_does_not_name_the_first_iterations():
    """A sized prediction (the model fits) with an "activations" verdict after logged iterations: the first
    iterations fitted, so the verdict's words do not say they did not; before the first iteration they still do."""
    from diagnose.memory_types import MemoryAnalysis
    from diagnose.present.memory_text import verdict_words

    trained = MemoryAnalysis(80 << 30, 1 << 30, "activations", 8_000_000_000, "log", "training")
    first = MemoryAnalysis(80 << 30, 1 << 30, "activations", 8_000_000_000, "log", "first_iteration")
    assert "first iterations" not in verdict_words(trained) and "after iterations that did" in verdict_words(trained)
    assert verdict_words(first) == "activations of the first iterations did not fit"


def _check_plans(out: str) -> tuple[dict[int, bool], dict[int, bool]]:
    """``check``'s table (plan number -> fits and valid) and its change lines (plan number -> sets the global
    batch size)."""
    import re

    fits = {int(m[1]): m[2] == "yes" for m in re.finditer(r"^\s+(\d+)\s+\S+\s+\d+/\d+/\d+/\d+\s.*?(yes|NO|invalid)\s*$",
                                                        out, re.M)}
    gbs = {int(m[1]): "--global-batch-size" in m[2] for m in re.finditer(r"^\s?(\d+)  ([-(].*)$", out, re.M)}
    return fits, gbs


def test_check_ranks_a_global_batch_change_after_every_plan_that_fits_and_keeps_it():
    """qa-report-16 L3: `check examples/mlm_args.txt --gpus 1024 --gpu h200` named "--global-batch-size 512"
    (128 -> 512, a tuned hyper-parameter) the cheapest plan that fits, above PP / TP x PP plans that keep 128."""
    out = run("check", str(ROOT / "examples" / "mlm_args.txt"), "--gpus", "1024", "--gpu", "h200").stdout
    fits, gbs = _check_plans(out)
    assert set(fits) == set(gbs) and any(gbs.values()) and not all(gbs.values())
    keepers = [i for i in fits if fits[i] and not gbs[i]]
    changers = [i for i in fits if gbs[i]]
    assert keepers and max(keepers) < min(changers)
    assert f"Cheapest valid plan that fits: #{min(keepers)}." in " ".join(out.split())
    assert "It changes the global batch size" not in out


def test_check_says_plainly_when_only_plans_that_change_the_global_batch_size_fit(tmp_path):
    """Global batch 2 on 1024 GPUs: keeping it needs TP x PP >= 512, more pipeline stages than the 32 layers; every
    plan changes it, and the answer says so."""
    args = (ROOT / "examples" / "mlm_args.txt").read_text(encoding="utf-8")
    assert "--global-batch-size 128" in args
    path = write(tmp_path, "gbs2.txt", args.replace("--global-batch-size 128", "--global-batch-size 2"))
    out = " ".join(run("check", str(path), "--gpus", "1024", "--gpu", "h200").stdout.split())
    assert ("Cheapest valid plan that fits: #1. It changes the global batch size to 512, a tuned hyper-parameter "
            "(numerics, LR schedule): no valid plan that keeps it fits on this GPU count.") in out


def test_the_tui_memory_view_says_how_the_count_was_had_and_warns_of_assumed_values_as_analyze_does():
    """The TUI's memory view said "parameters (config)" where `analyze -v` says "counted from the config's shape,
    with ASSUMED values: see the WARNING below" and prints the WARNING; one wording (count_words, the analysis's
    assumption_warning note), both places."""
    from diagnose.pipeline import analyze
    from diagnose.present.memory_text import count_words
    from diagnose.present.tui.memoryview import memory_text

    report = analyze([str(ROOT / "sample_logs" / "b042_first_iter_oom.log")])
    memory = report.memory
    assert memory is not None and memory.params_assumed and memory.params_source == "config"
    finding = next(f for f in report.findings if f.category == "cuda_oom")
    tui = memory_text(memory, finding)
    assert tui is not None
    words = count_words(memory.params_source, memory.params_assumed)
    assert f"parameters ({words})" in tui.plain and "parameters (config)" not in tui.plain
    warning = next(n for n in memory.notes if n.startswith("WARNING: the parameter count assumes"))
    assert warning in tui.plain
    cli = " ".join(run("analyze", "-v", str(ROOT / "sample_logs" / "b042_first_iter_oom.log")).stdout.split())
    assert words in cli and " ".join(warning.split()) in cli


def test_the_tui_memory_view_of_a_job_that_trained_says_the_verdict_and_not_drawn_in_analyzes_words():
    from diagnose.memory_types import TRAINED_LATER, TRAINED_OVER
    from diagnose.pipeline import analyze
    from diagnose.present.tui.memoryview import memory_text

    report = analyze([str(ROOT / "sample_logs" / "cascade_512_ranks_oom.log")])
    tui = memory_text(report.memory, next(f for f in report.findings if f.category == "cuda_oom"))
    assert tui is not None
    assert f"not drawn: {TRAINED_OVER}" in tui.plain and TRAINED_LATER in tui.plain
    assert "parameters (as the log states)" in tui.plain


def test_a_plan_that_restates_the_configs_global_batch_size_is_not_said_to_change_it():
    """batch_change_words read any train.global_batch_size override as a change; the option now carries the new
    value only when it differs from the config's (changes_global_batch, the ranking's own test)."""
    from diagnose.explain.memory.options import Plan, option_of
    from diagnose.explain.memory.state import Layout, Phases, StateBytes
    from diagnose.model import Override
    from diagnose.present.memory_text import batch_change_words

    plan = Plan("pp 2", [Override("model.pipeline_model_parallel_size", 2), Override("train.global_batch_size", 256)],
                Layout(gpus=8, pp=2), None, StateBytes({"params": 2 << 30}, 1 << 30, 1), None,
                Phases(1 << 30, 1 << 30, 1 << 30, 1 << 30, 0), True, "", 0.0)
    assert batch_change_words(option_of(plan, 256)) == ""
    assert batch_change_words(option_of(plan, "256")) == ""
    assert "changes the global batch size to 256" in batch_change_words(option_of(plan, 128))
    assert batch_change_words(option_of(Plan("tp 2", [Override("model.tensor_model_parallel_size", 2)],
                                             *([plan.layout, None, plan.state, None, plan.phases, True, "", 0.0])),
                                        128)) == ""
