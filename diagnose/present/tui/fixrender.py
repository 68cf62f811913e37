"""The fix in the forms a user pastes somewhere: Bridge CLI overrides, Python recipe lines, YAML, Megatron-LM
flags, environment lines.

Every form comes from ``diagnose.explain.render``, the one renderer the text, markdown and JSON reports use too, so
what a user copies from a tab is what the reports print. The replay stage renders the proven set
(``report.replay.rendered``); for findings the replay did not cover the rule's ``Fix.overrides`` and ``Fix.env``
are rendered here. This module lays the forms out for the tabs (export lines above the overrides, one Megatron-LM
flag a line). No Textual import.

Which forms a job is shown is the reports' decision (``render.fix_style`` and ``render.fix_words``, from the
report's ``framework`` and ``stack``), not a second copy of it: a Megatron-Bridge job, or one whose log names no
stack, gets the four Megatron forms as before; a Megatron-LM job its flags (and the Bridge words only where a key has
no flag); a job of another stack (DeepSpeed, HF Trainer, plain PyTorch) no Megatron form at all, only its
environment lines, and the rule's stack-neutral steps (``RenderedFix.steps``). A form left "" has no tab.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnose.explain import render as fixrender
from diagnose.explained import ReplayResult
from diagnose.model import Finding, Fix, Override, Report

TAB_ORDER = (("cli", "Bridge CLI"), ("python", "Python"), ("yaml", "YAML"), ("mlm", "Megatron-LM flags"),
             ("env", "Environment"))


@dataclass
class RenderedFix:
    """The fix for one finding, each form ready to copy, plus what replay said about it."""

    forms: dict[str, str]  # keys of TAB_ORDER; "" where a form has nothing to say (its tab is hidden)
    verdict: str  # one line: "passes validation after the fix (reproduced the failure first)" ...
    proven: bool  # True when the overrides are replay's own proven set
    overrides: list[Override]
    steps: list[str] = field(default_factory=list)  # the fix's steps in the job's words (render.fix_words)
    style: str = "bridge"  # render.fix_style of the report

    @property
    def tabs(self) -> list[str]:
        """The keys of TAB_ORDER this job is shown, in order: those with something to say."""
        return [key for key, _ in TAB_ORDER if self.forms.get(key)]


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
        state = " (the model state; activations not counted)" if fit is not None and fit.model_state_only else ""
        head += f"; fits in memory{more}{state}"
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


def _forms(overrides: list[Override], style: str, given: dict[str, Any] | None = None) -> dict[str, str]:
    """The tabs' text in the job's words (``style``: render.fix_style). ``given``: replay's own rendering of the
    same overrides, shown as the report has it."""
    fresh = fixrender.render_fix(overrides, "megatron-lm")
    given = {k: v for k, v in (given or {}).items() if isinstance(v, str) and v}
    env = given.get("env") or fresh.get("env", "")
    forms = dict.fromkeys((key for key, _ in TAB_ORDER), "")
    if style == "neutral":  # no Megatron config to set: only what any launch script takes
        forms["env"] = env
        return forms
    words = fixrender.fix_words(Fix(overrides=_config(overrides)), style)
    if style == "megatron-lm":
        flags = [fixrender.mlm_flag(o) for o in _config(overrides)]
        forms["mlm"] = _lines(env, "\n".join(dict.fromkeys(f for f in flags if f)))
        if not words.overrides:
            return forms
        # a key with no Megatron-LM flag: the Bridge words stay beside the flags, as the text report has them
        fresh = fixrender.render_fix(words.overrides + _env(overrides), "megatron-lm")
        given = {}
        env = ""
    else:
        flags = [fixrender.mlm_flag(o) or f"# no Megatron-LM flag known for {fixrender.comment_safe(o.key)}"
                 for o in _config(overrides)]
        forms["mlm"] = _lines(env, "\n".join(flags))
    forms.update({
        "cli": _lines(env, given.get("cli") or fresh["cli"]),
        "python": given.get("python") or fresh["python"],
        "yaml": given.get("yaml") or fresh["yaml"],
    })
    return forms


def render_fix(report: Report, finding: Finding) -> RenderedFix:
    style = fixrender.fix_style(report.framework, report.stack)
    steps = fixrender.fix_words(finding.shown_fix, style).steps
    replay = report.replay
    if replay is not None and replay_covers(report, finding) and fixrender.replay_speaks_to(style):
        proven = list(replay.fix)
        extra = _env_overrides(finding.shown_fix, proven)
        given = replay.rendered if not extra else None
        forms = _forms(proven + extra, style, given)
        return RenderedFix(forms, replay_verdict(replay), True, _config(proven), steps, style)
    overrides = list(finding.shown_fix.overrides)
    forms = _forms(overrides + _env_overrides(finding.shown_fix, overrides), style)
    shown = _config(overrides) if style != "neutral" else []
    verdict = "not replayed: overrides from the rule" if shown else "no config change suggested"
    return RenderedFix(forms, verdict, False, shown, steps, style)


def _env(overrides: list[Override]) -> list[Override]:
    return [o for o in overrides if o.key.startswith(("env.", "launch."))]


def _config(overrides: list[Override]) -> list[Override]:
    return [o for o in overrides if not o.key.startswith(("env.", "launch."))]
