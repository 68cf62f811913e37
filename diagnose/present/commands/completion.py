"""``diagnose completion bash|zsh`` and ``diagnose man``: generated from the argument parser itself, so they never
drift from the options that exist."""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from diagnose import __version__


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted({s for a in parser._actions for s in a.option_strings})


def bash_script(parser: argparse.ArgumentParser) -> str:
    """A bash completion function: sub-commands, then each sub-command's options (files otherwise)."""
    subs = _subcommands(parser)
    cases = []
    for name, sub in subs.items():
        words = _options(sub) + list(_subcommands(sub))
        cases.append(f"        {name}) opts=\"{' '.join(words)}\" ;;")
    return f"""# bash completion for diagnose {__version__} (generated: diagnose completion bash)
_diagnose() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" cmd="${{COMP_WORDS[1]}}" opts
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "{' '.join(subs)} {' '.join(_options(parser))}" -- "$cur"))
        return
    fi
    case "$cmd" in
{chr(10).join(cases)}
        *) opts="" ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F _diagnose diagnose
"""


def zsh_script(parser: argparse.ArgumentParser) -> str:
    return "#compdef diagnose\n# zsh: bash-style completion (generated: diagnose completion zsh)\n" \
           "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(parser)


def _roff(text: Any) -> str:
    text = str(text or "").replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + line) if line.startswith((".", "'")) else line for line in text.splitlines())


def man_page(parser: argparse.ArgumentParser) -> str:
    """A man(7) page: name, synopsis, description, one section per sub-command with its options, exit status."""
    date = datetime.date.today().isoformat()
    out = [f'.TH DIAGNOSE 1 "{date}" "diagnose {__version__}" "User Commands"', ".SH NAME",
           "diagnose \\- " + _roff(parser.description), ".SH SYNOPSIS", ".B diagnose",
           "\\fICOMMAND\\fR [\\fIOPTIONS\\fR]", ".SH COMMANDS"]
    for name, sub in _subcommands(parser).items():
        out += [f".SS diagnose {_roff(name)}", _roff(sub.description or sub.format_usage().strip())]
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            names = ", ".join(action.option_strings) or str(action.metavar or action.dest)
            if action.option_strings and action.nargs != 0 and action.metavar:
                names += f" {action.metavar}"
            out += [".TP", f"\\fB{_roff(names)}\\fR", _roff(action.help or "")]
    out += [".SH EXIT STATUS", "0 no failure found (or the config validates and fits); 1 a failure diagnosed "
            "(or it would fail); 2 a usage or input error, one line on stderr.",
            ".SH SEE ALSO", "diagnose rules show CODE; the README of the project."]
    return "\n".join(out) + "\n"


def run(args: Any) -> int:
    from diagnose.present.cli import build_parser
    from diagnose.present.output import write_output

    parser = build_parser()
    if args.command == "man":
        write_output(getattr(args, "output", None), man_page(parser))
    else:
        write_output(getattr(args, "output", None),
                     zsh_script(parser) if args.shell == "zsh" else bash_script(parser))
    return 0


