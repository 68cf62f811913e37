"""Write the report to a file: JSON or markdown by the file name's extension.

Uses the shared renderers (``diagnose.present.json_report`` / ``diagnose.present.markdown``), so the TUI exports
exactly what ``diagnose analyze --format json|markdown`` prints.
"""

from __future__ import annotations

import os

from diagnose.model import DiagnoseError, Report
from diagnose.present.json_report import render_json
from diagnose.present.markdown import render_markdown


def export_format(path: str) -> str:
    return "json" if path.lower().endswith(".json") else "markdown"


def export_report(report: Report, path: str) -> str:
    """Write the report to ``path``; returns the format written. One-line DiagnoseError when it cannot."""
    fmt = export_format(path)
    content = render_json(report) if fmt == "json" else render_markdown(report)
    try:
        with open(os.path.expanduser(path), "w", encoding="utf-8") as fh:
            fh.write(content)
    except OSError as e:
        raise DiagnoseError(f"cannot write {path}: {e.strerror or e}") from None
    return fmt
