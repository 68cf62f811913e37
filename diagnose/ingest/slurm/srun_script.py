"""Find the ``srun`` invocations of a batch script (or a step's submit line) and their ``-o``/``-e`` patterns.

The script is only read, never run: each logical line (``\\``-continued lines joined) is split into shell words
with ``shlex`` (quotes honoured, ``;``, ``&&``, ``|`` and friends split off), and a word ``srun`` in command
position starts an invocation whose options are read until its program. Shell variables in a pattern are replaced
when their value is known without running anything: the ``SLURM_*`` values Slurm sets for the job, and plain
``NAME=value`` assignments earlier in the script; anything else (``$(cmd)``, ``${X:-y}``, a loop variable) is
reported as unresolved rather than guessed.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from diagnose.ingest.slurm.output_path import command_options

# srun short options that take no value (-I, -K, -k take an optional one, which must then be attached)
_SHORT_FLAGS = set("EHhIKklOQsuVvXZ")
# srun long options that take no value (or an optional one, attached with "=")
_LONG_FLAGS = {
    "label", "unbuffered", "multi-prog", "pty", "overlap", "exact", "exclusive", "disable-status", "preserve-env",
    "no-allocate", "overcommit", "oversubscribe", "quiet", "verbose", "help", "usage", "version", "hold",
    "contiguous", "test-only", "kill-on-bad-exit", "no-kill", "immediate", "spread-job", "use-min-nodes", "reboot",
    "propagate", "whole", "send-libs", "x11", "wait-all-nodes", "cpu-freq-governor", "interactive",
}  # fmt: skip
_WANTED = {
    "-o": "output", "--output": "output", "-e": "error", "--error": "error", "-n": "ntasks", "--ntasks": "ntasks",
    "-D": "chdir", "--chdir": "chdir",
}  # fmt: skip
# words that may come before a command without being it
_PREFIXES = {"exec", "time", "nohup", "command", "env", "then", "do", "else", "elif", "if", "while", "until", "!",
             "{", "builtin", "stdbuf", "numactl"}  # fmt: skip
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_SEPARATOR_CHARS = set(";&|()<>")


@dataclass(frozen=True, slots=True)
class SrunCall:
    """One srun invocation and the options that decide where its tasks' output goes."""

    line: int  # 1-based line of the script where it starts (1 for a submit line)
    output: str | None = None  # -o/--output, variables replaced where known
    error: str | None = None
    ntasks: int | None = None  # -n/--ntasks when it is a number
    chdir: str | None = None  # -D/--chdir: relative patterns are relative to it
    unresolved: tuple[str, ...] = field(default_factory=tuple)  # variables the patterns need but we cannot know

    @property
    def writes_files(self) -> bool:
        return bool(file_pattern(self.output) or file_pattern(self.error))


def file_pattern(value: str | None) -> str | None:
    """The pattern when it names files; None for srun's non-file forms (``none``, ``all``, a task number, /dev/null)
    and for a pattern we could not resolve."""
    if not value or value in ("none", "all", "/dev/null") or value.isdigit() or "$" in value or "`" in value:
        return None
    return value


def job_variables(job_id: int, name: str, user: str, array_job_id: int | None, array_task_id: int | None,
                  work_dir: str) -> dict[str, str]:
    """The variables Slurm sets in a batch job's environment that an output pattern commonly uses."""
    values = {"SLURM_JOB_ID": str(job_id), "SLURM_JOBID": str(job_id), "SLURM_JOB_NAME": name, "USER": user,
              "SLURM_JOB_USER": user}
    if array_job_id is not None and array_task_id is not None:
        values["SLURM_ARRAY_JOB_ID"] = str(array_job_id)
        values["SLURM_ARRAY_TASK_ID"] = str(array_task_id)
    if work_dir:
        values["PWD"] = work_dir
    return {k: v for k, v in values.items() if v}


def _logical_lines(script: str) -> list[tuple[int, str]]:
    """Lines with backslash continuations joined, each with the number of its first physical line."""
    out: list[tuple[int, str]] = []
    pending = ""
    start = 0
    for number, line in enumerate(script.splitlines(), 1):
        if not pending:
            start = number
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def _words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: whitespace words, better than nothing
        return line.split()


def _commands(words: list[str]) -> list[list[str]]:
    """Split words at shell operators (``;``, ``&&``, ``|``, ``(``...)."""
    commands: list[list[str]] = [[]]
    for w in words:
        if w and set(w) <= _SEPARATOR_CHARS:
            commands.append([])
        else:
            commands[-1].append(w)
    return [c for c in commands if c]


def substitute(word: str, variables: dict[str, str]) -> tuple[str, list[str]]:
    """Replace ``$NAME``/``${NAME}`` whose value is known; return the text and the names left unknown."""
    missing: list[str] = []

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name in variables:
            return variables[name]
        missing.append(name)
        return m.group(0)

    text = _VARIABLE.sub(one, word)
    if "$" in _VARIABLE.sub("", text) or "`" in text:
        missing.append("$(...)" if text.endswith("$") else text)  # $(...), ${X:-y}, `...`: never evaluated
    return text, missing


def parse_srun_words(words: list[str], line: int, variables: dict[str, str]) -> SrunCall:
    """The options of one srun invocation (``words`` start after ``srun``), up to its program."""
    found: dict[str, str] = {}
    for name, value in command_options(words, _SHORT_FLAGS, _LONG_FLAGS):
        if name is None:
            break  # the program; its own arguments follow
        if name in _WANTED:
            found[_WANTED[name]] = value
    unresolved: list[str] = []
    resolved: dict[str, str] = {}
    for key in ("output", "error", "chdir"):
        if key in found:
            resolved[key], missing = substitute(found[key], variables)
            unresolved += missing
    ntasks_text, _ = substitute(found.get("ntasks", ""), variables)
    return SrunCall(
        line=line,
        output=resolved.get("output"),
        error=resolved.get("error"),
        ntasks=int(ntasks_text) if ntasks_text.isdigit() else None,
        chdir=resolved.get("chdir"),
        unresolved=tuple(dict.fromkeys(unresolved)),
    )


def find_srun_calls(script: str, variables: dict[str, str] | None = None) -> list[SrunCall]:
    """Every srun invocation of a batch script (or of a single submit line), in the script's order."""
    known = dict(variables or {})
    calls: list[SrunCall] = []
    for number, line in _logical_lines(script):
        if line.lstrip().startswith("#"):
            continue
        for command in _commands(_words(line)):
            _scan_command(command, number, known, calls)
    return calls


def _scan_command(command: list[str], number: int, known: dict[str, str], calls: list[SrunCall]) -> None:
    i = 0
    while i < len(command):
        word = command[i]
        m = _ASSIGNMENT.match(word)
        if m is not None:
            _assign(m.group(1), m.group(2), known)
            i += 1
            continue
        if word in _PREFIXES or word in ("export", "declare", "local", "readonly"):
            i += 1
            continue
        if word == "srun" or word.endswith("/srun"):
            calls.append(parse_srun_words(command[i + 1 :], number, known))
        return


def _assign(name: str, value: str, known: dict[str, str]) -> None:
    """A plain assignment: remember the value when it is fully known, forget the name otherwise."""
    text, missing = substitute(value, known)
    if missing:
        known.pop(name, None)
    else:
        known[name] = text
