"""What the explain stage proves, as data: validation, replay, the memory fit of a fix, verify.

These are typed sections of a ``Report`` (``Report.replay``, ``Report.verify``); they live outside the explain
package because ``model.py``, which every stage imports, names them. Each type has one serialiser, its
``to_dict``, called by ``Report.to_dict`` and by the commands' own payloads (check@1, replay@1, verify@1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from diagnose.model import Evidence, Finding, Override, is_delete
from diagnose.units import GIB, fmt_gib

# failures the validator can reproduce (a config check prints them); others (OOM, NCCL, ...) only get their fix proven
CONFIG_CATEGORIES = {"config_validation", "fsdp_config", "checkpoint_format"}
VERDICTS = ("pass", "fail", "warn", "unknown", "skip")


@dataclass
class Violation:
    check: str
    message: str
    keys: list[str]
    source: str = ""
    fixes: list[list[Override]] = field(default_factory=list)  # alternatives; each one a complete set
    kind: str = "error"  # "error": the job fails; "note": the real code auto-fixes it and prints this

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "message": self.message, "keys": list(self.keys)}


@dataclass
class ValidationResult:
    violations: list[Violation] = field(default_factory=list)
    notes: list[Violation] = field(default_factory=list)
    family: str = "new"
    mcore_checked: bool = False  # real megatron-core config classes were built
    assumed_release: str = ""  # which release the checks assumed, and why (releases.assumed_release)

    @property
    def passes(self) -> bool:
        return not self.violations


@dataclass
class CapacityFit:
    finding: Finding
    overrides: list[Override]  # what replay proves (config keys, env.*, launch.world_size when more GPUs)
    fits: bool | None  # None: the memory model could not size it (activations unknown, a layout it cannot map)
    gpus: int | None = None  # GPUs the fix needs
    dp: int | None = None
    job_gpus: int | None = None  # GPUs the job ran on
    peak_bytes: int | None = None
    capacity_bytes: int | None = None
    usable_bytes: int | None = None
    label: str = ""
    cost: str = ""
    notes: list[str] = field(default_factory=list)
    fragmentation: bool = False  # the allocator setting is the fix (memory verdict "fragmentation")
    layout: str = ""  # "TP 2 x DP 4": how the GPUs are split
    reason: str = ""  # fragmentation: why the allocator setting fits, as the OOM's numbers say (not in JSON)
    # fits counts the model state and its buffers only: a capacity OOM (the state is what did not fit) whose config
    # gives no model shape. Every "fits" it renders says the activations are not counted.
    model_state_only: bool = False

    @property
    def fits_text(self) -> str:
        """"fits", or what fits when the activations are not counted (``peak_text`` then says they are not)."""
        return "the model state fits" if self.model_state_only else "fits"

    @property
    def peak_text(self) -> str:
        """What makes the fit fit: the predicted peak against the GPU, or (an allocator fix) why the cache would have
        served the request."""
        return self.peak_words()

    def peak_words(self, after_fits_text: bool = False) -> str:
        """``peak_text``; ``after_fits_text``: written after ``fits_text``, which already says the model state is
        what fits, so the peak is not called the model state's twice."""
        if self.peak_bytes and after_fits_text and self.model_state_only:
            return (f"peak {self.peak_bytes / GIB:.1f} of {fmt_gib(self.capacity_bytes, 1)} per GPU, activations "
                    "not counted")
        if self.peak_bytes:
            what, tail = ("model-state peak", ", activations not counted") if self.model_state_only else ("peak", "")
            return (f"predicted {what} {fmt_gib(self.peak_bytes, 1)} per GPU of {fmt_gib(self.capacity_bytes, 1)}"
                    f"{tail}")
        return self.reason or "the reserved-but-unallocated memory would have served the request"

    @property
    def more_gpus(self) -> bool:
        return bool(self.gpus and self.job_gpus and self.gpus > self.job_gpus)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fits": self.fits, "gpus": self.gpus, "dp": self.dp, "layout": self.layout,
                               "job_gpus": self.job_gpus,
                               "peak_bytes": self.peak_bytes, "capacity_bytes": self.capacity_bytes,
                               "usable_bytes": self.usable_bytes, "label": self.label, "cost": self.cost}
        if self.notes:
            out["notes"] = list(self.notes)
        if self.model_state_only:
            out["model_state_only"] = True
        return out


