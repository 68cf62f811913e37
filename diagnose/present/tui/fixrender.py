"""The fix in the four forms a user pastes somewhere: Bridge CLI overrides, Python recipe lines, YAML, Megatron-LM
flags.

Every form comes from ``diagnose.explain.render``, the one renderer the text, markdown and JSON reports use too, so
what a user copies from a tab is what the reports print. The replay stage renders the proven set
(``report.replay.rendered``); for findings the replay did not cover the rule's ``Fix.overrides`` and ``Fix.env``
are rendered here. This module lays the forms out for the tabs (export lines above the overrides, one Megatron-LM
flag a line). No Textual import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnose.explain import render as fixrender
from diagnose.explained import ReplayResult
from diagnose.model import Finding, Fix, Override, Report

TAB_ORDER = (("cli", "Bridge CLI"), ("python", "Python"), ("yaml", "YAML"), ("mlm", "Megatron-LM flags"))


@dataclass
class RenderedFix:
    """The fix for one finding, each form ready to copy, plus what replay said about it."""

    forms: dict[str, str]  # keys of TAB_ORDER; "" where a form has nothing to say
    verdict: str  # one line: "passes validation after the fix (reproduced the failure first)" ...
    proven: bool  # True when the overrides are replay's own proven set
    overrides: list[Override]
    # the fix's steps in the job's words (render.fix_words: a job of another stack than Megatron's gets the rule's
    # other_stacks steps, and no Megatron overrides above them)
    steps: list[str] = field(default_factory=list)


def _env_overrides(fix: Fix, taken: list[Override]) -> list[Override]:
    """The finding's environment variables as ``env.NAME`` overrides (the renderer's form), less those set already."""
    names = {o.key for o in taken}
    return [Override(f"env.{e.name}", e.value) for e in fix.env if f"env.{e.name}" not in names]


def replay_covers(report: Report, finding: Finding) -> bool:
    """Replay proved the fix of the finding it names (``ReplayResult.rule``); one that names none replayed the
    validator's own fix on the job's config, which belongs to the root cause."""
    replay = report.replay
    if replay is None or not replay.fix:
        return False
    return replay.rule == finding.rule if replay.rule else report.root is finding


def replay_verdict(replay: ReplayResult) -> str:
    if replay.passes:
        head = "✔ passes validation with these overrides"
    else:
        remaining = len(replay.after.violations)
        head = f"✘ still fails validation after the fix ({remaining} check{'s' if remaining != 1 else ''})"
    if replay.reproduced is True:
        tail = "replay reproduced the failure first"
    elif replay.reproduced is False:
        tail = "replay did not reproduce the failure"
    else:
        tail = "the log did not carry enough config to reproduce"
    fit = replay.fit
    if replay.fits is True:
        gpus, job = (fit.gpus, fit.job_gpus) if fit is not None else (None, None)
        more = f" on {gpus} GPUs (the job had {job})" if gpus and job and gpus != job else ""
        head += f"; fits in memory{more}"
    elif replay.fits is False:
        head += "; but does NOT fit in GPU memory"
    launch = replay.rendered.get("launch")
    notes = [v.message for v in replay.after.notes if v.message]
    lines = [f"{head}; {tail}"]
    if launch:
        lines.append(launch)
    return "\n".join(lines) + "".join(f"\n  note: {n}" for n in notes)


def _lines(*blocks: str) -> str:
    return "\n".join(b for b in blocks if b)


def _forms(overrides: list[Override], given: dict[str, Any] | None = None) -> dict[str, str]:
    """The tabs' text. ``given``: replay's own rendering of the same overrides, shown as the report has it."""
    fresh = fixrender.render_fix(overrides, "megatron-lm")
    given = {k: v for k, v in (given or {}).items() if isinstance(v, str) and v}
    env = given.get("env") or fresh.get("env", "")
    flags = [fixrender.mlm_flag(o) or f"# no Megatron-LM flag known for {fixrender.comment_safe(o.key)}"
             for o in _config(overrides)]
    return {
        "cli": _lines(env, given.get("cli") or fresh["cli"]),
        "python": given.get("python") or fresh["python"],
        "yaml": given.get("yaml") or fresh["yaml"],
        "mlm": _lines(env, "\n".join(flags)),
    }


def render_fix(report: Report, finding: Finding) -> RenderedFix:
    replay = report.replay
    if replay is not None and replay_covers(report, finding):
        proven = list(replay.fix)
        extra = _env_overrides(finding.shown_fix, proven)
        given = replay.rendered if not extra else None
        forms = _forms(proven + extra, given)
        return RenderedFix(forms, replay_verdict(replay), True, _config(proven), list(finding.shown_fix.steps))
    # the rule's words as the reports decide them: a job of another stack gets no Megatron overrides
    style = fixrender.fix_style(report.framework, report.stack)
    words = fixrender.fix_words(finding.shown_fix, style)
    overrides = [] if style == "neutral" else list(finding.shown_fix.overrides)
    forms = _forms(overrides + _env_overrides(finding.shown_fix, overrides))
    verdict = "not replayed: overrides from the rule" if _config(overrides) else "no config change suggested"
    return RenderedFix(forms, verdict, False, _config(overrides), words.steps)


def _config(overrides: list[Override]) -> list[Override]:
    return [o for o in overrides if not o.key.startswith(("env.", "launch."))]
