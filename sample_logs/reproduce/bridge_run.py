"""Run Megatron-Bridge's own ``pretrain()`` on its vanilla GPT recipe, with Hydra-style overrides, to capture logs.

Usage (under torchrun):
    bridge_run.py [--size tiny|1b|8b|10b|36b] [--seq N] [--mbs N] [--gbs N] [--iters N] [OVERRIDE ...]

Works with Megatron-Bridge 0.4.x (recipe ``recipes.gpt.vanilla_gpt``, key ``dataset.sequence_length``) and 0.5+/0.6
(recipe ``recipes.gpt.h100.vanilla_gpt``, key ``dataset.seq_length``). The model always uses Bridge's own local
(non-Transformer-Engine) layer spec: the capture machine has no Transformer Engine. Everything else is the recipe
plus the overrides given, so the failure is whatever Bridge and megatron-core really do with that config.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import stubs  # noqa: F401  (placeholders for optional packages a GPT pretrain does not use; must come first)

# layers, hidden, ffn, attention heads, query groups (SwiGLU, RMSNorm, RoPE, no biases, untied embeddings)
SIZES = {
    "tiny": (2, 1024, 4096, 16, 4),
    "1b": (16, 2048, 8192, 16, 8),
    "8b": (32, 4096, 14336, 32, 8),
    "10b": (40, 4096, 14336, 32, 8),
    "36b": (40, 8192, 28672, 64, 8),
}
VOCAB = 128256


def load_recipe():
    try:  # Megatron-Bridge 0.5+
        from megatron.bridge.recipes.gpt.h100.vanilla_gpt import vanilla_gpt_pretrain_1gpu_h100_bf16_config as recipe

        return recipe, "dataset.seq_length"
    except ImportError:  # Megatron-Bridge 0.4.x
        from megatron.bridge.recipes.gpt.vanilla_gpt import vanilla_gpt_pretrain_config as recipe

        return recipe, "dataset.sequence_length"


def model_overrides(size: str, seq: int) -> list[str]:
    layers, hidden, ffn, heads, groups = SIZES[size]
    return [
        f"model.num_layers={layers}",
        f"model.hidden_size={hidden}",
        f"model.ffn_hidden_size={ffn}",
        f"model.num_attention_heads={heads}",
        f"model.num_query_groups={groups}",
        "model.gated_linear_unit=true",
        "model.normalization=RMSNorm",
        "model.add_bias_linear=false",
        "model.position_embedding_type=rope",
        "model.share_embeddings_and_output_weights=false",
        "model.make_vocab_size_divisible_by=128",
        f"model.seq_length={seq}",
        # No apex on the capture machine: neither the fused wgrad kernel nor the fused masked softmax exists
        # (batch 2 captured what the latter does: ModuleNotFoundError 'scaled_masked_softmax_cuda' at the first forward).
        "model.gradient_accumulation_fusion=false",
        *([] if os.environ.get("KEEP_FUSED_SOFTMAX") else ["model.masked_softmax_fusion=false"]),
        f"tokenizer.vocab_size={VOCAB}",
    ]


def with_fault(forward_step):
    """Wrap Bridge's forward_step so that one rank misbehaves at one iteration, as ``FAULT=kind@rank:iteration`` says.

    kinds: ``stall`` (sleeps for an hour: the other ranks wait in a collective until the NCCL watchdog fires),
    ``kill`` (SIGKILL to itself, as the kernel OOM killer or a preemption does), ``oom`` (asks for a 100 GiB buffer, as
    an outsized batch would), ``fragment`` (leaves the caching allocator's segments split, then asks for one large
    block: the fragmentation OOM). Without FAULT the function is returned unchanged.
    """
    spec = os.environ.get("FAULT")
    if not spec:
        return forward_step
    kind, _, where = spec.partition("@")
    fault_rank, fault_iteration = (int(x) for x in where.split(":"))
    calls = {"n": 0}

    @functools.wraps(forward_step)
    def faulty(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == fault_iteration and int(os.environ.get("RANK", "0")) == fault_rank:
            inject(kind)
        return forward_step(*args, **kwargs)

    return faulty


def inject(kind: str) -> None:
    import signal
    import time

    import torch

    gib = 2**30
    if kind == "stall":
        time.sleep(3600)
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "oom":
        torch.empty(100 * gib, dtype=torch.uint8, device="cuda")
    elif kind == "fragment":
        free, _ = torch.cuda.mem_get_info()
        count = int((free - 8 * gib) // (2 * gib))
        segments = [torch.empty(2 * gib, dtype=torch.uint8, device="cuda") for _ in range(count)]
        del segments  # the 2 GiB segments stay cached by the allocator
        held = [torch.empty(int(1.2 * gib), dtype=torch.uint8, device="cuda") for _ in range(count)]
        big = torch.empty(24 * gib, dtype=torch.uint8, device="cuda")  # each segment now has a 0.8 GiB hole
        del big, held
    else:
        raise SystemExit(f"unknown FAULT kind {kind!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--mbs", type=int, default=1)
    parser.add_argument("--gbs", type=int, default=None, help="default: micro batch x data-parallel size")
    parser.add_argument("--iters", type=int, default=5)
    args, overrides = parser.parse_known_args()

    import torch.distributed  # noqa: F401
    from megatron.bridge.models.gpt_provider import local_layer_spec
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    recipe, seq_key = load_recipe()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    base = model_overrides(args.size, args.seq) + [
        f"{seq_key}={args.seq}",
        f"train.micro_batch_size={args.mbs}",
        f"train.global_batch_size={args.gbs or args.mbs * world}",
        f"train.train_iters={args.iters}",
        "logger.log_interval=1",
        "dataset.mock=true",
    ]
    cfg = recipe()
    cfg = process_config_with_overrides(cfg, cli_overrides=base + overrides)
    cfg.model.transformer_layer_spec = local_layer_spec  # a callable: no Hydra override can set it
    pretrain(config=cfg, forward_step_func=with_fault(forward_step))


if __name__ == "__main__":
    sys.exit(main())
