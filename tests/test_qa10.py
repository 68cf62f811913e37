"""QA round 10 (docs/qa-report-10.md): a hostile new user of the commands past ``analyze``, and the answers on the
newest dev logs (``ce-`` .. ``ch-``).

Each test failed on the tree before its fix. Output tests run the real command line (``python -m diagnose``) as a
subprocess; catalogue tests read ``load_catalogue()``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import ROOT, finding_words, root_finding, run, write

EXAMPLE = ROOT / "examples" / "run_config.yaml"




def _config_with(tmp_path: Path, key: str, value: str) -> Path:
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    out = [f"  {key}: {value}" if line.startswith(f"  {key}:") else line for line in lines]
    assert out != lines
    return write(tmp_path, "run_config.yaml", "\n".join(out) + "\n")


@pytest.mark.parametrize(("key", "value"), [("seq_length", "0"), ("vocab_size", "-1"),
                                            ("hidden_size", "99999999999999999999999999")])
def test_check_refuses_a_size_that_is_zero_negative_or_past_any_model(tmp_path: Path, key: str, value: str) -> None:
    """A seq_length of 0 was planned as 4,096 and a vocab_size of -1 as 32,000, silently; a hidden_size of 1e26
    printed a table of 45-digit figures. Each is now one line naming the key, exit 2."""
    proc = run("check", str(_config_with(tmp_path, key, value)), "--gpus", "8", code=(2,))
    assert proc.stdout == ""
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and f"model.{key}=" in err and "Traceback" not in err


def _immutable(path: Path) -> bool:
    """Make ``path`` unwritable even for root (chattr +i); False where that cannot be done here."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        path.parent.chmod(0o555)
        return True
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def test_fleet_scan_into_a_store_that_cannot_be_written_is_one_line_before_the_scan(tmp_path: Path) -> None:
    """A read-only store was opened, every log analysed, then the first commit failed with "internal error:
    OperationalError: attempt to write a readonly database". It is now refused at once, in words, and the report
    still reads it."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write(logs, "a.log", "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"
                         "RuntimeError: shard 7 is truncated\n")
    store = tmp_path / "store" / "fleet.db"
    store.parent.mkdir()
    run("fleet", "scan", str(logs), "--store", str(store), code=(0,))
    write(logs, "b.log", "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"
                         "ValueError: another failure\n")
    if not _immutable(store):
        pytest.skip("no way to make a file unwritable here")
    try:
        proc = run("fleet", "scan", str(logs), "--store", str(store), code=(2,))
        err = proc.stderr.strip().splitlines()[-1]
        assert "internal error" not in err and "cannot be written" in err, proc.stderr
        assert "1/1 jobs" not in proc.stderr  # refused before analysing anything
        assert run("fleet", "report", "--store", str(store), code=(0, 1)).stdout.startswith("FLEET REPORT")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(store)], capture_output=True)
        else:
            store.parent.chmod(0o755)


def test_a_checkpoint_sharding_validation_failure_on_save_is_not_told_the_checkpoint_does_not_fit(tmp_path: Path) -> None:
    """cf-mbridge-gpt-oss-tp2-pp2-ep1-dist-ckpt-save-flattened-ranges-exception: megatron-core's dist_checkpointing
    validation ('Flattened ranges dont cover the whole shard', validation.py) failed while SAVING. The answer was
    'Checkpoint tensor shapes do not match the model' with steps about the checkpoint on disk only."""
    finding = root_finding(tmp_path, (
        "[rank0]:   File \"/opt/megatron-lm/megatron/core/dist_checkpointing/serialization.py\", line 386, in save\n"
        "[rank0]: megatron.core.dist_checkpointing.core.CheckpointingException: Flattened ranges dont cover the "
        "whole shard ShardedTensor(key='optimizer.state.exp_avg.decoder.layers.mlp.experts.experts.linear_fc2.bias',"
        " dtype=torch.float32, local_shape=(2880,)) of size 2880. Ranges: (array([0, 0]), array([2880, 2880]))\n"))
    words = finding_words(finding)
    assert "Flattened ranges" in words and "sharded state dict" in words
    assert any("saving" in s.lower() for s in finding["fix"]["steps"])


def test_a_port_in_use_reported_by_several_ranks_of_one_job_is_told_the_launcher_ran_per_task(tmp_path: Path) -> None:
    """ce-neox-*-address-in-use (3 dev logs): the DeepSpeed runner ran once per MPI/srun task, each copy binding the
    same port. The answer was only 'Use a free, job-specific MASTER_PORT', which cannot help."""
    finding = root_finding(tmp_path, "".join(f"[1,{r}]<stderr>:RuntimeError: Address already in use\n" for r in (3, 5)))
    assert finding["rule"] == "LA010"
    steps = " ".join(finding["fix"]["steps"])
    assert "--ntasks-per-node=1" in steps and "--force_multi" in steps


def test_a_nccl_remote_error_on_every_node_points_at_the_interface_nccl_chose(tmp_path: Path) -> None:
    """ce-deepspeed-2node-nccl-socket-iface-eno1-remote-error: both nodes failed at the first collective; the thread
    set NCCL_SOCKET_IFNAME. NC013's Fix was 'Find the rank that exited first' with no step."""
    line = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1333,"
            " remote process exited or there was a network error, NCCL version 2.18.6\n")
    finding = root_finding(tmp_path, f"server101: {line}server100: {line}")
    assert finding["rule"] == "NC013"
    steps = " ".join(finding["fix"]["steps"])
    assert "NCCL_SOCKET_IFNAME" in steps and "NCCL_DEBUG=INFO" in steps


