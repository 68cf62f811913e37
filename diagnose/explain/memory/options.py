"""Search the changes that make a job fit, evaluate each with the memory model, rank them cheapest first.

Every candidate is a set of Megatron-Bridge overrides (plus possibly a different GPU count) turned into a
``Layout`` / ``Workload``; the model predicts its per-GPU peak over the phases (wrap, first step, steady state)
and it fits when that peak stays under the GPU's capacity less a headroom for the CUDA context, NCCL and the
allocator's slack. Cost ranks are deliberately coarse: free settings first, then numerics-neutral sharding,
then changes that cost speed (recompute, smaller micro batches, model parallelism), then more GPUs, then CPU offload.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from diagnose.explain.memory.activations import Workload, activation_bytes, cuda_graph_bytes
from diagnose.explain.memory.gpus import GIB
from diagnose.explain.memory.shape import ModelShape, ParamCount, stage_counts
from diagnose.explain.memory.state import Layout, Phases, StateBytes, layer_params_max, model_state, phases
from diagnose.explain.validate.checks_parallel import divisible_global_batch
from diagnose.memory_types import Breakdown, MemoryOption
from diagnose.model import Override, WordedOverride

HEADROOM_FRACTION = 0.04  # CUDA context, NCCL buffers, cuBLAS workspaces, allocator rounding
HEADROOM_MIN = 2 * GIB

STRATEGY_COST = {
    "ddp": (0.0, "plain DDP"),
    "distributed_optimizer": (
        1.0, "distributed optimizer: reduce-scatter + all-gather instead of all-reduce, same speed"
    ),
    "fsdp:no_shard": (2.0, "Megatron FSDP without sharding"),
    "fsdp:optim": (2.2, "Megatron FSDP, optimizer state sharded: about the communication of the distributed optimizer"),
    "fsdp:optim_grads": (2.5, "Megatron FSDP, optimizer + grads sharded (ZeRO-2): reduce-scatter of grads"),
    "fsdp:optim_grads_params": (3.0, "Megatron FSDP, everything sharded (ZeRO-3): weights all-gathered every "
                                      "forward and backward (more communication, overlapped)"),
}


# A strategy name as a sentence says it: a plan's label starts with its short name (the table's, `check`'s column)
STRATEGY_WORDS = {
    "ddp": "plain DDP",
    "distributed_optimizer": "the distributed optimizer",
    "fsdp:no_shard": "Megatron FSDP without sharding",
    "fsdp:optim": "Megatron FSDP, sharding optim",
    "fsdp:optim_grads": "Megatron FSDP, sharding optim_grads",
    "fsdp:optim_grads_params": "Megatron FSDP, sharding optim_grads_params",
}


def worded_label(label: str) -> str:
    """A plan's label in words for a sentence: "fsdp:optim_grads_params + bf16 grads on 8 GPUs" reads "Megatron
    FSDP, sharding optim_grads_params, with bf16 grads, on 8 GPUs" (the sharding value is the one its override
    sets); a label that does not start with a strategy's name is already words ("micro batch 2", "TP 4")."""
    for name in sorted(STRATEGY_WORDS, key=len, reverse=True):
        if label != name and not label.startswith(name + " "):
            continue
        words, rest, gpus = STRATEGY_WORDS[name], label[len(name):].strip(), ""
        if (rest.startswith("on ") or " on " in rest) and rest.endswith(" GPUs"):
            rest, _, count = f" {rest}".rpartition(" on ")
            rest, gpus = rest.strip(), f"on {count}"
        parts = [words] + ([f"with {rest[1:].strip()}"] if rest.startswith("+") else [rest] if rest else [])
        comma = "," if "," in words or len(parts) > 1 else ""
        return f"{comma} ".join(parts) + (f"{comma} {gpus}" if gpus else "")
    return label


