"""Checks on mixture-of-experts settings and the expert-parallel process grid.

Rules CV060-CV065, CV067 and CV086. Sources: megatron-core 0.16.1 ``transformer/moe/moe_layer.py``
(``MoELayer.__init__`` L101, ``MoELayer.forward`` L379), ``model_parallel_config.py`` ``__post_init__`` (0.8-0.14:
a ValueError, since 0.15 only a warning, L440), ``transformer/transformer_config.py`` ``__post_init__``
(L1062-L1136), ``parallel_state.py`` ``initialize_model_parallel`` (L786-L795, L833, L1263); Megatron-LM d98e8a64
``megatron/training/arguments.py`` ``validate_args`` (~L1655); Megatron-Bridge 067f987d ``training/comm_overlap.py``
``CommOverlapConfig.setup`` (~L478). Where megatron-core's wording changed with its release, the job's megatron-core
version (when the log shows it) picks the wording; unknown means 0.16.
"""

from __future__ import annotations

from collections.abc import Iterable

from diagnose.explain.validate.registry import KNOWN_KEYS, CheckContext, Violation, check, ov, simple_check

EP = "model.expert_model_parallel_size"
ETP = "model.expert_tensor_parallel_size"
EXPERTS = "model.num_moe_experts"
DISPATCHER = "model.moe_token_dispatcher_type"
DEEPEP = "model.moe_enable_deepep"
BACKEND = "model.moe_flex_dispatcher_backend"
CAPACITY = "model.moe_expert_capacity_factor"
PAD = "model.moe_pad_expert_input_to_capacity"
LB_TYPE = "model.moe_router_load_balancing_type"
INSTANCES = "ddp.num_distributed_optimizer_instances"
A2A_OVERLAP = "comm_overlap.overlap_moe_expert_parallel_comm"

MSG_SP_OLD = "When using expert parallelism and tensor parallelism, sequence parallelism must be used"
# upstream concatenates two literals without a space ("parallelismare")
MSG_SP_NEW = ("During training, performance may degrade if MoE and tensor parallelismare enabled without also "
              "enabling sequence parallelism.")
MSG_DEEPEP_FLEX = "DeepEP backend is only supported with flex token dispatcher."
MSG_ONE_BACKEND = "Only one backend is supported for flex token dispatcher."
MSG_DEEPEP_PAD = "Flex token dispatcher with deepep backend does not support moe_pad_expert_input_to_capacity"
MSG_PAD_NEEDS_CAPACITY = "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity"
MSG_DP_INSTANCES = "Data parallel size should be divisible by partial DistOpt shard factor"
MSG_EDP_INSTANCES = "Expert data parallel size should be divisible by partial DistOpt shard factor"
# load-balancing types that allow a capacity factor, and the message, per megatron-core release
_CAPACITY_LB = (
    ((0, 15, 0), ("aux_loss", "seq_aux_loss", "global_aux_loss", "none"),
     "moe_expert_capacity_factor only works with aux_loss, seq_aux_loss, global_aux_loss or none load balancing"),
    ((0, 14, 0), ("aux_loss", "seq_aux_loss", "none"),
     "moe_expert_capacity_factor only works with aux_loss, seq_aux_loss or none load balancing"),
    ((0, 0, 0), ("aux_loss", "none"), "moe_expert_capacity_factor only works with aux_loss or none load balancing"),
)

KNOWN_KEYS.update({EP, ETP, EXPERTS, DISPATCHER, DEEPEP, BACKEND, CAPACITY, PAD, LB_TYPE, INSTANCES,
                   "model.moe_shared_expert_intermediate_size", "model.moe_shared_expert_overlap", A2A_OVERLAP,
                   "model.overlap_moe_expert_parallel_comm", "model.mtp_num_layers"})


def _etp(ctx: CheckContext) -> int:
    """Expert TP; upstream uses TP when it is unset."""
    return ctx.number(ETP) or ctx.tp


