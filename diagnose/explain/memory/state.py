"""Bytes of model state per GPU: parameters, gradients, fp32 main parameters, optimizer state, buffers.

Sources (../shared/knowledge/megatron-core.md §2): megatron-core ``DistributedDataParallel`` /
``param_and_grad_buffer.py``, ``DistributedOptimizer`` and Megatron-FSDP's ``_init_each_parameter_group_buffers``.
bf16 (or fp16) parameters, fp32 main parameters, Adam with two fp32 moments; ``g`` is the grad-buffer dtype size
(4 with ``grad_reduce_in_fp32``, 2 otherwise). ``N`` is the group the buffers and the optimizer shard over: DP x CP
divided by ``num_distributed_optimizer_instances`` for dense parameters, expert DP for expert parameters.

| strategy | params | grads | main params | Adam | g=4 total |
|---|---|---|---|---|---|
| ddp | 2 | g | 4 | 8 | 18 |
| distributed_optimizer | 2 | g | 4/N | 8/N | 6 + 12/N |
| fsdp:no_shard | 2 | g | 4 | 8 | 18 |
| fsdp:optim | 2 | g | 4/N | 8/N | 6 + 12/N |
| fsdp:optim_grads | 2 | g/N | 4/N | 8/N | 2 + 16/N |
| fsdp:optim_grads_params | 2/N | g/N | 4/N | 8/N | 18/N |

``buffers`` are the transient communication buffers live during forward/backward: Megatron-FSDP's unsharded
all-gathered weights and unsharded gradients of the layer(s) in flight, or with ``optim_grads`` and a single bucket
(no ``overlap_grad_reduce``) the whole unsharded gradient (Megatron-LM issue #6314).

FP8 (estimated, not calibrated on hardware), on the transformer-layer weights only (``ParamCount.linear``;
embeddings, output layer and norms stay in bf16/fp32):
- FP8 compute with bf16 parameters: Transformer Engine casts each weight to FP8 and keeps the copy across the micro
  batches of a step (``is_first_microbatch`` weight caching), with its transpose for the backward GEMMs
  (columnwise data for MXFP8): ``fp8`` component = 2 bytes per linear weight; with Megatron FSDP
  ``optim_grads_params`` only the gathered layers are cast: 2 bytes x the gathered unit(s);
- FP8 parameters (``fp8_param_gather`` / ``fp8_param``): the weights themselves are FP8, so the param buffer
  (``param_and_grad_buffer.py``: the distributed optimizer's all-gather buffer is ``torch.uint8``) holds 1 byte per
  linear weight instead of 2 (sharded like the params), plus the cached transpose (1 byte) for the backward;
  grads and fp32 main params are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnose.explain.memory.shape import ModelShape, ParamCount, layer_params

COMPONENTS = ("params", "grads", "main_params", "optimizer", "buffers")
OPTIONAL_COMPONENTS = ("fp8", "cuda_graphs")  # present only when the job uses FP8 / CUDA graphs
PREFETCH_ELEMENTS = 1_000_000_000  # megatron_fsdp.py: suggested_communication_unit_size floor

# which state is divided by N, per strategy: (params, grads, main params + optimizer)
_SHARDED = {
    "ddp": (False, False, False),
    "distributed_optimizer": (False, False, True),
    "fsdp:no_shard": (False, False, False),
    "fsdp:optim": (False, False, True),
    "fsdp:optim_grads": (False, True, True),
    "fsdp:optim_grads_params": (True, True, True),
}
STRATEGIES = tuple(_SHARDED)


@dataclass(frozen=True)
class Layout:
    """How one job places its model on GPUs, and the knobs that change bytes per parameter."""

    strategy: str = "ddp"
    gpus: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    dist_opt_instances: int = 1
    grad_bytes: int = 4  # 4: fp32 grads (grad_reduce_in_fp32), 2: bf16
    param_bytes: int = 2  # 2: bf16/fp16 training, 4: fp32
    optimizer: str = "adam"
    optimizer_offload_fraction: float = 0.0  # optimizer.optimizer_cpu_offload with this fraction on the CPU
    meta_init: bool = False  # model.init_model_with_meta_device
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False  # Megatron FSDP prefetches gathered weights (~1e9 elements) ahead
    fused_adam: bool = True  # TE / apex FusedAdam; torch.optim.Adam (foreach) needs a temporary at the step
    fp8: bool = False  # FP8 GEMMs (model.fp8 / mixed_precision.fp8 set)
    fp8_params: bool = False  # FP8 primary weights (ddp.fp8_param_gather / model.fp8_param)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}")

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        return max(1, self.gpus // self.model_parallel)

    @property
    def shard_group(self) -> int:
        return max(1, self.dp * self.cp // max(1, self.dist_opt_instances))

    @property
    def expert_shard_group(self) -> int:
        return max(1, self.gpus // ((self.etp or self.tp) * self.ep * self.pp) // max(1, self.dist_opt_instances))

    @property
    def fsdp(self) -> bool:
        return self.strategy.startswith("fsdp:")


@dataclass
class StateBytes:
    components: dict[str, int]
    params: int  # parameters on this rank
    shard_group: int

    @property
    def total(self) -> int:
        return sum(self.components.values())

    @property
    def persistent(self) -> int:
        return self.total - self.components.get("buffers", 0)

    @property
    def transient(self) -> int:
        """Megatron-FSDP's gathered weights / unsharded grads in flight: live only during forward/backward."""
        return self.components.get("buffers", 0)

    @property
    def bytes_per_param(self) -> float:
        """Persistent model state per parameter (the §2 table: 18/N for optim_grads_params), without the
        transient FSDP buffers, which do not scale with the parameter count (reported as ``transient_bytes``)."""
        held = self.components.get("cuda_graphs", 0)  # static graph buffers do not scale with the parameters
        return (self.persistent - held) / self.params if self.params else 0.0


