"""Text of a verify section (``Report.verify`` / ``diagnose verify``): one line per check, its evidence below.

Everything from the log goes through ``safe.inert`` (the evidence lines are log text)."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from diagnose.explained import VerifyResult
from diagnose.present.safe import inert

_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "unknown": "magenta", "skip": "dim"}
_MARK = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "unknown": " ?? ", "skip": "SKIP"}


def verify_renderables(result: VerifyResult | None) -> list[Any]:
    if result is None:
        return []
    head = Text("\n")
    head.append("VERIFY (Megatron FSDP run)", style="bold underline")
    out: list[Any] = [head]
    run = {"wrapper": result.wrapper, "sharding_strategy": result.sharding_strategy, "dp_size": result.dp_size,
           "last_iteration": result.last_iteration, "train_iters": result.train_iters,
           "checkpoint_format": result.checkpoint_format}
    facts = [f"{k.replace('_', ' ')}: {inert(str(v))}" for k, v in run.items() if v is not None]
    if facts:
        out.append(Text("  " + "; ".join(facts), style="dim"))
    if result.release:
        out.append(Text("  release: " + inert(result.release), style="dim"))
    for check in result.checks:
        line = Text("  ")
        line.append(f"[{_MARK.get(check.verdict, check.verdict)}]", style=_STYLE.get(check.verdict, ""))
        line.append(" " + inert(check.title) + ": ")
        line.append(inert(check.detail))
        out.append(line)
        for e in check.evidence:
            ev = Text("         ", style="dim")
            ev.append(f"{inert(e.path)}:{e.line}: ", style="dim")
            ev.append(inert(e.text)[:300], style="dim")
            out.append(ev)
    if result.passes:
        out.append(Text("  all checks hold", style="bold green"))
    else:
        unknown = [c.name for c in result.checks if c.verdict == "unknown"]
        names = ", ".join(inert(n) for n in result.failed + unknown)
        out.append(Text(f"  does not hold: {names or 'warnings (strict)'}", style="bold red"))
    return out
