"""Measure the forward+backward activation peak of real megatron-core training on one GPU.

For each model x attention backend x recompute setting this builds a GPT model with megatron-core's local
(non-Transformer-Engine) layer spec on the GPU, wraps it in megatron-core's DDP (fp32 gradient buffer), builds the
Megatron optimizer (Adam) and runs one warm-up iteration with ``optimizer.step()`` so that the whole model state
(bf16 params, fp32 grads, fp32 main params, Adam moments) is allocated. Then, for each micro batch x sequence length:
``state_bytes`` = ``memory_allocated()`` just before the forward (model state + the batch); the peak is reset; one
forward (with labels: the loss is megatron-core's vocab-parallel cross entropy) and one backward run;
``peak_bytes`` = ``max_memory_allocated()`` over both, ``activation_peak_bytes`` = peak - state. A point that
raises ``torch.OutOfMemoryError`` is recorded as ``outcome: "oom"`` with the request, the allocated bytes at the
failure and the phase (forward / backward). Megatron-core's global memory buffer (the preallocated ``baddbmm``
input of the local attention, kept between iterations) is emptied before each point, so each point's peak
includes it as a first iteration's would.

Attention backends:
- ``local``: megatron-core's ``DotProductAttention`` (what ``transformer_impl=local`` builds: unfused, the
  ``[b*a, s, s]`` scores through ``baddbmm``, the softmax in fp32 when ``attention_softmax_in_fp32``);
- ``sdpa_flash``: the same local spec with the core attention replaced by a module calling
  ``torch.nn.functional.scaled_dot_product_attention`` restricted to the flash kernel (a stand-in for Transformer
  Engine's flash backend, which cannot be installed on the measurement machine: its wheel alone is 264 MiB).

Run on one GPU (no torchrun needed): ``python measure_activations.py --family dense --out dense.json``;
``--cpu-smoke`` runs two tiny points on the CPU (gloo) to check the script without a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
import time
import traceback
from dataclasses import asdict, dataclass

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
    swiglu: bool = True
    untie_embeddings: bool = True
    num_moe_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_router_topk: int | None = None


DENSE = Shape(16, 2048, 8192, 16, 8)  # the s1b shape of measure.py: 1.53B parameters
MOE = Shape(16, 2048, 8192, 16, 8, num_moe_experts=8, moe_ffn_hidden_size=2048, moe_router_topk=2)
TINY = Shape(2, 128, 256, 4, 2, vocab_size=1024)
TINY_MOE = Shape(2, 128, 256, 4, 2, vocab_size=1024, num_moe_experts=4, moe_ffn_hidden_size=64, moe_router_topk=2)

GRID = [(m, s) for s in (2048, 4096, 8192) for m in (1, 2, 4)]
MOE_GRID = [(1, 2048), (2, 2048), (1, 4096), (2, 4096), (1, 8192), (2, 8192)]
# Variants of the TransformerConfig (name suffix, overrides): what Megatron-Bridge's GPT recipes set
# (attention_softmax_in_fp32=False, bias_activation_fusion=True) and megatron-core's default dropout (0.1).
BF16_SOFTMAX = ("+bf16softmax", {"attention_softmax_in_fp32": False})
FUSED_SWIGLU = ("+fusedswiglu", {"bias_activation_fusion": True})
DROPOUT = ("+dropout", {"hidden_dropout": 0.1, "attention_dropout": 0.1})
PLAIN = ("", {})
# family -> [(shape name, backend, recompute, points, variant)]
PLANS = {
    "dense": [("dense", b, r, GRID, PLAIN) for b in ("local", "sdpa_flash") for r in (None, "selective", "full")],
    "extra": [("dense", "local", r, GRID, BF16_SOFTMAX) for r in (None, "selective", "full")]
    + [("dense", "sdpa_flash", None, [(1, 2048), (2, 4096), (1, 8192), (4, 8192)], FUSED_SWIGLU),
       ("dense", "local", None, [(1, 2048), (2, 2048), (1, 4096)], DROPOUT),
       ("dense", "sdpa_flash", None, [(1, 2048), (2, 4096), (1, 8192)], DROPOUT)],
    # megatron-core 0.16.1's MoE layers are not freed when the model is deleted (22 GiB left after one group):
    # one MoE group per process
    "moe1": [("moe", "local", None, MOE_GRID[:4], PLAIN)],
    "moe2": [("moe", "sdpa_flash", None, MOE_GRID, PLAIN)],
    "moe3": [("moe", "sdpa_flash", "full", MOE_GRID[2:], PLAIN)],
    "moe4": [("moe", "local", "full", MOE_GRID[:5], PLAIN)],
    "tiny": [("tiny", b, r, [(1, 64), (2, 128)], PLAIN) for b in ("local", "sdpa_flash")
             for r in (None, "selective", "full")]
    + [("tiny", "local", None, [(1, 64)], BF16_SOFTMAX), ("tiny", "sdpa_flash", None, [(1, 64)], FUSED_SWIGLU),
       ("tiny", "local", None, [(1, 64)], DROPOUT),
       ("tiny_moe", "local", None, [(1, 64)], PLAIN), ("tiny_moe", "sdpa_flash", "full", [(2, 128)], PLAIN)],
}
# TransformerConfig values that decide what the layers keep for backward, recorded with each point
CONFIG_KEYS = ("attention_softmax_in_fp32", "masked_softmax_fusion", "bias_activation_fusion", "hidden_dropout",
               "attention_dropout", "normalization", "gated_linear_unit", "cross_entropy_loss_fusion",
               "apply_rope_fusion", "recompute_granularity", "recompute_modules", "recompute_method",
               "recompute_num_layers", "moe_token_dispatcher_type", "moe_grouped_gemm")
SHAPES = {"dense": DENSE, "moe": MOE, "tiny": TINY, "tiny_moe": TINY_MOE}


class SdpaFlashAttention(torch.nn.Module):
    """Core attention through torch's flash kernel: [s, b, n, d] in, [s, b, n*d] out (as DotProductAttention)."""

    gqa: bool | None = None  # whether the flash kernel takes grouped K/V directly (decided on the first call)

    def __init__(self, config, layer_number=None, attn_mask_type=None, attention_type=None, cp_comm_type=None,
                 softmax_scale=None, pg_collection=None, **_unused):
        super().__init__()
        self.config = config
        self.softmax_scale = softmax_scale
        self.groups = config.num_attention_heads // config.num_query_groups

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, n, s, d]
        backends = [SDPBackend.FLASH_ATTENTION] if q.is_cuda else [SDPBackend.MATH]
        with sdpa_kernel(backends):
            if SdpaFlashAttention.gqa is not False and self.groups > 1:
                try:
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                                         enable_gqa=True)
                    SdpaFlashAttention.gqa = True
                except RuntimeError:
                    SdpaFlashAttention.gqa = False
            if SdpaFlashAttention.gqa is False or self.groups == 1:
                k = k.repeat_interleave(self.groups, dim=1)
                v = v.repeat_interleave(self.groups, dim=1)
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(query.size(0), query.size(1), -1)


