"""The JSON report: exactly ``Report.to_dict()`` (schema ``diagnose/report@1``), nothing added or removed.

``ensure_ascii`` keeps every non-ASCII character escaped, so a bidi override or C1 control in a fact value cannot
reach a terminal that cats the file.
"""

from __future__ import annotations

from diagnose.model import Report
from diagnose.present.json_text import dumps


def render_json(report: Report) -> str:
    return dumps(report.to_dict(), indent=2, ensure_ascii=True, default=str) + "\n"
