"""The orchestration of a config's checks, beside ``pipeline.analyze``: ``check`` (will this config validate and
fit?), ``plan`` (the TUI plan screen's what-ifs) and ``replay_config`` (a config or a log replayed through the
validator). Each wires explain.config, explain.replay and explain.memory and returns typed results; the commands
and screens only parse arguments and render. Never prints; imports no presenter.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diagnose.model import DiagnoseError, Override, Report

if TYPE_CHECKING:
    from diagnose.configview import ConfigView
    from diagnose.explain.memory.plan import MemoryPlan
    from diagnose.explained import ReplayResult, Violation
    from diagnose.memory_types import MemoryOption

CHECK_SCHEMA = "diagnose/check@1"
REPLAY_SCHEMA = "diagnose/replay@1"


# ------------------------------------------------------------------------------------------ check


@dataclass
class CheckRequest:
    """``diagnose check``'s question: this config file, with these ``--set`` words, on this many GPUs of this size."""

    config: str
    gpus: int
    capacity: int
    sets: list[str] = field(default_factory=list)
    bridge_version: str | None = None
    gpu: str = ""  # the --gpu model's name (explain.memory.gpus); "" when only a size was given


@dataclass
class Validation:
    """The config's validation in ``check`` and on the plan screen: explain.replay's answer (its ``fits``: whether
    the validator's fix fits the memory model) and the change the fix makes to train.global_batch_size, a training
    hyper-parameter, as (from, to)."""

    result: ReplayResult
    changes_global_batch_size: tuple[Any, Any] | None = None

    @property
    def violations(self) -> list[Violation]:
        return self.result.before.violations

    @property
    def passes(self) -> bool:
        """The config as given validates (the fix, if any, is ``result.passes``)."""
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        """The check@1 ``replay`` section: the report's replay section with ``passes`` and the batch size change."""
        out = {**self.result.to_dict(), "passes": self.passes}
        if self.changes_global_batch_size is not None:
            was, now = self.changes_global_batch_size
            out["changes_global_batch_size"] = {"from": was, "to": now}
        return out


@dataclass
class CheckResult:
    replay: Validation
    memory: MemoryPlan
    mlm: bool  # the input was a Megatron-LM argument list: fixes are written as its flags

    @property
    def ok(self) -> bool:
        """Validates and, as given, fits (exit code 0)."""
        return self.replay.passes and bool(self.memory.given.fits)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": CHECK_SCHEMA, "replay": self.replay.to_dict(), "memory": self.memory.to_dict()}


def load_view(path: str) -> ConfigView:
    from diagnose.explain.config import load_config

    return load_config(path)


def prepare_view(path: str, gpus: int, sets: list[str], bridge_version: str | None = None,
                 gpu: str = "") -> ConfigView:
    """The config as loaded, with the ``--set`` overrides, the GPU count (and the ``--gpu`` model, ``launch.gpu``,
    which some checks read: Megatron-LM asks TP/CP > 1 for CUDA_DEVICE_MAX_CONNECTIONS=1 only before Blackwell)
    and the release's defaults."""
    from diagnose.explain.config import apply_defaults, apply_overrides, parse_set
    from diagnose.explain.config.keycheck import check_overrides

    view = load_view(path)
    overrides = [parse_set(s) for s in sets]
    check_overrides(overrides)
    if overrides:
        view = apply_overrides(view, overrides)
    view.set("launch.world_size", int(gpus), "override")
    if gpu:
        view.set("launch.gpu", gpu, "override")
    apply_defaults(view, bridge_version)
    return view


def replay_section(view: Any, bridge_version: str | None, accept=None, real_mcore: bool = True) -> Validation:
    """The config as given validated: its violations, the smallest fix the validator's suggestions give that passes
    (and that ``accept``, the memory check, takes), and the result after the fix (``diagnose.explain.replay``)."""
    from diagnose.explain.replay import replay

    return Validation(replay(view, [], bridge_version, accept=accept, real_mcore=real_mcore))


