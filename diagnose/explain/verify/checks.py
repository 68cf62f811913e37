"""The verify checks: each reads ``Facts`` (what the log's own lines say) and returns one ``Check``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from diagnose.explain.config.releases import assumed_release
from diagnose.explain.config.values import as_int
from diagnose.explain.verify import Check
from diagnose.explain.verify import facts as F
from diagnose.model import Block, Evidence, LogLine, Report

_TRUE = {"true", "1", "yes", "on"}


def _ev(line: LogLine | None) -> list[Evidence]:
    return [] if line is None else [Evidence(path=line.path, line=line.lineno, text=line.text[:500])]


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in _TRUE


@dataclass
class Facts:
    """What one log says about the run, gathered once from the scan (bounded: first/last occurrences only)."""

    report: Report
    blocks: dict[str, list[Block]]
    view: Any = None  # ConfigView with the wrapper's repr (the effective DDP config)
    requested: Any = None  # ConfigView without the wrapper's repr (what the config asked for)
    wrapper: str | None = None
    wrapper_line: LogLine | None = None
    wrapper_fields: dict[str, str] = field(default_factory=dict)
    mixed_wrappers: bool = False
    fsdp_setup_line: LogLine | None = None
    strategy: str | None = None
    dp_size: int | None = None
    dp_how: str = ""
    last_iteration_line: LogLine | None = None
    last_iteration: int | None = None
    train_iters: int | None = None
    nonfinite_line: LogLine | None = None
    saving_line: LogLine | None = None
    saved_line: LogLine | None = None
    saved_format: str | None = None
    release: str = ""

    @classmethod
    def collect(cls, report: Report, blocks: dict[str, list[Block]], view: Any) -> Facts:
        f = cls(report=report, blocks=blocks, view=view)
        f._requested_view()
        f._wrapper()
        f._iterations()
        f._checkpoint()
        f._dp_size()
        f.release = assumed_release(getattr(view, "version", None), getattr(view, "framework", None))
        return f

    # ------------------------------------------------------------------ gathering

    def lines(self, prefix: str) -> list[LogLine]:
        return [b.lines[0] for name, bs in self.blocks.items() if name.startswith(prefix) for b in bs if b.lines]

    def config_line(self, view: Any, key: str) -> LogLine | None:
        """The log line a config value came from (origin ``log:N``), found in the captured blocks."""
        origin = (view.origin(key) or "") if view is not None else ""
        if not origin.startswith("log:"):
            return None
        try:
            lineno = int(origin[4:].split()[0])
        except ValueError:
            return None
        return next((line for bs in self.blocks.values() for b in bs for line in b.lines if line.lineno == lineno),
                    None)

    def _requested_view(self) -> None:
        try:
            from diagnose.explain.config.extract import from_blocks

            without_repr = {k: v for k, v in self.blocks.items() if k != "config.ddp_repr"}
            self.requested = from_blocks(without_repr, self.report.findings, defaults=False)
        except Exception:  # noqa: BLE001 - an unreadable config leaves "requested" unknown
            self.requested = None

    def _wrapper(self) -> None:
        kinds: list[tuple[str, LogLine]] = []
        for line in self.lines("verify.wrapper"):
            kind = F.wrapper_kind(line.text)
            if kind:
                kinds.append((kind, line))
        self.fsdp_setup_line = next(iter(self.lines("verify.fsdp_setup")), None)
        if kinds:
            self.wrapper, self.wrapper_line = kinds[0]
            self.mixed_wrappers = len({k for k, _ in kinds}) > 1
            self.wrapper_fields = F.repr_fields(self.wrapper_line.text)
        elif self.fsdp_setup_line is not None:
            self.wrapper, self.wrapper_line = "megatron_fsdp", self.fsdp_setup_line
        self.strategy = self.wrapper_fields.get("data_parallel_sharding_strategy") or (
            str(self.view.get("ddp.data_parallel_sharding_strategy")) if self.view is not None
            and self.view.has("ddp.data_parallel_sharding_strategy") else None)

    def _iterations(self) -> None:
        its = self.lines("verify.iteration")
        if its:
            self.last_iteration_line = max(its, key=lambda line: (F.iteration(line.text) or (0, 0))[0])
            parsed = F.iteration(self.last_iteration_line.text)
            if parsed:
                self.last_iteration, self.train_iters = parsed
        self.nonfinite_line = min(self.lines("verify.nonfinite"), key=lambda line: line.lineno, default=None)
        last = self.last_iteration_line
        if self.nonfinite_line is None and last and not all(map(math.isfinite, F.losses(last.text).values())):
            self.nonfinite_line = last

    def _checkpoint(self) -> None:
        self.saving_line = max(self.lines("verify.saving"), key=lambda line: line.lineno, default=None)
        self.saved_line = max(self.lines("verify.saved"), key=lambda line: line.lineno, default=None)
        if self.saving_line is not None:
            m = F.SAVING_RE.search(self.saving_line.text)
            self.saved_format = m.group("format") if m else None
        if self.saved_format is None and self.saved_line is not None and self.view is not None:
            fmt = self.view.get("checkpoint.ckpt_format")
            self.saved_format = str(fmt) if fmt is not None else None

    def _dp_size(self) -> None:
        """DP = global batch / (micro batch x microbatches) from the log's own lines; else world / (TP x PP x CP)."""
        v = self.view
        if v is None:
            return
        gbs, mbs = as_int(v.get("train.global_batch_size")), as_int(v.get("train.micro_batch_size"))
        mb_lines = self.lines("verify.microbatches")
        m = F.MICROBATCHES_RE.search(mb_lines[0].text) if mb_lines else None
        if gbs and mbs and m and int(m.group("n")) > 0 and gbs % (mbs * int(m.group("n"))) == 0:
            self.dp_size = gbs // (mbs * int(m.group("n")))
            self.dp_how = f"global batch {gbs} / (micro batch {mbs} x {m.group('n')} microbatches)"
            return
        world = as_int(v.get("launch.world_size"))
        if world:
            tp, pp, cp = (as_int(v.get(f"model.{k}_parallel_size"), 1) or 1
                          for k in ("tensor_model", "pipeline_model", "context"))
            if world % (tp * pp * cp) == 0:
                self.dp_size = world // (tp * pp * cp)
                self.dp_how = f"world size {world} / (TP {tp} x PP {pp} x CP {cp})"

    # ------------------------------------------------------------------ helpers

    def fsdp_requested(self) -> tuple[bool, LogLine | None, str]:
        """Whether the config asked for Megatron FSDP, with the line that says so."""
        for finding in self.report.findings:
            if finding.rule in ("MB152", "MB151") and finding.evidence:
                e = finding.evidence[0]
                return True, LogLine(path=e.path, lineno=e.line, raw=e.text, text=e.text), \
                    "dist.use_megatron_fsdp was given but the release has no such field"
        r = self.requested
        if r is None:
            return False, None, ""
        for key, why in (("ddp.use_megatron_fsdp", "ddp.use_megatron_fsdp is true"),
                         ("dist.use_megatron_fsdp", "dist.use_megatron_fsdp is true")):
            if r.has(key) and _truthy(r.get(key)) and r.origin(key) not in (None, "default"):
                return True, self.config_line(r, key), why
        key = "ddp.data_parallel_sharding_strategy"
        strategy = r.get(key) if r.has(key) else None
        if strategy not in (None, "no_shard") and r.origin(key) != "default":
            return True, self.config_line(r, key), \
                f"data_parallel_sharding_strategy is {strategy} (only Megatron FSDP shards parameters)"
        if r.get("checkpoint.ckpt_format") == "fsdp_dtensor" and r.origin("checkpoint.ckpt_format") != "default":
            return True, self.config_line(r, "checkpoint.ckpt_format"), "checkpoint.ckpt_format is fsdp_dtensor"
        return False, None, ""

    def effective(self, key: str) -> Any:
        """A DDP config field as the wrapper really used it (its repr), else the config's value."""
        leaf = key.split(".", 1)[1]
        if leaf in self.wrapper_fields:
            return self.wrapper_fields[leaf]
        return self.view.get(key) if self.view is not None else None

    @property
    def fsdp(self) -> bool:
        return self.wrapper == "megatron_fsdp"


