"""The fix in the four forms a user pastes somewhere: Bridge CLI overrides, Python recipe lines, YAML, Megatron-LM
flags.

Every form comes from ``diagnose.explain.render``, the one renderer the text, markdown and JSON reports use too, so
what a user copies from a tab is what the reports print. The replay stage renders the proven set
(``report.replay["render"]``); for findings the replay did not cover the rule's ``Fix.overrides`` and ``Fix.env``
are rendered here. This module lays the forms out for the tabs (export lines above the overrides, one Megatron-LM
flag a line). No Textual import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagnose.explain import render as fixrender
from diagnose.model import Finding, Fix, Override, Report

TAB_ORDER = (("cli", "Bridge CLI"), ("python", "Python"), ("yaml", "YAML"), ("mlm", "Megatron-LM flags"))


@dataclass
class RenderedFix:
    """The fix for one finding, each form ready to copy, plus what replay said about it."""

    forms: dict[str, str]  # keys of TAB_ORDER; "" where a form has nothing to say
    verdict: str  # one line: "passes validation after the fix (reproduced the failure first)" ...
    proven: bool  # True when the overrides are replay's own proven set
    overrides: list[Override]


def _env_overrides(fix: Fix, taken: list[Override]) -> list[Override]:
    """The finding's environment variables as ``env.NAME`` overrides (the renderer's form), less those set already."""
    names = {o.key for o in taken}
    return [Override(f"env.{e.name}", e.value) for e in fix.env if f"env.{e.name}" not in names]


def _as_overrides(items: Any) -> list[Override]:
    out: list[Override] = []
    for item in items or []:
        if isinstance(item, Override):
            out.append(item)
        elif isinstance(item, dict) and "key" in item:
            out.append(Override(str(item["key"]), item.get("value")))
    return out


def replay_covers(report: Report, finding: Finding) -> bool:
    """Replay names the rule it proved (``replay["rule"]``); without that it worked on the root cause and on any
    finding whose overrides it extended."""
    replay = report.replay
    if not replay or not replay.get("fix"):
        return False
    if replay.get("rule"):
        return replay["rule"] == finding.rule
    if report.root is finding:
        return True
    proven_keys = {o.key for o in _as_overrides(replay.get("fix"))}
    own = {o.key for o in finding.fix.overrides}
    return bool(own) and own <= proven_keys


def replay_verdict(replay: dict[str, Any]) -> str:
    reproduced = replay.get("reproduced")
    after = replay.get("after_fix") or {}
    passes = after.get("passes")
    if passes is True:
        head = "✔ passes validation with these overrides"
    elif passes is False:
        remaining = len(after.get("violations") or [])
        head = f"✘ still fails validation after the fix ({remaining} check{'s' if remaining != 1 else ''})"
    else:
        head = "replay did not run the fix"
    if reproduced is True:
        tail = "replay reproduced the failure first"
    elif reproduced is False:
        tail = "replay did not reproduce the failure"
    else:
        tail = "the log did not carry enough config to reproduce"
    got = replay.get("fit")
    fit: dict[str, Any] = got if isinstance(got, dict) else {}
    fits = replay.get("fits")
    if fits is True:
        gpus, job = fit.get("gpus"), fit.get("job_gpus")
        more = f" on {gpus} GPUs (the job had {job})" if gpus and job and gpus != job else ""
        head += f"; fits in memory{more}"
    elif fits is False:
        head += "; but does NOT fit in GPU memory"
    launch = (replay.get("render") or {}).get("launch")
    notes = [str(n) for n in replay.get("notes") or [] if n]
    lines = [f"{head}; {tail}"]
    if launch:
        lines.append(str(launch))
    return "\n".join(lines) + "".join(f"\n  note: {n}" for n in notes)


def _lines(*blocks: str) -> str:
    return "\n".join(b for b in blocks if b)


def _forms(overrides: list[Override], given: dict[str, Any] | None = None) -> dict[str, str]:
    """The tabs' text. ``given``: replay's own rendering of the same overrides, shown as the report has it."""
    fresh = fixrender.render_fix(overrides, "megatron-lm")
    given = {k: v for k, v in (given or {}).items() if isinstance(v, str) and v}
    env = given.get("env") or fresh.get("env", "")
    config = [o for o in overrides if not o.key.startswith(("env.", "launch."))]
    flags = [fixrender.mlm_flag(o) or f"# no Megatron-LM flag known for {fixrender.comment_safe(o.key)}"
             for o in config]
    return {
        "cli": _lines(env, given.get("cli") or fresh["cli"]),
        "python": given.get("python") or fresh["python"],
        "yaml": given.get("yaml") or fresh["yaml"],
        "mlm": _lines(env, "\n".join(flags)),
    }


def render_fix(report: Report, finding: Finding) -> RenderedFix:
    if replay_covers(report, finding):
        replay = report.replay or {}
        proven = _as_overrides(replay.get("fix"))
        extra = _env_overrides(finding.fix, proven)
        given = replay.get("render") if isinstance(replay.get("render"), dict) and not extra else None
        forms = _forms(proven + extra, given)
        return RenderedFix(forms, replay_verdict(replay), True, _config(proven))
    overrides = list(finding.fix.overrides)
    forms = _forms(overrides + _env_overrides(finding.fix, overrides))
    verdict = "not replayed: overrides from the rule" if _config(overrides) else "no config change suggested"
    return RenderedFix(forms, verdict, False, _config(overrides))


def _config(overrides: list[Override]) -> list[Override]:
    return [o for o in overrides if not o.key.startswith(("env.", "launch."))]
