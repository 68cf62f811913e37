"""The config and Slurm sections of the -v text report and the markdown report, read from their typed objects
(``ConfigView``, ``SlurmFacts``) as indented ``key: value`` lines, YAML-like; plain strings, made inert by the
caller. Empty fields are left out at the top (JSON keeps them); values read ``true`` / ``false`` / ``null``.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from diagnose.configview import ConfigView
from diagnose.model import SlurmFacts
from diagnose.units import format_bytes

# a view with this many values from release defaults counts them instead of listing them
HIDE_DEFAULTS_FROM = 8
# a list or mapping value longer than this is cut (with …): the JSON report keeps it whole
SCALAR_WIDTH = 160


def config_lines(view: ConfigView, stack: str | None = None) -> list[str]:
    """Where the values were read, framework and release, then each value with its origin (``key: v  (log:12)``);
    a view that has nothing from the job lists no values (release defaults alone say nothing about it).

    ``stack`` (the report's: the packages its tracebacks name) answers another question than ``framework`` (how
    the printed config reads); where both are known and differ, the section says both, so that a config read as
    Megatron-LM beside a fix in Megatron-Bridge words (render.fix_style: Bridge's frames decide) is explained, not a
    contradiction (qa-report-17 L7)."""
    lines = _list_lines("source", view.sources, "")
    for name, text in (("framework", view.framework), ("version", view.version)):
        lines += _field_lines(name, text, "") if text else []
        if name == "framework" and text and stack and stack != text:
            lines.append(f"stack: {stack}  (the packages its tracebacks ran; framework is how the config reads)")
    shown = sorted(view.values.items()) if view.known() else []
    if shown:
        lines.append("values:")
        hide = len(shown) >= HIDE_DEFAULTS_FROM
        hidden = sum(1 for _, v in shown if hide and v.origin == "default")
        lines += [f"  {key}: {_scalar(v.value)}  ({v.origin})" for key, v in shown
                  if not (hide and v.origin == "default")]
        if hidden:
            lines.append(f"  … {hidden} more at their defaults")
    return lines


def slurm_lines(slurm: SlurmFacts) -> list[str]:
    """Every field Slurm reported, in the dataclass's order, its steps and output files as nested lists; the
    largest step's MaxRSS in binary units."""
    return [line for f in fields(slurm) if (value := getattr(slurm, f.name)) not in (None, "", [])
            for line in _field_lines(f.name, value, "")]


def _field_lines(name: str, value: Any, pad: str) -> list[str]:
    if isinstance(value, list):
        return _list_lines(name, value, pad)
    if isinstance(value, str) and "\n" in value:
        return [f"{pad}{name}: |"] + [f"{pad}    {ln}" for ln in value.splitlines()]
    if name == "max_rss_bytes" and isinstance(value, int):
        return [f"{pad}{name}: {format_bytes(value)}"]
    return [f"{pad}{name}: {_scalar(value)}"]


def _list_lines(name: str, items: list[Any], pad: str) -> list[str]:
    """``name:`` then one ``- item`` line per item; a record's fields go under its dash, one line each."""
    if not items:
        return []
    lines = [f"{pad}{name}:"]
    for item in items:
        if isinstance(item, str):
            lines.append(f"{pad}  - {item}")
            continue
        record = [ln for f in fields(item) for ln in _field_lines(f.name, getattr(item, f.name), pad + "    ")]
        lines += [f"{pad}  - {record[0].lstrip()}", *record[1:]]
    return lines


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list, tuple)):
        # spelt out as the JSON has it ("['core_attn']" is not "[]": an empty recompute_modules recomputes nothing)
        text = json.dumps(v, default=str, ensure_ascii=False)
        return text if len(text) <= SCALAR_WIDTH else text[:SCALAR_WIDTH - 1] + "…"
    return str(v)