# ---------------------------------------------------------------------------------------------- checks


def no_failure(f: Facts) -> Check:
    say = partial(Check, "no_failure", "No failure in the log")
    root = f.report.root
    if root is None:
        return say("pass", "no error finding became a root cause")
    return say("fail", f"{root.rule}: {root.title}", list(root.evidence[:1]))


def megatron_fsdp_active(f: Facts) -> Check:
    say = partial(Check, "megatron_fsdp_active", "Megatron FSDP was active")
    requested, req_line, why = f.fsdp_requested()
    facts = []
    if f.strategy:
        facts.append(f"strategy {f.strategy}")
    if f.dp_size:
        facts.append(f"DP size {f.dp_size} ({f.dp_how})")
    tail = f" ({'; '.join(facts)})" if facts else ""
    if f.wrapper == "megatron_fsdp":
        mixed = "; but another rank built DistributedDataParallel" if f.mixed_wrappers else ""
        return say("fail" if mixed else "pass",
                   f"the model was wrapped by Megatron FSDP (FullyShardedDataParallel){tail}{mixed}",
                   _ev(f.wrapper_line) + _ev(f.fsdp_setup_line))
    if f.wrapper == "ddp":
        built = "DistributedDataParallel"
        if requested:
            return say("fail", f"FSDP was requested in the config ({why}) but the model was wrapped by {built}{tail}",
                       _ev(req_line) + _ev(f.wrapper_line))
        return say("fail", f"the model was wrapped by {built}: Megatron FSDP was not requested "
                   f"(set ddp.use_megatron_fsdp=true){tail}", _ev(f.wrapper_line))
    return say("unknown", "no data-parallel wrapper line in the log (megatron-core logs 'Setting up "
               "DistributedDataParallel with config ...' at INFO level)"
               + (f"; FSDP was requested ({why})" if requested else ""), _ev(req_line))


