"""The explain stage: the job's config, replay of the validator with proven fixes, and the memory model.

``enrich(report, blocks, options)`` fills ``report.config``, ``report.replay``, ``report.memory`` and, for a log
without failure that shows a Megatron FSDP run (or when ``options.verify``), ``report.verify``. Each part
that fails adds one line to ``report.warnings`` and leaves the rest of the report intact.
"""

from __future__ import annotations

from typing import Any

from diagnose.configview import ConfigView
from diagnose.explained import CONFIG_CATEGORIES, ReplayResult
from diagnose.model import DiagnoseError, Finding, FindingReplay, Fix, Override, Report


def enrich(report: Report, blocks: dict | None, options: Any = None) -> None:
    view = None
    try:
        view = build_view(report, blocks, options)
        report.config = view.copy()  # as recovered: what the memory model or replay do later is theirs
    except DiagnoseError as e:
        report.warnings.append(f"config: {e}")
    except Exception as e:  # noqa: BLE001 - one part failing never breaks the report
        report.warnings.append(f"config extraction failed: {type(e).__name__}: {e}")
    if view is not None:
        from diagnose.explain.timeouts import short_timeout_first

        short_timeout_first(report, view)  # before replay, which proves the fix it leads with
    # the memory model first: for a capacity OOM, replay proves the memory model's fitting option
    _run_memory(report, view, options)
    if view is not None:
        try:
            report.replay = replay_findings(report, view, getattr(options, "bridge_version", None))
        except Exception as e:  # noqa: BLE001
            report.warnings.append(f"config replay failed: {type(e).__name__}: {e}")
    want = getattr(options, "verify", None)
    if want or (want is None and report.root is None):
        try:
            from diagnose.explain.verify import verify

            result = verify(report, blocks, view, strict=bool(getattr(options, "strict", False)))
            # asked for (``verify``, ``--verify``): always; analyze's own section only for a log that shows a
            # Megatron FSDP run (its wrapper, or a config asking for it): `echo hi` or a torch DDP job that ended
            # well is no failed Megatron FSDP check list (qa-report-6 L3)
            if want or result.megatron_fsdp_run:
                report.verify = result
        except Exception as e:  # noqa: BLE001
            report.warnings.append(f"verify failed: {type(e).__name__}: {e}")


def build_view(report: Report, blocks: dict | None, options: Any = None):
    """Config from the captured blocks, merged over an explicit ``options.config_path`` (the log wins: it shows
    what the job really ran with)."""
    from diagnose.explain.config import apply_defaults
    from diagnose.explain.config.extract import from_blocks, load_config

    view = from_blocks(blocks or {}, report.findings, defaults=False)
    path = getattr(options, "config_path", None)
    if path:
        file_view = load_config(path, defaults=False)
        file_view.merge(view)
        view = file_view
    # what the error message states fills what the log did not print (the log wins where it states a value)
    from diagnose.explain.config.implied import implied_view

    implied = implied_view(report.findings)
    for key, item in implied.values.items():
        if not view.has(key):
            view.values[key] = item
    view.sources.extend(s for s in implied.sources if s not in view.sources)
    forced = getattr(options, "bridge_version", None)
    if forced:
        view.version = forced
    if view.known():
        apply_defaults(view)
    return view


def fix_overrides(finding: Finding) -> list[Override]:
    """A finding's fix as overrides: config keys plus its environment changes as ``env.<NAME>``."""
    out = list(finding.fix.overrides)
    out.extend(Override(key=f"env.{e.name}", value=e.value) for e in finding.fix.env)
    return out


def replay_findings(report: Report, view: ConfigView, bridge_version: str | None = None) -> ReplayResult | None:
    """Replay every finding's fix; the report's section is the root cause's (or the first fixable one's).

    Each replayed finding gets ``replay`` (proven, reproduced, what was added). With no fix to replay but a known
    config that fails validation, the validator's own suggested fix is replayed.
    """
    from diagnose.explain.replay import replay

    rule_fit = fit = None
    if report.findings:  # (without a finding there is nothing to fit: the memory model is not imported)
        from diagnose.explain.fit import apply_fit, apply_memory_fit, capacity_fix, memory_fit_of, rule_fix_fit

        rule_fit = rule_fix_fit(report, view)  # the rule's fix sized once: whether it leads, and its replay's fit
        fit = capacity_fix(report, view, rule_fit)
    chosen = None
    for index, finding in enumerate(report.findings):
        overrides = fit.overrides if fit is not None and finding is fit.finding else fix_overrides(finding)
        if not overrides:
            continue
        result = replay(view, overrides, bridge_version, finding=finding, real_mcore=_wants_mcore(finding))
        if fit is not None and finding is fit.finding:
            apply_fit(result, fit)
        elif index == report.root_cause and finding.category == "cuda_oom":
            # any other fix for the OOM is checked against the same memory model (one answer)
            apply_memory_fit(result, memory_fit_of(report, view, result.fix, finding, rule_fit))
        finding.replay = FindingReplay(result.passes if result.reproduced is not None else None,
                                       result.reproduced, list(result.added))
        if chosen is None or index == report.root_cause:
            chosen = result
    if chosen is None:
        if not view.config_known:
            return None
        root = report.root
        chosen = replay(view, [], bridge_version, finding=root, real_mcore=_wants_mcore(root))
    _megatron_lm_words(report, chosen)
    return chosen