# What a change costs in speed, on one scale with STRATEGY_COST: TP inside a node with sequence parallel and a
# short pipeline are the usual layouts of large models and cost less than recomputing every layer (~30 %).
RECOMPUTE_COST = {"selective": 4.5, "full": 6.5}
# A plan that cannot keep train.global_batch_size (micro batch x DP must divide it) changes a hyper-parameter the
# user tuned (numerics, LR schedule): it ranks after every plan that keeps it, whatever its speed cost
# (``changes_global_batch``; qa-report-16 L3: "--global-batch-size 512" was ranked above PP plans keeping 128).
FULL_RECOMPUTE: list[tuple[str, Any]] = [("model.recompute_granularity", "full"), ("model.recompute_method", "uniform"),
                                         ("model.recompute_num_layers", 1)]


def tp_cost(t: int) -> float:
    return 5.0 + t / 8 if t > 1 else 0.0


def pp_cost(p: int) -> float:
    return 5.5 + p / 16 if p > 1 else 0.0


def combined_cost(parts: list[float]) -> float:
    """A combination costs about its most expensive part, a little more for each other part."""
    parts = [c for c in parts if c > 0]
    return (max(parts) + 0.25 * (len(parts) - 1)) if parts else 0.0


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
    global_batch_size: int | None = None  # train.global_batch_size: a hyper-parameter plans should keep

    def count(self, layout: Layout) -> ParamCount | None:
        """Parameters on the most-loaded pipeline stage."""
        stages = self.stages(layout)
        return None if stages is None else max(stages, key=lambda c: c.total)

    def stages(self, layout: Layout) -> list[ParamCount] | None:
        """Parameters on each pipeline stage (one entry when only the log's per-rank count is known)."""
        if self.shape is not None:
            counts = stage_counts(self.shape, layout.tp, layout.pp, layout.ep, layout.etp)
            if self.scale != 1.0:
                counts = [ParamCount(int(c.dense * self.scale), int(c.expert * self.scale), c.embedding, c.details,
                                     int(c.linear * self.scale)) for c in counts]
            return counts
        if self.log_params is None:
            return None
        if (layout.tp, layout.pp, layout.ep) != (self.layout.tp, self.layout.pp, self.layout.ep):
            return None  # model parallelism changes need the shape
        return [ParamCount(self.log_params)]


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
    stage: int = 0  # the pipeline stage whose peak this plan reports (the worst one)
    stage_peaks: list[int] = field(default_factory=list)  # peak of every pipeline stage, by pipeline rank

    @property
    def peak(self) -> int:
        return self.phases.peak

    @property
    def stages_differ(self) -> bool:
        return len(set(self.stage_peaks)) > 1


def option_of(p: Plan, given_global_batch: Any = None) -> MemoryOption:
    """The plan as data (one type for the report's options and check's plans; with pipeline parallelism, the
    stage that peaks and every stage's peak; the global batch size it sets when that is not the config's
    ``given_global_batch``)."""
    staged = p.layout.pp > 1 and bool(p.stage_peaks)
    new_gbs = next((o.value for o in p.overrides if o.key == "train.global_batch_size"), None)
    return MemoryOption(
        overrides=list(p.overrides), label=p.label, cost=p.cost, strategy=p.layout.strategy, gpus=p.layout.gpus,
        dp=p.layout.dp, tp=p.layout.tp, pp=p.layout.pp, cp=p.layout.cp, model_state_bytes=p.state.persistent,
        transient_bytes=p.state.transient, activation_bytes=p.activations, peak_bytes=p.peak, fits=p.fits,
        valid=p.valid, bytes_per_param=round(p.state.bytes_per_param, 3), components=Breakdown(**p.state.components),
        worst_stage=p.stage if staged else None, stage_peak_bytes=list(p.stage_peaks) if staged else [],
        new_global_batch=new_gbs if changes_global_batch(p.overrides, given_global_batch) else None)


