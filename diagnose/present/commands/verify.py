"""``diagnose verify LOG... [--format text|json] [--strict]``: did a run that finished really train with
Megatron FSDP (wrapper, strategy, DP size), keep a finite loss to its last iteration and write an fsdp_dtensor
checkpoint, and which performance fallbacks happened? Checks in ``diagnose.explain.verify``.

Exit codes: 0 every check holds (warnings allowed unless ``--strict``), 1 a check failed or is unknown, 2 bad input.
JSON: {"schema": "diagnose/verify@1", "inputs": [...], "root_cause": {...} | null, "verify": {...}}
(``diagnose schema verify``).
"""

from __future__ import annotations

from typing import Any

from diagnose.model import Report
from diagnose.present import json_text

SCHEMA = "diagnose/verify@1"
EXIT_OK, EXIT_FAIL = 0, 1


def _verified(paths: list[str], config: str | None, bridge_version: str | None, strict: bool,
              rules: list[str] | None) -> Report:
    from diagnose.pipeline import AnalyzeOptions, analyze

    options = AnalyzeOptions(rules_dirs=list(rules or []), config_path=config, bridge_version=bridge_version,
                             verify=True, strict=strict, split_jobs=False,  # one run, whatever its files hold
                             refuse_empty=True)  # as analyze: an empty log is an input error, not a failed run
    return analyze(list(paths), options)


def _payload(paths: list[str], report: Report) -> dict[str, Any]:
    root = report.root
    payload: dict[str, Any] = {
        "schema": SCHEMA,
        "inputs": list(paths),
        "root_cause": None if root is None else {"rule": root.rule, "title": root.title},
        "verify": report.verify.to_dict() if report.verify is not None else
        {"passes": False, "failed": [], "counts": {}, "run": {}, "checks": []},
    }
    if report.warnings:
        payload["warnings"] = list(report.warnings)
    return payload


def run(args: Any) -> int:
    from diagnose.present.output import hint_if_stdin_is_a_terminal, output_stream

    paths = list(args.paths)
    hint_if_stdin_is_a_terminal(paths)
    report = _verified(paths, getattr(args, "config", None), getattr(args, "bridge_version", None),
                       bool(getattr(args, "strict", False)), getattr(args, "rules", None))
    out_path = getattr(args, "output", None)
    with output_stream(out_path) as fh:
        if getattr(args, "format", "text") == "json":
            fh.write(json_text.dumps(_payload(paths, report), indent=2, default=str) + "\n")
        else:
            _print_text(fh, paths, report, getattr(args, "color", "auto") if not out_path else "never")
    return EXIT_OK if report.verify is not None and report.verify.passes else EXIT_FAIL


def _print_text(fh: Any, paths: list[str], report: Report, color: str) -> None:
    from rich.console import Group
    from rich.text import Text

    from diagnose.present.safe import inert
    from diagnose.present.text import make_console
    from diagnose.present.verify_text import verify_renderables

    console = make_console(fh, color)
    parts: list[Any] = [Text("diagnose verify: ", style="bold") + Text(inert(", ".join(paths)))]
    parts.extend(verify_renderables(report.verify))
    parts.extend(Text("warning: ", style="yellow") + Text(inert(w)) for w in report.warnings)
    console.print(Group(*parts), soft_wrap=False, highlight=False, markup=False, crop=False)