def optimizer_state_bytes(optimizer: str) -> int:
    """fp32 optimizer state per parameter: Adam/AdamW two moments, SGD one momentum buffer."""
    return 4 if optimizer.lower() in ("sgd",) else 8


def _group_bytes(p: int, n: int, layout: Layout, fp8_linear: int = 0) -> dict[str, float]:
    """State of ``p`` parameters sharded over ``n``; ``fp8_linear`` of them stored as FP8 (1 byte) weights."""
    p_sh, g_sh, o_sh = _SHARDED[layout.strategy]
    main_b = 4 if layout.param_bytes < 4 else 0
    opt_b = optimizer_state_bytes(layout.optimizer)
    on_gpu = 1.0 - min(1.0, max(0.0, layout.optimizer_offload_fraction))
    fp8_saving = (layout.param_bytes - 1) * fp8_linear
    return {
        "params": (layout.param_bytes * p - fp8_saving) / (n if p_sh else 1),
        "grads": layout.grad_bytes * p / (n if g_sh else 1),
        "main_params": main_b * p / (n if o_sh else 1) * on_gpu,
        "optimizer": opt_b * p / (n if o_sh else 1) * on_gpu,
    }


def layer_params_max(shape: ModelShape, layout: Layout) -> int:
    """Parameters of the largest transformer layer on one rank (the unit Megatron-FSDP gathers)."""
    return max((sum(layer_params(shape, moe, layout.tp, layout.ep, layout.etp)) for moe in set(shape.moe_layers())),
               default=0)