def memory_accept(view: Any, gpus: int, capacity: int):
    """A validator's fix must not put the model where it no longer fits (a layout fix that sets PP 1 on a 671B
    model): when the config as given fits, a fix must fit too; when it does not, memory is the plans' question
    and any valid fix is taken. Returns (accept, fits_of) for ``replay`` and for the report."""
    from diagnose.explain.memory.plan import fix_plan

    cache: dict[str, Any] = {}

    def fits_of(overrides: list) -> bool | None:
        key = repr([(o.key, o.value) for o in overrides])
        if key not in cache:
            try:
                plan = fix_plan(view, overrides, gpus, capacity)
            except DiagnoseError:
                plan = None
            cache[key] = None if plan is None else plan.fits
        return cache[key]

    given = fits_of([])

    def accept(overrides: list) -> bool:
        return given is not True or fits_of(overrides) is not False

    return accept, fits_of


def check(req: CheckRequest) -> CheckResult:
    """Validate the config (replay, every violation with the fix proven by replay), then plan memory per GPU for
    the config as given and the alternatives at the same GPU count."""
    from diagnose.explain.memory.plan import NoModelShape, memory_plan
    from diagnose.explain.memory.replay_check import prove

    view = prepare_view(req.config, req.gpus, req.sets, version := req.bridge_version, req.gpu)
    _prefetch_param_count(view)
    accept, fits_of = memory_accept(view, req.gpus, req.capacity)
    replay = replay_section(view, version, accept)
    if replay.result.fix:
        replay.result.fits = fits_of(replay.result.fix)
    try:
        plan = memory_plan(view, req.gpus, req.capacity, prove=lambda ovs: prove(view, ovs, version))
    except NoModelShape as e:
        # an overrides-only YAML: say what can still be checked without a model (replay validates it alone)
        command = f"diagnose replay {shlex.quote(req.config)} --gpus {req.gpus}"
        raise DiagnoseError(f"{e}; give the model (its provider's _target_ or its shape), or validate the config "
                            f"without a memory plan: {command}") from None
    mark_validation(replay, plan, view)
    mlm = mlm_input(view)
    if not mlm and view.get("train.micro_batch_size") is None:
        # a partial YAML (no train section): the activations were planned for 1 sample per micro batch, unsaid
        plan.notes.append("train.micro_batch_size is not in the config: every plan's activations assume a micro "
                          "batch of 1 sample (they grow with it); set it (--set train.micro_batch_size=N) for a "
                          "true peak")
    if note := _max_connections_note(plan, view, mlm):
        plan.notes.append(note)
    if not replay.passes:
        _lead_with_the_fix(plan, view, replay.result, req.gpus, req.capacity)
        fix = fix_text(replay.result.fix, mlm)
        if len(plan.plans) > 1:
            plan.notes.append(_invalid_given_note(plan, view, version, fix))
        if plan.more_gpus is not None:
            plan.notes.append(_wider_validation(view, plan.more_gpus, version, req.gpus, mlm))
    return CheckResult(replay, plan, mlm)


