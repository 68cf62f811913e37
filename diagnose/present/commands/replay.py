"""``diagnose replay CONFIG [--set k=v ...] [--bridge-version X] [--gpus N] [--format text|json]``.

CONFIG is a Megatron-Bridge YAML (``run_config.yaml``), a Megatron-LM arguments dump or argument list, or a log.
The config is validated as is, then with the ``--set`` overrides; a fix that trips another check is extended
until it passes (or no compatible fix is known), and the complete set is printed.
Exit codes: 0 the config with the requested overrides passes as is (and, on a CUDA OOM log, fits per the memory
model), 1 it has violations (the output then shows the extended fix, if one passes) or does not fit, 2 bad input.
JSON: {"schema": "diagnose/replay@1", "config": {...}, "replay": {...}, "requested_passes": bool}
(sections as in the analyze report).
"""

from __future__ import annotations

import json
from typing import Any

from diagnose.explain.render import render_fix
from diagnose.model import DiagnoseError

SCHEMA = "diagnose/replay@1"
EXIT_OK, EXIT_FAIL = 0, 1


def run(args: Any) -> int:
    from diagnose.explain.config import apply_defaults, normalize_overrides
    from diagnose.explain.config.extract import load_config, looks_like_log_file
    from diagnose.explain.replay import replay

    overrides = normalize_overrides(getattr(args, "sets", None) or [])
    from diagnose.explain.config.keycheck import check_overrides

    check_overrides(overrides)
    finding = None
    fit = None
    report = None
    if looks_like_log_file(args.config):
        view, report = _from_log(args.config)
        finding = report.root
        if not overrides and finding is not None:
            from diagnose.explain import fix_overrides
            from diagnose.explain.fit import capacity_fix

            fit = capacity_fix(report, view)  # a capacity OOM: the memory model's fitting option, as in analyze
            overrides = fit.overrides if fit is not None else fix_overrides(finding)  # the root cause's own fix
    else:
        view = load_config(args.config, defaults=False)
    if getattr(args, "bridge_version", None):
        view.version = args.bridge_version
    gpus = getattr(args, "gpus", None)
    if gpus is not None:
        if gpus <= 0:
            raise DiagnoseError(f"--gpus {gpus}: must be at least 1")
        view.set("launch.world_size", gpus, "override")
    apply_defaults(view)
    result = replay(view, overrides, view.version, finding=finding)
    if fit is not None:
        from diagnose.explain.fit import apply_fit

        apply_fit(result, fit)
    elif finding is not None and report is not None and finding.category == "cuda_oom":
        # the rule's fix or the user's --set on an OOM log: checked against the same memory model as analyze
        from diagnose.explain.fit import apply_memory_fit, memory_fit

        apply_memory_fit(result, memory_fit(report, view, result.fix, finding))
    requested_passes = result.requested is not None and result.requested.passes
    payload = {"schema": SCHEMA, "config": view.to_dict(), "replay": result.to_dict(),
               "requested_passes": requested_passes}
    if getattr(args, "format", "text") == "json":
        text = json.dumps(payload, indent=2, default=str) + "\n"
        _write(args, text)
    else:
        _print_text(args, view, result, user=bool(getattr(args, "sets", None)))
    # One meaning for a log and a config (issue 16): 0 when what you replay (the config as given, with your --set)
    # passes validation and, on an OOM log, fits; a log replayed without --set is the job's own config, which
    # failed: 1, like analyze, even when the fix shown is proven (the output says so).
    if report is not None and not getattr(args, "sets", None) and report.root is not None:
        return EXIT_FAIL
    return EXIT_OK if requested_passes and result.fits is not False else EXIT_FAIL


def _from_log(path: str) -> tuple[Any, Any]:
    """A log: scan it with the engine for the config blocks and the root cause (whose failure replay should
    reproduce); a log with neither is bad input."""
    from diagnose.explain import build_view
    from diagnose.ingest import open_inputs
    from diagnose.match import load_catalogue, scan_and_match

    catalogue = load_catalogue([])
    with open_inputs([path]) as sources:
        result = scan_and_match(sources, catalogue)
    report = result.report
    view = build_view(report, result.blocks, None)
    implied = any(v.origin.startswith("implied:") for v in view.values.values())
    oom = report.root is not None and report.root.category == "cuda_oom"
    if not (view.config_known or implied or oom):
        raise DiagnoseError(f"no configuration found in {path} (no config block, arguments dump, launch line, "
                            "or error message that states settings)")
    if oom:
        from diagnose.explain import _run_memory

        _run_memory(report, view, None)  # the memory verdict decides a CUDA OOM's fix, as in analyze
    return view, report


def _write(args: Any, text: str) -> None:
    from diagnose.present.output import write_output

    write_output(getattr(args, "output", None), text)


