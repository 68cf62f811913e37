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

from typing import Any

from diagnose.checking import ReplayRequest, fix_text, mlm_input, replay_config
from diagnose.explain.render import render_fix
from diagnose.present import json_text
from diagnose.present.output import output_stream, write_output

EXIT_OK, EXIT_FAIL = 0, 1


def run(args: Any) -> int:
    outcome = replay_config(ReplayRequest(args.config, list(getattr(args, "sets", None) or []),
                                          getattr(args, "bridge_version", None), getattr(args, "gpus", None)))
    if getattr(args, "format", "text") == "json":
        write_output(getattr(args, "output", None), json_text.dumps(outcome.to_dict(), indent=2, default=str) + "\n")
    else:
        _print_text(args, outcome.view, outcome.result, user=outcome.user_sets)
    return EXIT_OK if outcome.ok else EXIT_FAIL


def _print_text(args: Any, view: Any, result: Any, user: bool = True) -> None:
    from rich.text import Text

    from diagnose.present.safe import inert, inert_block
    from diagnose.present.text import make_console

    color = getattr(args, "color", "auto")
    out_path = getattr(args, "output", None)
    with output_stream(out_path) as fh:
        # the text report's console: a pipe or a file is never broken mid-phrase (qa-report-4 L11)
        console = make_console(fh, "never" if out_path else color)
        console.soft_wrap = True  # each line whole ("validated as: Megatron-Bridge ..." was broken mid-phrase)
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
        # an override Megatron-Bridge refuses (a key the config does not have) is no part of a fix: the violation
        # and the verdict say it was refused, and neither the fix line nor its Python/YAML forms repeat it
        refused = {k for v in result.after.violations if v.check == "override_unknown_key" for k in v.keys}
        # a field the release moved, set by your override, is refused too (Bridge >= 0.7 fails at start-up on it):
        # it is no fix either, and the migration the validator suggests is shown instead (the replay never undoes
        # a requested key itself)
        moves = result.migrations()  # JSON says the same: the migration is its fix, the key in "replaced"
        refused |= {o.key for move, _ in moves for o in move}
        shown = [o for o in result.fix if o.key not in refused]
        rendered = result.rendered if not refused else render_fix(shown, result.framework) if shown else {}
        kept = [o for o in given if o.key not in refused]
        mlm = mlm_input(view)  # a Megatron-LM argument list: its flags, as check writes them, not Bridge forms
        if shown:
            label = ("fix: " if user else f"fix (the root cause {result.rule}'s): ") if kept else \
                "fix (suggested by the validator): "
            fix = Text(label, style="bold")
            for i, line in enumerate([fix_text(shown, True)] if mlm else fix_lines(rendered)):
                fix.append(("\n" + " " * len(label) if i else "") + inert(line))
            if result.added and kept:
                extension = fix_text(result.added, True) if mlm else "; ".join(
                    fix_lines(render_fix(result.added, result.framework)))
                fix.append("  (extended with: " + inert(extension) + ")", style="yellow")
            console.print(fix, soft_wrap=True)  # command lines: never hard-wrapped (copy-paste)
        if result.fix:
            console.print(_violations_text("with the fix" if shown else "with your overrides",
                                            result.after.violations))
        for move, rest in moves:  # your override is dropped, not deleted from a config that never had it
            if rest:
                console.print(Text(f"instead of {inert(', '.join(o.key for o in move))} (suggested by the validator): ",
                                   style="bold")
                              + Text(inert(fix_text(rest, True) if mlm else
                                           "; ".join(fix_lines(render_fix(rest, result.framework))))))
        for note in result.after.notes:
            console.print(Text("note: ", style="cyan") + Text(inert(note.message)))
        console.print(_verdict(result, given if user else []))
        if result.fits is not None and result.fit is not None:
            console.print(Text("memory: ", style="bold") + Text(_fit_line(result.fit),
                                                                  style="green" if result.fits else "red"))
        elif result.fit is not None and result.fit.notes:
            console.print(Text("memory: ", style="bold") + Text(inert(result.fit.notes[0]), style="yellow"))
        if shown:
            for key in ("mlm", "env") if mlm else ("python", "yaml", "env", "mlm"):
                if rendered.get(key):
                    console.print(Text(f"{key}:", style="bold"))
                    console.print(Text(inert_block(rendered[key]).rstrip("\n")), soft_wrap=True)  # code: never wrapped


def fix_lines(render: dict[str, str]) -> list[str]:
    """A rendered fix (``diagnose.explain.render.render_fix``) as the lines a person applies, in order: the
    ``export`` lines for the launch script, then the Bridge CLI words; the launch note when the fix is only a GPU
    count."""
    lines = [*(render.get("env") or "").splitlines(), *([render["cli"]] if render.get("cli") else [])]
    if not lines and render.get("launch"):
        lines = [render["launch"]]
    return lines


def _fit_line(fit: Any) -> str:
    from diagnose.units import fmt_gib

    if fit.fits:
        need = (f"needs >= {fit.gpus} GPUs ({fit.layout or f'DP {fit.dp}'}; the job ran on {fit.job_gpus}), "
                if fit.more_gpus else "")
        return f"{fit.fits_text}: {need}{fit.peak_words(after_fits_text=True)}"
    if fit.peak_bytes:
        return f"does not fit: {fmt_gib(fit.peak_bytes, 1)} per GPU of {fmt_gib(fit.capacity_bytes, 1)}"
    return f"does not fit: the memory model finds nothing that fits in {fmt_gib(fit.capacity_bytes, 1)}"


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