def test_a_pinned_memory_oom_names_deepspeeds_offload_pin_memory(tmp_path: Path) -> None:
    """ce-deepspeed-cifar-zero3-offload-pin-memory-oom-small-container and ce-deepspeed-wsl2-zero2-cpu-offload-...:
    DeepSpeed's offload pinned its CPU buffers in a small container; the thread set pin_memory: false. OOM025's
    steps spoke of checkpoint saves only."""
    finding = root_finding(tmp_path, (
        "Traceback (most recent call last):\n"
        "  File \"/opt/conda/lib/python3.8/site-packages/deepspeed/runtime/zero/stage3.py\", line 400, in "
        "_setup_for_real_optimizer\n"
        "    self.fp32_partitioned_groups_flat.append(t.cpu().pin_memory())\n"
        "  File \"/opt/conda/lib/python3.8/site-packages/deepspeed/accelerator/cuda_accelerator.py\", line 225, in "
        "pin_memory\n"
        "    return tensor.pin_memory()\n"
        "RuntimeError: CUDA error: out of memory\n"))
    assert finding["rule"] == "OOM025"
    assert "pin_memory: false" in " ".join(finding["fix"]["steps"])


def test_a_dependency_pin_fix_has_no_placeholder_and_covers_upgrading_the_pinning_package(tmp_path: Path) -> None:
    """cg-llamafactory-internvl3-transformers-dev-version-check-importerror: the user needed the newer transformers
    (InternVL3); the thread upgraded LLaMA-Factory or set DISABLE_VERSION_CHECK=1. IM054's only step was the literal
    placeholder pip install '<requirement from the message>', i.e. go back to the old version."""
    finding = root_finding(tmp_path, (
        "ImportError: transformers>=4.45.0,<=4.51.3,!=4.48.0 is required for a normal functioning of this module, "
        "but found transformers==4.52.0.dev0.\n"))
    assert finding["rule"] == "IM054"
    words = finding_words(finding)
    assert "<" + "requirement" not in words and "upgrade the package" in words


def test_an_early_watchdog_timeout_of_an_idle_inference_server_is_told_to_raise_its_timeout(tmp_path: Path) -> None:
    """ch-sglang-deepseek-r1-2node-tp16-idle-allgather-watchdog-timeout-default-dist-timeout: a TP all-gather of an
    idle sglang server hit the 600 s timeout (SeqNum 41). NC002 spoke of training set-up only; the thread raised
    sglang's --dist-timeout."""
    finding = root_finding(tmp_path, (
        "[rank4]:[E304 10:56:40.122900448 ProcessGroupNCCL.cpp:616] [Rank 4] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=41, OpType=_ALLGATHER_BASE, NumelIn=8080, NumelOut=129280, Timeout(ms)=600000) ran "
        "for 600013 milliseconds before timing out.\n"))
    assert finding["rule"] == "NC002"
    assert "--dist-timeout" in " ".join(finding["fix"]["steps"])


def test_a_state_dict_missing_only_frozen_keys_is_told_about_trainable_only_checkpoints(tmp_path: Path) -> None:
    """ch-lavis-blip2-resume-*-missing-keys-strict-load (2 dev logs): LAVIS saved only the trainable parameters and
    the resume loaded strictly; the maintainers' fix was strict=False. CK009's steps covered prefixes, sizes and
    Megatron formats only."""
    finding = root_finding(tmp_path, (
        "Traceback (most recent call last):\n"
        "  File \"/workspace/LAVIS/lavis/runners/runner_base.py\", line 640, in _load_checkpoint\n"
        "    self.unwrap_dist_model(self.model).load_state_dict(checkpoint[\"model\"])\n"
        "RuntimeError: Error(s) in loading state_dict for Blip2OPT:\n"
        "\tMissing key(s) in state_dict: \"visual_encoder.cls_token\", \"visual_encoder.pos_embed\".\n"))
    assert finding["rule"] == "CK009"
    assert "strict=False" in " ".join(finding["fix"]["steps"])