def _invalid_given_note(memory: MemoryPlan, view: Any, version: str | None, fix: str) -> str:
    """What the plans need when the config as given fails validation: a plan whose own change clears every
    violation (a smaller micro batch for "global batch size not divisible by micro batch x DP") needs nothing more;
    the others change only memory and need the validator's fix too (qa-report-13: the note said every plan needed
    train.global_batch_size=2048 where plan #1, micro batch 1, was valid as it stood)."""
    from diagnose.explain.config import apply_overrides
    from diagnose.explain.validate import validate

    def valid_alone(option: MemoryOption) -> bool:
        if not option.overrides:
            return False
        try:
            return not validate(apply_overrides(view, list(option.overrides)), version)
        except Exception:  # noqa: BLE001 - a validator failure leaves the plan with the validator's fix
            return False

    alone = [i for i, p in enumerate(memory.plans[1:], 1) if valid_alone(p)]
    need = (f"validator's fix ({fix})" if fix else "violations above fixed") + \
        (" or its own split (TP x PP) where it changes them" if fix and "parallel_size" in fix else "")
    head = "the config as given fails validation: "
    if not alone:
        return head + "each plan below changes only memory, so it also needs the " + need
    if len(alone) == len(memory.plans) - 1:
        return head + "each plan below makes it valid by its own change (no validator's fix needed)"
    rest = [i for i in range(1, len(memory.plans)) if i not in alone]

    def numbers(ids: list[int]) -> str:
        return ", ".join(f"#{i}" for i in ids)

    def numbered(ids: list[int]) -> str:
        return ("plans " if len(ids) > 1 else "plan ") + numbers(ids)

    if len(rest) < len(alone):  # name the fewer: "every plan but #10 ..."
        one = len(rest) == 1
        return (head + f"every plan but {numbers(rest)} makes it valid by its own change; "
                f"{numbered(rest)} change{'s' if one else ''} only memory, so {'it' if one else 'they'} also "
                f"need{'s' if one else ''} the " + need)
    return (head + f"{numbered(alone)} make{'s' if len(alone) == 1 else ''} it valid by "
            f"{'its' if len(alone) == 1 else 'their'} own change; the others change only memory, so they also "
            "need the " + need)


def _wider_validation(view: Any, more: MemoryOption, version: str | None, gpus: int, mlm: bool) -> str:
    """What the config needs to pass validation on the GPUs of the cheapest plan that fits (a note): validated
    there, with that plan's changes, not assumed from the violations at the GPU count asked for."""
    from diagnose.explain.config import apply_overrides
    from diagnose.explain.replay import replay

    changes = [o for o in more.overrides if not o.key.startswith(("env.", "launch."))]
    wider = apply_overrides(view, [Override("launch.world_size", more.gpus), *changes])
    result = replay(wider, [], version)
    where = f"on the {more.gpus} GPUs the cheapest plan that fits needs"
    if not result.before.violations:
        return (f"the config as given fails validation on {gpus} GPU{'s' if gpus != 1 else ''} only: {where}, it "
                f"passes validation with no validator's fix")
    fix = fix_text(result.fix, mlm)
    if result.passes and fix:
        return f"{where}, the config also needs the validator's fix there ({fix})"
    return f"{where}, the config still fails validation ({len(result.before.violations)} violation(s)): fix them too"


def _max_connections_note(memory: MemoryPlan, view: Any, mlm: bool) -> str | None:
    """A Megatron-LM job with TP or CP > 1 and no Megatron FSDP starts only with CUDA_DEVICE_MAX_CONNECTIONS=1 before
    Blackwell, and Megatron FSDP refuses 1 (megatron/training/arguments.py, both asserts): a plan that turns FSDP on
    needs the launch script's export changed too. ``check`` reads no environment, so this is said, not replayed
    (with the variable given, ``--set CUDA_DEVICE_MAX_CONNECTIONS=1``, replay extends each such plan itself). On a
    Blackwell GPU (``launch.gpu``, the one ``check --gpu`` named) the TP/CP assert does not apply
    (``get_device_arch_version() < 10``): only an export of 1 the script may still carry is in the way, so the note
    says that instead of the Hopper requirement."""
    from diagnose.explain.validate.checks_fsdp import tp_cp_export_waiver

    if not mlm or view.has("env.CUDA_DEVICE_MAX_CONNECTIONS") or view.get("ddp.use_megatron_fsdp") is True:
        return None
    tp, cp = (view.get(k) for k in ("model.tensor_model_parallel_size", "model.context_parallel_size"))
    if not any(isinstance(v, int) and v > 1 for v in (tp, cp)):
        return None
    fsdp = [i for i, p in enumerate(memory.plans) if any(
        o.key == "ddp.use_megatron_fsdp" and o.value is True for o in p.overrides)]
    if not fsdp:
        return None
    head = ("plans that turn Megatron FSDP on (" + ", ".join(f"#{i}" for i in fsdp) + ") also need "
            "CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 (e.g. 32): Megatron-LM refuses 1 with FSDP")
    waiver = tp_cp_export_waiver(view)  # the validator's own reading of Megatron-LM's assert
    if waiver is not None:
        why = ("with --overlap-moe-expert-parallel-comm" if waiver == "overlap_moe_expert_parallel_comm"
               else f"on {waiver} (Blackwell)")
        return (head + f"; {why} this TP/CP > 1 job does not need 1, so only a launch script that still exports 1 "
                "changes that export with the plan")
    return (head + ", and this TP/CP > 1 job, without FSDP, must export 1 on GPUs before Blackwell; change the "
            "launch script's export with the plan")


