"""Measure per-GPU memory of real megatron-core training state, to calibrate diagnose's memory model.

For each model size and each data-parallel strategy (DDP with fp32 or bf16 gradient buffers, the distributed
optimizer, Megatron FSDP no_shard / optim / optim_grads / optim_grads_params) this builds a GPT model with
megatron-core on the GPU, wraps it, builds the Megatron optimizer (Adam, bf16 params, fp32 main params), runs one
training iteration and records ``torch.cuda.memory_allocated`` and ``max_memory_allocated`` after the wrap and after
the first optimizer step (when Adam's moment tensors exist). Peaks are counted from just before the model build.

Run on GPUs, one process per GPU (DP = number of processes):
    torchrun --nproc_per_node=1 measure.py --sizes s400m s1b --out h200_dp1.json
    torchrun --nproc_per_node=2 measure.py --sizes s1b --out h200_dp2.json
``--count-only`` builds the models on the meta device and prints the parameter counts (no GPU needed).

Each record (one per size x strategy x phase) has the keys agreed with the memory model (docs/memory.md):
name, model{...}, params, strategy, grad_reduce_in_fp32, dp, tp, pp, phase, allocated_bytes, max_allocated_bytes,
torch, megatron_core; plus batch{micro_batch_size, seq_length} and baseline_bytes (memory still allocated before
the build: non-zero would mean an earlier configuration leaked, and the record is then suspect).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int = 128256
    seq_length: int = 4096
    swiglu: bool = True
    untie_embeddings: bool = True

    def as_dict(self) -> dict:
        return dict(self.__dict__)


SIZES = {
    "s400m": Shape(12, 1024, 4096, 16, 4),
    "s1b": Shape(16, 2048, 8192, 16, 8),
    "s3b": Shape(28, 3072, 8192, 24, 8),
}
# strategy name, DistributedDataParallelConfig overrides, grad_reduce_in_fp32
STRATEGIES = [
    ("ddp", dict(use_distributed_optimizer=False), True),
    ("ddp", dict(use_distributed_optimizer=False), False),
    ("distributed_optimizer", dict(use_distributed_optimizer=True), True),
    ("distributed_optimizer", dict(use_distributed_optimizer=True), False),
    ("fsdp:no_shard", dict(use_megatron_fsdp=True, data_parallel_sharding_strategy="no_shard"), True),
    ("fsdp:optim", dict(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim"), True),
    ("fsdp:optim_grads", dict(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads"), True),
    ("fsdp:optim_grads_params", dict(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params"), True),
]
MICRO_BATCH = 1
MEASURE_SEQ = 512  # the iteration's sequence length: small, so that activations stay a minor term


def transformer_config(shape: Shape, on_meta: bool = False):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        gated_linear_unit=shape.swiglu,
        activation_func=F.silu,
        normalization="RMSNorm",
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        # On the meta device: layers then take the ambient device instead of torch.cuda.current_device().
        use_cpu_initialization=on_meta,
        perform_initialization=not on_meta,
    )


def build_model(shape: Shape, device):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    with torch.device(device):
        return GPTModel(
            config=transformer_config(shape, on_meta=str(device) == "meta"),
            transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=shape.vocab_size,
            max_sequence_length=shape.seq_length,
            position_embedding_type="rope",
            share_embeddings_and_output_weights=not shape.untie_embeddings,
        )


def count_params(shape: Shape) -> int:
    model = build_model(shape, "meta")
    return sum(p.numel() for p in model.parameters())


def wrap(model, strategy_overrides: dict, grad_fp32: bool):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    fsdp = strategy_overrides.get("use_megatron_fsdp", False)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=grad_fp32,
        # As Megatron-Bridge forces for Megatron FSDP; plain DDP as the Bridge recipes default.
        use_distributed_optimizer=strategy_overrides.get("use_distributed_optimizer", True) if not fsdp else True,
        overlap_grad_reduce=fsdp,
        overlap_param_gather=fsdp,
        average_in_collective=False,
        **{k: v for k, v in strategy_overrides.items() if k != "use_distributed_optimizer"},
    )
    if fsdp:
        from megatron.core.distributed import FullyShardedDataParallel as DP
    else:
        DP = DistributedDataParallel
    return DP(config=model.config, ddp_config=ddp_config, module=model), ddp_config


def build_optimizer(wrapped, ddp_config):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(
        optimizer="adam",
        lr=1e-5,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=ddp_config.use_distributed_optimizer,
        clip_grad=1.0,
    )
    return get_megatron_optimizer(config, [wrapped])


def one_iteration(wrapped, optimizer, shape: Shape) -> None:
    seq = MEASURE_SEQ
    tokens = torch.randint(0, shape.vocab_size, (MICRO_BATCH, seq), device="cuda")
    position_ids = torch.arange(seq, device="cuda").unsqueeze(0).expand(MICRO_BATCH, -1)
    mask = torch.ones(1, 1, seq, seq, device="cuda", dtype=torch.bool).triu(1)  # True = masked (causal)
    wrapped.zero_grad_buffer()
    optimizer.zero_grad()
    loss = wrapped(tokens, position_ids, mask, labels=tokens)
    loss.float().mean().backward()
    wrapped.finish_grad_sync()
    optimizer.step()
    torch.cuda.synchronize()


def measure(name: str, shape: Shape, params: int, strategy, versions: dict, dp: int) -> list[dict]:
    label, overrides, grad_fp32 = strategy
    gc.collect()
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    common = {
        "name": f"{name}/{label}/{'fp32' if grad_fp32 else 'bf16'}-grads/dp{dp}",
        "model": shape.as_dict(),
        "params": params,
        "strategy": label,
        "grad_reduce_in_fp32": grad_fp32,
        "dp": dp,
        "tp": 1,
        "pp": 1,
        "batch": {"micro_batch_size": MICRO_BATCH, "seq_length": MEASURE_SEQ},
        "baseline_bytes": baseline,
        **versions,
    }
    records = []
    model = build_model(shape, torch.device("cuda", torch.cuda.current_device()))
    after_build = torch.cuda.memory_allocated()
    wrapped, ddp_config = wrap(model, overrides, grad_fp32)
    torch.cuda.synchronize()
    records.append({**common, "phase": "after_wrap", "allocated_bytes": torch.cuda.memory_allocated(),
                    "max_allocated_bytes": torch.cuda.max_memory_allocated(), "after_build_bytes": after_build})
    optimizer = build_optimizer(wrapped, ddp_config)
    one_iteration(wrapped, optimizer, shape)
    records.append({**common, "phase": "after_step", "allocated_bytes": torch.cuda.memory_allocated(),
                    "max_allocated_bytes": torch.cuda.max_memory_allocated(), "after_build_bytes": after_build})
    del optimizer, wrapped, model
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description="Measure megatron-core memory per DP strategy on GPUs.")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--index", type=int, nargs="*", default=None,
                        help="positions in STRATEGIES to run (default: all). Megatron FSDP keeps memory alive after "
                        "its objects are deleted, so measure_all.sh runs one strategy per process")
    parser.add_argument("--merge", nargs="*", default=None, help="merge these record files into --out and exit")
    parser.add_argument("--out", default="measurements.json")
    parser.add_argument("--count-only", action="store_true")
    args = parser.parse_args()

    if args.merge is not None:
        merged = []
        for path in args.merge:
            with open(path) as fh:
                merged.extend(json.load(fh))
        merged.sort(key=lambda r: (r.get("dp", 0), r.get("params", 0), r.get("name", "")))
        with open(args.out, "w") as fh:
            json.dump(merged, fh, indent=1)
        print(f"{len(merged)} records -> {args.out}")
        return 0

    import megatron.core

    if args.count_only:
        from megatron.core import parallel_state

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        for name in args.sizes:
            print(name, count_params(SIZES[name]))
        return 0

    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group("nccl")
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    dp = torch.distributed.get_world_size()
    rank = torch.distributed.get_rank()
    versions = {"torch": torch.__version__, "megatron_core": megatron.core.__version__,
                "gpu": torch.cuda.get_device_name(), "gpu_capacity_bytes": torch.cuda.get_device_properties(0).total_memory}

    results: list[dict] = []
    for name in args.sizes:
        shape = SIZES[name]
        params = count_params(shape)
        for index, strategy in enumerate(STRATEGIES):
            if args.index is not None and index not in args.index:
                continue
            started = time.time()
            try:
                records = measure(name, shape, params, strategy, versions, dp)
            except Exception as exc:  # record and go on: one failing strategy must not lose the others
                records = [{"name": f"{name}/{strategy[0]}", "error": f"{type(exc).__name__}: {str(exc)[:300]}"}]
            results.extend(records)
            if rank == 0:
                for r in records:
                    if "error" in r:
                        print(f"{r['name']}: {r['error']}", flush=True)
                    else:
                        print(f"{r['name']} {r['phase']}: allocated {r['allocated_bytes'] / 2**30:.3f} GiB, "
                              f"max {r['max_allocated_bytes'] / 2**30:.3f} GiB ({time.time() - started:.1f}s)",
                              flush=True)
                with open(args.out, "w") as fh:  # after every strategy: a timeout keeps what was measured
                    json.dump(results, fh, indent=1)
            gc.collect()
            torch.cuda.empty_cache()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
