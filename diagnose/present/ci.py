"""Report formats for CI: GitHub Actions annotations, JSON lines (one finding per line) and SARIF 2.1.0.

Each shows the findings that matter (root cause first, then the others; the collapsed cascade is left out, as in
the text report). Text from a log is made inert first; GitHub's workflow-command escapes keep a message on one
command line, so a log cannot issue a workflow command of its own.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from diagnose import __version__
from diagnose.explain.render import fix_one_line, fix_style
from diagnose.inert import no_ci_commands_inside
from diagnose.model import Finding, Report
from diagnose.present import json_text
from diagnose.present.safe import inert

LEVELS = {"error": "error", "warning": "warning"}  # anything else is a notice / note


def _per_job(report: Report) -> list[tuple[str | None, Report]]:
    """(job label, report) for each job of the inputs; (None, report) for inputs of one job."""
    return [(j.label, j.report) for j in report.jobs] if report.jobs else [(None, report)]


def _shown(report: Report) -> list[tuple[Finding, bool]]:
    """(finding, is_root) for the root cause and the non-cascade findings, root first."""
    first = [(report.root, True)] if report.root is not None else []
    return first + [(f, False) for i, f in enumerate(report.findings) if i != report.root_cause and f.role != "cascade"]


def _fix(f: Finding, report: Report) -> str | None:
    """The finding's fix as one line in the job's words (render.fix_one_line, as the text report decides them)."""
    return fix_one_line(f.shown_fix, fix_style(report.framework, report.stack))


def _message(f: Finding, is_root: bool, report: Report) -> str:
    text = ("root cause: " if is_root else "") + f.title
    if fix := _fix(f, report):
        text += f". Fix: {fix}"
    return inert(text)


def _where(f: Finding) -> tuple[str | None, int | None]:
    """Where the finding is: the line its rule first matched, as the text report's "first at line N" and -q say
    (not the last evidence line: a third NaN-loss line, a frame shown after the message)."""
    e = f.headline_evidence
    return (None, None) if e is None else (e.path, e.line)


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(report: Report) -> str:
    """``::error file=…,line=…,title=…::message`` lines, one per finding (GitHub Actions workflow commands)."""
    lines = []
    for job, one in _per_job(report):
        prefix = f"{job}: " if job else ""
        for f, is_root in _shown(one):
            level = LEVELS.get(f.severity, "notice")
            path, line = _where(f)
            props = [f"title={_gh_property(inert(f.rule + ' ' + f.title))}"]
            if path and path != "-":
                props.insert(0, f"file={_gh_property(inert(path))}")
                if line:
                    props.insert(1, f"line={line}")
            lines.append(f"::{level} {','.join(props)}::{_gh_data(inert(prefix) + _message(f, is_root, one))}")
        if one.root is None:
            lines.append(f"::notice title=diagnose::{_gh_data(inert(prefix))}no failure found")
    # each line is one command of ours: a "##[" in a file name or a job's label (the user's own) must not make it
    # another (the runner reads the legacy form anywhere in a line); a "::" there is inside it, ":" escaped in a
    # property
    return no_ci_commands_inside("\n".join(lines)) + "\n"


def render_jsonl(report: Report) -> str:
    """One JSON object per finding: rule, role, severity, title, path, line, ranks, fix (one line in the job's
    words: Megatron-LM flags, Bridge CLI words, or the rule's summary for a job of another stack)."""
    out = []
    for job, one in _per_job(report):
        for f, is_root in _shown(one):
            path, line = _where(f)
            row = {
                "rule": f.rule, "root_cause": is_root, "role": f.role, "severity": f.severity,
                "category": f.category, "phase": f.phase, "title": f.title, "path": path, "line": line,
                "ranks": list(f.ranks),
                "fix": _fix(f, one),
            }
            if job:
                row["job"] = job  # inputs of several jobs: which job's finding
            out.append(json_text.dumps(row, ensure_ascii=False))
    return "\n".join(out) + ("\n" if out else "")


def _uri(path: str) -> str:
    """SARIF's ``artifactLocation.uri`` is a URI reference (RFC 3986), not a path: a space, ``%``, ``#`` or ``?`` in
    a log's name made it invalid or named another file (``a%20b.log`` read as ``a b.log``, ``run#2.log`` as
    ``run`` and a fragment). Percent-encoded; an absolute path as a ``file://`` URI, a relative one stays relative
    (code scanning resolves it against the checkout)."""
    encoded = quote(path, safe="/", errors="surrogateescape")
    return "file://" + encoded if path.startswith("/") else encoded


def render_sarif(report: Report) -> str:
    """A SARIF 2.1.0 log: one run of the ``diagnose`` tool, a result per finding with its evidence location."""
    rules: dict[str, dict[str, Any]] = {}
    results = []
    shown = [(job, one, f, is_root) for job, one in _per_job(report) for f, is_root in _shown(one)]
    for job, one, f, is_root in shown:
        rules.setdefault(f.rule, {"id": f.rule, "name": f.name or f.rule,
                                  "shortDescription": {"text": inert(f.title)},
                                  "help": {"text": f"diagnose rules show {f.rule}"}})
        result: dict[str, Any] = {"ruleId": f.rule, "level": LEVELS.get(f.severity, "note"),
                                  "message": {"text": _message(f, is_root, one)},
                                  "properties": {"root_cause": is_root, "role": f.role, "phase": f.phase,
                                                 "ranks": list(f.ranks), **({"job": job} if job else {})}}
        path, line = _where(f)
        if path and path != "-":
            region = {"startLine": line} if line else {}
            result["locations"] = [{"physicalLocation": {"artifactLocation": {"uri": _uri(path)}, **(
                {"region": region} if region else {})}}]
        results.append(result)
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "diagnose", "version": __version__,
                                      "rules": list(rules.values())}},
                  "results": results}],
    }
    return json_text.dumps(log, indent=2, ensure_ascii=False) + "\n"