def sharding_strategy(f: Facts) -> Check:
    say = partial(Check, "sharding_strategy", "Sharding strategy optim_grads_params")
    if not f.fsdp:
        return say("skip", "Megatron FSDP was not active")
    if f.strategy is None:
        return say("unknown", "the log does not show the sharding strategy")
    if f.strategy == "optim_grads_params":
        return say("pass", "parameters, gradients and optimizer state are sharded", _ev(f.wrapper_line))
    return say("warn", f"data_parallel_sharding_strategy is {f.strategy}: less is sharded than with "
               "optim_grads_params", _ev(f.wrapper_line))


def loss_finite(f: Facts) -> Check:
    say = partial(Check, "loss_finite", "Loss finite to the last iteration")
    if f.nonfinite_line is not None:
        it = F.iteration(f.nonfinite_line.text)
        where = f" at iteration {it[0]}" if it else ""
        return say("fail", f"a non-finite loss was logged{where}", _ev(f.nonfinite_line))
    if f.last_iteration_line is None:
        return say("fail", "no training iteration was logged")
    if f.train_iters and f.last_iteration is not None and f.last_iteration < f.train_iters:
        return say("fail", f"training stopped at iteration {f.last_iteration} of {f.train_iters}",
                   _ev(f.last_iteration_line))
    loss = F.losses(f.last_iteration_line.text)
    shown = ", ".join(f"{k} {v:.4g}" for k, v in loss.items()) or "no loss on the line"
    return say("pass" if loss else "unknown", f"iteration {f.last_iteration}/{f.train_iters}: {shown}",
               _ev(f.last_iteration_line))


_FORMAT_FINDINGS = {"checkpoint_format"}