def _megatron_lm_words(report: Report, result: ReplayResult) -> None:
    """The JSON's ``replay.render.mlm`` for every job the text shows Megatron-LM flags (``fix_style``): replay
    renders from the config's framework only, so a Megatron-LM job whose log printed no argument dump (its stack
    read from the traceback) had the flags in the text report and none in the JSON (qa-report-16)."""
    from diagnose.explain.render import fix_style, mlm_fix_line

    if "mlm" in result.rendered or fix_style(report.framework, report.stack) != "megatron-lm":
        return
    config = [o for o in result.fix if not o.key.startswith(("env.", "launch."))]
    if config:
        result.rendered["mlm"] = mlm_fix_line(config)[0]


# Failures whose cause is the config: worth importing megatron-core (seconds) to run its own checks too.
# For OOMs, NCCL, Slurm... the mirrored checks alone prove the fix, keeping analyze fast.


def _wants_mcore(finding: Finding | None) -> bool | str:
    """megatron-core's own checks for config failures, from the cache; never waited for (seconds of import): a
    config not cached yet is checked by a background worker for the next run."""
    from diagnose.explain.validate import BACKGROUND

    return BACKGROUND if finding is None or finding.category in CONFIG_CATEGORIES else False


def _run_memory(report: Report, view, options: Any) -> None:
    from diagnose.explain import memory  # the module, not its run: tests replace memory.run

    try:
        report.memory = memory.run(report, view, options)
    except Exception as e:  # noqa: BLE001
        report.warnings.append(f"memory model failed: {type(e).__name__}: {e}")
        return
    _allocator_as_a_step(report, getattr(options, "catalogue", None))


def _allocator_only(fix: Fix) -> bool:
    """A fix that is the allocator setting and nothing else, no memory lever among its steps (OOM190's, read from
    the message's words alone; OOM104's names recompute and the micro batch as its next step, and keeps it)."""
    allocator = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    return not fix.overrides and not fix.steps and any(e.name in allocator for e in fix.env)


def _allocator_as_a_step(report: Report, catalogue: Any) -> None:
    """The numbers do not say fragmentation (a nearly full GPU, or a small unallocated share of what PyTorch
    reserved), yet cached and free memory exceeded the request: the rule's memory lever stays the fix and the
    allocator setting becomes a step (qa-report-9 L1). A rule whose fix is the allocator setting alone (its regex
    reads the message's words, not the share) takes the cuda_oom category's fix, the memory lever, instead
    (qa-report-11 L1), and its ``[rule.numbers_say_demand]`` title and Why, where it has them."""
    root = report.root
    if report.memory is None or report.memory.verdict == "fragmentation" or root is None \
            or root.category != "cuda_oom":
        return
    from diagnose.explain.memory.analysis import allocator_step, numbers_of, step_sentence

    step = allocator_step(root)
    if step is None:
        return
    lever = (getattr(catalogue, "category_fixes", None) or {}).get("cuda_oom")
    if lever is not None and _allocator_only(root.fix):
        root.fix = Fix(lever.summary, lever.safety, list(lever.overrides), [], list(lever.steps),
                       list(lever.other_stacks))
        # the rule's Why says "fragmented" from the message's words; its numbers say demand: the Why says what
        # the fix and the memory section say (one verdict), in the rule's words
        rule = catalogue.by_code(root.rule) if catalogue is not None else None
        reworded = rule.numbers_say_demand if rule is not None else None
        if reworded is not None:
            root.explanation = reworded.explanation.replace("{numbers}", step_sentence(numbers_of(root)))
            root.title = reworded.title
    # the steps, and the stack-neutral steps that stand in for them for a job of another stack (render.fix_words)
    for steps in (root.fix.steps, root.fix.other_stacks):
        if (steps or steps is root.fix.steps) and step not in steps:
            steps.append(step)