def mark_validation(replay: Validation, memory: MemoryPlan | None, view: ConfigView) -> None:
    """A config that fails validation is never a working plan (its given row is for reference: ``valid=False``),
    and a validator fix that changes train.global_batch_size, a training hyper-parameter, says so."""
    for o in replay.result.fix:
        if o.key == "train.global_batch_size" and (was := view.get(o.key)) != o.value:
            replay.changes_global_batch_size = (was, o.value)
    if memory is not None and memory.plans:
        if not replay.passes:
            memory.given.valid = False
        elif memory.given.valid is None:
            memory.given.valid = True


def mlm_input(view: Any) -> bool:
    """Was the config a Megatron-LM argument list (or dump)? Then ``check`` and ``replay`` write its fixes as
    Megatron-LM flags (``fix_text``), not as Bridge overrides."""
    return getattr(view, "framework", None) == "megatron-lm"


def fix_text(overrides: list[Override], mlm: bool = False) -> str:
    """Overrides as the reports print them (one renderer): Bridge CLI words, then ``export`` lines for env.* keys.
    With ``mlm`` (the input was a Megatron-LM argument list) in its dialect (``render.overrides_in_style``):
    Megatron-LM flags, Bridge words only for the keys that have no flag, each flag once, the exports after them."""
    from diagnose.explain.render import inline_fix, overrides_in_style

    return overrides_in_style(overrides, "megatron-lm") if mlm else inline_fix(overrides)


def _prefetch_param_count(view: Any) -> None:
    """Start megatron-core's meta-device parameter count now, in a child, while the validator imports megatron-core
    here: the two imports take seconds each and no longer add up."""
    from diagnose.explain.memory import from_config as fc
    from diagnose.explain.memory.meta_count import prefetch
    from diagnose.explain.memory.plan import _exact_wanted

    if not _exact_wanted():
        return
    try:
        shape = fc.shape_from_config(view)
    except Exception:  # noqa: BLE001 - memory_plan reports a bad shape itself, with its own message
        return
    if shape is not None:
        prefetch(shape)


def _lead_with_the_fix(memory: MemoryPlan, view: Any, replay: ReplayResult, gpus: int, capacity: int) -> None:
    """When the validator's fix alone makes the config valid and it then fits, that is the first plan (one answer:
    no layout or sharding change is needed), ahead of the memory alternatives."""
    from diagnose.explain.memory.options import changes_global_batch
    from diagnose.explain.memory.plan import fix_plan, option_of

    fix = replay.fix
    if not fix or not replay.passes:
        return
    plan = fix_plan(view, fix, gpus, capacity)
    if plan is None or not plan.fits:
        return
    plan.overrides = fix
    plan.label = "the validator's fix"
    plan.cost = "the fix above; no memory change needed"
    pinned = {o.key: o.value for o in fix}
    try:
        gbs = int(pinned.get("train.global_batch_size", view.get("train.global_batch_size")) or 0)
        mbs = int(pinned.get("train.micro_batch_size", view.get("train.micro_batch_size")) or 1)
    except (TypeError, ValueError):
        gbs, mbs = 0, 1
    if "train.global_batch_size" in pinned or (gbs and gbs % (mbs * max(1, plan.layout.dp))):
        plan.cost += "; changes train.global_batch_size (a hyper-parameter)"
    plan.valid = True
    rest = [p for p in memory.plans[1:] if p.overrides != fix]
    at = 0
    given = view.get("train.global_batch_size")
    if changes_global_batch(fix, given):
        # a fix that changes the global batch size (a tuned hyper-parameter) comes after every plan that fits and
        # keeps it (qa-report-16 L3), as the memory plans among themselves are ranked
        while at < len(rest) and rest[at].fits and rest[at].valid is not False and not changes_global_batch(
                rest[at].overrides, given):
            at += 1
    memory.plans[:] = [memory.plans[0], *rest[:at], option_of(plan, given), *rest[at:]]