def checkpoint_fsdp_dtensor(f: Facts) -> Check:
    say = partial(Check, "checkpoint_fsdp_dtensor", "Checkpoint written in fsdp_dtensor")
    for finding in f.report.findings:
        if finding.category in _FORMAT_FINDINGS and finding.severity == "error":
            return say("fail", f"checkpoint-format error {finding.rule}: {finding.title}", list(finding.evidence[:1]))
    if f.saved_line is None:
        save = f.view.get("checkpoint.save") if f.view is not None else None
        why = " (checkpoint.save is not set)" if save in (None, "", "None", "null") else ""
        started = " a save started but never finished" if f.saving_line is not None else ""
        return say("fail", f"no checkpoint was written{why}{';' + started if started else ''}", _ev(f.saving_line))
    fmt, evidence = f.saved_format, _ev(f.saving_line) + _ev(f.saved_line)
    if fmt == "fsdp_dtensor":
        return say("pass", "saved in fsdp_dtensor format", evidence)
    if f.fsdp:
        return say("fail", f"saved in {fmt or 'an unknown'} format under Megatron FSDP (it needs fsdp_dtensor: set "
                   "checkpoint.ckpt_format=fsdp_dtensor)", evidence)
    return say("fail", f"saved in {fmt or 'an unknown'} format, not fsdp_dtensor", evidence)


def te_apex(f: Facts) -> Check:
    say = partial(Check, "te_apex", "Transformer Engine and Apex in use")
    missing = f.lines("config.te_missing") + f.lines("config.apex_missing")
    if missing:
        return say("warn", "megatron-core fell back to local implementations (Transformer Engine and/or Apex "
                   "missing)", _ev(missing[0]))
    return say("pass", "no fallback warning in the log")


def cuda_device_max_connections(f: Facts) -> Check:
    say = partial(Check, "cuda_device_max_connections", "CUDA_DEVICE_MAX_CONNECTIONS suits FSDP with TP/CP")
    v = f.view
    tp = as_int(v.get("model.tensor_model_parallel_size"), 1) if v is not None else 1
    cp = as_int(v.get("model.context_parallel_size"), 1) if v is not None else 1
    if not f.fsdp or ((tp or 1) == 1 and (cp or 1) == 1):
        return say("skip", "not Megatron FSDP with TP/CP > 1")
    env = v.get("env.CUDA_DEVICE_MAX_CONNECTIONS") if v is not None else None
    warn_lines = f.lines("verify.tp_cp_warning")
    gpus = " ".join(line.text for line in f.lines("verify.gpu_name"))
    if F.BLACKWELL.search(gpus) and not F.HOPPER_OR_OLDER.search(gpus):
        return say("pass", "Blackwell: one setting suits both")
    return say("warn", f"Megatron FSDP with TP={tp} CP={cp}: FSDP wants CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset, "
               f"TP/CP overlap wants 1 on Hopper and earlier (now {env if env is not None else 'unset'})",
               _ev(warn_lines[0] if warn_lines else f.wrapper_line))


def keep_fp8_transpose_cache(f: Facts) -> Check:
    say = partial(Check, "keep_fp8_transpose_cache", "keep_fp8_transpose_cache off")
    if not f.fsdp:
        return say("skip", "not Megatron FSDP")
    if _truthy(f.effective("ddp.keep_fp8_transpose_cache")):
        return say("warn", "keep_fp8_transpose_cache=True keeps FP8 transposes in memory under FSDP (the skill sets "
                   "it false)", _ev(f.wrapper_line))
    return say("pass", "off", _ev(f.wrapper_line))


def average_in_collective(f: Facts) -> Check:
    say = partial(Check, "average_in_collective", "average_in_collective off")
    if not f.fsdp:
        return say("skip", "not Megatron FSDP")
    adjusted = [e for finding in f.report.findings if finding.rule == "MB150" for e in finding.evidence
                if "average_in_collective" in e.text]
    if _truthy(f.effective("ddp.average_in_collective")):
        return say("warn", "average_in_collective=True under Megatron FSDP (the skill sets it false)",
                   _ev(f.wrapper_line))
    if adjusted:
        return say("warn", "the config set average_in_collective; Megatron-Bridge turned it off (set it false "
                   "yourself)", adjusted[:1])
    return say("pass", "off", _ev(f.wrapper_line))


CHECKS: list[Callable[[Facts], Check]] = [
    no_failure, megatron_fsdp_active, sharding_strategy, loss_finite, checkpoint_fsdp_dtensor, te_apex,
    cuda_device_max_connections, keep_fp8_transpose_cache, average_in_collective,
]
