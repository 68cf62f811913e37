"""QA round 13 (docs/qa-report-13.md): a Megatron FSDP user with the real H200 logs (sample_logs/ holds the same
bytes as the captures), then the newest dev answers.

Each test failed on the tree before its fix. Output tests run the real command line (tests/cli_run.py)."""

from __future__ import annotations

from pathlib import Path

from tests.cli_run import ROOT, root_finding, run

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


def test_check_does_not_ask_for_the_validators_fix_where_a_plan_is_valid_by_its_own_change() -> None:
    """check b042_first_iter_oom.log --gpus 8: "global batch size (256) is not divisible by micro batch size (256)
    times data parallel size (8)", fix train.global_batch_size=2048. The note then said every plan "changes only
    memory, so it also needs the validator's fix (train.global_batch_size=2048)", yet every plan lowers the micro
    batch (or DP), which clears the violation: following the note multiplies the global batch by 8 for nothing."""
    out = " ".join(run("check", B042, "--gpus", "8").stdout.split())
    assert "also needs the validator's fix" not in out
    assert "each plan below makes it valid by its own change" in out


def test_check_names_the_plans_that_still_need_the_validators_fix() -> None:
    """Llama-3 8B (examples/run_config.yaml) with micro batch 4 of a global 16 on 8 GPUs: the TP/PP plans lower DP
    and are valid as they stand; the Megatron FSDP plan keeps DP 8 and micro batch 4, and needs
    train.global_batch_size=32. The note named that one plan; since fixer42 (qa-report-13 L4) the plan carries the
    value itself, so no plan needs the validator's fix (tests/test_fixer42.py)."""
    out = " ".join(run("check", str(ROOT / "examples" / "run_config.yaml"), "--gpus", "8", "--gpu", "h100-80gb",
                       "--set", "train.micro_batch_size=4", "--set", "train.global_batch_size=16").stdout.split())
    assert "each plan below makes it valid by its own change (no validator's fix needed)" in out, out[-800:]


def test_a_transformer_config_field_the_summary_does_not_list_is_known_not_assumed() -> None:
    """b042_first_iter_oom.log's "Configuration Summary (Non-Default Values vs Megatron Core)" lists every
    TransformerConfig field that differs from megatron-core's default under [model]; gated_linear_unit,
    normalization and add_bias_linear are not listed, so they are at megatron-core's default. check called the
    count "with ASSUMED values" and told the user to set all five. Only GPTModel's own arguments (tied embeddings,
    position embedding), which the summary never prints, are assumptions."""
    out = " ".join(run("check", B042, "--gpus", "8").stdout.split())
    warning = out[out.index("WARNING: the parameter count assumes"):]
    warning = warning[:warning.index("true count")]
    for known in ("gated_linear_unit", "normalization", "add_bias_linear"):
        assert known not in warning, warning
    assert "share_embeddings_and_output_weights" in warning
    verbose = run("analyze", "-v", "--color", "never", "--no-progress", B042).stdout
    assert "model.gated_linear_unit: false  (log:47 not listed: megatron-core's default)" in verbose


def test_a_queue_pair_nccl_could_not_create_is_the_memlock_limit_not_a_bad_link(tmp_path: Path) -> None:
    """cx-tf-mirrored-pyxis-nccl-ibv-create-qp-memlock (and two older dev threads): "NCCL WARN Call to ibv_create_qp
    failed" under pyxis/srun, then ncclCommInitRank's unhandled system error. NC011 called it "InfiniBand transfer
    failed (NCCL NET/IB completion error)" with the fix "Check the named peer's node and its IB link; exclude a bad
    node": no transfer had started, and every thread's fix was the locked-memory limit."""
    log = "\n".join([
        "gpu-a100-07:2614407:2615443 [4] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.1.0.7<0>",
        "gpu-a100-07:2614407:2615443 [4] ibvwrap.c:130 NCCL WARN Call to ibv_create_qp failed",
        "gpu-a100-07:2614407:2615443 [4] NCCL INFO ib_plugin.c:196 -> 2",
        "W tensorflow/core/framework/op_kernel.cc:1692] OP_REQUIRES failed at nccl_ops.cc:104 : Unknown: "
        "ncclCommInitRank failed: unhandled system error", ""])
    root = root_finding(tmp_path, log)
    assert root["rule"] == "NC521", root["rule"]
    assert root["category"] == "nccl_error"
    assert "locked-memory limit" in root["fix"]["summary"]
    assert "exclude" not in root["fix"]["summary"]


def test_quiet_shows_the_line_the_rule_first_matched(tmp_path: Path) -> None:
    """cv-nuplan-raster-fp16-amp-overflow-loss-nan: NU005 "11 lines, first at line 51" and -q printed line 53, the
    third NaN-loss progress line; the first NaN (450/3125) is the one that tells when it started. -q's one evidence
    line is the one at the finding's first line (the traceback frame shown before an OOM message stays out)."""
    lines = [f"Epoch 0:  {p}%|#   | {s}/3125 [00:5{i}<05:32, 8.05it/s, loss={'nan' if s >= 450 else '2.31'}, v_num=0]"
             for i, (p, s) in enumerate(((13, 400), (14, 450), (16, 500), (17, 550)))]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = run("analyze", "-q", "--color", "never", "--no-progress", str(log)).stdout
    assert f"{log}:2: " in out.replace("\n", ""), out
    oom = run("analyze", "-q", "--color", "never", "--no-progress", B042).stdout.replace("\n", "")
    assert "b042_first_iter_oom.log:308: " in oom, oom