def _dispatcher(ctx: CheckContext) -> str:
    return str(ctx.get(DISPATCHER) or "allgather")  # TransformerConfig's default


def _smaller_ep(ctx: CheckContext, below: int) -> int | None:
    """The largest EP < ``below`` that divides the experts and keeps ETP*EP*PP dividing the world size."""
    experts, world = ctx.number(EXPERTS), ctx.number("launch.world_size")
    rest = _etp(ctx) * ctx.pp
    for d in range(below - 1, 0, -1):
        if experts and experts % d:
            continue
        if world and world % (d * rest):
            continue
        if not world and below % d:
            continue  # GPU count unknown: a divisor of the old EP keeps ETP*EP*PP dividing it
        return d
    return None


@check("experts_divisible_by_ep", "megatron-core transformer/moe/moe_layer.py MoELayer.__init__ (0.16.1 L101, a bare "
       "assert; self.expert_parallel_size up to 0.12); Megatron-LM arguments.py validate_args (d98e8a64 ~L1657)")
def experts_divisible_by_ep(ctx: CheckContext) -> Iterable[Violation]:
    experts, ep = ctx.number(EXPERTS), ctx.size(EP)
    if not experts or ep <= 1 or experts % ep == 0:
        return
    if ctx.mlm:
        message = "Number of experts should be a multiple of expert model parallel_size."
    elif not ctx.core_before((0, 13, 0)):
        message = "assert self.config.num_moe_experts % ep_size == 0"
    else:
        message = "assert self.config.num_moe_experts % self.expert_parallel_size == 0"
    new_ep = _smaller_ep(ctx, ep)
    yield Violation("experts_divisible_by_ep", message, [EXPERTS, EP],
                    fixes=[[ov(EP, new_ep)]] if new_ep else [])


simple_check("moe_tp_needs_sequence_parallel", "megatron-core transformer/moe/moe_layer.py MoELayer.forward (0.16.1 "
             "L379, at the first training step); model_parallel_config.py __post_init__ raised its own ValueError "
             "for EP>1 in 0.8-0.14",
             lambda ctx: bool(ctx.number(EXPERTS)) and ctx.tp > 1 and not ctx.flag("model.sequence_parallel"),
             lambda ctx: MSG_SP_OLD if ctx.core_before((0, 15, 0)) and ctx.size(EP) > 1 else MSG_SP_NEW,
             [EXPERTS, "model.tensor_model_parallel_size", "model.sequence_parallel"],
             [[("model.sequence_parallel", True)]])


@check("expert_world_size_divisible", "megatron-core parallel_state.py initialize_model_parallel (0.16.1 L786-L795: "
       "ETP defaults to TP; raised after the TP*PP*CP check)")
def expert_world_size_divisible(ctx: CheckContext) -> Iterable[Violation]:
    world = ctx.number("launch.world_size")
    tp, pp, cp = ctx.tp, ctx.pp, ctx.cp
    if not world or world % (tp * pp * cp):
        return  # the dense check (world_size_divisible) raises first
    size = _etp(ctx) * ctx.size(EP) * pp
    if world % size == 0:
        return
    new_ep = _smaller_ep(ctx, ctx.size(EP))
    yield Violation(
        "expert_world_size_divisible",
        f"world_size ({world}) is not divisible by expert_tensor_model_pipeline_parallel size ({size})",
        ["launch.world_size", ETP, EP, "model.pipeline_model_parallel_size"],
        fixes=[[ov(EP, new_ep)]] if new_ep else [],
    )


@check("distributed_optimizer_instances", "megatron-core parallel_state.py initialize_model_parallel (0.16.1 L833 "
       "dense, L1263 expert data-parallel groups)")
