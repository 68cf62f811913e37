"""QA round 13 (docs/qa-report-13.md): a Megatron FSDP user with the real H200 logs (sample_logs/ holds the same
bytes as the captures), then the newest dev answers.

Each test failed on the tree before its fix. Output tests run the real command line (tests/cli_run.py)."""

from __future__ import annotations

from tests.cli_run import ROOT, run

B042 = str(ROOT / "sample_logs" / "b042_first_iter_oom.log")


def test_a_list_value_of_the_config_is_spelt_out_not_shown_as_empty() -> None:
    """b042_first_iter_oom.log's Configuration Summary says "recompute_modules: ['core_attn']". analyze -v and the
    markdown report printed "model.recompute_modules: []  (log:70)": an empty list, which in megatron-core means
    selective recompute recomputes nothing. A list (or mapping) must be shown with its items; an empty one stays []."""
    verbose = run("analyze", "-v", "--color", "never", "--no-progress", B042).stdout
    markdown = run("analyze", "--format", "markdown", "--no-progress", B042).stdout
    for text in (verbose, markdown):
        line = next(ln for ln in text.splitlines() if "model.recompute_modules:" in ln)
        assert "core_attn" in line, line
        empty = next(ln for ln in text.splitlines() if "model.cuda_graph_scope:" in ln)
        assert "[]" in empty, empty


def test_replay_of_a_log_sizes_memory_on_the_gpus_it_validates_on() -> None:
    """replay b042_first_iter_oom.log --gpus 8 (Megatron FSDP optim_grads_params) validated at world size 8 ("global
    batch size (256) is not divisible by micro batch size (256) times data parallel size (8)") but sized memory on
    the log's one GPU: "fits: predicted peak 103.5 GiB" for micro batch 2 + selective recompute, the 1-GPU figure,
    while check on the same log at 8 GPUs says 80.8 GiB (the model state sharded 8 ways). One GPU count for both."""
    sets = ("--set", "train.micro_batch_size=2", "--set", "model.recompute_granularity=selective")
    on_one = run("replay", B042, "--gpus", "1", *sets).stdout
    on_eight = run("replay", B042, "--gpus", "8", *sets).stdout
    assert "predicted peak 103.5 GiB per GPU" in on_one
    assert "predicted peak 80.8 GiB per GPU" in on_eight, on_eight
    check = run("check", B042, "--gpus", "8", "--gpu", "h200").stdout
    assert "80.8G" in check
