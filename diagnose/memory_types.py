"""The memory model's answer as data: ``Report.memory`` (``MemoryAnalysis``) and every sized configuration in it or
in ``diagnose check``'s plans (``MemoryOption``, one type with one serialiser).

Stage-neutral (no import from a stage), so that ``diagnose.model`` can name it; ``diagnose/explain/memory`` fills
it, presenters and ``explain/fit.py`` read its attributes, and only ``to_dict`` turns it into the JSON of the
schemas (``report@1`` memory, ``check@1`` plans).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from diagnose.model import Override


@dataclass
class Breakdown:
    """Model state per GPU by kind, in bytes; ``fp8`` and ``cuda_graphs`` only with FP8 / CUDA graphs."""

    params: int = 0
    grads: int = 0
    main_params: int = 0
    optimizer: int = 0
    buffers: int = 0  # Megatron FSDP's gathered weights / unsharded grads in flight (transient)
    fp8: int = 0
    cuda_graphs: int = 0

    def to_dict(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if v or k not in ("fp8", "cuda_graphs")}


@dataclass
class PhasePeaks:
    """Predicted allocated bytes per GPU at the moments jobs run out of memory."""

    dp_wrap: int
    after_wrap: int
    optimizer_step: int
    training: int
    checkpoint: int


# The keys of one option in each schema, in their order (a key in OPTIONAL is left out when it has no value).
REPORT_OPTION_KEYS = ("overrides", "gpus", "model_state_bytes", "transient_bytes", "activation_bytes", "fits",
                      "cost", "strategy", "dp", "tp", "pp", "cp", "peak_bytes", "valid", "label")
CHECK_PLAN_KEYS = ("overrides", "strategy", "dp", "tp", "pp", "cp", "bytes_per_param", "model_state_bytes",
                   "transient_bytes", "activation_bytes", "peak_bytes", "fits", "cost", "label", "components",
                   "valid", "worst_stage", "stage_peak_bytes")
OPTIONAL = frozenset({"transient_bytes", "worst_stage", "stage_peak_bytes"})


@dataclass
class MemoryOption:
    """One configuration sized per GPU: a change to the job (``overrides``, possibly on more GPUs) and what the
    memory model predicts for it on its worst pipeline stage."""

    overrides: list[Override]
    label: str
    cost: str
    strategy: str
    gpus: int
    dp: int
    tp: int
    pp: int
    cp: int
    model_state_bytes: int
    transient_bytes: int | None  # None: not modelled (the allocator-setting option)
    activation_bytes: int | None  # None: not sized (no model shape)
    peak_bytes: int | None
    fits: bool
    valid: bool | None = None  # replay's verdict on the overrides; None: not replayed
    bytes_per_param: float = 0.0
    components: Breakdown = field(default_factory=Breakdown)
    worst_stage: int | None = None  # with pipeline parallelism: the stage that peaks
    stage_peak_bytes: list[int] = field(default_factory=list)
    # the global batch size the plan sets where it differs from the config's (a tuned hyper-parameter); None: kept
    new_global_batch: Any = None

    def to_dict(self, keys: tuple[str, ...] = REPORT_OPTION_KEYS) -> dict[str, Any]:
        """The option in one schema's shape: ``REPORT_OPTION_KEYS`` (report) or ``CHECK_PLAN_KEYS`` (check)."""
        values = {**asdict(self), "components": self.components.to_dict(),
                  "overrides": [{"key": o.key, "value": o.value} for o in self.overrides]}  # no render hints
        return {key: values[key] for key in keys if key not in OPTIONAL or values[key] not in (None, [])}


@dataclass
class MemoryPrediction:
    """The job as configured (or as inferred from the OOM), predicted per GPU."""

    strategy: str
    dp: int
    dp_known: bool  # False: the log does not give the world size, DP was modelled as 1
    gpus: int
    grad_dtype: str  # "fp32" | "bf16"
    bytes_per_param: float  # persistent model state per parameter
    model_state_bytes: int
    transient_bytes: int
    components: Breakdown
    activation_bytes: int | None  # None: not sized (no model shape)
    phase_peaks: PhasePeaks
    peak_bytes: int  # the highest of the wrap, first-step and training peaks (a checkpoint save is apart)
    usable_bytes: int  # the GPU's capacity less the headroom for the CUDA context, NCCL and the allocator
    sized: bool = True  # False: the config read cannot be what ran (the job trained, yet it predicts > the GPU)
    worst_stage: int | None = None
    stage_peak_bytes: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {**asdict(self), "components": self.components.to_dict()}
        if self.sized:
            del out["sized"]  # shown only when False
        if self.worst_stage is None:
            del out["worst_stage"], out["stage_peak_bytes"]
        return out


# One wording, in one place, for a job whose log shows completed iterations while the config read from it predicts
# more than the GPU holds (its model state, or a step's peak): the memory section (analysis),
# replay's fit, the text report and the TUI say it.
TRAINED_OVER = ("the config read from the log predicts more memory than the GPU holds, yet the job trained (the "
                "log shows completed iterations): the model's inputs are incomplete or wrong")
TRAINED_LATER = ("the job's first iterations fitted (the log shows them completed), so this OOM came later: a longer "
                 "or larger batch, fragmentation, evaluation or a checkpoint save")


# Phases of a failure that come before the model is built: its state is not on the GPU yet (what "Now" may show).
BEFORE_MODEL_BUILD = frozenset({"init"})


@dataclass
class MemoryAnalysis:
    """Why a CUDA OOM's allocation did not fit and which changes will (``Report.memory``)."""

    gpu_capacity_bytes: int | None
    requested_bytes: int | None
    verdict: str  # diagnose.explain.memory.verdict.VERDICTS
    params: int | None
    params_source: str | None  # "log" | "config" | None (no count)
    phase: str
    current: MemoryPrediction | None = None
    options: list[MemoryOption] = field(default_factory=list)  # cheapest first
    notes: list[str] = field(default_factory=list)
    explanation: str = ""
    request_is: str | None = None  # the buffer the failing request is (decided only with a prediction)
    params_assumed: list[str] = field(default_factory=list)  # values a count from the config assumed (not said)

    @property
    def model_built(self) -> bool:
        """Was the model built when the allocation failed? Not at ``init`` (a JIT warm-up, set-up before the model
        build): then ``current`` is only the state predicted once it is, none of it resident at the failure."""
        return self.phase not in BEFORE_MODEL_BUILD

    def to_dict(self) -> dict[str, Any]:
        out = {**asdict(self), "current": self.current and self.current.to_dict(),
               "options": [o.to_dict() for o in self.options]}
        if self.current is None:
            del out["request_is"]
        return out