# ------------------------------------------------------------------------------------------ the TUI's what-ifs


@dataclass
class PlanRequest:
    """What to plan: the config as loaded, the what-if overrides on top, the GPU count and capacity."""

    base: Any  # ConfigView, never changed
    gpus: int
    capacity: int
    sets: list[Override] = field(default_factory=list)
    bridge_version: str | None = None
    real_mcore: bool = True  # also build megatron-core's config classes when importable (seconds, once)


@dataclass
class PlanResult:
    replay: Validation | None = None
    memory: MemoryPlan | None = None
    error: str | None = None  # the config could not be validated or planned: said on the screen


def plan(req: PlanRequest, on_memory: Callable[[PlanResult], None] | None = None) -> PlanResult:
    """Plan memory, then validate (replay, as ``check`` does) for the request. Never raises: an error is the
    result's ``error``. ``on_memory`` gets the plan as soon as it is known: the validator may first import
    megatron-core (seconds)."""
    from diagnose.explain.config import apply_defaults, apply_overrides
    from diagnose.explain.memory.plan import memory_plan
    from diagnose.explain.memory.replay_check import prove

    def said(e: Exception) -> str:  # a model bug must not take the UI down: said on the screen like bad input
        return str(e) if isinstance(e, DiagnoseError) else f"internal error: {type(e).__name__}: {e}"

    try:
        view = apply_overrides(req.base, req.sets) if req.sets else req.base.copy()
        view.set("launch.world_size", int(req.gpus), "override")
        apply_defaults(view, req.bridge_version)
    except Exception as e:  # noqa: BLE001
        return PlanResult(error=said(e))
    memory, error = None, None
    try:
        memory = memory_plan(view, int(req.gpus), req.capacity,
                             prove=lambda ovs: prove(view, ovs, req.bridge_version))
    except Exception as e:  # noqa: BLE001
        error = said(e)
    if on_memory is not None:
        on_memory(PlanResult(None, memory, error))
    replay = None
    try:
        replay = replay_section(view, req.bridge_version, real_mcore=req.real_mcore)
        mark_validation(replay, memory, view)
    except Exception as e:  # noqa: BLE001
        error = error or f"validation: {said(e)}"
    return PlanResult(replay, memory, error)


# ------------------------------------------------------------------------------------------ replay


@dataclass
class ReplayRequest:
    """``diagnose replay``'s question: this config or log, with these ``--set`` words."""

    config: str
    sets: list[str] = field(default_factory=list)
    bridge_version: str | None = None
    gpus: int | None = None


@dataclass
class ReplayOutcome:
    view: ConfigView
    result: ReplayResult
    report: Report | None = None  # the log's report when the input was a log
    user_sets: bool = False  # the user gave --set

    @property
    def requested_passes(self) -> bool:
        return self.result.requested is not None and self.result.requested.passes

    @property
    def ok(self) -> bool:
        """One meaning for a log and a config (issue 16): what you replay (as given, with your --set) passes and, on
        an OOM log, fits; a log without --set is the job's own config, which failed, even when the fix is proven."""
        if self.report is not None and not self.user_sets and self.report.root is not None:
            return False
        return self.requested_passes and self.result.fits is not False

    def to_dict(self) -> dict[str, Any]:
        return {"schema": REPLAY_SCHEMA, "config": self.view.to_dict(), "replay": self.result.to_dict(),
                "requested_passes": self.requested_passes}