def transformer_config(shape: Shape, recompute: str | None, device: str, overrides: dict | None = None):
    from megatron.core.transformer.transformer_config import TransformerConfig

    extra: dict = {}
    if recompute == "full":
        extra = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif recompute == "selective":
        extra = dict(recompute_granularity="selective")  # recompute_modules defaults to ["core_attn"]
    if shape.num_moe_experts:
        extra.update(num_moe_experts=shape.num_moe_experts, moe_ffn_hidden_size=shape.moe_ffn_hidden_size,
                     moe_router_topk=shape.moe_router_topk, moe_token_dispatcher_type="alltoall",
                     moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2, moe_grouped_gemm=False)
    base = dict(
        num_layers=shape.num_layers, hidden_size=shape.hidden_size, ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_attention_heads, num_query_groups=shape.num_query_groups,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        gated_linear_unit=shape.swiglu, activation_func=F.silu, normalization="RMSNorm", add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, use_cpu_initialization=device == "cpu",
    )
    return TransformerConfig(**{**base, **extra, **(overrides or {})})


def layer_spec(shape: Shape, backend: str):
    import copy

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(num_experts=shape.num_moe_experts, moe_grouped_gemm=False,
                                    normalization="RMSNorm")
    if backend == "sdpa_flash":
        spec = copy.deepcopy(spec)
        spec.submodules.self_attention.submodules.core_attention = SdpaFlashAttention
    return spec


def _define_missing_te_names() -> None:
    """megatron-core 0.16.1's MoE router (``router_gating_linear``) tests ``te_general_gemm is not None``, a name
    its ``moe_utils`` defines only when Transformer Engine imports: without TE every MoE forward raises
    ``NameError: name 'te_general_gemm' is not defined``. Define the TE-only names as None, which is the fallback
    the code means (plain torch matmuls)."""
    from megatron.core.transformer.moe import moe_utils

    for name in ("te_general_gemm", "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss", "fused_permute",
                 "fused_permute_with_probs", "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs",
                 "fused_topk_with_score_function", "fused_unpermute"):
        if not hasattr(moe_utils, name):
            setattr(moe_utils, name, None)