def evaluate(scn: Scenario, label: str, overrides: list[Override], layout: Layout, workload: Workload | None,
             cost: str, cost_rank: float) -> Plan | None:
    """Predict every pipeline stage and keep the worst: stages differ (embedding on the first, output layer, loss
    and MTP on the last, uneven layer counts, micro batches in flight), and the job fails on the one that peaks."""
    counts = scn.stages(layout)
    if counts is None:
        return None
    if layout.dp != scn.layout.dp:
        # the same global batch over another DP size is another number of micro batches (what a stage holds)
        workload = _with_microbatches(scn, workload, layout)
    unit = layer_params_max(scn.shape, layout) if scn.shape is not None else None
    worst: tuple[int, StateBytes, int | None, Phases] | None = None
    peaks = []
    for i, count in enumerate(counts):
        state = model_state(count, layout, unit)
        act = None
        if scn.shape is not None and workload is not None:
            act = activation_bytes(scn.shape, workload, layout.tp, layout.pp, layout.cp, stage=i)
            graphs = cuda_graph_bytes(scn.shape, workload, layout.tp, layout.pp, layout.cp, stage=i)
            if graphs:
                state.components["cuda_graphs"] = graphs
        ph = phases(state, layout, act or 0)
        peaks.append(ph.peak)
        if worst is None or ph.peak > worst[3].peak:
            worst = (i, state, act, ph)
    assert worst is not None  # there is at least one stage
    stage, state, act, ph = worst
    fits = ph.peak <= scn.capacity - headroom(scn.capacity)
    return Plan(label, overrides, layout, workload, state, act, ph, fits, cost, cost_rank, stage=stage,
                stage_peaks=peaks)


# ------------------------------------------------------------------------------------------ overrides


def _current(scn: Scenario, key: str) -> Any:
    """The job's value of ``key`` as the model has it: what the config states, else (a release default or not
    shown) what the model inferred from the OOM itself, e.g. fp32 grads from the size of the grad buffer being
    allocated; an option must then still say ``ddp.grad_reduce_in_fp32=false`` to get bf16 grads."""
    if scn.view is None:
        return None
    if scn.view.origin(key) in (None, "default"):
        modelled = {"ddp.grad_reduce_in_fp32": scn.layout.grad_bytes == 4,
                    "ddp.use_distributed_optimizer": scn.layout.strategy == "distributed_optimizer",
                    "optimizer.use_distributed_optimizer": scn.layout.strategy == "distributed_optimizer",
                    "ddp.use_megatron_fsdp": scn.layout.strategy.startswith("fsdp:")}
        if key in modelled:
            return modelled[key]
    return scn.view.get(key)


def _diff(scn: Scenario, pairs: list[tuple[str, Any]]) -> list[Override]:
    return [_override(scn, k, v) for k, v in pairs if _current(scn, k) != v or scn.view is None]


def _override(scn: Scenario, key: str, value: Any) -> Override:
    if key == "ddp.grad_reduce_in_fp32" and value is False and mlm_fp16_grads(scn):
        # the flag the job passed is what turns fp32 grads on; --grad-reduce-in-bf16 is read only under --bf16
        return WordedOverride(key, value, "(remove --accumulate-allreduce-grads-in-fp32)")
    return Override(key, value)


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


def mlm_fp16_grads(scn: Scenario) -> bool:
    """A Megatron-LM fp16 job that passes --accumulate-allreduce-grads-in-fp32: its grads go to the param dtype
    (fp16) only by dropping that flag. --grad-reduce-in-bf16 is read only under --bf16 (arguments.py), and
    Megatron-LM turns the fp32 accumulation on by itself only for bf16."""
    view = scn.view
    if view is None or getattr(view, "framework", None) != "megatron-lm":
        return False
    fp16 = any(view.get(k) is True for k in ("model.fp16", "mlm.fp16"))
    return fp16 and view.origin("ddp.grad_reduce_in_fp32") not in (None, "default")


