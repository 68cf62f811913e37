"""Exact parameter count: build megatron-core's GPTModel on the meta device (no memory, no GPU).

The build runs in a child process (``python -m diagnose.explain.memory.meta_count``, the shape as JSON on stdin)
so that the single-process gloo group it needs, and megatron-core's global parallel state, never touch the
caller. Only the local (non-Transformer-Engine) layer spec is used: TE holds the same parameters.
Returns None when torch or megatron-core is missing or the build fails: callers fall back to the analytic count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import threading
import warnings

from diagnose.explain.megatron_child import PACKAGE_PARENT, JsonCache
from diagnose.explain.megatron_child import megatron_installed as available
from diagnose.explain.megatron_child import versions as _versions
from diagnose.explain.memory.shape import ModelShape

# Layers x experts the child may build: DeepSeek-V3 is 61 x 256. A typo'd ``num_moe_experts=1000000000`` made the
# child build modules for minutes, GBs deep, before its timeout; beyond this the analytic count stands alone.
MAX_BUILD_MODULES = 200_000
# Layers the child may build, experts or not: the deepest real models have about 130 (Llama-3 405B 126). A typo'd
# ``--num-layers 100000`` (under the cap above: no experts) built for the child's whole timeout (about 10 ms a layer),
# and ``diagnose check`` sat silent for minutes before falling back to the analytic count it could have given at once.
MAX_BUILD_LAYERS = 2_000


def buildable(shape: ModelShape) -> bool:
    """Multi-latent attention, MTP and hybrid Mamba models are not built by the child (it builds the plain GPT
    layer spec); nor is a model of more layers, or more layer x expert modules, than any real one."""
    if shape.num_layers > MAX_BUILD_LAYERS or shape.num_layers * max(1, shape.num_moe_experts or 0) > MAX_BUILD_MODULES:
        return False
    return not (shape.multi_latent_attention or shape.mtp_num_layers or shape.hybrid_pattern)


def exact_count(shape: ModelShape, timeout: float = 180.0, cache: bool = True) -> int | None:
    """Total parameters of the full model (TP=PP=EP=1), or None if it cannot be built here.

    The build costs seconds (importing megatron-core in a child), so a count is kept on disk per shape and per
    torch/megatron-core version (``meta_counts.json`` in the cache folder), and ``prefetch`` can start it while the
    caller does other work. ``cache=False`` always builds (the tests comparing the analytic count with megatron-core
    use it).
    """
    if not buildable(shape):
        return None
    key = _cache_key(shape)
    if cache:
        hit = _cache.read().get(key)
        if isinstance(hit, int) and hit > 0:
            return hit
        pending = _PENDING.pop(key, None)
        if pending is not None:
            pending.join(timeout)
            if isinstance(_DONE.get(key), int):
                return _DONE[key]
    counts = exact_counts([shape], timeout)
    count = None if counts is None else counts[0]
    if cache and count is not None:
        _cache.write(key, count)
    return count


def prefetch(shape: ModelShape) -> None:
    """Start the meta-device build in the background (a thread waiting on the child process), so that
    ``exact_count`` later finds it done: ``diagnose check`` overlaps it with the validator's own megatron-core
    import instead of paying both one after the other."""
    if not buildable(shape) or not available():
        return
    key = _cache_key(shape)
    if key in _PENDING or key in _DONE or isinstance(_cache.read().get(key), int):
        return

    def work() -> None:
        counts = exact_counts([shape])
        if counts is not None and counts[0] is not None:
            _DONE[key] = counts[0]
            _cache.write(key, counts[0])

    thread = threading.Thread(target=work, name="diagnose-meta-count", daemon=True)
    _PENDING[key] = thread
    thread.start()


_PENDING: dict[str, threading.Thread] = {}
_DONE: dict[str, int] = {}
_CACHE_VERSION = 1  # bump when the child builds models differently
_cache = JsonCache("meta_counts.json")  # in diagnose's cache folder (``diagnose.cache``)


def _whole_model(shape: ModelShape) -> dict:
    """The fields that decide the whole model's count: the pipeline layout only places layers, so it is left out
    (counts cached before it existed stay valid)."""
    fields = dataclasses.asdict(shape)
    fields.pop("pipeline_layout", None)
    return fields


def _cache_key(shape: ModelShape) -> str:
    text = json.dumps([_CACHE_VERSION, _versions(), _whole_model(shape)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def exact_counts(shapes: list[ModelShape], timeout: float = 300.0) -> list[int | None] | None:
    """Several models in one child process (megatron-core is imported once); None if it cannot run here."""
    if not available():
        return None
    payload = json.dumps([_whole_model(s) for s in shapes])
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "diagnose.explain.memory.meta_count"],
            input=payload,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=PACKAGE_PARENT,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return [None if c is None else int(c) for c in json.loads(line)["params"]]
            except (ValueError, KeyError, TypeError):
                return None
    return None


def _build_and_count(shape: ModelShape) -> int:  # runs in the child process
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    norm = "LayerNorm" if shape.layernorm else "RMSNorm"
    moe = {}
    if shape.num_moe_experts:
        moe = {
            "num_moe_experts": shape.num_moe_experts,
            "moe_ffn_hidden_size": shape.moe_ffn_hidden_size or shape.ffn,
            "moe_shared_expert_intermediate_size": shape.moe_shared_expert_intermediate_size,
            "moe_shared_expert_gate": shape.moe_shared_expert_gate,
            "moe_layer_freq": (
                shape.moe_layer_freq if isinstance(shape.moe_layer_freq, int) else list(shape.moe_layer_freq)
            ),
            "moe_router_dtype": "fp32",
        }
    cfg = TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.groups,
        kv_channels=shape.kv,
        gated_linear_unit=shape.gated_linear_unit,
        add_bias_linear=shape.add_bias_linear,
        add_qkv_bias=shape.add_qkv_bias,
        qk_layernorm=shape.qk_layernorm,
        normalization=norm,
        bf16=True,
        params_dtype=torch.bfloat16,
        perform_initialization=False,
        use_cpu_initialization=True,
        **moe,
    )
    if shape.num_moe_experts:
        spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization=norm)
    else:
        spec = get_gpt_layer_local_spec(normalization=norm, qk_layernorm=shape.qk_layernorm)
    with torch.device("meta"):
        model = GPTModel(
            config=cfg,
            transformer_layer_spec=spec,
            vocab_size=shape.padded_vocab(1),
            max_sequence_length=shape.seq_length,
            share_embeddings_and_output_weights=not shape.untie_embeddings,
            position_embedding_type=shape.position_embedding,
        )
    return sum(p.numel() for p in model.parameters())


def main() -> int:
    counts: list[int | None] = []
    for raw in json.loads(sys.stdin.read()):
        if isinstance(raw.get("moe_layer_freq"), list):
            raw["moe_layer_freq"] = tuple(raw["moe_layer_freq"])
        try:
            counts.append(_build_and_count(ModelShape(**raw)))
        except Exception as e:  # noqa: BLE001 - one shape megatron-core refuses must not hide the others
            print(f"meta build failed: {type(e).__name__}: {e}", file=sys.stderr)
            counts.append(None)
    print(json.dumps({"params": counts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