@dataclass
class ReplayResult:
    reproduced: bool | None
    before: ValidationResult  # the config as the job had it
    fix: list[Override]
    after: ValidationResult
    added: list[Override] = field(default_factory=list)  # what the extension added to the requested fix
    requested: ValidationResult | None = None  # the config with only the requested overrides
    framework: str | None = None
    rule: str | None = None
    implied: bool = False  # the config came only from what an error message states
    category: str | None = None  # the finding's category (a CUDA OOM is no config check to reproduce)
    fits: bool | None = None  # capacity OOM: whether the fix fits per the memory model (None: not a memory question)
    fit: CapacityFit | None = None  # when the fix is checked against the memory model (diagnose.explain.fit)
    config_known: bool = False  # the job's own settings were read (a dump, arguments, a file), not just defaults
    rendered: dict[str, str] = field(default_factory=dict)  # the fix in every form (diagnose.explain.render)
    # the fix with a refused moved key replaced by its migration, in every form (set by explain.replay when
    # ``migrations`` finds one; JSON's ``fix`` and ``render`` then say what the text shows)
    migrated_rendered: dict[str, str] = field(default_factory=dict)

    @property
    def passes(self) -> bool:
        return self.after.passes

    @property
    def summary(self) -> str:
        """One line for people: whether replay reproduced the failure and whether the fix is proven (JSON's
        ``summary``: the fix in the words replay rendered for the config's framework)."""
        return self.sentence(self._shown())

    def sentence(self, shown: str) -> str:
        """The summary with the fix's overrides as ``shown``: the words are the caller's, so that a presenter writes
        them in the job's fix style (render.fix_style: a Megatron-LM job's flags, a Bridge job's overrides) as its
        Fix does (qa-report-8 L8: the summary printed Bridge keys beside a Fix of Megatron-LM flags)."""
        verdict = [f"fix {self._verdict()}" + (f": {shown}" if shown else "")] if self.fix else []
        return "; ".join([self._reproduction()] + verdict)

    def _reproduction(self) -> str:
        violations = self.before.violations
        how = " (from the settings the error states)" if self.implied else ""
        not_a_check = self.category if self.category and self.category not in CONFIG_CATEGORIES else None
        if self.reproduced is True:
            return f"reproduced by replay{how}: {violations[0].message}" if violations else f"reproduced by replay{how}"
        if not_a_check and not violations and (self.reproduced is False or self.config_known):
            article = "an" if not_a_check[:1] in "aeiou" else "a"
            return f"the job's config passes validation ({article} {not_a_check} failure is not a config check)"
        if self.reproduced is False:
            return ("not reproduced by replay (the job's config passes these checks)" if not violations
                    else f"replay finds {len(violations)} other violation(s)")
        if self.implied:
            return "config not in the log: replay checked the fix against the settings the error states"
        if self.config_known:
            return "replay checked the fix against the job's config (release defaults for what it does not set)"
        return "config not in the log: replay checked the fix against release defaults only"

    def _verdict(self) -> str:
        ok, fit = self.passes, self.fit
        valid = "valid" if ok else "INVALID"
        if self.fits is True and fit is not None:
            gpus = (f"needs >= {fit.gpus} GPUs ({fit.layout or f'DP {fit.dp or fit.gpus}'}; the job ran on "
                    f"{fit.job_gpus}), " if fit.more_gpus else "")
            if fit.model_state_only:
                return f"{valid}; {fit.fits_text}: {gpus}{fit.peak_words(after_fits_text=True)}"
            return f"{valid} and fits: {gpus}{fit.peak_text}"
        if self.fits is False and fit is not None:
            need = (f"{fmt_gib(fit.peak_bytes, 1)} per GPU" if fit.peak_bytes
                    else "the memory model finds nothing that fits")
            return f"{valid} but does not fit: {need} (GPU holds {fmt_gib(fit.capacity_bytes, 1)})"
        verdict = "proven to pass validation" if ok and self.reproduced is not None else (
            "passes validation" if ok else "still fails validation")
        return f"{verdict}; memory: {fit.notes[0]}" if self.fits is None and fit is not None and fit.notes else verdict

    def _shown(self) -> str:
        cli, env = self.rendered.get("cli") or "", self.rendered.get("env") or ""
        if self.framework == "megatron-lm" and self.rendered.get("mlm"):
            cli = self.rendered["mlm"]  # a Megatron-LM job's own flags (the Fix above keeps Bridge words for the rest)
        return "; ".join(x for x in (cli, env.replace("\n", "; ")) if x)  # as render.overrides_in_style

    def migrations(self) -> list[tuple[list[Override], list[Override]]]:
        """The requested overrides the release refuses because it moved their field (``stale_moved_field``: Bridge
        >= 0.7 fails at start-up on ``dist.use_megatron_fsdp``), each as (the overrides refused, the migration the
        validator suggests instead). The replay never undoes a requested key itself, so such an override is no part
        of a fix: the text shows the migration in its place, and JSON's ``fix`` holds the migration with the
        refused key in ``replaced`` (qa-report-17 L2)."""
        given = [o for o in self.fix if not any(o is a for a in self.added)]
        given_keys = {o.key for o in given}
        out: list[tuple[list[Override], list[Override]]] = []
        for v in self.after.violations:
            if v.check != "stale_moved_field":
                continue
            for alternative in v.fixes:
                dropped = [o.key for o in alternative if is_delete(o) and o.key in given_keys]
                if dropped:
                    out.append(([o for o in given if o.key in dropped],
                                [o for o in alternative if o.key not in dropped]))
        return out

    def migrated_fix(self) -> tuple[list[Override], list[dict[str, Any]], list[str]]:
        """The fix with each refused moved key replaced by its migration (``migrations``), the JSON ``replaced``
        entries, and the refused keys; the fix itself, [] and [] when nothing was refused."""
        moves = self.migrations()
        if not moves:
            return list(self.fix), [], []
        refused = {o.key for move, _ in moves for o in move}
        fix = [o for o in self.fix if o.key not in refused]
        replaced: list[dict[str, Any]] = []
        for move, instead in moves:
            fix += [o for o in instead if o.key not in {f.key for f in fix}]
            replaced += [{"key": o.key, "value": None if is_delete(o) else o.value, "check": "stale_moved_field",
                          "by": [{"key": b.key, "value": None if is_delete(b) else b.value} for b in instead]}
                         for o in move]
        return fix, replaced, [o.key for move, _ in moves for o in move]

    def to_dict(self) -> dict[str, Any]:
        """The report's ``replay`` section (issue 3 schema, plus ``rule``, ``extended``, ``notes``, ``proven``;
        ``replaced`` when a requested override is refused for a moved field and the migration is the fix)."""
        fix, replaced, refused_keys = self.migrated_fix()
        rendered = dict(self.migrated_rendered or self.rendered) if replaced else dict(self.rendered)
        out: dict[str, Any] = {
            "reproduced": self.reproduced,
            "violations": [v.to_dict() for v in self.before.violations],
            "fix": [{"key": o.key, "value": None if is_delete(o) else o.value} for o in fix],
            "after_fix": {"violations": [v.to_dict() for v in self.after.violations], "passes": self.passes},
            "render": rendered,
        }
        if replaced:
            out["replaced"] = replaced
        if self.before.assumed_release:
            out["assumed_release"] = self.before.assumed_release
        if self.rule:
            out["rule"] = self.rule
            # proven only against the job's own config; against release defaults it is not a proof
            out["proven"] = (self.passes and bool(self.fix)) if self.reproduced is not None else None
        if self.implied:
            out["implied"] = True
        out["fits"] = self.fits
        if self.category and self.category not in CONFIG_CATEGORIES:
            out["category"] = self.category
        if self.fit is not None:
            out["fit"] = self.fit.to_dict()
        if self.added:
            out["extended"] = [{"key": o.key, "value": None if is_delete(o) else o.value} for o in self.added]
        if notes := [v.message for v in self.after.notes]:
            out["notes"] = notes
        out["summary"] = self.summary
        if replaced:  # the summary names the migration, not the refused key (which was all it replayed)
            words = " ".join(x for x in (rendered.get("cli") or "", (rendered.get("env") or "").replace("\n", "; "))
                             if x)
            refused_words = ", ".join(dict.fromkeys(refused_keys))
            out["summary"] = (f"{self._reproduction()}; your override {refused_words} is refused (stale_moved_field)"
                              + (f": use {words} instead (suggested by the validator)" if words else ""))
        return out