def build(shape: Shape, backend: str, recompute: str | None, device: str, overrides: dict | None = None):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    if shape.num_moe_experts:
        _define_missing_te_names()
    config = transformer_config(shape, recompute, device, overrides)
    model = GPTModel(config=config, transformer_layer_spec=layer_spec(shape, backend), vocab_size=shape.vocab_size,
                     max_sequence_length=8192, position_embedding_type="rope",
                     share_embeddings_and_output_weights=not shape.untie_embeddings)
    if device == "cpu":
        return model.to(torch.bfloat16), None, model
    model = model.cuda()
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=False,
                                               overlap_grad_reduce=False, average_in_collective=False)
    wrapped = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-5, bf16=True, params_dtype=torch.bfloat16,
                        use_distributed_optimizer=False, clip_grad=1.0), [wrapped])
    return wrapped, optimizer, model


def batch(shape: Shape, mbs: int, seq: int, device):
    tokens = torch.randint(0, shape.vocab_size, (mbs, seq), device=device)
    position_ids = torch.arange(seq, device=device).unsqueeze(0).expand(mbs, -1)
    mask = torch.ones(1, 1, seq, seq, device=device, dtype=torch.bool).triu(1)  # True = masked (causal)
    return tokens, position_ids, mask


def clear_global_buffer() -> None:
    from megatron.core import parallel_state

    buf = getattr(parallel_state, "_GLOBAL_MEMORY_BUFFER", None)
    if buf is not None:
        buf.buffer.clear()


def saved_tally(run_forward):
    """Bytes of activations autograd saves during one forward, by dtype and shape (parameters excluded)."""
    seen: dict[int, tuple[str, tuple[int, ...], int]] = {}

    def pack(t):
        if not isinstance(t, torch.nn.Parameter) and t.device.type != "meta":
            try:
                st = t.untyped_storage()
                seen.setdefault(st.data_ptr(), (str(t.dtype), tuple(t.shape), st.nbytes()))
            except (RuntimeError, NotImplementedError):
                pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run_forward()
    groups: dict[str, dict] = {}
    for dtype, shp, nbytes in seen.values():
        key = f"{dtype}{list(shp)}"
        g = groups.setdefault(key, {"dtype": dtype, "shape": list(shp), "count": 0, "bytes": 0})
        g["count"] += 1
        g["bytes"] += nbytes
    return out, sorted(groups.values(), key=lambda g: -g["bytes"])


_REQ = re.compile(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|B)")


def _bytes(num: str, unit: str) -> int:
    return int(float(num) * {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}[unit])


