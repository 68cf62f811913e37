"""Write the report to a file: JSON (``Report.to_dict``) or markdown, by the file name's extension.

Uses the shared renderers ``diagnose.present.json_report`` / ``diagnose.present.markdown`` when they are there,
so the TUI exports exactly what ``diagnose analyze --format`` prints; a plain built-in rendering otherwise.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Callable

from diagnose.model import DiagnoseError, Report
from diagnose.present.tui.fixrender import render_fix
from diagnose.present.tui.fmt import rank_phrase


def _shared_renderer(module: str, names: tuple[str, ...]) -> Callable[[Report], str] | None:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    for name in names:
        fn = getattr(mod, name, None)
        if callable(fn):
            return fn
    return None


def report_json(report: Report) -> str:
    shared = _shared_renderer("diagnose.present.json_report", ("render", "render_json", "to_json"))
    if shared is not None:
        return shared(report)
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False, default=str) + "\n"


def report_markdown(report: Report) -> str:
    shared = _shared_renderer("diagnose.present.markdown", ("render", "render_markdown", "to_markdown"))
    if shared is not None:
        return shared(report)
    return _fallback_markdown(report)


def _fence(text: str, lang: str = "") -> str:
    body = text.replace("```", "` ` `")
    return f"```{lang}\n{body}\n```"


def _fallback_markdown(report: Report) -> str:
    out = ["# diagnose report", ""]
    out += [f"- input: `{i.path}` ({i.bytes:,} bytes, {i.lines:,} lines)" for i in report.inputs]
    if not report.findings:
        out += ["", "No failure found."]
    for n, f in enumerate(report.findings):
        tag = "Root cause" if n == report.root_cause else f.role.capitalize()
        out += ["", f"## {tag}: {f.title} ({f.rule})", ""]
        who = rank_phrase(f.ranks, f.hosts, f.count)
        out.append(f"{f.category} · phase {f.phase} · {f.severity}" + (f" · {who}" if who else ""))
        if f.explanation:
            out += ["", f.explanation.strip()]
        if f.evidence:
            out += ["", _fence("\n".join(f"{e.path}:{e.line}: {e.text}" for e in f.evidence[:12]))]
        rendered = render_fix(report, f)
        if f.fix.summary:
            out += ["", f"**Fix** ({f.fix.safety}): {f.fix.summary}"]
        if rendered.forms.get("cli"):
            out += ["", _fence(rendered.forms["cli"], "shell"), "", rendered.verdict]
        out += [f"- {s}" for s in f.fix.steps]
    if report.warnings:
        out += ["", "## Warnings", ""] + [f"- {w}" for w in report.warnings]
    return "\n".join(out) + "\n"


def export_report(report: Report, path: str) -> str:
    """Write the report to ``path``; returns the format written. One-line DiagnoseError when it cannot."""
    fmt = "json" if path.lower().endswith(".json") else "markdown"
    content = report_json(report) if fmt == "json" else report_markdown(report)
    target = os.path.expanduser(path)
    try:
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(content)
    except OSError as e:
        raise DiagnoseError(f"cannot write {path}: {e.strerror or e}") from None
    return fmt