def half_grads(scn: Scenario) -> str:
    """The dtype the grads take when no longer reduced in fp32: the param dtype (fp16 for an fp16 job)."""
    return "fp16" if mlm_fp16_grads(scn) else "bf16"


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
        half = half_grads(scn)
        add(Candidate(f"{half} grads", bf16_grad_overrides(scn), replace(lay, grad_bytes=2), work,
                      f"grads reduced in {half}: half the grad memory and traffic; a small numerics change", 1.5))

    if work is not None and shape is not None:
        mbs = work.micro_batch_size
        while mbs > 1:
            mbs //= 2
            add(Candidate(f"micro batch {mbs}", [("train.micro_batch_size", mbs)], lay,
                          replace(work, micro_batch_size=mbs), "more, smaller micro batches: lower GPU efficiency",
                          4.0 + 0.1 * (work.micro_batch_size // max(1, mbs))))
            if work.recompute is None and work.attention != "flash":
                # attention that keeps the a*s^2 scores: the scores, not the micro batch, may be what does not fit
                add(Candidate(f"micro batch {mbs} + selective recompute",
                              [("train.micro_batch_size", mbs), ("model.recompute_granularity", "selective")], lay,
                              replace(work, micro_batch_size=mbs, recompute="selective"),
                              "smaller micro batches, attention core recomputed: lower GPU efficiency",
                              RECOMPUTE_COST["selective"] + 0.25 + 0.1 * (work.micro_batch_size // max(1, mbs))))
        if work.recompute is None:
            add(Candidate("selective recompute", [("model.recompute_granularity", "selective")], lay,
                          replace(work, recompute="selective"), "recompute attention core: a few % slower",
                          RECOMPUTE_COST["selective"]))
        if work.recompute != "full":
            add(Candidate("full recompute", FULL_RECOMPUTE, lay,
                          replace(work, recompute="full", recompute_num_layers=1),
                          "recompute every layer in backward: about 30 % slower", RECOMPUTE_COST["full"]))
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
            pairs: list[tuple[str, Any]] = [("model.tensor_model_parallel_size", t), ("model.sequence_parallel", True)]
            w = replace(work, sequence_parallel=True) if work else None
            more = "" if gpus == lay.gpus else f" on {gpus} GPUs"
            add(Candidate(f"TP {t}{more}", pairs, replace(lay, tp=t, gpus=gpus), w,
                          f"tensor parallel {t}: activation all-gathers every layer, keep TP inside a node{more}",
                          tp_cost(t) if gpus == lay.gpus else _more_gpus_cost(gpus // lay.gpus) + 0.5 + t / 16))
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
                          pp_cost(p) if gpus == lay.gpus else _more_gpus_cost(gpus // lay.gpus) + 0.6 + p / 32))
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
        offloaded = replace(lay, strategy=strat, optimizer_offload_fraction=1.0)
        add(Candidate("optimizer CPU offload", pairs, offloaded, work,
                      "optimizer step on the CPU: much slower steps (several x at 100 % offload)", 10.0))

    # combinations at the same GPU count: full sharding + bf16 grads (+ recompute)
    strongest = "fsdp:optim_grads_params"
    combo = replace(lay, strategy=strongest, meta_init=True)
    pairs = strategy_overrides(scn, strongest, True) if lay.strategy != strongest else []
    if lay.grad_bytes == 4:
        combo = replace(combo, grad_bytes=2)
        pairs = pairs + bf16_grad_overrides(scn)
        add(Candidate(f"full sharding + {half_grads(scn)} grads", pairs, combo, work,
                      STRATEGY_COST[strongest][1] + f"; grads in {half_grads(scn)}", 3.6))
    if work is not None and shape is not None and work.recompute != "full":
        # the words name what the plan changes: a job already fully sharded is told of no sharding cost, and bf16
        # grads, when the plan turns them on, are named (qa-report-16: "Megatron FSDP, everything sharded" for a
        # plan of ddp.grad_reduce_in_fp32=false + recompute on a job already on optim_grads_params)
        label = ["full sharding"] if lay.strategy != strongest else []
        words = [STRATEGY_COST[strongest][1]] if lay.strategy != strongest else []
        if combo.grad_bytes != lay.grad_bytes:
            label.append(f"{half_grads(scn)} grads")
            words.append(f"grads in {half_grads(scn)}")
        add(Candidate(" + ".join(label + ["full recompute"]),
                      pairs + FULL_RECOMPUTE, combo, replace(work, recompute="full", recompute_num_layers=1),
                      "; ".join(words + ["recompute every layer (about 30 % slower)"]),
                      combined_cost([STRATEGY_COST[strongest][0], RECOMPUTE_COST["full"]])))

    if shape is not None:
        out += split_combinations(scn)

    if not same_gpus_only:
        # more GPUs (data parallel), for the sharded strategies: the smallest power-of-two multiple that fits
        bases: list[tuple[str, list, Layout]] = []
        if lay.strategy not in ("ddp", "fsdp:no_shard"):
            bases.append((lay.strategy, [], lay))
        full = replace(lay, strategy=strongest, meta_init=True)
        bases.append((strongest, strategy_overrides(scn, strongest, True), full))
        if lay.grad_bytes == 4:
            bf16_pairs = strategy_overrides(scn, strongest, True) + bf16_grad_overrides(scn)
            bases.append((strongest + f" + {half_grads(scn)} grads", bf16_pairs, replace(full, grad_bytes=2)))
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
                bf16 = f"; grads in {half_grads(scn)}" if base.grad_bytes != lay.grad_bytes else ""
                note = STRATEGY_COST[base.strategy][1] + bf16
                cand = Candidate(f"{name} on {gpus} GPUs", spairs, cand_layout, work,
                                 f"{gpus} GPUs instead of {lay.gpus} (data parallel {cand_layout.dp}); " + note,
                                 _more_gpus_cost(factor) + strategy_cost / 10)
                plan = evaluate(scn, cand.label, [], cand.layout, cand.workload, cand.cost, cand.cost_rank)
                if plan is not None and plan.fits:
                    add(cand)
                    break
                factor *= 2
    return out


def valid_splits(scn: Scenario, max_tp: int = 8, max_pp: int = 16) -> list[tuple[int, int]]:
    """(TP, PP) pairs at the scenario's GPU count and CP: TP divides the attention heads and divides or is a multiple
    of the query groups (at most 8: inside a node), PP splits the layers as megatron-core requires (evenly, or
    with the config's first/last-stage layer counts or embedding/loss accounting), TP x PP x CP divides the GPUs."""
    shape, lay = scn.shape, scn.layout
    if shape is None:
        return []
    heads, groups = shape.num_attention_heads, shape.groups
    tps = [t for t in range(1, max_tp + 1) if heads % t == 0 and (groups % t == 0 or t % groups == 0)]
    pps = [p for p in range(1, max_pp + 1) if shape.pipeline_split_ok(p)]
    # experts: each pipeline stage's GPUs split into expert-TP x EP groups (megatron-core's expert mesh)
    return [(t, p) for t in tps for p in pps if not lay.gpus % (t * p * lay.cp)
            and not (lay.ep > 1 and (lay.gpus // p) % ((lay.etp or t) * lay.ep))]


def keeps_global_batch(scn: Scenario, layout: Layout, work: Workload | None) -> bool:
    gbs = scn.global_batch_size
    if not gbs or work is None:
        return True
    return gbs % (work.micro_batch_size * layout.dp) == 0


def _with_microbatches(scn: Scenario, work: Workload | None, layout: Layout) -> Workload | None:
    if work is None or not scn.global_batch_size:
        return work
    per = work.micro_batch_size * layout.dp
    return replace(work, num_microbatches=max(1, scn.global_batch_size // per))


def split_combinations(scn: Scenario) -> list[Candidate]:
    """TP x PP splits of the same GPU count combined with the sharding strategies and recompute: for each split
    the cheapest combination that fits (bounded: one candidate per split, at most a few dozen evaluations each)."""
    lay, work, shape = scn.layout, scn.workload, scn.shape
    if shape is None:
        return []
    strategies = [lay.strategy] + [s for s in ("distributed_optimizer", "fsdp:optim_grads", "fsdp:optim_grads_params")
                                   if s != lay.strategy and not (lay.strategy != "ddp" and s == "ddp")]
    recomputes: list[str | None] = [work.recompute if work else None]
    if work is not None and shape is not None:
        recomputes += [r for r in ("selective", "full") if r != work.recompute and not (
            work.recompute == "full" and r == "selective")]
    current_valid = lay.gpus % lay.model_parallel == 0
    out: list[Candidate] = []
    for t, p in valid_splits(scn):
        if (t, p) == (lay.tp, lay.pp) and current_valid:
            continue  # the single changes cover the split as configured
        options = []
        for strategy in strategies:
            for rc in recomputes:
                layout = replace(lay, tp=t, pp=p, strategy=strategy,
                                 meta_init=lay.meta_init or strategy == "fsdp:optim_grads_params")
                w = work
                if w is not None:
                    w = replace(w, sequence_parallel=w.sequence_parallel or t > 1, recompute=rc,
                                recompute_num_layers=(1 if rc == "full" else w.recompute_num_layers))
                    w = _with_microbatches(scn, w, layout)
                keeps = keeps_global_batch(scn, layout, w)
                parts = [tp_cost(t) if t != lay.tp else 0.0, pp_cost(p) if p != lay.pp else 0.0,
                         STRATEGY_COST[strategy][0] if strategy != lay.strategy else 0.0,
                         RECOMPUTE_COST.get(cast(str, rc), 0.0)
                         if w is not None and work is not None and rc != work.recompute else 0.0]
                rank = combined_cost(parts)
                options.append((rank, strategy, rc, layout, w, keeps))
        options.sort(key=lambda o: (not o[5], o[0]))  # keeping the global batch first
        chosen, smallest = None, None
        for option in options:
            plan = evaluate(scn, "", [], option[3], option[4], "", option[0])
            if plan is None:
                continue
            if plan.fits:
                chosen = option
                break
            if smallest is None or plan.peak < smallest[0]:
                smallest = (plan.peak, option)
        if chosen is None and smallest is not None:
            chosen = smallest[1]  # nothing fits at this split: its smallest combination, shown as not fitting
        if chosen is not None:
            rank, strategy, rc, layout, w, keeps = chosen
            pairs: list[tuple[str, Any]] = []
            if t != lay.tp:
                pairs.append(("model.tensor_model_parallel_size", t))
            if t > 1 and work is not None and not work.sequence_parallel:
                pairs.append(("model.sequence_parallel", True))
            if p != lay.pp:
                pairs.append(("model.pipeline_model_parallel_size", p))
            if strategy != lay.strategy:
                pairs += strategy_overrides(scn, strategy, strategy == "fsdp:optim_grads_params")
            if work is not None and rc != work.recompute:
                pairs += FULL_RECOMPUTE if rc == "full" else [("model.recompute_granularity", rc)]
            label = f"TP {t} x PP {p}" + ("" if strategy == lay.strategy else f", {strategy}") + (
                f", {rc} recompute" if work is not None and rc != work.recompute else "")
            notes = [f"TP {t} x PP {p} x DP {layout.dp}" + (f" x CP {lay.cp}" if lay.cp > 1 else "")]
            if t > 1:
                notes.append("tensor parallel: activation all-gathers every layer, keep TP inside a node")
            if p > 1:
                notes.append("pipeline parallel: bubbles, needs several micro batches per step")
            if strategy != lay.strategy:
                notes.append(STRATEGY_COST[strategy][1])
            if work is not None and rc != work.recompute:
                notes.append({"selective": "recompute attention core: a few % slower",
                              "full": "recompute every layer (about 30 % slower)"}[cast(str, rc)])
            if not keeps:
                assert w is not None  # keeps_global_batch holds without a workload
                notes.append(_gbs_note(scn, w.micro_batch_size * layout.dp))
            out.append(Candidate(label, pairs, layout, w, "; ".join(notes), rank))
    return out


def _gbs_note(scn: Scenario, per: int) -> str:
    assert scn.global_batch_size  # only for a plan that cannot keep it
    new = divisible_global_batch(scn.global_batch_size, per)
    return (f"changes train.global_batch_size {scn.global_batch_size} -> {new}: {scn.global_batch_size} is not "
            f"divisible by micro batch x DP = {per} (a hyper-parameter: numerics and LR schedule)")


def _change_global_batch(scn: Scenario, plan: Plan, per: int) -> None:
    """A plan whose micro batch x DP does not divide train.global_batch_size says so in its cost and carries the
    value it needs (the validator's fix for that violation), also where the config as given already broke it: the
    replay (``prove_plan``) extends a plan only with fixes for violations the plan itself causes (qa-report-13 L4)."""
    if "global_batch_size" not in plan.cost:
        plan.cost = (plan.cost + "; " if plan.cost else "") + _gbs_note(scn, per)
    if scn.global_batch_size and not any(o.key == "train.global_batch_size" for o in plan.overrides):
        plan.overrides = [*plan.overrides,
                          Override("train.global_batch_size", divisible_global_batch(scn.global_batch_size, per))]


def search(scn: Scenario, verdict: str = "unknown", same_gpus_only: bool = False, prove=None,
           keep_fitting: int = 8, keep_other: int = 3) -> list[Plan]:
    """Evaluate every candidate, replay the ones worth showing, rank: fitting and valid first, cheapest first."""
    plans: list[Plan] = []
    seen: set = set()
    for c in candidates(scn, verdict, same_gpus_only):
        if c.layout.gpus % c.layout.model_parallel:
            continue  # TP x PP x CP must divide the GPU count: not a configuration that can run
        plan = evaluate(scn, c.label, _diff(scn, c.pairs), c.layout, c.workload, c.cost, c.cost_rank)
        if plan is None:
            continue
        if not keeps_global_batch(scn, c.layout, c.workload):
            assert c.workload is not None  # keeps_global_batch holds without a workload
            _change_global_batch(scn, plan, c.workload.micro_batch_size * c.layout.dp)
        if c.label == "expandable segments":
            # the OOM numbers showed the memory was there (free + cached), only not contiguous
            plan.fits = verdict == "fragmentation"
        key = (replace(plan.layout, meta_init=False), tuple(sorted((o.key, str(o.value)) for o in plan.overrides)))
        if key in seen:
            continue
        seen.add(key)
        plans.append(plan)
    fitting = sorted((p for p in plans if p.fits),
                     key=lambda p: (changes_global_batch(p.overrides, scn.global_batch_size), p.cost_rank, p.peak))
    baseline = evaluate(scn, "as configured", [], scn.layout, scn.workload, "", 0.0)
    other = sorted((p for p in plans if not p.fits and (baseline is None or p.peak < baseline.peak)),
                   key=lambda p: (p.peak, p.cost_rank))
    kept: list[Plan] = []
    for plan in fitting:
        if len([p for p in kept if p.fits]) >= keep_fitting:
            break
        if prove is not None:
            prove_plan(scn, plan, prove)
            if plan.valid is False:
                continue
        kept.append(plan)
    for plan in other[:keep_other]:
        if prove is not None:
            prove_plan(scn, plan, prove)
        kept.append(plan)
    # the replay may have added a global batch change (its fix for a violation): such a plan moves after the
    # fitting ones that keep it (a stable sort: the order is otherwise the cost's)
    kept.sort(key=lambda p: (not p.fits, p.fits and changes_global_batch(p.overrides, scn.global_batch_size)))
    return kept


def changes_global_batch(overrides: Sequence[Override], given: Any) -> bool:
    """Does the plan set train.global_batch_size to another value than the config's ``given`` one?"""
    return any(o.key == "train.global_batch_size" and str(o.value) != str(given) for o in overrides)


def prove_plan(scn: Scenario, plan: Plan, prove) -> None:
    before = {o.key for o in plan.overrides}
    proof = prove(plan.overrides)
    plan.overrides, plan.valid, plan.violations = proof.overrides, proof.valid, proof.violations
    gbs = next((o for o in plan.overrides if o.key == "train.global_batch_size"), None)
    if gbs is not None and gbs.key not in before and "global_batch_size" not in plan.cost:
        was = _current(scn, "train.global_batch_size") or scn.global_batch_size
        plan.cost = (plan.cost + "; " if plan.cost else "") + (
            f"changes train.global_batch_size {was} -> {gbs.value} (added by replay: a hyper-parameter, "
            "numerics and LR schedule)")
