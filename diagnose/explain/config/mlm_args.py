"""Megatron-LM arguments: the rank-0 dump and argument lists, mapped to Megatron-Bridge paths.

Dump format (``megatron/training/arguments.py`` ``_print_args``)::

    ------------------------ arguments ------------------------
      tensor_model_parallel_size ...................... 8
    -------------------- end of arguments ---------------------

An argument list is what follows ``pretrain_gpt.py`` on a launch line: ``--tensor-model-parallel-size 2
--use-megatron-fsdp --ckpt-format=fsdp_dtensor``. Names with no Bridge equivalent are kept as ``mlm.<name>``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from diagnose.configview import ConfigView
from diagnose.explain.config.values import as_bool, parse_scalar
from diagnose.model import LogLine

# Megatron-LM argument name -> Megatron-Bridge paths it sets: those with another name or several paths; the
# arguments named like their Bridge field follow in _SAME_NAME. The first argument of a path is its flag in a fix.
MLM_TO_BRIDGE: dict[str, tuple[str, ...]] = {
    "seq_length": ("model.seq_length", "dataset.seq_length"),
    "padded_vocab_size": ("model.vocab_size",),
    "num_experts": ("model.num_moe_experts",),
    "bf16": ("model.bf16", "optimizer.bf16"),
    "fp16": ("model.fp16", "optimizer.fp16"),
    "bias_swiglu_fusion": ("model.bias_activation_fusion",),
    "use_distributed_optimizer": ("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"),
    "overlap_param_gather": ("ddp.overlap_param_gather", "optimizer.overlap_param_gather"),
    "accumulate_allreduce_grads_in_fp32": ("ddp.grad_reduce_in_fp32",),
    "ddp_average_in_collective": ("ddp.average_in_collective",),
    "ddp_bucket_size": ("ddp.bucket_size",),
    "use_megatron_fsdp": ("ddp.use_megatron_fsdp", "dist.use_megatron_fsdp"),
    "use_custom_fsdp": ("ddp.use_megatron_fsdp", "dist.use_megatron_fsdp"),
    "fully_parallel_load": ("checkpoint.fully_parallel_load",),
    "ckpt_fully_parallel_load": ("checkpoint.fully_parallel_load",),
    "mock_data": ("dataset.mock",),
    "fp8_format": ("model.fp8",),  # --fp8-format is stored as args.fp8 (dest='fp8')
    "fp4_format": ("model.fp4",),  # --fp4-format is stored as args.fp4 (dest='fp4')
    # Megatron-LM's names of the uneven first/last pipeline stage (core_transformer_config_from_args maps them)
    "decoder_first_pipeline_num_layers": ("model.num_layers_in_first_pipeline_stage",),
    "decoder_last_pipeline_num_layers": ("model.num_layers_in_last_pipeline_stage",),
    # an argument list's VPP flag; a dump also prints the virtual_pipeline_model_parallel_size validate_args computed
    # from it, after it (the dump is sorted), which then stands
    "num_virtual_stages_per_pipeline_rank": ("model.virtual_pipeline_model_parallel_size",),
    "te_rng_tracker": ("model.use_te_rng_tracker",),  # --te-rng-tracker, dest use_te_rng_tracker
    # the flag is --use-nccl-ub (dest nccl_ub, the name an argument dump prints, in _SAME_NAME): a fix says the flag
    "use_nccl_ub": ("ddp.nccl_ub",),
}
_SAME_NAME: dict[str, tuple[str, ...]] = {
    "model": (
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
        "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
        "max_position_embeddings", "moe_router_topk", "params_dtype", "transformer_impl", "recompute_granularity",
        "recompute_method", "recompute_num_layers", "recompute_modules", "cpu_offloading", "cpu_offloading_num_layers",
        "fine_grained_activation_offloading", "cuda_graph_impl", "init_model_with_meta_device",
        "use_cpu_initialization", "gradient_accumulation_fusion", "calculate_per_token_loss",
        "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
        "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage", "moe_ffn_hidden_size",
        "normalization", "position_embedding_type", "qk_layernorm",
        # what the layers keep for backward (the activation model): attention kind, softmax dtype, fusions, dropout
        "attention_backend", "attention_softmax_in_fp32", "apply_rope_fusion", "hidden_dropout", "attention_dropout",
        # TransformerConfig fields that Bridge's model provider spells the same way (MoE, MLA, MTP, layouts, FP8):
        # left as mlm.<name>, the validator and the memory model did not see them (a DeepSeek-V3 argument list got
        # "moe_act ... only supported with moe_grouped_gemm" with --moe-grouped-gemm given, and every layer as MoE).
        "mtp_num_layers", "pipeline_model_parallel_layout", "moe_grouped_gemm", "moe_layer_freq",
        "moe_shared_expert_intermediate_size", "moe_shared_expert_overlap", "moe_token_dispatcher_type",
        "moe_router_load_balancing_type", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
        "moe_enable_deepep", "moe_flex_dispatcher_backend", "overlap_moe_expert_parallel_comm",
        "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
        "fp8", "fp8_recipe", "fp4", "first_last_layers_bf16", "cp_comm_type", "hierarchical_context_parallel_sizes",
        "use_te_rng_tracker",
    ),
    "train": (
        "micro_batch_size", "global_batch_size", "train_iters", "check_weight_hash_across_dp_replicas_interval",
        "train_samples", "empty_unused_memory_level",
    ),
    "ddp": (
        "overlap_grad_reduce", "num_distributed_optimizer_instances", "megatron_fsdp_version",
        "data_parallel_sharding_strategy", "nccl_ub", "fsdp_double_buffer", "fsdp_manual_registration",
        "suggested_communication_unit_size",
    ),
    "dist": ("use_torch_fsdp2", "use_tp_pp_dp_mapping", "distributed_backend", "distributed_timeout_minutes"),
    "optimizer": (
        "optimizer", "lr", "use_precision_aware_optimizer", "optimizer_cpu_offload", "optimizer_offload_fraction",
        "min_lr", "weight_decay", "clip_grad", "adam_beta1", "adam_beta2",
    ),
    "checkpoint": ("ckpt_format", "save", "load", "save_interval", "async_save", "pretrained_checkpoint", "finetune"),
    "rng": ("seed",),
    "tokenizer": ("tokenizer_type",),
    "launch": ("world_size", "data_parallel_size"),
}
MLM_TO_BRIDGE.update((name, (f"{section}.{name}",)) for section, names in _SAME_NAME.items() for name in names)

# Bridge path -> Megatron-LM flag, for rendering a fix as Megatron-LM flags.
BRIDGE_TO_MLM: dict[str, str] = {}
for _name, _paths in MLM_TO_BRIDGE.items():
    for _p in _paths:
        BRIDGE_TO_MLM.setdefault(_p, _name)
# Fix rendering: paths whose flag is not the first name above that reads into them (megatron/training/arguments.py).
# --ckpt-fully-parallel-load (there is no --fully-parallel-load, the older dump's name); Bridge's fp8_param is
# --fp8-param-gather; the last three are store_true flags no argument dump is read into (a fix naming them kept the
# Bridge words). --fp4-format, --decoder-first/last-pipeline-num-layers and --num-virtual-stages-per-pipeline-rank
# come from MLM_TO_BRIDGE itself: an argument list is read with the flags a fix prints.
BRIDGE_TO_MLM.update({
    "checkpoint.fully_parallel_load": "ckpt_fully_parallel_load",
    "model.fp8_param": "fp8_param_gather",
    "model.defer_embedding_wgrad_compute": "defer_embedding_wgrad_compute",
    "optimizer.overlap_param_gather_with_optimizer_step": "overlap_param_gather_with_optimizer_step",
    "comm_overlap.overlap_moe_expert_parallel_comm": "overlap_moe_expert_parallel_comm",
})
# No flag of these names: params_dtype follows --bf16/--fp16, cpu_offloading is on when --cpu-offloading-num-layers is
# above 0 (a fix turning either on keeps the Bridge words); the three fusions have only a --no-... flag (INVERTED).
for _p in ("model.params_dtype", "model.cpu_offloading", "model.bias_activation_fusion",
           "model.gradient_accumulation_fusion", "model.apply_rope_fusion"):
    BRIDGE_TO_MLM.pop(_p, None)
# What a fix that clears one of these paths tells a Megatron-LM job to remove: every flag that can have set it.
MLM_REMOVE: dict[str, str] = {
    "model.cpu_offloading": "--cpu-offloading-num-layers",
    "model.virtual_pipeline_model_parallel_size":
        "--num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank",
}

_DUMP_LINE = re.compile(r"^\s*([A-Za-z_]\w*) \.{2,} (.*)$")
_DUMP_LONG = re.compile(r"^\s*([A-Za-z_]\w{47,})\s+(.*)$")


# Megatron-LM "negative" flags (``--no-save-optim`` is stored as ``no_save_optim``) -> the Bridge key they clear.
INVERTED: dict[str, str] = {
    "no_save_optim": "checkpoint.save_optim",
    "no_save_rng": "checkpoint.save_rng",
    "no_load_optim": "checkpoint.load_optim",
    "no_load_rng": "checkpoint.load_rng",
    "untie_embeddings_and_output_weights": "model.share_embeddings_and_output_weights",
    "disable_bias_linear": "model.add_bias_linear",
    "no_gradient_accumulation_fusion": "model.gradient_accumulation_fusion",
    "no_bias_swiglu_fusion": "model.bias_activation_fusion",
    "no_rope_fusion": "model.apply_rope_fusion",
    "no_ckpt_fully_parallel_save": "checkpoint.fully_parallel_save",
    "no_strict_fsdp_dtensor_load": "checkpoint.strict_fsdp_dtensor_load",
    "disable_gloo_process_groups": "dist.use_gloo_process_groups",
    "no_align_grad_reduce": "dist.align_grad_reduce",
}


_FREQ_TERM = re.compile(r"\[([01](?:,[01])*)\](?:\*(\d{1,5}))?")
_FREQ_MAX = 100_000


def moe_freq_value(text: str) -> Any:
    """``--moe-layer-freq`` as megatron reads it (``moe_freq_type``), without eval: ``"2"`` -> 2,
    ``"([0]*3+[1]*58)"`` -> a 0/1 list, ``"([1]*3+[0])*2"`` -> the group repeated. Anything else stays text."""
    s = "".join(text.split())
    if s.isdigit():
        return int(s)
    repeat = 1
    m = re.fullmatch(r"\((.*)\)\*(\d{1,5})", s)
    if m:
        s, repeat = m.group(1), int(m.group(2))
    elif s.startswith("(") and s.endswith(")"):
        s = s[1:-1]
    out: list[int] = []
    for term in s.split("+"):
        t = _FREQ_TERM.fullmatch(term)
        if t is None:
            return text
        items = [int(x) for x in t.group(1).split(",")]
        count = int(t.group(2) or 1)
        if len(out) + len(items) * count > _FREQ_MAX:
            return text
        out.extend(items * count)
    if not out or len(out) * repeat > _FREQ_MAX:
        return text
    return out * repeat


def set_mlm_arg(view: ConfigView, name: str, value: Any, origin: str) -> None:
    """Set one Megatron-LM argument (underscore name) on the view, under its Bridge paths."""
    if name in INVERTED:
        view.set(INVERTED[name], not as_bool(value), origin)
        return
    if name == "grad_reduce_in_bf16":
        if as_bool(value):
            view.set("ddp.grad_reduce_in_fp32", False, origin)
        return
    if name == "swiglu":
        view.set("model.gated_linear_unit", as_bool(value), origin)
        if as_bool(value):
            view.set("model.activation_func", "silu", origin)
        return
    if name in ("quick_geglu", "squared_relu"):  # arguments.py: quick_geglu is a GLU, squared_relu is not
        view.set(f"mlm.{name}", value, origin)
        if as_bool(value):
            view.set("model.gated_linear_unit", name == "quick_geglu", origin)
            view.set("model.activation_func", "quick_gelu" if name == "quick_geglu" else "squared_relu", origin)
        return
    if name == "moe_layer_freq" and isinstance(value, str):
        value = moe_freq_value(value)
    paths = MLM_TO_BRIDGE.get(name)
    if not paths:
        view.set(f"mlm.{name}", value, origin)
        return
    for path in paths:
        view.set(path, value, origin)


def parse_args_dump(lines: Iterable[LogLine], view: ConfigView | None = None) -> ConfigView:
    view = view or ConfigView()
    view.framework = "megatron-lm"
    values: dict[str, tuple[Any, str]] = {}
    for line in lines:
        if "end of arguments" in line.text:
            break
        m = _DUMP_LINE.match(line.text) or _DUMP_LONG.match(line.text)
        if m:
            values[m.group(1)] = (parse_scalar(m.group(2)), f"log:{line.lineno}")
    _apply_values(view, values)
    return view


def _apply_values(view: ConfigView, values: dict[str, tuple[Any, str]]) -> None:
    gqa = values.get("group_query_attention")
    for name, (value, origin) in values.items():
        if name == "num_query_groups" and gqa is not None and not as_bool(gqa[0]):
            continue  # without --group-query-attention megatron ignores num_query_groups
        set_mlm_arg(view, name, value, origin)
    _position_embedding(view, values)


def _position_embedding(view: ConfigView, values: dict[str, tuple[Any, str]]) -> None:
    """Megatron-LM's older position flags (``arguments.py``): ``--use-rotary-position-embeddings`` means
    ``position_embedding_type=rope``; ``--no-position-embedding`` drops the learned table (type ``none`` unless
    RoPE). An explicit ``--position-embedding-type`` wins over the first."""
    rotary = values.get("use_rotary_position_embeddings")
    if rotary is not None and as_bool(rotary[0]) and "position_embedding_type" not in values:
        view.set("model.position_embedding_type", "rope", rotary[1])
    nope = values.get("no_position_embedding")
    if nope is not None and as_bool(nope[0]) and str(view.get("model.position_embedding_type", "")) != "rope":
        view.set("model.position_embedding_type", "none", nope[1])


def parse_arg_list(tokens: list[str], origin: str, view: ConfigView | None = None) -> ConfigView:
    """``--tensor-model-parallel-size 2 --use-megatron-fsdp --ckpt-format=fsdp_dtensor`` onto the view."""
    view = view or ConfigView()
    values: dict[str, tuple[Any, str]] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--") or len(tok) <= 2:
            continue
        body = tok[2:]
        if "=" in body:
            name, raw = body.split("=", 1)
            values[name.replace("-", "_")] = (parse_scalar(raw), origin)
            continue
        name = body.replace("-", "_")
        nxt = tokens[i] if i < len(tokens) else None
        if nxt is None or (nxt.startswith("-") and not _is_number(nxt)):
            if name.startswith("no_") and name not in INVERTED and name[3:] in MLM_TO_BRIDGE:
                values[name[3:]] = (False, origin)
            else:
                values[name] = (True, origin)
            continue
        # flags that take several values (--recompute-modules a b) keep the first values as a list
        items = [nxt]
        i += 1
        while i < len(tokens) and not tokens[i].startswith("-") and "=" not in tokens[i]:
            items.append(tokens[i])
            i += 1
        value = parse_scalar(items[0]) if len(items) == 1 else [parse_scalar(x) for x in items]
        values[name] = (value, origin)
    _apply_values(view, values)
    return view


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False
