"""The data that flows between pipeline stages.

ingest -> normalize -> match -> explain -> present. Every stage speaks in these plain dataclasses; the JSON
report (schema ``diagnose/report@1``) is ``Report.to_dict()`` and nothing else, so the presenters and other tools
read the same thing.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # the explain stage's results, in stage-neutral modules that import this one
    from diagnose.configview import ConfigView
    from diagnose.explained import ReplayResult, VerifyResult
    from diagnose.memory_types import MemoryAnalysis

REPORT_SCHEMA = "diagnose/report@1"

CATEGORIES = (
    "cuda_oom",
    "host_oom",
    "fsdp_config",
    "checkpoint_format",
    "checkpoint_io",
    "nccl_timeout",
    "nccl_error",
    "config_validation",
    "slurm",
    "launcher",
    "import_version",
    "hardware",
    "numerics",
    "data",
    "other",
)
PHASES = (
    "init",
    "model_build",
    "dp_wrap",
    "checkpoint_load",
    "first_iteration",
    "training",
    "optimizer_step",
    "checkpoint_save",
    "eval",
    "shutdown",
    "unknown",
)
SEVERITIES = ("error", "warning", "info")
ROLES = ("root", "cascade", "context")
SAFETIES = ("safe", "unsafe", "manual")

Category = str
Phase = str
Severity = Literal["error", "warning", "info"]
Role = Literal["root", "cascade", "context"]
Safety = Literal["safe", "unsafe", "manual"]


# --------------------------------------------------------------------------------------------- lines


@dataclass(slots=True)
class LogLine:
    """One input line after normalisation.

    ``text`` is the message with every transport prefix removed (torchrun ``[rank3]:``/``[default0]:``,
    ``srun --label`` ``3: ``, pdsh ``host: ``, glog header, timestamps), ANSI stripped and ``\\r`` rewrites
    collapsed to what a terminal would show last. ``raw`` is the line as read (decoded with replacement).
    ``lineno`` is 1-based in the original input ``path``. Inside an exception group printout the group's margin
    (``  | ``, ``    | ``...) is removed from ``text`` too and its depth kept in ``group_depth``.
    """

    path: str
    lineno: int
    raw: str
    text: str
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    timestamp: str | None = None
    level: str | None = None  # glog/logging level letter or word: "E", "W", "I", "ERROR"...
    group_depth: int = 0  # nesting in a Python 3.11+ exception group printout (the "  | " margin removed), 0 outside
    pid: int | None = None  # the process id an actor runtime's tag names (Ray's "(Worker pid=12, ip=10.0.0.1) ")

    @property
    def stream(self) -> tuple:
        """Key of the process that wrote the line: lines of one stream belong to one traceback."""
        where: object = self.path if self.host is None else self.host
        if self.pid is not None:
            where = (where, self.pid)  # one process of an actor runtime (its host is the ip, when the tag gives it)
        if self.rank is not None:
            return (where, "rank", self.rank)
        return (where, "main", None) if self.local_rank is None else (where, "local", self.local_rank)


def rank_runs(ranks) -> list[str]:
    """Ranks as sorted runs: ``[9, 0, 1, 2, 3, 11, 12]`` -> ``["0-3", "9", "11-12"]`` (duplicates ignored).

    The one place rank sets are compacted; reports, the TUI and the NCCL silent-rank sentence join these runs."""
    runs: list[str] = []
    for _, group in itertools.groupby(enumerate(sorted(set(ranks))), lambda pair: pair[1] - pair[0]):
        run = [rank for _, rank in group]  # consecutive ranks: rank - position is the same along a run
        runs.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return runs


@dataclass(slots=True)
class Block:
    """Consecutive lines of one stream captured after an anchor (a config dump, a torchrun summary...)."""

    name: str
    path: str
    start_line: int
    lines: list[LogLine]


@dataclass(frozen=True, slots=True)
class CaptureSpec:
    """Ask the scanner to collect lines after an anchor, for a later stage (config extraction, phase markers).

    The scanner finds lines whose normalised text contains ``anchor`` (and matches ``regex`` if given), then takes
    that line plus up to ``lines_after`` following lines of the same stream, stopping after a line containing
    ``until`` (if given). ``keep`` says which occurrences to keep: "first", "last", "first_last" or "all"
    (at most ``max_blocks``, the earliest ones). Lines that fire on every rank are thus counted, not all kept.
    ``deferred``: the scan only notes the windows where the anchor occurs; its lines are read from them after the
    scan when a later step asks (the loss series, read only when nothing else is the root cause).
    """

    name: str
    anchor: str
    regex: str | None = None
    lines_after: int = 0
    until: str | None = None
    keep: str = "first"
    max_blocks: int = 64
    deferred: bool = False


# ------------------------------------------------------------------------------------------ findings


@dataclass(slots=True)
class Evidence:
    path: str
    line: int
    text: str


@dataclass(slots=True)
class Override:
    key: str  # Megatron-Bridge ConfigContainer path, e.g. "ddp.use_megatron_fsdp"
    value: Any


@dataclass(slots=True, eq=False)
class WordedOverride(Override):
    """An override whose Megatron-LM words depend on the job, not on the key alone: ``ddp.grad_reduce_in_fp32=false``
    is --grad-reduce-in-bf16 for a bf16 job but dropping --accumulate-allreduce-grads-in-fp32 for an fp16 one
    (Megatron-LM's arguments.py reads --grad-reduce-in-bf16 only under --bf16). Equal to the plain override of the
    same key and value."""

    mlm: str = ""  # the Megatron-LM words for this job

    def __eq__(self, other: object) -> bool:
        """Equal to any ``Override`` of the same key and value, whatever its words. Written by hand because a
        dataclass's generated ``__eq__`` compares only instances of the very same class: both ``Override.__eq__``
        and a generated one here would return NotImplemented for the other class, so ``plain == worded`` and
        ``plain in [worded]`` would fall back to identity and be False (``mlm = field(compare=False)`` does not
        change that). Nor can ``mlm`` move onto ``Override`` itself, where the generated comparison would do:
        ``Finding.fix`` is written to the report's JSON with ``asdict``, and every override there would gain an
        ``mlm`` key the report schema refuses (``additionalProperties: false``)."""
        if not isinstance(other, Override):
            return NotImplemented
        return (self.key, self.value) == (other.key, other.value)


DELETE = object()  # the value of an override that removes its key (``~key`` / ``--set ~key``)


def is_delete(override: Override) -> bool:
    return override.value is DELETE


@dataclass(slots=True)
class EnvVar:
    name: str
    value: str


@dataclass(slots=True)
class Fix:
    summary: str = ""
    safety: Safety = "manual"
    overrides: list[Override] = field(default_factory=list)
    env: list[EnvVar] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    # the steps for a job of another stack than Megatron's (plain PyTorch, HF Trainer, DeepSpeed), whose overrides
    # and steps name Megatron's keys: shown instead of them there (explain/render.py fix_words); [] keeps the steps
    other_stacks: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.summary or self.overrides or self.env or self.steps or self.other_stacks)


@dataclass(slots=True)
class ImpliedSetting:
    """One config value an error message states: a fixed ``value``, or the integer of the rule's named group
    ``fact`` (with ``after``: the integer right after that text inside the fact)."""

    key: str  # ConfigView path, e.g. "model.tensor_model_parallel_size" or "env.CUDA_DEVICE_MAX_CONNECTIONS"
    value: Any = None
    fact: str = ""
    after: str = ""


@dataclass(slots=True)
class Implies:
    """What a rule's message proves about the job's config (``[rule.implies]``), for logs that fail before printing
    it: the validator ``check`` that prints the message and the ``settings`` it states. ``patterns`` (1-based) limits
    it to some of the rule's patterns (another wording may state other things); empty means all."""

    check: str = ""
    settings: list[ImpliedSetting] = field(default_factory=list)
    patterns: list[int] = field(default_factory=list)


@dataclass(slots=True)
class FindingReplay:
    """What replaying one finding's fix showed (the JSON's ``facts["replay"]``)."""

    proven: bool | None  # the fix passes validation; None when the job's config was not there to reproduce
    reproduced: bool | None
    added: list[Override] = field(default_factory=list)  # what replay had to add to the fix for it to pass

    def to_dict(self) -> dict[str, Any]:
        return {"proven": self.proven, "reproduced": self.reproduced,
                "added": [{"key": o.key, "value": None if is_delete(o) else o.value} for o in self.added]}


@dataclass(slots=True)
class Finding:
    rule: str
    name: str
    title: str
    category: Category
    phase: Phase
    severity: Severity
    role: Role
    confidence: float
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    count: int = 1
    first_line: int = 0
    evidence: list[Evidence] = field(default_factory=list)
    explanation: str = ""
    fix: Fix = field(default_factory=Fix)
    facts: dict[str, Any] = field(default_factory=dict)
    # How the category was reached: "rule" (a specific rule's message), "inferred" (a generic rule's evidence read by
    # an [[infer]] table: frames, exception type, words) or "catchall" (the most salient error line, nothing else).
    basis: str = "rule"
    basis_detail: str = ""  # for "inferred": which table and which evidence decided
    # Not in JSON:
    cause_of: int | None = None  # index of the finding this one is a cascade of (set by ranking)
    # srun per-node lines behind this finding, from every hit (not only the evidence kept): task id -> node
    task_nodes: dict[int, str] = field(default_factory=dict)
    implies: Implies | None = None  # the rule's [rule.implies] when the pattern that matched states it
    implied_lines: list[int] = field(default_factory=list)  # evidence lines (hits) whose message states ``implies``
    # where the failure its first line reports is, as its rule (or the pattern that matched) says: "own_node" (the
    # node's own NCCL failure), "other_node" (what another's did to it) or "" (not told); read by match/one_host.py
    fault_on: str = ""
    replay: FindingReplay | None = None  # what replaying ``fix`` (or ``proven_fix``) showed
    # the fix replay proved in place of the rule's (a capacity OOM: the memory model's fitting option); ``fix``
    # stays the rule's. Shown (and in the JSON as "fix") instead of it.
    proven_fix: Fix | None = None

    @property
    def headline_evidence(self) -> Evidence | None:
        """The evidence line a one-line answer points at: the line the rule first matched (a repeated NaN-loss
        line's first, not its third; an OOM's message, not the traceback frame shown above it), else the last."""
        if not self.evidence:
            return None
        return next((x for x in self.evidence if x.line == self.first_line), self.evidence[-1])

    @property
    def shown_fix(self) -> Fix:
        """The fix to show: the one replay proved when it replaced the rule's, else the rule's."""
        return self.fix if self.proven_fix is None else self.proven_fix


@dataclass(slots=True)
class InputInfo:
    path: str
    bytes: int
    lines: int


# ------------------------------------------------------------------------------------------- slurm


@dataclass(slots=True)
class SlurmStepFacts:
    id: str
    name: str
    state: str
    exit_code: int | None = None
    signal: str | None = None


@dataclass(slots=True)
class SlurmOutputFacts:
    path: str
    stream: str  # "stdout", "stderr" or "stdout+stderr"
    exists: bool = False
    readable: bool = False
    size: int = 0
    problem: str | None = None  # why it cannot be read, for the user


@dataclass(slots=True)
class SlurmTaskFacts:
    path: str
    stream: str
    step: str | None = None
    rank: int | None = None  # srun's %t in the file name (None for a per-node or per-step file)
    node: str | None = None
    size: int = 0


@dataclass(slots=True)
class SlurmFacts:
    """What Slurm says about the job (``diagnose slurm JOBID``): the report's ``"slurm"`` section, in its key order."""

    job_id: str = ""
    raw_id: int | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_offset: int | None = None
    name: str = ""
    user: str = ""
    state: str = ""
    reason: str = ""
    cancelled_by: str | None = None
    launch_failed: bool = False  # the batch step never started (JobLaunchFailure): its exit code is not a program's
    exit_code: int | None = None
    signal: str | None = None
    derived_exit_code: int | None = None
    derived_signal: str | None = None
    failed_step: str | None = None
    steps: list[SlurmStepFacts] = field(default_factory=list)
    nodes: str = ""
    elapsed_s: int | None = None
    elapsed: str | None = None
    time_limit_s: int | None = None
    time_limit: str | None = None
    restarts: int = 0
    start: str | None = None
    end: str | None = None
    work_dir: str | None = None
    source: str = ""  # "scontrol" or "sacct"
    output_route: str | None = None
    outputs: list[SlurmOutputFacts] = field(default_factory=list)
    task_route: str | None = None
    task_patterns: list[str] = field(default_factory=list)
    task_outputs_found: int = 0
    task_outputs: list[SlurmTaskFacts] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # seff's figures, from sacct (None: not recorded): nodes, GPUs (AllocTRES gres/gpu), the largest step's MaxRSS,
    # CPU efficiency (TotalCPU / (AllocCPUS x elapsed), 0..1), GPU-hours the job held (GPUs x elapsed)
    nnodes: int | None = None
    gpus: int | None = None
    max_rss_bytes: int | None = None
    cpu_efficiency: float | None = None
    gpu_hours: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    inputs: list[InputInfo] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    root_cause: int | None = None
    config: ConfigView | None = None  # the job's config as recovered (a copy: replay works on its own)
    replay: ReplayResult | None = None  # the root cause's (or first fixable finding's) replay
    memory: MemoryAnalysis | None = None  # diagnose.memory_types: the CUDA OOM explained
    slurm: SlurmFacts | None = None
    hang: HangReport | None = None  # from PyTorch flight-recorder dumps found beside the logs
    warnings: list[str] = field(default_factory=list)  # problems reading input or rules, shown to the user
    verify: VerifyResult | None = None  # diagnose.explain.verify: a run without failure, checked (issue 21)
    # inputs of several jobs (issue 19 item 6): one full report per job; the fields above are then the first
    # failing job's (the first job's when none failed), so that a reader of one report gets a real one
    jobs: list[JobReport] = field(default_factory=list)
    # the software stack the log's tracebacks name ("megatron-lm", "deepspeed", "transformers"...: match/stack.py),
    # None when they name none; with ``framework`` it decides the words of a fix's overrides (render.fix_style)
    stack: str | None = None

    @property
    def root(self) -> Finding | None:
        return None if self.root_cause is None else self.findings[self.root_cause]

    @property
    def framework(self) -> str | None:
        """The job's framework as its printed config told it ("megatron-lm", "megatron-bridge"), else None."""
        return self.config.framework if self.config is not None else None

    def lead_with(self, finding: Finding, trailing: list[Finding] | None = None) -> None:
        """Make ``finding`` the root cause, first in the list: every ``cause_of`` index shifts by one, and the old
        root becomes its cascade. ``trailing`` findings (context) go at the end. Evidence from outside the log (a
        flight-recorder hang, Slurm's job state, a node's record) explaining the log's own root is merged this way."""
        for f in self.findings:
            if f.cause_of is not None:
                f.cause_of += 1
        if (old_root := self.root) is not None:
            old_root.role = "cascade"
            old_root.cause_of = 0
        finding.role = "root"
        finding.cause_of = None
        self.findings = [finding, *self.findings, *(trailing or [])]
        self.root_cause = 0

    def to_dict(self) -> dict[str, Any]:
        findings = [_finding_dict(f) for f in self.findings]
        out: dict[str, Any] = {
            "schema": REPORT_SCHEMA,
            "inputs": [asdict(i) for i in self.inputs],
            "root_cause": self.root_cause,
            "findings": findings,
            # a view with nothing from the job shows no values: release defaults alone say nothing about it
            "config": None if self.config is None else self.config.to_dict(job_only=True),
            "replay": None if self.replay is None else self.replay.to_dict(),
            "memory": None if self.memory is None else self.memory.to_dict(),
        }
        if self.stack is not None:
            out["stack"] = self.stack
        if self.slurm is not None:
            out["slurm"] = self.slurm.to_dict()
        if self.hang is not None:
            out["hang"] = asdict(self.hang)
        if self.verify is not None:
            out["verify"] = self.verify.to_dict()
        if self.warnings:
            out["warnings"] = list(self.warnings)
        if self.jobs:
            out["jobs"] = [j.to_dict() for j in self.jobs]
        return out


@dataclass
class JobReport:
    """One job's report when the inputs hold several jobs. ``identity``: what told it apart (``slurm_job``,
    ``run_id``, ``master``, ``world_size``), from its logs; empty when only its failures did."""

    label: str
    identity: dict[str, str]
    paths: list[str]
    report: Report

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "identity": dict(self.identity), "paths": list(self.paths),
                "report": self.report.to_dict()}