def test_an_oom_after_training_started_with_selective_recompute_is_offered_full_recompute(tmp_path: Path) -> None:
    """cf-mbridge-gemma4-vl-sft-selective-recompute-oom-iter7-8gpu: the recipe already recomputed selectively and the
    fix was full-layer recompute. OOM104's only step offered recompute_granularity=selective, which it had."""
    finding = root_finding(tmp_path, (
        " [2026-11-29 10:00:00] iteration      7/   10000 | consumed samples:        896 | lm loss: 2.404998E+00 |\n"
        "Traceback (most recent call last):\n"
        "  File \"/opt/megatron-lm/megatron/core/pipeline_parallel/schedules.py\", line 172, in forward_step\n"
        "    output_tensor = forward_step_func(data_iterator, model)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.94 GiB. GPU 3 has a total capacity of "
        "79.11 GiB of which 2.38 GiB is free.\n"))
    assert finding["rule"] == "OOM104"
    assert "recompute_granularity=full" in " ".join(finding["fix"]["steps"])


def test_fleet_reports_node_test_rate_says_what_it_is_a_rate_of(tmp_path: Path) -> None:
    """On sample_logs, the report's first line said '54 failed (98.2%)' and the next 'fleet rate 92.0%': two failure
    rates, the second over job-node pairs with the failures blamed on a node (docs/fleet.md), unexplained."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for log in sorted((ROOT / "sample_logs").glob("*.log"))[:20]:
        shutil.copy(log, logs / log.name)
    store = tmp_path / "fleet.db"
    run("fleet", "scan", str(logs), "--store", str(store), "-j", "1", "--no-progress", code=(0,))
    out = run("fleet", "report", "--store", str(store)).stdout
    line = next(x for x in out.splitlines() if "fleet rate" in x)
    assert "job-node pairs" in line


def test_an_enroot_gpu_hook_failure_is_not_answered_with_disk_space_only(tmp_path: Path) -> None:
    """cf-pyxis-enroot-gpu-container-start-file-lookup-denied-after-libnvidia-container-upgrade: 98-nvidia.sh
    (nvidia-container-cli) failed after a libnvidia-container upgrade. SL016's Fix was only free space and enroot's
    paths."""
    finding = root_finding(tmp_path, (
        "slurmstepd: error: pyxis:     nvidia-container-cli: container error: file lookup failed: "
        "/proc/418833/root/etc/debian_version: permission denied\n"
        "slurmstepd: error: pyxis:     [ERROR] /etc/enroot/hooks.d/98-nvidia.sh exited with return code 1\n"))
    assert finding["rule"] == "SL016"
    assert "nvidia-container-cli" in " ".join(finding["fix"]["steps"])


@pytest.mark.parametrize("line", [
    "{'loss': nan, 'learning_rate': 4.993446030541355e-05, 'epoch': 0.00}\n",
    "{'loss': 0.0, 'acc': 0.0, 'grad_norm': nan, 'learning_rate': 1.00e-05, 'epoch': 0.03}\n",
])
def test_a_nan_loss_or_grad_norm_fix_names_fp16_overflow(tmp_path: Path, line: str) -> None:
    """cg-hf-trainer-t5-large-fp16-amp-loss-nan (NU005), cf-swift-deepseek-vl-full-ft-fp16-zero2-grad-nan-... and
    ch-qwen2-7b-v100-fp16-sft-loss-zero-grad-norm-nan-... (NU010): fp16 training of a bf16-pretrained model; the
    threads' fix was bf16 or fp32. The Fix named lr, warm-up and 'precision' with no step."""
    finding = root_finding(tmp_path, line * 4)
    assert finding["rule"] in ("NU005", "NU010")
    steps = " ".join(finding["fix"]["steps"])
    assert "fp16" in steps and "bf16" in steps


