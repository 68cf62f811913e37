"""Replay's answer in words, for people: the -v REPLAY section of the text report and the replay details of the
markdown report. Read from the typed ``ReplayResult``; the fix itself is shown once, in the finding's fix block
above (its Bridge CLI, Python, YAML and launch lines), so it is not repeated here; sizes in GiB; plain strings, made
inert by the caller (messages and notes may carry config values).
"""

from __future__ import annotations

from diagnose.explain.render import mlm_flag, overrides_in_style
from diagnose.explained import CapacityFit, ReplayResult, Violation
from diagnose.model import Override, is_delete
from diagnose.units import fmt_gib

REPRODUCED = {True: "yes: the validator fails on the job's config as the job did",
              False: "no: the job's config passes the mirrored checks",
              None: "not asked (no config of the job to replay, or not a config failure)"}


def replay_summary(replay: ReplayResult, style: str) -> str:
    """Replay's lead sentence with the fix in the job's words (``style``: render.fix_style), as the Fix shows it."""
    return replay.sentence(overrides_in_style(replay.fix, style))


def replay_lines(replay: ReplayResult, style: str = "bridge") -> list[str]:
    """The section after its lead sentence (``replay_summary``), nested lines indented with spaces; what replay
    added to the fix in the job's words (``style``: render.fix_style)."""
    lines = [f"Reproduced: {REPRODUCED[replay.reproduced]}."]
    if replay.before.assumed_release:
        lines.append(f"Release checked: {replay.before.assumed_release}.")
    lines += _violations("Before the fix", replay.before.violations)
    if replay.fix:
        verdict = "passes validation" if replay.passes else "still fails validation"
        lines.append(f"After the fix ({len(replay.fix)} change{'s' if len(replay.fix) != 1 else ''}): {verdict}.")
        lines += _violations("  still failing", replay.after.violations, header=False)
    if replay.added:
        lines.append("Replay added to the rule's fix (needed to pass): "
                     + ", ".join(_change(o, style) for o in replay.added) + ".")
    if replay.fit is not None:
        lines += _fit_lines(replay.fit)
    notes = [v.message for v in replay.after.notes]
    if notes:
        lines.append("Notes (the real code adjusts these itself):")
        lines += [f"  - {n}" for n in notes]
    return lines


def _violations(title: str, violations: list[Violation], header: bool = True) -> list[str]:
    if not violations:
        return [f"{title}: no violation."] if header else []
    head = [f"{title}: {len(violations)} violation{'s' if len(violations) != 1 else ''}:"] if header else []
    return head + [f"  - {v.message}" + (f" ({', '.join(v.keys)})" if v.keys else "") for v in violations]


def _change(o: Override, style: str = "bridge") -> str:
    flag = mlm_flag(o) if style == "megatron-lm" and not o.key.startswith(("env.", "launch.")) else ""
    if flag:
        return flag
    return f"delete {o.key}" if is_delete(o) else f"{o.key}={o.value}"


def _fit_lines(fit: CapacityFit) -> list[str]:
    if fit.fits is None:
        head = "Memory: the memory model could not size this fix."
    elif fit.fits:
        where = f" on {fit.gpus} GPUs ({fit.layout or f'DP {fit.dp or fit.gpus}'})" if fit.gpus else ""
        more = f", the job ran on {fit.job_gpus}" if fit.more_gpus else ""
        unsized = " (activations not counted)" if fit.model_state_only else ""
        head = f"Memory: {fit.fits_text}{where}{more}{unsized}."
    else:
        head = "Memory: does not fit."
    lines = [head]
    if fit.peak_bytes:
        usable = f" ({fmt_gib(fit.usable_bytes)} usable)" if fit.usable_bytes else ""
        lines.append(f"  predicted peak {fmt_gib(fit.peak_bytes)} per GPU of {fmt_gib(fit.capacity_bytes)}{usable}")
    if fit.label:
        lines.append(f"  option: {fit.label}")
    if fit.cost:
        lines.append(f"  cost: {fit.cost}")
    lines += [f"  - {n}" for n in fit.notes]
    return lines