_NOT_IN_JSON = ("cause_of", "task_nodes", "implies", "implied_lines", "fault_on", "replay", "proven_fix")


def _finding_dict(f: Finding) -> dict[str, Any]:
    d = asdict(f)
    for name in _NOT_IN_JSON:
        d.pop(name)
    if f.proven_fix is not None:
        d["fix"] = asdict(f.proven_fix)
    # a WordedOverride's Megatron-LM words are for the presenters; the schema's override is its key and value
    d["fix"]["overrides"] = [{"key": o["key"], "value": o["value"]} for o in d["fix"]["overrides"]]
    if not d["fix"]["other_stacks"]:  # only the rules that write them: the JSON of the others is unchanged
        del d["fix"]["other_stacks"]
    if f.replay is not None:
        d["facts"]["replay"] = f.replay.to_dict()
    return d


# ------------------------------------------------------------------------------- flight recorder (hangs)


@dataclass(slots=True)
class FrFrame:
    """One Python frame of a recorded collective's stack (the recorder lists them innermost first)."""

    name: str
    filename: str
    line: int


@dataclass(slots=True)
class FrEntry:
    """One collective (or p2p op) in a rank's flight-recorder ring buffer, whatever the dump's format version."""

    record_id: int
    group: str  # process group name ("0", "1"... or a hash), the key of pg_config / pg_status
    group_desc: str  # "default_pg", "undefined", a user's description ("dp", "tp"...)
    seq: int  # collective_seq_id (``seq_id`` before format 2.0); p2p ops use p2p_seq
    p2p_seq: int
    is_p2p: bool
    op: str  # profiling_name: "nccl:all_reduce", "gloo:broadcast"...
    input_sizes: list[list[int]]
    state: str  # scheduled | started | completed
    completed: bool  # state completed, or a completion time recorded
    frames: list[FrFrame]


