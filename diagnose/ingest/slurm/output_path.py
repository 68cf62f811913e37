"""Where a batch job's output went: sbatch option parsing and Slurm's filename patterns.

Slurm's precedence for ``--output``/``--error`` is: command line > ``SBATCH_OUTPUT``/``SBATCH_ERROR`` in the
submit environment > ``#SBATCH`` lines of the script > the default ``slurm-%j.out`` (``slurm-%A_%a.out`` for an
array task). stderr goes to the stdout file unless ``--error`` is given.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from diagnose.ingest.slurm.hostlist import expand_hostlist

# sbatch short options that take no value; every other short option takes one (attached or the next token)
_SHORT_FLAGS = set("hHIkOQsvVW")
# sbatch long options that take no value (or only an optional one, which must then be attached with "=")
_LONG_FLAGS = {
    "parsable", "hold", "wait", "exclusive", "requeue", "no-requeue", "overcommit", "quiet", "verbose",
    "test-only", "spread-job", "use-min-nodes", "contiguous", "ignore-pbs", "no-kill", "oversubscribe", "reboot",
    "get-user-env", "help", "usage", "version", "export-file", "kill-on-invalid-dep", "exact",
}  # fmt: skip
_OUTPUT_NAMES = {"-o": "output", "--output": "output", "-e": "error", "--error": "error"}


@dataclass(frozen=True, slots=True)
class OutputOptions:
    output: str | None = None
    error: str | None = None


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=False)
    except ValueError:  # an unbalanced quote (SubmitLine is stored without quoting): fall back to whitespace
        return text.split()


def command_options(words: list[str], short_flags: set[str], long_flags: set[str]) -> Iterator[tuple[str | None, str]]:
    """The options of a Slurm command line, as ``(name, value)`` (``--output``, ``-o``), and ``(None, word)`` for a
    word that is no option (the caller decides whether it ends them); stops at ``--``. A long option takes
    ``=value`` or the next word unless it is in ``long_flags``; bundled short options (``-lun2``) are flags until one
    not in ``short_flags``, whose value is the rest of the word or the next word. Flags are not reported."""
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            return
        if word.startswith("--"):
            key, eq, attached = word.partition("=")
            if eq:
                yield key, attached
            elif key[2:] not in long_flags and i < len(words):
                yield key, words[i]
                i += 1
        elif word.startswith("-") and len(word) > 1:
            at = next((j for j in range(1, len(word)) if word[j] not in short_flags), None)  # the one with a value
            if at is not None and at + 1 < len(word):
                yield "-" + word[at], word[at + 1 :].removeprefix("=")
            elif at is not None and i < len(words):
                yield "-" + word[at], words[i]
                i += 1
        else:
            yield None, word


def parse_sbatch_options(text: str) -> OutputOptions:
    """Find ``-o/--output/-e/--error`` in an sbatch command line (or the options of one ``#SBATCH`` line).

    Options after the batch script's name belong to the script, so scanning stops at the first bare word that is
    not an option's value (unless ``--wrap`` was given: then there is no script and the wrapped command's words,
    stored unquoted, are skipped).
    """
    found: dict[str, str] = {}
    words = _tokens(text)
    if words and words[0].rsplit("/", 1)[-1] == "sbatch":
        words = words[1:]
    wrapped = False
    for name, value in command_options(words, _SHORT_FLAGS, _LONG_FLAGS):
        if name is None and not wrapped:
            break  # the script; what follows are its own arguments
        wrapped = wrapped or name == "--wrap"
        if name in _OUTPUT_NAMES and value:
            found[_OUTPUT_NAMES[name]] = value
    return OutputOptions(found.get("output"), found.get("error"))


def parse_batch_script_options(script: str) -> OutputOptions:
    """The ``#SBATCH`` lines of a batch script: read until the first command, as sbatch does."""
    merged = OutputOptions()
    lines = script.splitlines()
    if lines and lines[0].startswith("Batch Script for "):  # sacct --batch-script's own two header lines
        lines = lines[2:] if len(lines) > 1 and set(lines[1].strip()) <= {"-"} else lines[1:]
    for line in lines:
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#SBATCH")):
            continue
        if not stripped.startswith("#SBATCH"):
            break
        body = stripped[len("#SBATCH") :]
        if not body[:1].isspace():
            continue  # "#SBATCHX" is a comment
        body = body.split(" #", 1)[0]  # a trailing comment
        this = parse_sbatch_options(body)
        merged = OutputOptions(this.output or merged.output, this.error or merged.error)  # later lines win
    return merged


