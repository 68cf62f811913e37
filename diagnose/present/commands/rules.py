"""``diagnose rules list | show CODE | lint``: the rules catalogue as a user sees it.

* ``list`` prints every rule (built-in, then ``--rules`` folders) as a table, or JSON with ``--format json``.
* ``show CODE`` prints the rule's documentation page: what it means, why, the fix and its safety, the patterns and
  the examples (example log text is made inert before it is shown).
* ``lint`` checks the catalogue (see ``diagnose.match.lint``); exit 0 when clean, 1 when a problem was found.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from diagnose.match.rules import Catalogue, Context, Pattern, Rule, default_rules_dir, load_catalogue
from diagnose.model import DiagnoseError
from diagnose.present.safe import inert, inert_block

EXIT_OK, EXIT_PROBLEMS = 0, 1

SAFETY_MEANING = {
    "safe": "safe: no change to numerics or speed",
    "unsafe": "unsafe: changes numerics, speed or the checkpoint format; review before applying",
    "manual": "manual: needs a person (an environment, a node, a path); nothing to apply automatically",
}


# What each [rule.context] condition asks, for `rules show` (a condition missing here is still shown, by its name)
CONTEXT_MEANING = {
    "frames_any": "the line's traceback has a frame containing one of these",
    "frames_none": "and no frame containing one of these",
    "before_any": "a line of the same input before it contains one of these",
    "before_window": "how many lines back before_any looks",
    "also_before_any": "and a line within the same window also contains one of these",
    "not_on_command_line": "the command line that ran the program has none of the options in this capture",
    "pinned_on_command_line": "the command line that typed the option in this capture runs a version-tagged image",
    "config_hidden_by_launcher": "the launcher's own rank option hid the lone config file from the script (true), "
                                 "or did not (false)",
    "levels_any": "the log level taken off the line's prefix is one of these",
    "after_progress": "only once the job showed training progress before the line",
    "refused_unlike_listed": "the name the line refused is unlike every name it lists (true), or is not (false)",
    "after_none": "no later line of the same input contains one of these",
    "after_any": "a later line of the same input contains one of these",
    "none_anywhere": "no line of the same input, before or after it, contains one of these",
    "near_end": "the line is among the last N lines of its input: still going on when the output stopped",
    "traceback_ends_with": "the finding is the line ending the traceback this header starts, when it matches this",
}
PATTERN_MEANING = {
    "levels_any": CONTEXT_MEANING["levels_any"],
    "fault_on": "where the failure this wording reports is, over the rule's fault_on",
    "relays": "a wrapper's report of the command's failure: the command's own error (another pattern) leads it",
}
REPORTS_MEANING = {
    "own_death": "the line is the process's own fatal signal, caught by a library: the launcher's report of it is "
                 "the same death",
    "link_failure": "a link that failed mid-run: no device fault, an NCCL error before it stays the root cause",
}
FAULT_ON_MEANING = {
    "own_node": "the node's own failure (the error names no peer)",
    "other_node": "what another node's failure did to this one (a peer gone, a reset, a timeout)",
}


def run(args: Any) -> int:
    action = getattr(args, "rules_command", None)
    user_dirs = list(getattr(args, "rules", None) or [])
    if action == "list":
        return _list(load_catalogue(user_dirs), getattr(args, "format", "text"))
    if action == "show":
        return _show(load_catalogue(user_dirs), args.code)
    if action == "lint":
        return _lint(user_dirs, only_user=bool(getattr(args, "only_user", False)))
    raise DiagnoseError("rules: choose an action: list, show CODE or lint")


# ------------------------------------------------------------------------------------------------- list


def rule_summary(rule: Rule) -> dict[str, Any]:
    """One rule as a plain dict (the ``rules list --format json`` record)."""
    fields = ("code", "slug", "title", "category", "phase", "severity", "role", "confidence")
    return {**{name: getattr(rule, name) for name in fields}, "fix_safety": rule.fix.safety,
            "versions": rule.versions, "source": _source_name(rule.source)}


def _source_name(source: str) -> str:
    """The built-in files by name only; a user's files as given."""
    try:
        builtin = default_rules_dir().resolve()
        p = Path(source).resolve()
        if p.parent == builtin:
            return p.name
    except (DiagnoseError, OSError):
        pass
    return source