def test_slurm_on_a_running_job_says_the_log_is_so_far_and_offers_follow(tmp_path: Path) -> None:
    """`diagnose slurm JOBID` on a job still RUNNING printed 'No failure found.' under the job's header, a verdict
    on a log that is not finished. The header now says the job has not ended and names --follow. Slurm's commands
    are stand-ins on PATH printing what slurm-local's scontrol printed for such a job."""
    log = write(tmp_path, "run-4242.out", "starting training\niteration 1 / 100 | lm loss: 1.0\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = (f"JobId=4242 JobName=qa10-run UserId=root(0) GroupId=root(0) JobState=RUNNING Reason=None "
              f"ExitCode=0:0 RunTime=00:00:17 TimeLimit=365-00:00:00 StartTime=2026-12-06T14:51:43 "
              f"NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 WorkDir={tmp_path} StdErr={log} "
              f"StdIn=/dev/null StdOut={log}")
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\ncase \"$*\" in *'show job'*) echo '{record}';; esac\nexit 0\n", encoding="utf-8")
    sacct = bin_dir / "sacct"
    sacct.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    for tool in (scontrol, sacct):
        tool.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160", "DIAGNOSE_NO_CONFIG": "1",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("DIAGNOSE_SKIP_SLURM", None)
    proc = subprocess.run([sys.executable, "-m", "diagnose", "slurm", "4242"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "RUNNING" in proc.stdout
    assert "--follow" in proc.stdout and "so far" in proc.stdout


def test_replay_refuses_a_set_size_that_is_not_positive(tmp_path: Path) -> None:
    """`replay examples/run_config.yaml --set model.hidden_size=-5` printed 'passes validation with your overrides'
    and exit 0. It is refused in one line, exit 2, as check refuses the same config."""
    proc = run("replay", str(EXAMPLE), "--set", "model.hidden_size=-5", code=(2,))
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "model.hidden_size=-5" in err
    assert run("replay", str(EXAMPLE), "--set", "model.hidden_size=4096", code=(0,)).returncode == 0


def test_an_illegal_memory_access_fix_covers_upgrading_the_package_whose_kernel_faulted(tmp_path: Path) -> None:
    """ce-flashattn-0p2-illegal-memory-access-fwd-fixed-by-upgrade: the category line said 'a bug of that release,
    usually fixed by another' (IF911), but HW001's Fix spoke of locating the kernel and Xid errors only; the thread
    upgraded flash-attn."""
    finding = root_finding(tmp_path, (
        "Traceback (most recent call last):\n"
        "  File \"/opt/conda/lib/python3.8/site-packages/flash_attn/flash_attn_interface.py\", line 21, in _flash_attn_forward\n"
        "    softmax_lse, *rest = flash_attn_cuda.fwd(\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"))
    assert finding["rule"] == "HW001"
    assert "upgrade that package" in " ".join(finding["fix"]["steps"])


def test_a_missing_fused_layer_norm_is_not_offered_only_gradient_accumulation_fusion(tmp_path: Path) -> None:
    """cf-ernie-fp16-finetune-apex-reinstalled-without-cuda-ext-fused-layer-norm-missing: a plain pip install had
    replaced apex's extension build. IM020 offered 'or turn off gradient accumulation fusion', which does not touch
    fused_layer_norm_cuda, and nothing on how the build gets lost."""
    finding = root_finding(tmp_path, (
        "Traceback (most recent call last):\n"
        "  File \"/usr/local/lib/python3.8/dist-packages/apex/normalization/fused_layer_norm.py\", line 30, in "
        "forward\n"
        "    fused_layer_norm_cuda = importlib.import_module(\"fused_layer_norm_cuda\")\n"
        "ModuleNotFoundError: No module named 'fused_layer_norm_cuda'\n"))
    assert finding["rule"] == "IM020"
    steps = " ".join(finding["fix"]["steps"])
    assert "fused_layer_norm_cuda" in steps and "Python-only" in steps


def test_a_host_oom_while_loading_names_every_rank_loading_the_full_model(tmp_path: Path) -> None:
    """ce-deepspeed-zero3-bloom7b-8-ranks-host-ram-oom-killed: each of 8 ranks loaded the full model into CPU RAM
    before deepspeed.initialize; the thread's fix was zero.Init / low_cpu_mem_usage. OOM020's steps were data loader
    workers, CPU offload and --mem=0."""
    finding = root_finding(tmp_path, (
        "[Thu Feb 16 09:43:38 2023] Out of memory: Killed process 72236 (python3) total-vm:118442096kB, "
        "anon-rss:98765432kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:200000kB oom_score_adj:0\n"))
    assert finding["rule"] == "OOM020"
    steps = " ".join(finding["fix"]["steps"])
    assert "zero.Init" in steps and "low_cpu_mem_usage" in steps


def test_no_rule_step_is_a_bare_placeholder_for_text_of_the_message() -> None:
    """IM054 and IM063's only step was pip install '<requirement from the message>': a placeholder the reader must
    fill from a line the answer does not quote. Command templates (<node>, <interface>) are fine; a placeholder
    standing for 'the message' is not."""
    from diagnose.match.rules import load_catalogue

    catalogue = load_catalogue([])
    bad = [r.code for r in catalogue.rules
           for step in (r.fix.steps if r.fix is not None else ()) if "from the message>" in step]
    assert bad == []
