"""Search the changes that make a job fit, evaluate each with the memory model, rank them cheapest first.

Every candidate is a set of Megatron-Bridge overrides (plus possibly a different GPU count) turned into a
``Layout`` / ``Workload``; the model predicts its per-GPU peak over the phases (wrap, first step, steady state)
and it fits when that peak stays under the GPU's capacity less a headroom for the CUDA context, NCCL and the
allocator's slack. Cost ranks are deliberately coarse: free settings first, then numerics-neutral sharding,
then changes that cost speed (recompute, smaller micro batches, model parallelism), then more GPUs, then CPU offload.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from diagnose.explain.memory.activations import Workload, activation_bytes
from diagnose.explain.memory.gpus import GIB
from diagnose.explain.memory.shape import ModelShape, ParamCount, count_params
from diagnose.explain.memory.state import Layout, Phases, StateBytes, layer_params_max, model_state, phases
from diagnose.model import Override

HEADROOM_FRACTION = 0.04  # CUDA context, NCCL buffers, cuBLAS workspaces, allocator rounding
HEADROOM_MIN = 2 * GIB

STRATEGY_COST = {
    "ddp": (0.0, "plain DDP"),
    "distributed_optimizer": (1.0, "distributed optimizer: reduce-scatter + all-gather instead of all-reduce, same speed"),
    "fsdp:no_shard": (2.0, "Megatron FSDP without sharding"),
    "fsdp:optim": (2.2, "Megatron FSDP, optimizer state sharded: about the communication of the distributed optimizer"),
    "fsdp:optim_grads": (2.5, "Megatron FSDP, optimizer + grads sharded (ZeRO-2): reduce-scatter of grads"),
    "fsdp:optim_grads_params": (3.0, "Megatron FSDP, everything sharded (ZeRO-3): weights all-gathered every "
                                      "forward and backward (more communication, overlapped)"),
}


def headroom(capacity: int) -> int:
    return max(HEADROOM_MIN, int(capacity * HEADROOM_FRACTION))


@dataclass
class Scenario:
    """What the search starts from: the job as it ran (or as configured)."""

    shape: ModelShape | None
    layout: Layout
    workload: Workload | None
    capacity: int
    log_params: int | None = None  # parameters per rank from the log (used when the shape is unknown)
    view: Any = None  # the ConfigView, for current values and replay
    saves_checkpoints: bool = False
    scale: float = 1.0  # log count / shape count when the log's count cannot be explained by the shape

    def count(self, layout: Layout) -> ParamCount | None:
        if self.shape is not None:
            c = count_params(self.shape, layout.tp, layout.pp, layout.ep, layout.etp)
            if self.scale != 1.0:
                c = ParamCount(int(c.dense * self.scale), int(c.expert * self.scale), c.embedding, c.details)
            return c
        if self.log_params is None:
            return None
        if (layout.tp, layout.pp, layout.ep) != (self.layout.tp, self.layout.pp, self.layout.ep):
            return None  # model parallelism changes need the shape
        return ParamCount(self.log_params)


@dataclass
class Plan:
    label: str
    overrides: list[Override]
    layout: Layout
    workload: Workload | None
    state: StateBytes
    activations: int | None
    phases: Phases
    fits: bool
    cost: str
    cost_rank: float
    valid: bool | None = None
    violations: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return self.phases.peak


def evaluate(scn: Scenario, label: str, overrides: list[Override], layout: Layout, workload: Workload | None,
             cost: str, cost_rank: float) -> Plan | None:
    count = scn.count(layout)
    if count is None:
        return None
    unit = layer_params_max(scn.shape, layout) if scn.shape is not None else None
    state = model_state(count, layout, unit)
    act = activation_bytes(scn.shape, workload, layout.tp, layout.pp, layout.cp) if (
        scn.shape is not None and workload is not None) else None
    ph = phases(state, layout, act or 0)
    fits = ph.peak <= scn.capacity - headroom(scn.capacity)
    return Plan(label, overrides, layout, workload, state, act, ph, fits, cost, cost_rank)


# ------------------------------------------------------------------------------------------ overrides


def _current(scn: Scenario, key: str) -> Any:
    if scn.view is None:
        return None
    try:
        return scn.view.get(key)
    except Exception:  # noqa: BLE001
        return None


def _diff(scn: Scenario, pairs: list[tuple[str, Any]]) -> list[Override]:
    return [Override(k, v) for k, v in pairs if _current(scn, k) != v or scn.view is None]


def strategy_overrides(scn: Scenario, strategy: str, meta_init: bool = False) -> list[tuple[str, Any]]:
    if strategy.startswith("fsdp:"):
        pairs: list[tuple[str, Any]] = [
            ("ddp.use_megatron_fsdp", True),
            ("ddp.data_parallel_sharding_strategy", strategy.split(":", 1)[1]),
        ]
        if scn.saves_checkpoints:
            pairs.append(("checkpoint.ckpt_format", "fsdp_dtensor"))
        if meta_init:
            pairs.append(("model.init_model_with_meta_device", True))
        return pairs
    pairs = []
    if scn.layout.fsdp:
        pairs += [("ddp.use_megatron_fsdp", False), ("dist.use_megatron_fsdp", False)]
    dist_opt = strategy == "distributed_optimizer"
    pairs += [("ddp.use_distributed_optimizer", dist_opt), ("optimizer.use_distributed_optimizer", dist_opt)]
    return pairs


def bf16_grad_overrides(scn: Scenario) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = [("ddp.grad_reduce_in_fp32", False)]
    if _current(scn, "mixed_precision") is not None or _current(scn, "mixed_precision.grad_reduce_in_fp32") is not None:
        pairs.append(("mixed_precision.grad_reduce_in_fp32", False))
    return pairs


def _more_gpus_cost(factor: int) -> float:
    """Asking for more GPUs is the most expensive change short of CPU offload; twice as many costs less than 8x."""
    return 8.0 + max(1, factor).bit_length() * 0.25


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(2, limit + 1) if n % d == 0]


# --------------------------------------------------------------------------------------------- search


@dataclass
class Candidate:
    label: str
    pairs: list[tuple[str, Any]]
    layout: Layout
    workload: Workload | None
    cost: str
    cost_rank: float


def candidates(scn: Scenario, verdict: str = "unknown", same_gpus_only: bool = False,
               max_gpus: int = 16384) -> list[Candidate]:
    """Single changes, a few combinations, and the GPU counts that make the strongest strategies fit."""
    lay, work, shape = scn.layout, scn.workload, scn.shape
    out: list[Candidate] = []
    add = out.append

    if verdict == "fragmentation":
        add(Candidate("expandable segments", [("env.PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")], lay, work,
                      "none; not with ddp.nccl_ub on torch < 2.11 (megatron-core raises)", 0.1))

    # sharding strategy (and meta-device init for full sharding) at the same GPU count
    for strategy, (rank, text) in STRATEGY_COST.items():
        if strategy == lay.strategy:
            continue
        meta = strategy == "fsdp:optim_grads_params"
        add(Candidate(strategy, strategy_overrides(scn, strategy, meta), replace(lay, strategy=strategy, meta_init=(
            meta or (lay.meta_init and strategy != "fsdp:no_shard"))), work, text + (
            "; model built on the meta device" if meta else ""), rank))
    if lay.fsdp and lay.strategy != "fsdp:no_shard" and not lay.meta_init:
        add(Candidate("meta-device init", [("model.init_model_with_meta_device", True)], replace(lay, meta_init=True),
                      work, "none: the model is materialised shard by shard", 0.3))

    if lay.grad_bytes == 4:
        add(Candidate("bf16 grads", bf16_grad_overrides(scn), replace(lay, grad_bytes=2), work,
                      "grads reduced in bf16: half the grad memory and traffic; a small numerics change", 1.5))

    if work is not None and shape is not None:
        mbs = work.micro_batch_size
        while mbs > 1:
            mbs //= 2
            add(Candidate(f"micro batch {mbs}", [("train.micro_batch_size", mbs)], lay,
                          replace(work, micro_batch_size=mbs), "more, smaller micro batches: lower GPU efficiency",
                          4.0 + 0.1 * (work.micro_batch_size // max(1, mbs))))
        if work.recompute is None:
            add(Candidate("selective recompute", [("model.recompute_granularity", "selective")], lay,
                          replace(work, recompute="selective"), "recompute attention core: a few % slower", 4.5))
        if work.recompute != "full":
            add(Candidate("full recompute", [("model.recompute_granularity", "full"), ("model.recompute_method", "uniform"),
                                             ("model.recompute_num_layers", 1)], lay,
                          replace(work, recompute="full", recompute_num_layers=1),
                          "recompute every layer in backward: about 30 % slower", 6.0))
        if not work.sequence_parallel and lay.tp > 1:
            add(Candidate("sequence parallel", [("model.sequence_parallel", True)], lay,
                          replace(work, sequence_parallel=True), "none with TP > 1 (same communication volume)", 0.5))

    if shape is not None:
        heads, groups = shape.num_attention_heads, shape.groups
        for t in _divisors(heads, 8):
            if t <= lay.tp or not (groups % t == 0 or t % groups == 0):
                continue
            gpus = lay.gpus if lay.gpus % (t * lay.pp * lay.cp) == 0 and lay.gpus >= t * lay.pp * lay.cp else \
                lay.gpus // lay.tp * t
            if same_gpus_only and gpus != lay.gpus:
                continue
            pairs = [("model.tensor_model_parallel_size", t), ("model.sequence_parallel", True)]
            w = replace(work, sequence_parallel=True) if work else None
            more = "" if gpus == lay.gpus else f" on {gpus} GPUs"
            add(Candidate(f"TP {t}{more}", pairs, replace(lay, tp=t, gpus=gpus), w,
                          f"tensor parallel {t}: activation all-gathers every layer, keep TP inside a node{more}",
                          6.0 + t / 8 if gpus == lay.gpus else _more_gpus_cost(gpus // lay.gpus) + 0.5 + t / 16))
        for p in _divisors(shape.num_layers, 16):
            if p <= lay.pp or p > 16:
                continue
            gpus = lay.gpus if lay.gpus % (lay.tp * p * lay.cp) == 0 and lay.gpus >= lay.tp * p * lay.cp else \
                lay.gpus // lay.pp * p
            if same_gpus_only and gpus != lay.gpus:
                continue
            more = "" if gpus == lay.gpus else f" on {gpus} GPUs"
            add(Candidate(f"PP {p}{more}", [("model.pipeline_model_parallel_size", p)], replace(lay, pp=p, gpus=gpus),
                          work, f"pipeline parallel {p}: pipeline bubbles, more micro batches needed{more}",
                          7.0 + p / 16 if gpus == lay.gpus else _more_gpus_cost(gpus // lay.gpus) + 0.6 + p / 32))
        if work is not None and work.seq_length >= 8192:
            for c in (2, 4, 8):
                if c <= lay.cp or work.seq_length % (2 * c):
                    continue
                if lay.gpus % (lay.tp * lay.pp * c) or lay.gpus < lay.tp * lay.pp * c:
                    continue
                add(Candidate(f"CP {c}", [("model.context_parallel_size", c)], replace(lay, cp=c), work,
                              f"context parallel {c}: attention exchanges K/V between {c} GPUs", 6.5 + c / 8))

    # optimizer state on the CPU
    if lay.optimizer_offload_fraction < 1.0:
        pairs = [("optimizer.optimizer_cpu_offload", True), ("optimizer.optimizer_offload_fraction", 1.0),
                 ("optimizer.use_precision_aware_optimizer", True)]
        strat = lay.strategy if lay.strategy != "ddp" else "distributed_optimizer"
        if strat != lay.strategy:
            pairs = strategy_overrides(scn, strat) + pairs
        add(Candidate("optimizer CPU offload", pairs, replace(lay, strategy=strat, optimizer_offload_fraction=1.0), work,
                      "optimizer step on the CPU: much slower steps (several x at 100 % offload)", 10.0))

    # combinations at the same GPU count: full sharding + bf16 grads (+ recompute)
    strongest = "fsdp:optim_grads_params"
    combo = replace(lay, strategy=strongest, meta_init=True)
    pairs = strategy_overrides(scn, strongest, True) if lay.strategy != strongest else []
    if lay.grad_bytes == 4:
        combo = replace(combo, grad_bytes=2)
        pairs = pairs + bf16_grad_overrides(scn)
        add(Candidate("full sharding + bf16 grads", pairs, combo, work,
                      STRATEGY_COST[strongest][1] + "; grads in bf16", 3.6))
    if work is not None and shape is not None and work.recompute != "full":
        add(Candidate("full sharding + full recompute",
                      pairs + [("model.recompute_granularity", "full"), ("model.recompute_method", "uniform"),
                               ("model.recompute_num_layers", 1)],
                      combo, replace(work, recompute="full", recompute_num_layers=1),
                      STRATEGY_COST[strongest][1] + "; recompute every layer (about 30 % slower)", 7.0))

    if not same_gpus_only:
        # more GPUs (data parallel), for the sharded strategies: the smallest power-of-two multiple that fits
        bases: list[tuple[str, list, Layout]] = []
        if lay.strategy not in ("ddp", "fsdp:no_shard"):
            bases.append((lay.strategy, [], lay))
        full = replace(lay, strategy=strongest, meta_init=True)
        bases.append((strongest, strategy_overrides(scn, strongest, True), full))
        if lay.grad_bytes == 4:
            bases.append((strongest + " + bf16 grads", strategy_overrides(scn, strongest, True) + bf16_grad_overrides(scn),
                          replace(full, grad_bytes=2)))
        if lay.strategy != "fsdp:optim_grads":
            bases.append(("fsdp:optim_grads", strategy_overrides(scn, "fsdp:optim_grads"),
                          replace(lay, strategy="fsdp:optim_grads")))
        if lay.strategy != "distributed_optimizer" and not lay.fsdp:
            bases.append(("distributed_optimizer", strategy_overrides(scn, "distributed_optimizer"),
                          replace(lay, strategy="distributed_optimizer")))
        for name, spairs, base in bases:
            factor = 2
            strategy_cost = STRATEGY_COST[base.strategy][0] + (0.5 if base.grad_bytes != lay.grad_bytes else 0)
            while lay.gpus * factor <= max_gpus:
                gpus = lay.gpus * factor
                cand_layout = replace(base, gpus=gpus)
                note = STRATEGY_COST[base.strategy][1] + ("; grads in bf16" if base.grad_bytes != lay.grad_bytes else "")
                cand = Candidate(f"{name} on {gpus} GPUs", spairs, cand_layout, work,
                                 f"{gpus} GPUs instead of {lay.gpus} (data parallel {cand_layout.dp}); " + note,
                                 _more_gpus_cost(factor) + strategy_cost / 10)
                plan = evaluate(scn, cand.label, [], cand.layout, cand.workload, cand.cost, cand.cost_rank)
                if plan is not None and plan.fits:
                    add(cand)
                    break
                factor *= 2
    return out


def search(scn: Scenario, verdict: str = "unknown", same_gpus_only: bool = False, prove=None,
           keep_fitting: int = 8, keep_other: int = 3) -> list[Plan]:
    """Evaluate every candidate, replay the ones worth showing, rank: fitting and valid first, cheapest first."""
    plans: list[Plan] = []
    seen: set = set()
    for c in candidates(scn, verdict, same_gpus_only):
        plan = evaluate(scn, c.label, _diff(scn, c.pairs), c.layout, c.workload, c.cost, c.cost_rank)
        if plan is None:
            continue
        if c.label == "expandable segments":
            # the OOM numbers showed the memory was there (free + cached), only not contiguous
            plan.fits = verdict == "fragmentation"
        key = (plan.layout, plan.workload, tuple((o.key, str(o.value)) for o in plan.overrides))
        if key in seen:
            continue
        seen.add(key)
        plans.append(plan)
    fitting = sorted((p for p in plans if p.fits), key=lambda p: (p.cost_rank, p.peak))
    baseline = evaluate(scn, "as configured", [], scn.layout, scn.workload, "", 0.0)
    other = sorted((p for p in plans if not p.fits and (baseline is None or p.peak < baseline.peak)),
                   key=lambda p: (p.peak, p.cost_rank))
    kept: list[Plan] = []
    for plan in fitting:
        if len([p for p in kept if p.fits]) >= keep_fitting:
            break
        if prove is not None:
            proof = prove(plan.overrides)
            plan.overrides, plan.valid, plan.violations = proof.overrides, proof.valid, proof.violations
            if plan.valid is False:
                continue
        kept.append(plan)
    for plan in other[:keep_other]:
        if prove is not None:
            proof = prove(plan.overrides)
            plan.overrides, plan.valid, plan.violations = proof.overrides, proof.valid, proof.violations
        kept.append(plan)
    return kept