def _list(catalogue: Catalogue, fmt: str) -> int:
    if fmt == "json":
        json.dump([rule_summary(r) for r in catalogue.rules], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for col in ("code", "category", "phase", "role", "title"):
        table.add_column(col, no_wrap=col != "title", overflow="fold")
    for r in catalogue.rules:
        table.add_row(*(Text(inert(v)) for v in (r.code, r.category, r.phase, r.role, r.title)))
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        # piped (grep, a file) with no width asked for: one line per rule, its title whole, so that
        # `diagnose rules list | grep timeout` finds every rule whose title says so
        console = Console(highlight=False, soft_wrap=False, width=10_000)
    from diagnose.present.text import _RStripped

    console.print(_RStripped(table))  # a table pads every cell: no trailing blanks for a copy or a diff
    console.print(Text(f"{len(catalogue.rules)} rules", style="dim"))
    return EXIT_OK


# ------------------------------------------------------------------------------------------------- show


def find_rule(catalogue: Catalogue, code: str) -> Rule:
    wanted = code.strip().upper()
    for r in catalogue.rules:
        if r.code.upper() == wanted or r.slug == code.strip():
            return r
    import difflib

    codes = [r.code for r in catalogue.rules]
    close = difflib.get_close_matches(wanted, codes, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise DiagnoseError(f"no rule {inert(code)!r} in the catalogue ({hint}see 'diagnose rules list')")


def render_show(rule: Rule) -> list[Any]:
    """The rule's doc page as rich renderables (Text and Markdown), every catalogue string made inert."""
    from rich.markdown import Markdown
    from rich.text import Text

    from diagnose.explain.render import cli_token, env_line

    out: list[Any] = []
    head = Text()
    head.append(inert(rule.code), style="bold")
    head.append("  ")
    head.append(inert(rule.title), style="bold")
    out.append(head)
    meta = (
        f"{rule.slug} · category {rule.category} · phase {rule.phase} · {rule.severity} · role {rule.role} · "
        f"confidence {rule.confidence:g}"
    )
    out.append(Text(inert(meta), style="dim"))
    if rule.versions:
        out.append(Text(f"versions: {inert(rule.versions)}", style="dim"))
    out.append(Text(f"file: {inert(_source_name(rule.source))}", style="dim"))
    for name, meaning in (("reports", REPORTS_MEANING), ("fault_on", FAULT_ON_MEANING)):
        value = getattr(rule, name)
        if value in meaning:
            out.append(Text(f"{name} = {inert(value)}: {meaning[value]}", style="dim"))

    out.append(Text("\nIn short", style="bold underline"))
    out.append(Text(inert_block(reflow(rule.explanation))))
    if rule.doc:
        out.append(Text("\nDetails", style="bold underline"))
        out.append(Markdown(inert_block(rule.doc)))

    out.append(Text("\nFix", style="bold underline"))
    fix = rule.fix
    if fix.summary:
        out.append(Text(inert_block(fix.summary)))
    out.append(Text(f"safety: {SAFETY_MEANING.get(fix.safety, fix.safety)}", style="italic"))
    out.extend(Text(f"  {inert(cli_token(o))}", style="green") for o in fix.overrides)
    out.extend(Text(f"  {inert(env_line(e.name, e.value))}", style="green") for e in fix.env)
    out.extend(Text(f"  - {inert(s)}") for s in fix.steps)

    if rule.input == "slurm_job":
        out.append(Text("\nReads", style="bold underline"))
        out.append(Text(f"  the job's Slurm record (scontrol, sacct): outcome {inert(rule.slurm_outcome)}"))
    elif rule.input == "slurm_node":
        out.append(Text("\nReads", style="bold underline"))
        states = ", ".join(rule.node_states_any) or "any out-of-service state (DOWN, DRAIN, FAIL, ...)"
        out.append(Text(f"  the State and Reason of the job's nodes (scontrol show node): state {inert(states)}"))
        out.extend(Text(f"  reason   {inert(r)}", style="dim") for r in rule.node_reason_any)
    elif rule.input == "loss_series":
        out.append(Text("\nReads", style="bold underline"))
        out.append(Text("  the loss series the log prints (train and eval losses by step); made only when nothing else"
                        " is the root cause"))
    else:
        out.append(Text("\nPatterns", style="bold underline"))
    if rule.explains:
        out.append(Text(f"explains {inert(', '.join(rule.explains))}: when that finding is made, this line is its"
                        " cause (its category, explanation and fix)", style="dim"))
    for i, p in enumerate(rule.patterns, 1):
        out.append(Text(f"  {i}. anchor {inert(repr(p.anchor))}"))
        out.append(Text(f"     regex  {inert(p.regex)}", style="dim"))
        own = _set_fields(p, Pattern(p.anchor, p.regex), PATTERN_MEANING)  # its own conditions (levels, fault_on)
        out.extend(Text(f"     {inert(line)}", style="dim") for line in own)
    conditions = context_lines(rule.context)
    if conditions:
        out.append(Text("\nContext", style="bold underline"))
        out.extend(Text(f"  {inert(line)}") for line in conditions)
    if rule.parser:
        out.append(Text(f"facts parser: {inert(rule.parser)}", style="dim"))

    out.append(Text("\nExamples that match", style="bold underline"))
    for ex in rule.examples_match:
        out.extend(_example(ex))
    out.append(Text("\nExamples that must not match", style="bold underline"))
    for ex in rule.examples_no_match:
        out.extend(_example(ex))
    if rule.links:
        out.append(Text("\nLinks", style="bold underline"))
        out.extend(Text(f"  {inert(link)}") for link in rule.links)
    return out


def context_lines(ctx: Context) -> list[str]:
    """One line for every condition of ``ctx`` that is set (differs from its default), in the dataclass's order:
    derived from Context's fields, so a new condition is shown the day it is added."""
    return _set_fields(ctx, Context(), CONTEXT_MEANING)


def _set_fields(obj: Any, default: Any, meanings: dict[str, str]) -> list[str]:
    """``name = value: meaning`` for each field of ``obj`` whose value differs from the one in ``default``."""
    lines = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value == getattr(default, f.name):
            continue
        shown = ", ".join(value) if isinstance(value, (list, tuple)) else str(value).lower() if isinstance(
            value, bool) else str(value)
        meaning = meanings.get(f.name, "")
        lines.append(f"{f.name} = {shown}" + (f": {meaning}" if meaning else ""))
    return lines


def reflow(text: str) -> str:
    """Join the hard-wrapped lines of each paragraph (TOML text is wrapped at 120 columns; terminals differ)."""
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


def _example(example: str) -> list[Any]:
    from rich.text import Text

    lines = example.splitlines() or [""]
    return [Text(("  │ " if i else "  ▸ ") + inert(line), style="cyan") for i, line in enumerate(lines)]


def _show(catalogue: Catalogue, code: str) -> int:
    from rich.console import Console

    rule = find_rule(catalogue, code)
    console = Console(highlight=False)
    for part in render_show(rule):
        console.print(part)
    return EXIT_OK


# ------------------------------------------------------------------------------------------------- lint


def _lint(user_dirs: list[str], only_user: bool) -> int:
    from diagnose.match.lint import lint, load_for_lint

    if only_user and not user_dirs:
        raise DiagnoseError("rules lint --only-user needs at least one --rules folder")
    catalogue, load_problems = load_for_lint(user_dirs)
    builtin = {r.source for r in catalogue.rules if Path(r.source).resolve().parent == default_rules_dir().resolve()}
    user_sources = {r.source for r in catalogue.rules} - builtin
    user_sources |= {p.source for p in load_problems if p.source not in builtin}
    result = lint(catalogue, load_problems, only_sources=user_sources if only_user else None, strict_sources=builtin)
    checked = [r for r in catalogue.rules if not only_user or r.source in user_sources]
    for p in result.problems:
        print(inert(str(p)))
    print(f"{len(checked)} rules checked: {len(result.errors)} error(s), {len(result.warnings)} warning(s)",
          file=sys.stderr)
    return EXIT_PROBLEMS if result.errors else EXIT_OK