@dataclass(slots=True)
class FrGroup:
    name: str
    desc: str
    ranks: list[int] | None  # global ranks, from pg_config; None when the dump does not say
    last_enqueued: int | None = None
    last_completed: int | None = None


@dataclass(slots=True)
class FrDump:
    """One rank's flight-recorder dump, read without running code, normalised across format versions."""

    path: str
    rank: int
    format: str  # "pickle" | "json"
    version: str
    comm_lib_version: str
    groups: dict[str, FrGroup]
    entries: list[FrEntry]
    dropped_entries: int = 0  # entries beyond the cap or malformed


@dataclass(slots=True)
class HangRank:
    """A rank the analysis names, with where it was."""

    rank: int
    role: str  # stalled | desync | size_mismatch | no_dump
    last_op: str | None = None  # its last collective in the group ("gloo:all_reduce")
    last_seq: int | None = None
    last_sizes: list[list[int]] = field(default_factory=list)
    frame: str | None = None  # "train.py:57 in train_step": the first frame outside torch


@dataclass(slots=True)
class HangCell:
    """What one rank did at one collective of the grid."""

    rank: int
    state: str  # completed | waiting | absent | desync | size_mismatch | no_dump


@dataclass(slots=True)
class HangColumn:
    group: str
    group_desc: str
    seq: int
    op: str  # the majority's op
    cells: list[HangCell]


