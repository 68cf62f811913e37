"""Turn raw captures (run_capture.sh output) into sample logs: ``sample_logs/captured/<name>.log`` + ``.meta.json``.

    python3 finish.py --raw local=/tmp/raw_local --raw batch1=/tmp/b1/raw ... [--out ../captured]

Only path prefixes are rewritten (the machine-specific install and work folders become the usual container paths,
``/opt/venv/...`` and ``/workspace/``); every other byte stays as the programs printed it. The sidecar records the
versions, GPU, command, exit status and what really happened (``CAPTURES`` below, written after reading each log).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SITE = "/opt/venv/lib/python3.12/site-packages/"
# Longest first: a prefix must not be rewritten inside a longer one.
REWRITES = [
    ("/opt/torch/.venv/lib/python3.12/site-packages/", SITE),
    ("/tmp/v312/lib/python3.12/site-packages/", SITE),
    ("/root/.pyenv/versions/3.12.1/lib/python3.12/", "/usr/lib/python3.12/"),
    ("/work/main/sample_logs/reproduce/", "/workspace/"),
    ("/opt/torch/.venv/bin/", "/opt/venv/bin/"),
    ("/tmp/v312/bin/", "/opt/venv/bin/"),
    ("/tmp/site_old16/", SITE),
    ("/tmp/site_old/", SITE),
    ("/tmp/site_new/", SITE),
    ("/tmp/site_m16/", SITE),
]

HARNESS = (
    "Megatron-Bridge's own pretrain() on its vanilla GPT recipe (sample_logs/reproduce/bridge_run.py), local "
    "(non-TE) layer spec, mock data, NullTokenizer; optional packages the run never uses (Transformer Engine for "
    "Bridge's PEFT layers, ModelOpt, datasets, energon, diffusers, webdataset, nvidia_resiliency_ext) are import "
    "placeholders (stubs.py), megatron-core itself runs its real no-TE path."
)

# name -> (batch, raw name, what really happened)
CAPTURES: dict[str, tuple[str, str, str]] = {
    "b042_mfsdp_ckpt_format_old": ("local", "b042_mfsdp_ckpt_format_old",
        "2 ranks on CPU (validation runs before CUDA is touched). ddp.use_megatron_fsdp=true with the recipe's "
        "checkpoint.save directory and default torch_dist format: ConfigContainer.validate() raises "
        "AssertionError 'Megatron FSDP only supports fsdp_dtensor checkpoint format' (0.4.x wording) on both ranks."),
    "b062_mfsdp_ckpt_format_new": ("local", "b062_mfsdp_ckpt_format_new",
        "Same config on Bridge 0.6.2: AssertionError 'Megatron-FSDP requires the fsdp_dtensor checkpointing "
        "format!' on both ranks, from _validate_and_apply_megatron_fsdp_v1_configs."),
    "b042_dtensor_without_mfsdp": ("local", "b042_dtensor_without_mfsdp",
        "checkpoint.ckpt_format=fsdp_dtensor with plain DDP: AssertionError 'fsdp_dtensor checkpoint format only "
        "supports Megatron FSDP' on both ranks (Bridge 0.4.2)."),
    "b062_dtensor_without_mfsdp": ("local", "b062_dtensor_without_mfsdp",
        "checkpoint.ckpt_format=fsdp_dtensor with plain DDP on Bridge 0.6.2: the same assertion, current release."),
    "b062_cuda_max_connections": ("local", "b062_cuda_max_connections",
        "CUDA_DEVICE_MAX_CONNECTIONS=1 exported in the shell (it wins over the recipe's env_vars, which are "
        "setdefault) with Megatron FSDP and fsdp_dtensor: AssertionError 'FSDP requires CUDA_DEVICE_MAX_CONNECTIONS "
        "> 1 or unset.' on both ranks (Bridge 0.5+ only; 0.4.x has no such check)."),
    "b042_both_fsdp_old": ("local", "b042_both_fsdp_old",
        "dist.use_megatron_fsdp=true and dist.use_torch_fsdp2=true: ValueError 'Using use_megatron_fsdp and "
        "use_torch_fsdp2 at the same time is not supported.' from validate() on both ranks (Bridge 0.4.2)."),
    "b062_both_fsdp_new": ("local", "b062_both_fsdp_new",
        "dist.use_megatron_fsdp=true and dist.use_torch_fsdp2=true on Bridge 0.6.2: ValueError 'use_megatron_fsdp "
        "and use_torch_fsdp2 are mutually exclusive.' on both ranks."),
    # The first local run set ddp.use_megatron_fsdp (not dist.*) with dist.use_torch_fsdp2 and fsdp_dtensor; its raw
    # output was overwritten by the runs above, the finished logs were kept (exit status 1, 2 ranks).
    "b042_fsdp2_flag_dtensor_assert": ("local-first", "b042_both_fsdp_old",
        "ddp.use_megatron_fsdp=true plus dist.use_torch_fsdp2=true and checkpoint.ckpt_format=fsdp_dtensor: "
        "validate() checks the mutual exclusion on dist.use_megatron_fsdp only (still false), so it does not fire; "
        "the checkpoint check then fails: AssertionError 'fsdp_dtensor checkpoint format only supports Megatron "
        "FSDP' on both ranks (Bridge 0.4.2). The message blames the format, the cause is the FSDP2 flag."),
    "b062_fsdp2_flag_dtensor_assert": ("local-first", "b062_both_fsdp_new",
        "The same settings on Bridge 0.6.2: the same AssertionError 'fsdp_dtensor checkpoint format only supports "
        "Megatron FSDP' on both ranks."),
    "b042_import_no_te": ("local", "b042_import_no_te",
        "Transformer Engine absent and not stubbed (STUB_BLOCK): importing megatron.bridge fails with "
        "ModuleNotFoundError: No module named 'transformer_engine' (Bridge 0.4.2 imports it unguarded for its PEFT "
        "layers), before any config is read. 1 rank."),
    "b062_no_cuda": ("local", "b062_no_cuda",
        "No GPU visible (CUDA_VISIBLE_DEVICES empty, as on a Slurm step without --gpus): the config summary prints, "
        "validation passes, then initialize_megatron asserts 'Megatron requires CUDA.'; Bridge 0.6.2 logs "
        "'Pretrain failed on rank=0 ...' before the traceback."),
    "b042_override_key_renamed": ("local", "b042_override_key_renamed",
        "The 0.6 override key dataset.seq_length given to Bridge 0.4.2, whose key is dataset.sequence_length: "
        "Hydra cannot apply it (ConfigAttributeError 'Key 'seq_length' is not in struct' -> ConfigCompositionException "
        "-> Bridge's OverridesError 'Failed to parse Hydra overrides: Could not override 'dataset.seq_length'.'), on "
        "both ranks, before validation."),
    "b042_async_save_dtensor_old": ("local", "b042_async_save_dtensor_old",
        "Megatron FSDP with fsdp_dtensor and checkpoint.async_save=true on Bridge 0.4.2: AssertionError "
        "'async_save is only supported with ckpt_format='torch_dist'' (0.5+ also accepts fsdp_dtensor)."),
    "b062_world_not_divisible_by_tp": ("local", "b062_world_not_divisible_by_tp",
        "2 ranks with model.tensor_model_parallel_size=4: get_data_parallel_size asserts with a message that starts "
        "on the line after 'AssertionError:' ('world size (2) is not divisible by total_model_size (...)')."),
    "b062_gbs_not_divisible": ("local", "b062_gbs_not_divisible",
        "2 ranks, micro batch 1, train.global_batch_size=3: validate() fails on the value derived from it, "
        "'eval_global_batch_size (3) must be divisible by eval_micro_batch_size * eval_data_parallel_size "
        "(1 * 2 = 2)' (the message names the eval sizes although the training batch was set)."),
    "b042_fsdp2_pg_collection": ("batch1", "b042_fsdp2_pg_collection",
        "One H200, tiny model, dist.use_torch_fsdp2=true, Bridge 0.4.2 + megatron-core 0.17.1: the model builds, "
        "then pretrain -> setup -> _build_distributed_model -> provide_distributed_model -> get_model -> _ddp_wrap "
        "passes pg_collection= to TorchFullyShardedDataParallel, which has no such parameter: TypeError."),
    "b042_ddp_wrap_oom": ("batch1", "b042_ddp_wrap_oom",
        "One H200, 36.3B-parameter GPT (40 layers, hidden 8192, ffn 28672, 64/8 heads, vocab 128256, untied), plain "
        "DDP without the distributed optimizer, fp32 grad buffer: the model (67.67 GiB bf16) is built, then the "
        "135.33 GiB fp32 grad buffer does not fit at wrap time (torch.OutOfMemoryError)."),
    "b042_mfsdp_ogp_wrap_oom": ("batch1", "b042_mfsdp_ogp_wrap_oom",
        "One H200, the same 36.3B model, Megatron FSDP optim_grads_params (at DP=1 nothing is sharded): the FSDP "
        "buffers are being filled while the original parameters still exist; a 3.19 GiB allocation fails with "
        "137.65 GiB allocated (wrap time)."),
    "b062_transformers_tokenizers_pin": ("batch1", "b062_adam_step_oom",
        "Meant as a training run on Bridge 0.6.2; importing megatron.bridge imports transformers 5.12.1, whose "
        "runtime dependency check rejects the machine's tokenizers 0.23.2 (it pins tokenizers<=0.23.0): "
        "ImportError before any config is read. Batch 2 carried tokenizers 0.22.2 to get past it."),
    "b062_distopt_wrap_oom": ("batch2", "b062_distopt_wrap_oom",
        "One H200, the 36.3B model, distributed optimizer (the recipe's default, synced to ddp), fp32 grads, "
        "Bridge 0.6.2 + megatron-core 0.19.2: the 135.33 GiB grad buffer does not fit at wrap time; Bridge logs "
        "'Pretrain failed on rank=0 with OutOfMemoryError ...' and the traceback follows."),
    "b062_mfsdp_optim_wrap_oom": ("batch2", "b062_mfsdp_optim_wrap_oom",
        "One H200, the 36.3B model, Megatron FSDP 'optim' strategy, fsdp_dtensor format, Bridge 0.6.2: a 135.33 "
        "GiB buffer allocation fails at wrap time."),
    "b062_first_iter_activation_oom": ("batch2", "b062_first_iter_activation_oom",
        "One H200, 8.0B model (32 layers, hidden 4096), sequence 8192, micro batch 1, unfused (local) attention that "
        "materialises the score matrix: the model state fits, the first forward of iteration 1 runs out of memory "
        "(4.00 GiB request). The recipe's masked_softmax_fusion was on; the OOM came before the fused softmax."),
    "b062_missing_fused_softmax": ("batch2", "b062_mfsdp_dtensor_save",
        "2 H200s, tiny model, Megatron FSDP: the recipe enables masked_softmax_fusion, whose CUDA kernel comes from "
        "apex (not installed): ModuleNotFoundError: No module named 'scaled_masked_softmax_cuda' in the first "
        "forward, on both ranks. Batch 3 set model.masked_softmax_fusion=false."),
    "b062_adam_step_oom": ("batch3", "b062_adam_step_oom",
        "One H200, 9.8B model (40 layers, hidden 4096), distributed optimizer at DP=1, fp32 grads, seq 1024: wrap "
        "and the fp32 main parameters fit (about 10 bytes/param), forward and backward run, then Adam's "
        "exp_avg/exp_avg_sq are created lazily in the first optimizer step (torch.optim.Adam _init_group) and a "
        "96 MiB allocation fails with the GPU full."),
    "b062_ckpt_save_disk_full": ("batch3", "b062_ckpt_save_enospc",
        "One H200, tiny model, 3 iterations logged (config summary, iteration lines), then the torch_dist save at "
        "iteration 3 into a 1 MiB tmpfs (a full file system). megatron-core's async filesystem writer reports only "
        "'RuntimeError: Worker failure: An error is caught while starting worker 0, error: <class "
        "'RuntimeError'>': the ENOSPC itself is not printed."),
    "b062_tiny_train_success": ("batch3", "b062_fragmentation_oom",
        "Meant as a fragmentation OOM: at iteration 2 the harness filled the GPU with 2 GiB blocks, freed them and "
        "re-took 1.2 GiB of each, then asked for 24 GiB. The request was served (no OOM) and the run finished its "
        "4 iterations: kept as a clean single-GPU Bridge 0.6.2 log (exit 0)."),
    "b062_mfsdp_dtensor_save_hang": ("batch3", "b062_mfsdp_dtensor_save",
        "2 H200s, tiny model, Megatron FSDP optim_grads_params, fsdp_dtensor saves every 2 iterations: iterations "
        "1-2 log, then 'saving checkpoint at iteration 2 ... in fsdp_dtensor format' and 'Storing distributed "
        "optimizer sharded state of type fsdp_dtensor' and nothing more for about 60 s, until the harness's "
        "100 s limit sent SIGTERM to torchrun. A DP=2 memory measurement was running on the same two GPUs at the "
        "time; the cause of the hang was not established."),
    "b062_mfsdp_dtensor_resume_hang": ("batch3", "b062_mfsdp_dtensor_resume",
        "The resume run after b062_mfsdp_dtensor_save_hang (checkpoint.load=/tmp/ckok): that save never completed, "
        "so there was no checkpoint to load and the run started from iteration 0 without saying so; it trained 6 "
        "iterations, then hung again in the final fsdp_dtensor save ('saving checkpoint at iteration 6 ... in "
        "fsdp_dtensor format', nothing after it) until the harness's 100 s limit sent SIGTERM to torchrun. The DP=2 "
        "memory measurement was running on the same GPUs; the cause of the hang was not established."),
    "b062_rank_killed": ("batch3", "b062_rank_killed",
        "2 H200s, tiny model, DDP: rank 1 sends itself SIGKILL at its 3rd forward (as the kernel OOM killer or a "
        "preemption does). torchrun reports rank 1 exitcode -9 (Signal 9) as the root cause and SIGTERMs rank 0 "
        "(exitcode -15) in the Failures block."),
    "b062_rank_stall_watchdog": ("batch4", "b062_rank_stall_watchdog",
        "2 H200s, tiny model, DDP, dist.distributed_timeout_minutes=1: rank 1 sleeps at its 3rd forward; rank 0 "
        "waits in the gradient all-reduce (finish_grad_sync) and after 60 s the NCCL watchdog reports the timeout "
        "(SeqNum=7, OpType=COALESCED, NumelIn=293082112) with the stack of the collective and a flight-recorder "
        "dump on both ranks. The processes did not exit on their own afterwards; the harness's 150 s limit sent "
        "SIGTERM to torchrun (as a Slurm time limit would), which shut the workers down."),
    "b062_two_node_success": ("batch4", "b062_two_node_oom_cascade",
        "Meant as a two-node OOM cascade (two torchrun agents, one GPU each, output merged as in one Slurm job "
        "file): rank 1's injected 100 GiB request fitted on the otherwise empty H200, so nothing failed and both "
        "'nodes' finished 8 iterations. Kept as a clean two-agent log (exit 0)."),
}


def rewrite(text: str) -> str:
    for old, new in REWRITES:
        text = text.replace(old, new)
    return text


def read_env(path: Path) -> dict:
    env: dict[str, object] = {"gpus": []}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "gpu":
            env["gpus"].append(value)
        elif key in ("python", "torch", "megatron-core", "megatron-bridge", "transformers", "visible"):
            env[key.replace("-", "_")] = value
    return env


def finish(name: str, raw_dirs: dict[str, Path], out: Path) -> None:
    batch, raw_name, happened = CAPTURES[name]
    out = _out_dir(name, out)
    raw = raw_dirs[batch]
    if not (raw / f"{raw_name}.log").exists():
        print("no raw log, kept as finished:", name)
        return
    log = (raw / f"{raw_name}.log").read_bytes()
    # Decode as latin-1 so that every byte survives the prefix rewrite unchanged.
    (out / f"{name}.log").write_bytes(rewrite(log.decode("latin-1")).encode("latin-1"))
    env = read_env(raw / f"{raw_name}.env")
    rc_text = (raw / f"{raw_name}.rc").read_text().split() if (raw / f"{raw_name}.rc").exists() else []
    on_gpu = batch != "local"
    meta = {
        "name": name,
        "captured": "2026-11-29",
        "batch": batch,
        "machine": _machine(env) if on_gpu else "x86-64 Linux, no GPU (validation and import failures need none)",
        "cuda_visible_devices": env.get("visible"),
        "python": env.get("python"),
        "torch": env.get("torch"),
        "megatron_core": env.get("megatron_core"),
        "megatron_bridge": env.get("megatron_bridge"),
        "transformers": env.get("transformers"),
        "command": rewrite((raw / f"{raw_name}.cmd").read_text().strip()),
        "environment": _fault_env(name),
        "exit_status": int(rc_text[0]) if rc_text else None,
        "seconds": int(rc_text[1]) if len(rc_text) > 1 else None,
        "what_happened": happened,
        "harness": HARNESS,
        "path_prefixes_rewritten": [f"{a} -> {b}" for a, b in REWRITES],
    }
    (out / f"{name}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def _machine(env: dict) -> str:
    gpus, visible = env["gpus"], str(env.get("visible"))
    if not gpus:
        return "?"
    if visible.isdigit():
        return f"1 x {gpus[0]} (GPU {visible} of a {len(gpus)}-GPU machine)"
    return f"{len(gpus)} x {gpus[0]}"


def _out_dir(name: str, default: Path) -> Path:
    """Captures the tool does not diagnose right yet live in reproduce/pending (see its README)."""
    pending = Path(__file__).resolve().parent / "pending"
    return pending if (pending / f"{name}.log").exists() else default


def _fault_env(name: str) -> dict[str, str]:
    return {
        "b062_cuda_max_connections": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
        "b042_import_no_te": {"STUB_BLOCK": "transformer_engine transformer_engine_torch"},
        "b062_no_cuda": {"CUDA_VISIBLE_DEVICES": ""},
        "b062_tiny_train_success": {"FAULT": "fragment@0:2"},
        "b062_rank_killed": {"FAULT": "kill@1:3"},
        "b062_rank_stall_watchdog": {"FAULT": "stall@1:3"},
        "b062_two_node_success": {"FAULT": "oom@1:3"},
    }.get(name, {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", action="append", default=[], help="BATCH=DIR (local, batch1..batch4)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "captured"))
    parser.add_argument("names", nargs="*", help="captures to finish (default: all whose batch is given)")
    args = parser.parse_args()
    raw_dirs = {k: Path(v) for k, v in (item.split("=", 1) for item in args.raw)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.names or [n for n, c in CAPTURES.items() if c[0] in raw_dirs]:
        if CAPTURES[name][0] not in raw_dirs:
            print("no raw folder given for", name)
            continue
        finish(name, raw_dirs, out)
        print("finished", name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