def distributed_optimizer_instances(ctx: CheckContext) -> Iterable[Violation]:
    instances, world = ctx.size(INSTANCES), ctx.number("launch.world_size")
    if instances <= 1 or not world:
        return
    tp, pp, cp = ctx.tp, ctx.pp, ctx.cp
    expert = _etp(ctx) * ctx.size(EP) * pp
    if world % (tp * pp * cp) or world % expert:
        return  # the world-size checks raise first
    keys = [INSTANCES, "launch.world_size", "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
            "model.context_parallel_size"]
    if (world // (tp * pp * cp) * cp) % instances:
        yield Violation("distributed_optimizer_instances", MSG_DP_INSTANCES, keys, fixes=[[ov(INSTANCES, 1)]])
    elif (world // expert) % instances:
        yield Violation("distributed_optimizer_instances", MSG_EDP_INSTANCES, keys + [EP, ETP],
                        fixes=[[ov(INSTANCES, 1)]])


@check("moe_flex_dispatcher", "megatron-core transformer/transformer_config.py __post_init__ (0.16.1 L1062-L1079)")
def moe_flex_dispatcher(ctx: CheckContext) -> Iterable[Violation]:
    deepep = ctx.flag(DEEPEP)
    if deepep and _dispatcher(ctx) != "flex":
        yield Violation("moe_deepep_needs_flex", MSG_DEEPEP_FLEX, [DEEPEP, DISPATCHER],
                        fixes=[[ov(DISPATCHER, "flex")], [ov(DEEPEP, False)]])
        return
    if deepep and ctx.get(BACKEND) == "hybridep":
        yield Violation("moe_one_flex_backend", MSG_ONE_BACKEND, [DEEPEP, BACKEND], fixes=[[ov(DEEPEP, False)]])
        return
    if _dispatcher(ctx) == "flex" and ctx.flag(PAD) and (deepep or ctx.get(BACKEND) == "deepep"):
        yield Violation("moe_deepep_pad", MSG_DEEPEP_PAD, [PAD, DISPATCHER, DEEPEP, BACKEND], fixes=[[ov(PAD, False)]])


@check("moe_shared_expert_overlap", "megatron-core transformer/transformer_config.py __post_init__ (0.16.1 L1089; "
       "'alltoall or flex' since 0.18)")
def moe_shared_expert_overlap(ctx: CheckContext) -> Iterable[Violation]:
    size = ctx.number("model.moe_shared_expert_intermediate_size")
    if size is None or size <= 0 or not ctx.flag("model.moe_shared_expert_overlap"):
        return
    core = ctx.core
    if core is not None and core >= (0, 18, 0):
        allowed: tuple[str, ...] = ("alltoall", "flex")
        message = "moe_shared_expert_overlap only works with alltoall or flex token dispatcher."
    else:
        allowed, message = ("alltoall",), "moe_shared_expert_overlap only works with alltoall token dispatcher."
    if _dispatcher(ctx) in allowed:
        return
    yield Violation("moe_shared_expert_overlap", message, ["model.moe_shared_expert_overlap", DISPATCHER],
                    fixes=[[ov(DISPATCHER, "alltoall")], [ov("model.moe_shared_expert_overlap", False)]])


def _capacity(ctx: CheckContext) -> float | None:
    """The capacity factor as upstream uses it (a negative value means none)."""
    value = ctx.get(CAPACITY)
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if number < 0 else number


@check("moe_capacity_factor", "megatron-core transformer/transformer_config.py __post_init__ (0.16.1 L1105-L1136; "
       "the load-balancing list grew in 0.14 and 0.15)")
def moe_capacity_factor(ctx: CheckContext) -> Iterable[Violation]:
    capacity = _capacity(ctx)
    if capacity is not None:
        lb = ctx.get(LB_TYPE) or "aux_loss"
        core = ctx.core or (99, 0, 0)
        allowed, message = next((a, m) for since, a, m in _CAPACITY_LB if core >= since)
        types = lb if isinstance(lb, list) else [lb]
        if any(t not in allowed for t in types):
            yield Violation("moe_capacity_load_balancing", message, [CAPACITY, LB_TYPE],
                            fixes=[[ov(LB_TYPE, "aux_loss")], [ov(CAPACITY, None), ov(PAD, False)]])
            return
    if ctx.flag(PAD) and capacity is None:
        yield Violation("moe_pad_needs_capacity", MSG_PAD_NEEDS_CAPACITY, [PAD, CAPACITY], fixes=[[ov(PAD, False)]])


def _a2a_overlap_problem(ctx: CheckContext) -> tuple[str, list[str]] | None:
    """The first assert of ``CommOverlapConfig.setup`` that fails (message, keys), in upstream's order; the torch
    version assert (>= 2.6) is not decidable from the config and is skipped."""
    ep, experts, dispatcher = ctx.size(EP), ctx.number(EXPERTS), _dispatcher(ctx)
    if ep <= 1:
        return "overlap_moe_expert_parallel_comm is only supported when expert_model_parallel_size > 1", [EP]
    if experts is None or experts <= 1:
        # upstream's f-string continues the line with a backslash, so the message carries the indentation spaces
        return (f"overlap_moe_expert_parallel_comm is only supported when num_moe_experts > 1, "
                f"{' ' * 20}but got {experts}"), [EXPERTS]
    if dispatcher not in ("alltoall", "flex"):
        return (f"overlap_moe_expert_parallel_comm is only supported when moe_token_dispatcher_type == 'alltoall' or "
                f"'flex',{' ' * 22}but got {dispatcher}"), [DISPATCHER]
    if not (ctx.flag("model.bf16") or ctx.flag("model.fp16")):
        return "overlap_moe_expert_parallel_comm is only supported when using bf16 or fp16 models", ["model.bf16"]
    vpp = ctx.get("model.virtual_pipeline_model_parallel_size")
    if ctx.pp > 1 and vpp is None:
        return ("If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified when "
                "pipeline_model_parallel_size > 1"), ["model.virtual_pipeline_model_parallel_size"]
    if ctx.get("model.recompute_granularity") == "full":
        return ("disable full recomputation when enabling overlap_moe_expert_parallel_comm",
                ["model.recompute_granularity"])
    if ctx.get("model.recompute_method") is not None:
        return "disable recomputation method when enabling overlap_moe_expert_parallel_comm", ["model.recompute_method"]
    if ctx.get("model.recompute_num_layers") is not None:
        return ("recompute_num_layers must be None when enabling overlap_moe_expert_parallel_comm",
                ["model.recompute_num_layers"])
    modules = ctx.get("model.recompute_modules") or []
    if not ctx.surely_before((0, 6, 0)) and isinstance(modules, list) and "moe" in modules:
        return ("disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm",
                ["model.recompute_modules"])
    if ctx.flag("model.moe_shared_expert_overlap"):
        return ("disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm",
                ["model.moe_shared_expert_overlap"])
    mtp = ctx.number("model.mtp_num_layers")
    if mtp not in (None, 0, 1):
        message = ("MTP layernum only supports 1 when enabling overlap_moe_expert_parallel_comm."
                   if ctx.surely_before((0, 6, 0)) else
                   "MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm.")
        return message, ["model.mtp_num_layers"]
    return None


@check("ep_a2a_overlap_requirements", "Megatron-Bridge training/comm_overlap.py CommOverlapConfig.setup (>= 0.2.0; "
       "067f987d ~L478; 'moe in recompute_modules' and the MTP wording since 0.6.0)", ("megatron-bridge",))
def ep_a2a_overlap_requirements(ctx: CheckContext) -> Iterable[Violation]:
    if not ctx.flag(A2A_OVERLAP):
        return  # upstream tests the user's comm_overlap setting (``is True``)
    problem = _a2a_overlap_problem(ctx)
    if problem is None:
        return
    message, keys = problem
    yield Violation("ep_a2a_overlap_requirements", message, [A2A_OVERLAP] + keys,
                    fixes=[[ov(A2A_OVERLAP, False), ov("model.overlap_moe_expert_parallel_comm", False)]])