def run_point(wrapped, model, shape: Shape, mbs: int, seq: int, device, tally: bool) -> dict:
    on_gpu = device != "cpu"
    if shape.num_moe_experts and on_gpu:
        # megatron-core's MoE layers keep tensors of the last iteration (about 4h bytes per token per layer)
        # until the next forward replaces them: a tiny iteration first, so that the baseline holds a tiny one
        t, pos, m = batch(shape, 1, 128, device)
        wrapped(t, pos, m, labels=t).float().mean().backward()
        del t, pos, m
    tokens, position_ids, mask = batch(shape, mbs, seq, device)
    if wrapped is not None and hasattr(wrapped, "zero_grad_buffer"):
        wrapped.zero_grad_buffer()
    for p in model.parameters():
        p.grad = None
    clear_global_buffer()
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rec: dict = {"state_bytes": torch.cuda.memory_allocated() if on_gpu else 0, "phase_reached": "forward"}
    started = time.time()
    try:
        def forward():
            return wrapped(tokens, position_ids, mask, labels=tokens)

        if tally:
            loss, rec["saved_tensors"] = saved_tally(forward)
        else:
            loss = forward()
        if on_gpu:
            torch.cuda.synchronize()
            rec["forward_peak_bytes"] = torch.cuda.max_memory_allocated()
            rec["after_forward_bytes"] = torch.cuda.memory_allocated()
        rec["phase_reached"] = "backward"
        loss.float().mean().backward()
        del loss
        if on_gpu:
            torch.cuda.synchronize()
            rec["peak_bytes"] = torch.cuda.max_memory_allocated()
            rec["after_backward_bytes"] = torch.cuda.memory_allocated()
            rec["activation_peak_bytes"] = rec["peak_bytes"] - rec["state_bytes"]
        rec["outcome"] = "ok"
    except torch.OutOfMemoryError as exc:  # a measured OOM is a record too
        msg = str(exc)
        m = _REQ.search(msg)
        rec.update(outcome="oom", oom_phase=rec["phase_reached"], message=msg.splitlines()[0][:400],
                   requested_bytes=_bytes(*m.groups()) if m else None,
                   allocated_at_oom_bytes=torch.cuda.memory_allocated(),
                   peak_at_oom_bytes=torch.cuda.max_memory_allocated())
    except Exception as exc:  # noqa: BLE001 - anything else is recorded too, and the sweep goes on
        rec.update(outcome="error", message=f"{type(exc).__name__}: {str(exc)[:400]}")
    if on_gpu:
        rec["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    rec["seconds"] = round(time.time() - started, 2)
    del rec["phase_reached"]
    return rec


def versions(device: str) -> dict:
    import megatron.core

    out = {"torch": torch.__version__, "megatron_core": megatron.core.__version__}
    if device != "cpu":
        out.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                   gpu_capacity_bytes=torch.cuda.get_device_properties(0).total_memory,
                   alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=list(PLANS), default="dense")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    device = "cpu" if args.cpu_smoke else "cuda"
    family = "tiny" if args.cpu_smoke else args.family
    if args.cpu_smoke:  # megatron-core asks for the current CUDA device in a few places (rotary embedding)
        import contextlib

        from megatron.core.tensor_parallel import random as mrandom

        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
        mrandom.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()  # type: ignore[method-assign]
        mrandom.get_cuda_rng_tracker().get_states = lambda: {}  # type: ignore[method-assign]
        mrandom.get_cuda_rng_tracker().set_states = lambda states: None  # type: ignore[method-assign]
        mrandom._set_cuda_rng_state = lambda *a, **k: None
        mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()

    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    if device == "cuda":
        torch.cuda.set_device(0)
    torch.distributed.init_process_group("gloo" if device == "cpu" else "nccl", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    if device == "cuda":
        model_parallel_cuda_manual_seed(1234)
    common = versions(device)

    done: dict[str, dict] = {}
    if os.path.exists(args.out):  # resume after a crash: keep what was measured
        with open(args.out) as fh:
            done = {r["name"]: r for r in json.load(fh)}
    results = list(done.values())
    for shape_name, backend, recompute, points, (suffix, overrides) in PLANS[family]:
        shape = SHAPES[shape_name]
        names = [f"{shape_name}/{backend}{suffix}/{recompute or 'none'}/mbs{m}/s{s}" for m, s in points]
        if all(n in done for n in names):
            continue
        t0 = time.time()
        try:
            wrapped, optimizer, model = build(shape, backend, recompute, device, overrides)
        except Exception as exc:  # noqa: BLE001 - a group that cannot build is reported, the others still run
            print(f"{shape_name}/{backend}{suffix}/{recompute}: build failed: {exc!r}", flush=True)
            traceback.print_exc()
            continue
        params = sum(p.numel() for p in model.parameters())
        if optimizer is not None:  # warm-up: allocate the whole model state (Adam moments appear at step 1)
            tokens, pos, mask = batch(shape, 1, 512, device)
            wrapped.zero_grad_buffer()
            optimizer.zero_grad()
            wrapped(tokens, pos, mask, labels=tokens).float().mean().backward()
            wrapped.finish_grad_sync()
            optimizer.step()
            torch.cuda.synchronize()
            del tokens, pos, mask
        config_values = {k: getattr(model.config, k) for k in CONFIG_KEYS}
        print(f"{shape_name}/{backend}{suffix}/{recompute}: {params:,} params, built in {time.time() - t0:.1f}s",
              flush=True)
        for i, ((mbs, seq), name) in enumerate(zip(points, names, strict=True)):
            if name in done:
                continue
            rec = run_point(wrapped, model, shape, mbs, seq, device, tally=i == 0)
            rec = {"name": name, "model": asdict(shape), "params": params, "transformer_impl": "local",
                   "attention_backend": backend, "recompute": recompute, "config_overrides": overrides,
                   "config": config_values,
                   "recompute_method": "uniform" if recompute == "full" else None,
                   "recompute_num_layers": 1 if recompute == "full" else None,
                   "batch": {"micro_batch_size": mbs, "seq_length": seq},
                   "strategy": "ddp", "grad_reduce_in_fp32": True, "dp": 1, "tp": 1, "pp": 1,
                   "sdpa_gqa": SdpaFlashAttention.gqa if backend == "sdpa_flash" else None,
                   **common, **rec}
            results.append(rec)
            gib = 2**30
            if rec["outcome"] == "ok" and device != "cpu":
                state = rec["state_bytes"]
                print(f"  {name}: state {state / gib:.2f} GiB, act peak {rec['activation_peak_bytes'] / gib:.2f} GiB"
                      f" (fwd {(rec['forward_peak_bytes'] - state) / gib:.2f},"
                      f" kept {(rec['after_forward_bytes'] - state) / gib:.2f}) {rec['seconds']}s", flush=True)
            else:
                print(f"  {name}: {rec['outcome']} {rec.get('oom_phase', '')} {rec.get('message', '')[:120]}",
                      flush=True)
            with open(args.out, "w") as fh:
                json.dump(results, fh, indent=1)
        del wrapped, optimizer, model
        clear_global_buffer()
        gc.collect()
        if device != "cpu":
            torch.cuda.empty_cache()
            print(f"  left allocated after the group: {torch.cuda.memory_allocated() / 2**20:.0f} MiB", flush=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