def fsdp_buffers(count: ParamCount, layout: Layout, layer_params: int | None) -> int:
    """Transient unsharded buffers of Megatron-FSDP during forward/backward (0 for DDP / distributed optimizer)."""
    n = layout.shard_group
    if not layout.fsdp or layout.strategy == "fsdp:no_shard" or n <= 1:
        return 0
    if layout.strategy == "fsdp:optim_grads_params":
        unit = layer_params or max(1, count.total // 16)
        if layout.overlap_param_gather:
            # gathered weights prefetched up to the communication unit (at least 1e9 elements) plus one layer:
            # measured on an H200 after the first step (s1b at DP=2: 2.0 GiB still allocated, model 1.98 GiB)
            gathered = min(count.total, PREFETCH_ELEMENTS + unit)
            return int(gathered * layout.param_bytes + unit * layout.grad_bytes)
        # current + prefetched layer of gathered weights, and the layer whose gradient is being reduce-scattered
        return int(2 * unit * layout.param_bytes + unit * layout.grad_bytes)
    if layout.strategy == "fsdp:optim_grads":
        if not layout.overlap_grad_reduce:
            return int(count.total * layout.grad_bytes * (1 - 1 / n))
        unit = layer_params or max(1, count.total // 16)
        return int(2 * unit * layout.grad_bytes)
    return 0


def _fp8_split(count: ParamCount) -> tuple[int, int]:
    """(dense, expert) linear weights: expert weights are all linear, the rest of ``linear`` is dense."""
    expert = min(count.expert, count.linear)
    return max(0, count.linear - expert), expert


def fp8_cache_bytes(count: ParamCount, layout: Layout, layer_params: int | None) -> int:
    """Transformer Engine's FP8 weight copies / transposes held through the step (see the module docstring)."""
    if not (layout.fp8 or layout.fp8_params) or not count.linear:
        return 0
    per = 1 if layout.fp8_params else 2  # FP8 weights: only the transpose; bf16 weights: FP8 copy + transpose
    if layout.strategy == "fsdp:optim_grads_params" and layout.shard_group > 1:
        unit = layer_params or max(1, count.total // 16)
        return int(per * 2 * min(unit, count.linear))  # only the gathered (and the prefetched) layer
    return per * count.linear


def model_state(count: ParamCount, layout: Layout, layer_params: int | None = None) -> StateBytes:
    """Per-GPU bytes of model state on one pipeline stage, steady state (after the first optimizer step)."""
    fp8_dense, fp8_expert = _fp8_split(count) if layout.fp8_params else (0, 0)
    dense = _group_bytes(count.dense, layout.shard_group, layout, fp8_dense)
    expert = _group_bytes(count.expert, layout.expert_shard_group, layout, fp8_expert) if count.expert else {}
    comps = {k: int(round(dense[k] + expert.get(k, 0))) for k in dense}
    comps["buffers"] = fsdp_buffers(count, layout, layer_params)
    fp8 = fp8_cache_bytes(count, layout, layer_params)
    if fp8:
        comps["fp8"] = fp8  # only present with FP8, so bf16 reports keep their shape
    return StateBytes(comps, count.total, layout.shard_group)


@dataclass
class Phases:
    """Predicted allocated bytes at the moments where jobs run out of memory."""

    wrap_peak: int  # during the DP wrap: the model plus the buffers being allocated
    after_wrap: int  # after the wrap, before the optimizer exists
    first_step_peak: int  # the first optimizer.step(): Adam state appears
    steady_peak: int  # state + activations (+ buffers) of later iterations
    activations: int
    checkpoint_peak: int = 0  # state + staging of one copy of the local fp32 shard while saving / loading
    detail: dict[str, int] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return max(self.wrap_peak, self.first_step_peak, self.steady_peak)


def phases(state: StateBytes, layout: Layout, activations: int = 0) -> Phases:
    """Phase-aware peaks from the steady-state components.

    - DP wrap: the bf16 module built on the GPU (unless meta-device init) is still there while the buffers are
      allocated: DDP allocates the grad buffer (and with the distributed optimizer a bf16 param buffer the weights
      are then copied into). Megatron-FSDP (``_init_each_parameter_group_buffers``) moves one parameter group at a
      time into its weight / main-weight buffers, freeing the module's storage as it goes, and allocates the grad
      buffer last.
    - After the wrap: the buffers (params now live in them); fp32 main params of DDP / the distributed optimizer
      are created with the optimizer, Adam moments lazily at the first ``optimizer.step()``.
    - First step: everything, plus with bf16 grads the fp32 copy of the grads handed to the optimizer.
    """
    c = state.components
    params, grads, main, opt, buffers = (c["params"], c["grads"], c["main_params"], c["optimizer"], c["buffers"])
    # created by the first forward and kept: FP8 weight caches, CUDA graphs' static buffers
    held = c.get("fp8", 0) + c.get("cuda_graphs", 0)
    module = 0 if (layout.meta_init and layout.fsdp) else params if not layout.fsdp else (
        layout.param_bytes * state.params)
    after_wrap = params + grads + (main if layout.fsdp else 0)  # Megatron FSDP makes the main weights at the wrap
    wrap_peak = {
        "ddp": after_wrap,
        "distributed_optimizer": module + params + grads,  # old module storage + new param buffer + grad buffer
        # no weight buffer: the module's own params stay; main weights per group, then the grad buffer
        "fsdp:no_shard": after_wrap,
        # one parameter group per transformer layer: the module shrinks as each group moves into its sharded
        # buffer (through one unsharded bucket); the grad buffer is allocated after the module is gone
        "fsdp:optim_grads_params": max(module + buffers, after_wrap),
        # fsdp:optim / optim_grads: one group per dtype, its weight buffer is whole: module + buffer + main shard
    }.get(layout.strategy, max(module + params + main, after_wrap))
    cast = main if layout.grad_bytes < 4 else 0  # fp32 copy of the (sharded) bf16 grads handed to the optimizer
    # torch.optim.Adam (foreach), used when neither Transformer Engine nor apex is installed, allocates
    # sqrt(exp_avg_sq) for the whole local shard at once: one more fp32 copy (measured on an H200: +4 B/param at N=1)
    adam_temp = 0 if layout.fused_adam else (main if main else 4 * state.params // max(1, layout.shard_group))
    first_step = params + grads + main + opt + cast + adam_temp + held
    before_step = after_wrap + (0 if layout.fsdp else main) + buffers + activations + held
    steady = params + grads + main + opt + buffers + activations + held
    # Saving / loading a distributed checkpoint stages the local shards through GPU copies before D2H (and loading
    # creates the Adam state eagerly): an estimate of one extra copy of the local fp32 main-param shard.
    staging = main if main else 4 * params // max(1, layout.param_bytes)
    checkpoint = params + grads + main + opt + staging + held
    return Phases(
        wrap_peak=int(wrap_peak),
        after_wrap=int(after_wrap),
        first_step_peak=int(max(first_step, before_step)),
        steady_peak=int(steady),
        activations=int(activations),
        checkpoint_peak=int(checkpoint),
        detail={"grad_cast": cast, "adam_temp": int(adam_temp), "checkpoint_staging": int(staging)},
    )
