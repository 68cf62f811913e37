"""Text of a verify section (``Report.verify`` / ``diagnose verify``): one line per check, its evidence below.

Everything from the log goes through ``safe.inert`` (the evidence lines are log text)."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from diagnose.present.safe import inert

_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "unknown": "magenta", "skip": "dim"}
_MARK = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "unknown": " ?? ", "skip": "SKIP"}


def verify_renderables(section: dict[str, Any] | None) -> list[Any]:
    if not section:
        return []
    passes = bool(section.get("passes"))
    head = Text("\n")
    head.append("VERIFY (Megatron FSDP run)", style="bold underline")
    out: list[Any] = [head]
    run = section.get("run") or {}
    facts = [f"{k.replace('_', ' ')}: {inert(str(v))}" for k, v in run.items() if v is not None]
    if facts:
        out.append(Text("  " + "; ".join(facts), style="dim"))
    if section.get("assumed_release"):
        out.append(Text("  release: " + inert(str(section["assumed_release"])), style="dim"))
    for check in section.get("checks") or []:
        verdict = str(check.get("verdict"))
        line = Text("  ")
        line.append(f"[{_MARK.get(verdict, verdict)}]", style=_STYLE.get(verdict, ""))
        line.append(" " + inert(str(check.get("title"))) + ": ")
        line.append(inert(str(check.get("detail"))))
        out.append(line)
        for e in check.get("evidence") or []:
            ev = Text("         ", style="dim")
            ev.append(f"{inert(str(e.get('path')))}:{e.get('line')}: ", style="dim")
            ev.append(inert(str(e.get("text")))[:300], style="dim")
            out.append(ev)
    failed = section.get("failed") or []
    unknown = [c.get("name") for c in section.get("checks") or [] if c.get("verdict") == "unknown"]
    if passes:
        out.append(Text("  all checks hold", style="bold green"))
    else:
        names = ", ".join(inert(str(n)) for n in failed + unknown)
        out.append(Text(f"  does not hold: {names or 'warnings (strict)'}", style="bold red"))
    return out