def _print_text(args: Any, view: Any, result: Any, user: bool = True) -> None:
    from rich.console import Console
    from rich.text import Text

    from diagnose.present.safe import inert, inert_block

    color = getattr(args, "color", "auto")
    from diagnose.present.output import output_stream

    out_path = getattr(args, "output", None)
    with output_stream(out_path) as fh:
        console = Console(
            file=fh,
            no_color=color == "never" or bool(out_path),
            force_terminal=True if color == "always" else None,
            highlight=False,
        )
        if result.rule:
            console.print(Text("root cause: ", style="bold") + Text(inert(result.rule)))
        head = Text("config: ", style="bold")
        head.append(inert(", ".join(view.sources) or "(nothing recovered)"))
        head.append(f"  framework: {view.framework or 'unknown'}")
        if view.framework != "megatron-lm":
            head.append(f"  validated as: {inert(result.before.assumed_release)}")
        console.print(head)
        console.print(_violations_text("as given", result.before.violations))
        given = [o for o in result.fix if not any(o is a for a in result.added)]
        if result.fix:
            label = ("fix: " if user else f"fix (the root cause {result.rule}'s): ") if given else \
                "fix (suggested by the validator): "
            fix = Text(label, style="bold")
            for i, line in enumerate(fix_lines(result.rendered)):
                fix.append(("\n" + " " * len(label) if i else "") + inert(line))
            if result.added and given:
                extension = "; ".join(fix_lines(render_fix(result.added, result.framework)))
                fix.append("  (extended with: " + inert(extension) + ")", style="yellow")
            console.print(fix, soft_wrap=True)  # command lines: never hard-wrapped (copy-paste)
            console.print(_violations_text("with the fix", result.after.violations))
        for note in result.after.notes:
            console.print(Text("note: ", style="cyan") + Text(inert(note.message)))
        console.print(_verdict(result, given if user else []))
        if result.fits is not None and result.fit is not None:
            console.print(Text("memory: ", style="bold") + Text(_fit_line(result.fit),
                                                                  style="green" if result.fits else "red"))
        elif result.fit is not None and result.fit.notes:
            console.print(Text("memory: ", style="bold") + Text(inert(result.fit.notes[0]), style="yellow"))
        if result.fix:
            render = result.rendered
            for key in ("python", "yaml", "env", "mlm"):
                if render.get(key):
                    console.print(Text(f"{key}:", style="bold"))
                    console.print(Text(inert_block(render[key]).rstrip("\n")), soft_wrap=True)  # code: never wrapped


def fix_lines(render: dict[str, str]) -> list[str]:
    """A rendered fix (``diagnose.explain.render.render_fix``) as the lines a person applies, in order: the
    ``export`` lines for the launch script, then the Bridge CLI words; the launch note when the fix is only a GPU
    count."""
    lines = [*(render.get("env") or "").splitlines(), *([render["cli"]] if render.get("cli") else [])]
    if not lines and render.get("launch"):
        lines = [render["launch"]]
    return lines


def _fit_line(fit: Any) -> str:
    from diagnose.explain.fit import gib

    if fit.fits:
        need = (f"needs >= {fit.gpus} GPUs ({fit.layout or f'DP {fit.dp}'}; the job ran on {fit.job_gpus}), "
                if fit.more_gpus else "")
        peak = (f"predicted peak {gib(fit.peak_bytes)} per GPU of {gib(fit.capacity_bytes)}" if fit.peak_bytes
                else "the reserved-but-unallocated memory would have served the request")
        return f"fits: {need}{peak}"
    if fit.peak_bytes:
        return f"does not fit: {gib(fit.peak_bytes)} per GPU of {gib(fit.capacity_bytes)}"
    return f"does not fit: the memory model finds nothing that fits in {gib(fit.capacity_bytes)}"


def _verdict(result: Any, given: list) -> Any:
    """One line: what the config as given, the user's overrides and the complete fix each do (exit code 1 unless
    the requested overrides pass on their own: the complete fix above is then what to use)."""
    from rich.text import Text

    from diagnose.present.safe import inert

    tripped = []
    if given and result.requested is not None:
        before = {(v.check, v.message) for v in result.before.violations}
        tripped = [v.check for v in result.requested.violations if (v.check, v.message) not in before]
    if result.requested is not None and result.requested.passes:
        return Text("passes validation" + (" with your overrides" if given else ""), style="bold green")
    if tripped:
        head = "your overrides trip " + inert(", ".join(dict.fromkeys(tripped)))
        if result.passes:
            return Text(f"{head}; passes with the complete fix above", style="bold yellow")
        return Text(f"{head}; no complete fix found", style="bold red")
    if result.passes:
        return Text("fails as given; passes with the complete fix above", style="bold yellow")
    return Text("fails validation; no complete fix found", style="bold red")


def _violations_text(label: str, violations: list) -> Any:
    from rich.text import Text

    from diagnose.present.safe import inert

    if not violations:
        return Text(f"{label}: no violations", style="green")
    t = Text(f"{label}: {len(violations)} violation(s)", style="red")
    for v in violations:
        t.append("\n  ")
        t.append(inert(v.check), style="bold")
        t.append(": " + inert(v.message))
    return t
