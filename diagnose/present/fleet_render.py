"""Render a ``FleetReport`` as text, markdown or JSON (``diagnose/fleet@1``). Every value that came from a log, a
file name or a job name goes through ``safe.inert`` (text, markdown) or ``ensure_ascii`` (JSON)."""

from __future__ import annotations

import time

from diagnose.fleet.report import FleetReport
from diagnose.present import json_text
from diagnose.present.safe import inert

MAX_ROWS = 20  # per table in text/markdown; JSON has everything


def render_json(report: FleetReport) -> str:
    return json_text.dumps(report.to_dict(), indent=2, ensure_ascii=True) + "\n"


def day(ts: float) -> str:
    """A store timestamp as "2026-11-29 12:00" (UTC): the fleet report's and the fleet screen's dates."""
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    cells = [[inert(c) for c in r] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(headers, *cells)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return out


def _sections(r: FleetReport) -> list[tuple[str, list[str], list[list[str]]]]:
    classes = [[c.signature, str(c.jobs), f"{c.gpu_hours:.1f}", day(c.first_seen), day(c.last_seen), c.trend,
                c.title[:70]] for c in r.classes[:MAX_ROWS]]
    nodes = [[n.node, str(n.jobs), str(n.failed), _pct(n.rate), f"{n.p_value:.2g}", "FLAG" if n.flagged else "",
              n.top_signature or ""] for n in r.nodes[:MAX_ROWS]]
    users = [[g.key, str(g.jobs), str(g.failed), _pct(g.rate), f"{g.top_signature or ''} ({g.top_count})"]
             for g in r.users[:MAX_ROWS]]
    configs = [[g.key, str(g.jobs), str(g.failed), _pct(g.rate), f"{g.top_signature or ''} ({g.top_count})"]
               for g in r.configs[:MAX_ROWS]]
    unreadable = [[u.job_id or u.job_key, u.source.split("\n")[0], u.problem[:100]]
                  for u in r.unreadable_jobs[:MAX_ROWS]]
    return [
        ("Root causes", ["CLASS", "JOBS", "GPU-H LOST", "FIRST SEEN (UTC)", "LAST SEEN", "TREND", "TITLE"], classes),
        ("Nodes", ["NODE", "JOBS", "FAILED", "RATE", "P-VALUE", "FLAG", "MOST COMMON"], nodes),
        ("Users", ["USER", "JOBS", "FAILED", "RATE", "MOST COMMON"], users),
        ("Configs (job names, digits and hex ids folded)", ["CONFIG", "JOBS", "FAILED", "RATE", "MOST COMMON"],
         configs),
        ("Unreadable logs", ["JOB", "SOURCE", "PROBLEM"], unreadable),
    ]


def _summary(r: FleetReport) -> list[str]:
    new = ", ".join(c.signature for c in r.new_signatures) or "none"
    return [
        f"{r.jobs} jobs ended {day(r.start)} .. {day(r.end)} UTC (last {r.since}): {r.failed} failed "
        f"({_pct(r.failed / r.jobs if r.jobs else 0)}), {r.unreadable} with unreadable logs, "
        f"{r.gpu_hours_lost:.1f} GPU-hours lost",
        f"New signatures (not seen before the window): {new}",
        f"Node test: {r.test}; fleet rate {_pct(r.fleet_rate)} (failures blamed on a node / job-node pairs), "
        f"alpha {r.alpha} over {len(r.nodes)} nodes, "
        f"at least {r.min_failures} failures",
    ]


def render_text(r: FleetReport) -> str:
    lines = [f"FLEET REPORT  {inert(line)}" if i == 0 else inert(line) for i, line in enumerate(_summary(r))]
    for title, headers, rows in _sections(r):
        lines += ["", title.upper()]
        lines += _table(headers, rows) if rows else ["  (none)"]
    drains = [n.drain_command for n in r.nodes if n.drain_command]
    lines += ["", "DRAIN (printed, never run; review first)"]
    lines += [f"  {inert(d)}" for d in drains] or ["  (no node flagged)"]
    return "\n".join(lines) + "\n"


def render_markdown(r: FleetReport) -> str:
    def cell(text: str) -> str:
        return inert(text).replace("|", "\\|")

    lines = ["# Fleet report", ""] + [f"- {cell(s)}" for s in _summary(r)]
    for title, headers, rows in _sections(r):
        lines += ["", f"## {title}", ""]
        if not rows:
            lines.append("(none)")
            continue
        lines.append("| " + " | ".join(headers) + " |")
        lines.append("|" + " --- |" * len(headers))
        lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    drains = [n.drain_command for n in r.nodes if n.drain_command]
    lines += ["", "## Drain (printed, never run)", ""]
    lines += ["```", *[inert(d) for d in drains], "```"] if drains else ["(no node flagged)"]
    return "\n".join(lines) + "\n"
