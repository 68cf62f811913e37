"""A markdown report that pastes into a GitHub issue: root cause, evidence in fenced blocks, the fix, the rest.

Log text only ever appears inside fenced code blocks (made inert, with a fence longer than any backtick run in
it), so nothing from a log can become a link, an image, a mention or HTML in the rendered issue.
"""

from __future__ import annotations

import re

from diagnose.explain.render import cli_line, env_line, fix_style, fix_words, python_lines, replay_speaks_to
from diagnose.explained import VerifyResult
from diagnose.model import Finding, HangReport, Report
from diagnose.present.memory_text import memory_lines
from diagnose.present.replay_text import replay_lines, replay_summary
from diagnose.present.safe import inert, inert_block
from diagnose.present.section_lines import config_lines, slurm_lines
from diagnose.present.text import (
    NOTHING_RECOVERED,
    SAFETY_NOTE,
    category_words,
    collapsed_line,
    finding_label,
    seen_where,
    shown_facts,
    silent_line,
    skew_line,
    yaml_text,
)

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|<>~@])")


def md_inline(text: str) -> str:
    """Inline text with markdown punctuation escaped (rule titles, paths)."""
    return _MD_SPECIAL.sub(r"\\\1", inert(text))


def md_code(text: str) -> str:
    """An inline code span that holds ``text`` whatever backticks it has (a file named ``a`b.log`` used to close
    the span and turn the rest into markdown): the delimiter is longer than any backtick run inside."""
    body = inert(text)
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    tick = "`" * (longest + 1)
    pad = " " if body.startswith("`") or body.endswith("`") or longest else ""
    return f"{tick}{pad}{body}{pad}{tick}"


_CODE_SPAN = re.compile(r"(`[^`\n]+`)")


def md_words(text: str) -> str:
    """A rule's words (a fix step) as markdown: its `code` spans stay code (md_code), the rest is escaped as
    md_inline. Escaping the backticks too showed "\\`diagnose check CONFIG --gpus N\\`" as literal backticks."""
    return "".join(md_code(part[1:-1]) if _CODE_SPAN.fullmatch(part) else md_inline(part)
                   for part in _CODE_SPAN.split(text) if part)


def fenced(body: str, lang: str = "text") -> str:
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{body}\n{fence}"


def _finding(f: Finding, heading: str, root: Finding | None = None, launch: list[str] | None = None,
             style: str = "bridge") -> list[str]:
    out = [f"### {heading}: {md_inline(f.title)} (`{inert(f.rule)}`)", ""]
    meta = [f"phase `{inert(f.phase)}`", f"category `{inert(f.category)}`", f"confidence {f.confidence:.2f}"]
    if f.basis != "rule":
        meta[1] = md_inline(category_words(f))
    out += [" · ".join(meta + [md_inline(w) for w in seen_where(f)]), ""]
    silent = silent_line(f, root)
    if silent and silent.lower() not in f.explanation.lower():
        out += [f"**{md_inline(silent[0].upper() + silent[1:])}**", ""]
    skew = skew_line(f)
    if skew and skew.split("; ")[0].lower() not in f.explanation.lower():
        out += [f"**{md_inline(skew[0].upper() + skew[1:])}**", ""]
    if f.evidence:
        body = "\n".join(f"{inert(e.path)}{f':{e.line}' if e.line > 0 else ''}: {inert(e.text)}" for e in f.evidence)
        out += ["**Evidence**", "", fenced(body), ""]
    facts = shown_facts(f.facts, ranks_known=bool(f.ranks))
    folded: list[str] = []
    if facts:
        body = "\n".join(f"{inert(k)} = {inert(v)}" for k, v in facts)
        folded = details("Facts", ["", fenced(body), ""])
    fix = f.shown_fix
    if not fix.empty:
        line = "**Fix**"
        if fix.summary:
            line += f": {md_inline(fix.summary)}"
        line += f" ({SAFETY_NOTE.get(fix.safety, fix.safety)})"
        out += [line, ""]
        # in the job's words: a Megatron-LM job's flags (the Bridge words only for what has none), a Bridge job's
        # overrides, the rule's stack-neutral steps for a job of another stack
        words = fix_words(fix, style)
        if words.flags:
            out += ["Megatron-LM flags:", "", fenced(inert(words.flags), "shell"), ""]
        if words.overrides:
            out += ["Bridge command line:", "", fenced(inert(cli_line(words.overrides)), "shell"), ""]
        if launch:  # the fix needs more GPUs: how to launch them
            out += ["Launch:", "", fenced(inert_block("\n".join(launch)), "shell"), ""]
        if words.overrides:
            out += ["Python:", "", fenced(inert_block("\n".join(python_lines(words.overrides))), "python"), ""]
            out += details("YAML", ["", fenced(inert_block(yaml_text(words.overrides)), "yaml"), ""])
        if fix.env:
            body = "\n".join(env_line(e.name, e.value) for e in fix.env)
            out += ["Environment:", "", fenced(inert_block(body), "shell"), ""]
        for step in words.steps:
            out.append(f"- {md_words(step)}")
        if words.steps:
            out.append("")
    if f.explanation:
        out += [inert_block(f.explanation), ""]
    return out + folded