def replay_config(req: ReplayRequest) -> ReplayOutcome:
    """Validate the config as given, then with the overrides (on a log without ``--set``: the fix of its root
    cause, or the memory model's fitting option for a capacity OOM), extending a fix that trips another check."""
    from diagnose.explain import fix_overrides
    from diagnose.explain.config import apply_defaults, normalize_overrides
    from diagnose.explain.config.extract import load_config, looks_like_log_file
    from diagnose.explain.config.keycheck import check_overrides
    from diagnose.explain.fit import apply_fit, apply_memory_fit, capacity_fix, memory_fit, rule_fix_fit
    from diagnose.explain.replay import replay

    overrides = normalize_overrides(req.sets)
    check_overrides(overrides)
    finding = fit = report = None
    if req.gpus is not None and req.gpus <= 0:
        raise DiagnoseError(f"--gpus {req.gpus}: must be at least 1")
    if looks_like_log_file(req.config):
        view, report = _from_log(req.config, req.gpus)
        finding = report.root
        if not overrides and finding is not None:
            # a capacity OOM: the memory model's fitting option, as in analyze
            fit = capacity_fix(report, view, rule_fix_fit(report, view))
            overrides = fit.overrides if fit is not None else fix_overrides(finding)  # the root cause's own fix
    else:
        view = load_config(req.config, defaults=False)
    if req.bridge_version:
        view.version = req.bridge_version
    if req.gpus is not None:
        view.set("launch.world_size", req.gpus, "override")
    if req.sets or report is None:  # the user's config or --set: a size of 0, below or past any model's is refused
        from diagnose.explain.config.overrides import apply_overrides
        from diagnose.explain.memory.plan import size_problems
        from diagnose.explain.validate.checks_parallel import VALIDATED_SIZES

        bad = size_problems(apply_overrides(view, overrides) if overrides else view, VALIDATED_SIZES)
        if bad:
            raise DiagnoseError("; ".join(bad))
    apply_defaults(view)
    result = replay(view, overrides, view.version, finding=finding)
    if fit is not None:
        apply_fit(result, fit)
    elif finding is not None and report is not None and finding.category == "cuda_oom":
        # the rule's fix or the user's --set on an OOM log: checked against the same memory model as analyze
        apply_memory_fit(result, memory_fit(report, view, result.fix, finding))
    return ReplayOutcome(view, result, report, user_sets=bool(req.sets))


def _from_log(path: str, gpus: int | None = None) -> tuple[Any, Report]:
    """A log: scan it with the engine for the config blocks and the root cause (whose failure replay should
    reproduce); a log with neither is bad input. ``gpus`` (``--gpus``) is the world size before the memory model
    runs: validation and memory answer for the same GPU count (qa-report-13: memory was sized on the log's)."""
    from diagnose.explain import _run_memory, build_view
    from diagnose.ingest import open_inputs
    from diagnose.match import load_catalogue, scan_and_match

    catalogue = load_catalogue([])
    with open_inputs([path]) as sources:
        result = scan_and_match(sources, catalogue)
    report = result.report
    view = build_view(report, result.blocks, None)
    implied = any(v.origin.startswith("implied:") for v in view.values.values())
    oom = report.root is not None and report.root.category == "cuda_oom"
    if not (view.config_known or implied or oom):
        raise DiagnoseError(f"no configuration found in {path} (no config block, arguments dump, launch line, "
                            "or error message that states settings)")
    if oom:
        if gpus is not None:
            view.set("launch.world_size", gpus, "override")
        _run_memory(report, view, None)  # the memory verdict decides a CUDA OOM's fix, as in analyze
    return view, report


__all__ = ["CheckRequest", "CheckResult", "PlanRequest", "PlanResult", "ReplayOutcome", "ReplayRequest", "check",
           "fix_text", "load_view", "plan", "prepare_view", "replay_config"]
