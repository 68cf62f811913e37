"""What config extraction asks the scanner to capture (``diagnose.explain.config.CAPTURES``).

Block names are the contract with ``extract.from_blocks``. Config dumps are printed once by rank 0, so "first"
is enough; lines that each rank prints (parameter counts) are kept per occurrence; environment lines keep the
first and last value printed (the last one is what the failing process saw).
"""

from __future__ import annotations

from diagnose.model import CaptureSpec

TASK_CONFIG_BANNER = "------- Task Configuration -------"
TASK_CONFIG_END = "----------------------------------"
SUMMARY_TITLE = "Configuration Summary (Non-Default Values vs Megatron Core)"
MLM_ARGS_BANNER = "------------------------ arguments ------------------------"
MLM_ARGS_END = "-------------------- end of arguments ---------------------"

CAPTURES: list[CaptureSpec] = [
    # Bridge <= 0.3.0: the whole ConfigContainer as YAML between banners.
    CaptureSpec("config.task_yaml", TASK_CONFIG_BANNER, lines_after=5000, until=TASK_CONFIG_END),
    # Bridge >= 0.3.1: non-default values only; the block ends with a '=' rule after its sections, which the
    # parser finds (the line right after the title is a '=' rule too, so `until` cannot be used).
    CaptureSpec("config.summary", SUMMARY_TITLE, lines_after=3000),
    # Megatron-LM argument dump.
    CaptureSpec("config.mlm_args", MLM_ARGS_BANNER, lines_after=3000, until=MLM_ARGS_END),
    # Launch lines: torchrun / python -m torch.distributed.run / python script.py with flags or key=value.
    CaptureSpec("config.launch_torchrun", "torchrun", regex=r"torchrun\s+\S", lines_after=80, keep="all", max_blocks=8),
    CaptureSpec("config.launch_distrun", "torch.distributed.run", regex=r"-m\s+torch\.distributed\.run\s+\S",
                lines_after=80, keep="all", max_blocks=8),
    # Anchor ".py " (not ".py"): every Python warning line has "file.py:N"; a launch line worth reading has
    # arguments after the script.
    CaptureSpec("config.launch_python", ".py ", regex=r"(^|[\s/+])python[0-9.]*\s+(-u\s+)?\S+\.py(\s|$)",
                lines_after=80, keep="all", max_blocks=8),
    # Environment the job printed (env dumps, `set -x`, `export`).
    CaptureSpec("config.env_max_connections", "CUDA_DEVICE_MAX_CONNECTIONS=", keep="first_last"),
    CaptureSpec("config.env_alloc_conf", "ALLOC_CONF=", regex=r"PYTORCH_(CUDA_)?ALLOC_CONF=", keep="first_last"),
    CaptureSpec("config.env_slurm", "SLURM_",
                regex=r"SLURM_(NTASKS|NNODES|JOB_NUM_NODES|GPUS_ON_NODE|NTASKS_PER_NODE)=", keep="all", max_blocks=16),
    # World size / model-parallel sizes printed at start-up (Megatron-LM arguments.py L390).
    CaptureSpec("config.world_size", "using world size:"),
    # megatron-core DDP / Megatron-FSDP wrap prints its full config repr.
    CaptureSpec("config.ddp_repr", "Setting up DistributedDataParallel with config"),
    CaptureSpec("config.num_parameters", " > number of parameters on", keep="all", max_blocks=64),
    # megatron-core's import-time fallback warnings: no Transformer Engine (so the local layer spec), no apex
    CaptureSpec("config.te_missing", "Transformer Engine and Apex are not installed"),
    CaptureSpec("config.apex_missing", "Apex is not installed. Falling back to Torch Norm"),
    # Version clues: "megatron-core 0.16.1", "megatron_bridge==0.4.2", "megatron-bridge version: 0.6.2".
    *[
        CaptureSpec(f"config.version_line.{anchor}", anchor,
                    regex=r"megatron[-_.](core|bridge)(\s*(version)?\s*[:=]=?\s*|\s+v?)\d+\.\d+")
        for anchor in ("megatron-core", "megatron_core", "megatron-bridge", "megatron_bridge")
    ],
]