def _launch(report: Report) -> list[str]:
    """Replay's launch note and its torchrun / srun lines, when the fix needs more GPUs than the job had."""
    render = report.replay.rendered if report.replay is not None else {}
    if not render.get("launch"):
        return []
    return [str(render[k]) for k in ("launch", "torchrun", "srun") if isinstance(render.get(k), str)]


def details(summary: str, body: list[str]) -> list[str]:
    """A folded block (GitHub renders ``<details>`` closed): the detail is there for whoever opens it."""
    return [f"<details><summary>{md_inline(summary)}</summary>", "", *body, "</details>", ""]


def _section(title: str, lines: list[str], lead: str = "", lang: str = "text") -> list[str]:
    """A section: its one sentence (replay's summary, memory's explanation) in the open, its lines folded: config
    and Slurm from their typed objects (YAML-like), replay and memory in words; the fix is the finding's, not
    repeated."""
    if not lines:
        return [f"### {title}", "", f"_{NOTHING_RECOVERED}_", ""]
    opened = [md_inline(lead), ""] if lead else []
    return [f"### {title}", "", *opened] + details(f"{title} details",
                                                   ["", fenced(inert_block("\n".join(lines)), lang), ""])


def _hang(hang: HangReport) -> list[str]:
    from diagnose.present.hang_view import grid_rows, hang_lines

    lines = hang_lines(hang)
    out = ["### Hang (flight recorder)", "", md_inline(lines[0]), ""]
    out += [f"- {md_inline(line)}" for line in lines[1:]]
    rows = grid_rows(hang)
    if rows:
        out += ["", fenced(inert_block("\n".join(rows)))]
    return [*out, ""]


def _verify(result: VerifyResult | None) -> list[str]:
    """The verify section (a run without failure): one bullet per check with its verdict and first evidence line."""
    if result is None:
        return []
    verdict = "all checks hold" if result.passes else "does not hold: " + ", ".join(
        inert(n) for n in result.failed) if result.failed else "not proven"
    out = ["### Verify (Megatron FSDP run)", "", f"**{md_inline(verdict)}**", ""]
    for c in result.checks:
        line = f"- **{inert(c.verdict.upper())}** {md_inline(c.title)}: {md_inline(c.detail)}"
        if c.evidence:
            line += f" (line {c.evidence[0].line})"
        out.append(line)
    out.append("")
    return out


def render_markdown(report: Report, verbose: bool = False) -> str:
    """Markdown for an issue: root cause, evidence and fix in the open; facts, YAML, other findings' details and
    the config/replay/memory sections folded in ``<details>`` (``verbose`` is accepted for symmetry with text).
    Inputs of several jobs: a title, then each job's own report under a rule and its label."""
    if report.jobs:
        parts = [f"# diagnose: {len(report.jobs)} jobs in these inputs", ""]
        for job in report.jobs:
            parts += ["---", "", f"**{md_inline(job.label)}**", "", render_markdown(job.report, verbose)]
        return "\n".join(parts).rstrip() + "\n"
    out: list[str] = []
    root = report.root
    if root is None:
        out += ["## diagnose: no failure found", ""]
    else:
        out += [f"## diagnose: {md_inline(root.title)} (`{inert(root.rule)}`)", ""]
    if report.inputs:
        inputs = ", ".join(f"{md_code(i.path)} ({i.bytes:,} bytes, {i.lines:,} line{'' if i.lines == 1 else 's'})"
                           for i in report.inputs[:8])
        if len(report.inputs) > 8:
            inputs += f", … ({len(report.inputs)} inputs)"
        out += [f"Input: {inputs}", ""]
    if root is not None:
        out += _finding(root, "Root cause", launch=_launch(report), style=fix_style(report.framework, report.stack))
    secondary = [f for i, f in enumerate(report.findings) if i != report.root_cause and f.role != "cascade"]
    if secondary:
        body: list[str] = [""]
        for f in secondary:
            body += _finding(f, finding_label(f).capitalize(), root, style=fix_style(report.framework, report.stack))
        titles = ", ".join(f"{f.rule}" for f in secondary[:6]) + (" …" if len(secondary) > 6 else "")
        out += [f"### Other findings ({len(secondary)})", ""] + details(titles, body)
    cascades = [f for f in report.findings if f.role == "cascade"]
    if cascades:
        out += ["### Cascade (consequences)", ""]
        for f in cascades:
            text = collapsed_line(f, root if f.cause_of is not None else None)
            text += "".join(f"; {odd}" for odd in (silent_line(f, root), skew_line(f)) if odd)
            out.append(f"- {md_inline(text)} (`{inert(f.rule)}`, first at line {f.first_line})")
        out.append("")
    if report.hang is not None:
        out += _hang(report.hang)
    if report.config is not None:
        out += _section("Config", config_lines(report.config, report.stack), lang="yaml")
    style = fix_style(report.framework, report.stack)
    if report.replay is not None and replay_speaks_to(style):
        out += _section("Replay", replay_lines(report.replay, style), replay_summary(report.replay, style))
    if report.memory is not None:
        out += _section("Memory", [line for line, _ in memory_lines(report.memory)], report.memory.explanation)
    if report.slurm is not None:
        out += _section("Slurm", slurm_lines(report.slurm), lang="yaml")
    out += _verify(report.verify)
    if report.warnings:
        out += ["### Warnings", ""]
        out += [f"- {md_inline(w)}" for w in report.warnings]
        out.append("")
    return "\n".join(out).rstrip() + "\n"