@dataclass(slots=True)
class HangDumpInfo:
    path: str
    rank: int
    format: str
    version: str
    entries: int


@dataclass(slots=True)
class HangReport:
    """What the flight-recorder dumps say about a hang (schema: report-1 ``hang``)."""

    kind: str  # stalled | desync | size_mismatch | dead_rank | not_completed | none
    summary: str
    group: str | None = None
    group_desc: str | None = None
    seq: int | None = None  # the first collective where the ranks diverge (or the one nobody completed)
    op: str | None = None
    input_sizes: list[list[int]] = field(default_factory=list)
    waiting_ranks: list[int] = field(default_factory=list)  # ranks that entered it and wait
    culprits: list[HangRank] = field(default_factory=list)
    missing_dumps: list[int] = field(default_factory=list)  # members of the group without a dump
    world_size: int | None = None
    dumps: list[HangDumpInfo] = field(default_factory=list)
    grid: list[HangColumn] = field(default_factory=list)  # the collectives around the divergence, per rank
    warnings: list[str] = field(default_factory=list)


class DiagnoseError(Exception):
    """A problem with what the user gave us (a path, a rule file, a config). Printed as one line, exit 2."""

    # False when the problem is not the named file's (too many open files): a folder walk must not skip past it
    about_the_file: bool = True