@dataclass
class Check:
    name: str
    title: str
    verdict: str  # pass | fail | warn | unknown | skip
    detail: str
    evidence: list[Evidence] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VerifyResult:
    checks: list[Check] = field(default_factory=list)
    wrapper: str | None = None  # "megatron_fsdp" | "ddp" | None (no wrapper line: Torch FSDP2 logs none)
    sharding_strategy: str | None = None
    dp_size: int | None = None
    last_iteration: int | None = None
    train_iters: int | None = None
    checkpoint_format: str | None = None
    release: str = ""
    strict: bool = False
    megatron_fsdp_run: bool = False  # the log shows a Megatron FSDP run (wrapper line, or FSDP asked for): not in JSON

    @property
    def passes(self) -> bool:
        bad = {"fail", "unknown", "warn"} if self.strict else {"fail", "unknown"}
        return not any(c.verdict in bad for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.verdict == "fail"]

    def to_dict(self) -> dict[str, Any]:
        counts = {v: sum(c.verdict == v for c in self.checks) for v in VERDICTS}
        return {
            "passes": self.passes,
            "failed": self.failed,
            "counts": counts,
            "run": {"wrapper": self.wrapper, "sharding_strategy": self.sharding_strategy, "dp_size": self.dp_size,
                    "last_iteration": self.last_iteration, "train_iters": self.train_iters,
                    "checkpoint_format": self.checkpoint_format},
            "assumed_release": self.release,
            "checks": [c.to_dict() for c in self.checks],
        }