@dataclass(frozen=True, slots=True)
class PatternFields:
    """What Slurm substitutes into ``--output`` patterns for the batch step."""

    job_id: int  # %j: the job's own id (JobIDRaw; for an array task, the task's id)
    array_job_id: int | None = None  # %A (defaults to %j)
    array_task_id: int | None = None  # %a (4294967294 when not an array, as Slurm does)
    job_name: str = ""
    user: str = ""
    first_node: str = ""
    restarts: int = 0


_PATTERN = re.compile(r"%(\d{0,2})([%AabJjNnstuxr])")
_NO_ARRAY = 4294967294  # NO_VAL - 1, what sbatch writes for %a outside an array


def render_pattern(pattern: str, f: PatternFields, step: str | None, values: dict[str, int | str | None],
                   literal: Callable[[str], str] = str, unknown: Callable[[str], str] = "%".__add__) -> str:
    """Expand ``%j %A %a %b %J %N %n %s %t %u %x %r %%`` and padded numbers (``%4j`` -> ``0042``, at most 10) the
    way Slurm does for one task of ``step``; ``values`` has t/n/N (None or absent: unknown), ``literal`` escapes
    the text between specifiers (for a glob or a regex) and ``unknown`` stands for what is not known. Unknown ``%``
    sequences are kept as they are."""
    out: list[str] = []
    last = 0
    for m in _PATTERN.finditer(pattern):
        out.append(literal(pattern[last : m.start()]))
        last = m.end()
        width_text, letter = m.groups()
        width = min(int(width_text), 10) if width_text else 0
        if letter == "%":
            out.append(literal("%" + width_text if width_text else "%"))
            continue
        array_task = f.array_task_id if f.array_task_id is not None else _NO_ARRAY
        value = values.get(letter) if letter in "tnN" else {
            "s": step,
            "J": f"{f.job_id}.{step}" if step is not None else None,
            "j": f.job_id,
            "A": f.array_job_id if f.array_job_id is not None else f.job_id,
            "a": array_task,
            "b": array_task % 10,
            "r": f.restarts,
            "x": f.job_name,
            "u": f.user,
        }[letter]
        if value is None:
            out.append(unknown(letter))
        else:
            out.append(literal(str(value).zfill(width) if isinstance(value, int) else value))
    out.append(literal(pattern[last:]))
    return "".join(out)


def uses(pattern: str) -> set[str]:
    """The specifier letters a pattern uses."""
    return {m.group(2) for m in _PATTERN.finditer(pattern)}


def expand_pattern(pattern: str, f: PatternFields) -> str:
    """Expand a pattern for the batch step: ``%s`` is ``batch``, ``%J`` is ``JOBID.batch``, ``%n`` and ``%t`` are
    0, ``%N`` the first node."""
    return render_pattern(pattern, f, "batch", {"t": 0, "n": 0, "N": f.first_node})


def default_output(is_array_task: bool) -> str:
    return "slurm-%A_%a.out" if is_array_task else "slurm-%j.out"


def first_node(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[01-04,07]`` -> ``gpu01``, ``a,b`` -> ``a``."""
    return next(iter(expand_hostlist(nodelist, limit=1)), "")


def resolve(path: str, work_dir: str) -> str:
    if path.startswith("/") or not work_dir:
        return path
    return work_dir.rstrip("/") + "/" + path
