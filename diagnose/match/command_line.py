"""Were the options a parser refused typed by the user, or added by the framework that built the command line?

``<script>.py: error: unrecognized arguments: --x`` is a configuration mistake when the user wrote ``--x`` in the
launch command (a typo, a flag an old README names). When the log shows the command that started the script and
``--x`` is not on it, the user never wrote it: a wrapper (ms-swift's ``megatron sft``, a recipe launcher, the
DeepSpeed launcher adding ``--local_rank``) generated it for the version of the library it was written against, and
the installed library is another one: version skew, fixed by matching versions, not by editing the command.
"""

from __future__ import annotations

from functools import lru_cache

import regex

COMMAND_LOOKBACK_BYTES = 1 << 20  # how far back the launch command is looked for
_OPTION = regex.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]*)")


def refused_options(listed: str) -> list[str]:
    """The option words (``--softmax-type``, ``--local_rank``) in an ``unrecognized arguments:`` list."""
    return [m.group(1).rstrip(".") for m in _OPTION.finditer(listed)]


def _latest_command(buf, start: int, prog: str, floor: int = 0) -> tuple[int, str] | None:
    """The latest line before ``start`` that runs ``prog`` with options, as (offset of ``prog`` in it, the line);
    only occurrences of ``prog`` at or after ``floor`` are considered (and none further back than the look-back)."""
    if not prog:
        return None
    needle = prog.encode("utf-8", "surrogatepass")
    lo = max(0, start - COMMAND_LOOKBACK_BYTES, floor)
    end = start
    while end > lo:
        at = buf.rfind(needle, lo, end)
        if at == -1:
            return None
        line = _line_at(buf, at, start)
        after = line[line.find(prog) + len(prog):]
        # the options follow after any run of blanks (a command pasted with its continuation lines joined keeps
        # their indentation: ``src/train.py     --train_data x``)
        typed = after[:1] in (" ", "\t") and after.lstrip(" \t").startswith(("-", "\\"))
        if typed and "error:" not in line and not line.lstrip().startswith("usage:"):
            # unexpanded shell variables ($GPT_ARGS) hide options: such a line cannot say what was typed
            return None if "$" in after else (at, line)
        end = at
    return None


def _line_at(buf, at: int, start: int) -> str:
    """The line holding offset ``at`` (cut at ``start``, where the question was asked), decoded."""
    line_start = buf.rfind(b"\n", 0, at) + 1
    line_end = buf.find(b"\n", at, start)
    return bytes(buf[line_start:line_end if line_end != -1 else start]).decode("utf-8", "replace")


def _latest_remembered(memo: dict, key, start: int, search) -> tuple[int, str] | None:
    """``search(start, floor)``'s answer (the latest command line before ``start`` whose occurrence is at or after
    ``floor``), asked once per error line of many ranks: ``memo[key]`` keeps where the last question was asked and
    what was found, so a later question searches only the bytes since then for a newer command line. The answer is
    the one a fresh search from ``start`` gives: a command line printed between two error lines counts for the
    second, and a remembered one that fell out of the look-back is searched for afresh."""
    state = memo.get(key)
    found: tuple[int, str] | None
    if state is not None and state[0] <= start:
        asked, previous = state
        newer = search(start, asked)
        found = newer if newer is not None else previous
        if newer is None and previous is not None and previous[0] < start - COMMAND_LOOKBACK_BYTES:
            found = search(start, 0)
    else:
        found = search(start, 0)
    memo[key] = (start, found)
    return found


def _typed(command: str | None, options: list[str]) -> bool:
    return command is not None and not any(
        regex.search(r"(?<![\w-])" + regex.escape(opt) + r"(?![\w-])", command) for opt in options
    )


def options_not_typed(buf, start: int, prog: str, listed: str, memo: dict) -> bool:
    """True when the command line that ran ``prog`` is in the log before ``start`` and none of the options in
    ``listed`` is on it (so the user did not write them); False when there is no such line or one of them is.
    Every rank prints the same error: ``memo`` remembers, per (program, options), the last answer
    (``_latest_remembered``)."""
    options = refused_options(listed)
    if not options or not prog:
        return False
    found = _latest_remembered(memo, (prog, listed), start,
                               lambda at, floor: _latest_command(buf, at, prog, floor=floor))
    return _typed(found[1] if found else None, options)


# a release pinned on a command line: a version-tagged container image (``vllm/vllm-openai:v0.8.5``,
# ``nvcr.io/nvidia/pytorch:24.01-py3``: a registry path with a tag that starts with a release number; ``host:port`` and
# ``-v /a:/b`` have no such tag) or a package pinned for the run (``uvx --from vllm==0.8.5``, ``--with vllm==0.8.5``)
_PINNED_IMAGE = regex.compile(
    r"(?<![\w./:-])(?:[\w.-]+/)+[\w.-]+:v?\d+\.\d+(?:\.\d+)?[\w.+-]*(?![\w/:])"
    r"|(?<![\w.-])[A-Za-z][\w.-]*==\d+\.\d+(?:\.\d+)?[\w.+-]*"
)
PINNED_SCAN_HITS = 256  # occurrences of the option looked at per question (usage lines repeat it on every rank)


def _typing_command(buf, start: int, option: str, floor: int = 0) -> tuple[int, str] | None:
    """The latest line before ``start`` (and at or after ``floor``) that types ``option`` with a value: not argparse's
    usage text (``[--opt {a,b}]``) nor an error line; as (its offset, the line)."""
    needle = option.encode("utf-8", "surrogatepass")
    lo = max(0, start - COMMAND_LOOKBACK_BYTES, floor)
    end = start
    for _ in range(PINNED_SCAN_HITS):
        at = buf.rfind(needle, lo, end) if end > lo else -1
        if at == -1:
            return None
        end = at
        line = _line_at(buf, at, start)
        after = bytes(buf[at + len(needle):at + len(needle) + 2])
        if (at > 0 and buf[at - 1:at] in (b"[", b"-", b"_")) or after[:1] not in (b" ", b"="):
            continue  # usage text, a longer option, or the word inside another
        if "error:" in line or line.lstrip().startswith("usage:") or after[1:2] == b"{":
            continue
        return at, line
    return None


def pinned_release(buf, start: int, option: str, memo: dict) -> str:
    """The release pinned on the command line that typed ``option`` before ``start`` (a container image whose tag is
    a version, a package pinned with ``==``), or "" (no such command line in the log, or it pins no release).

    A parser that refuses a well-formed value of an option, in a program run from one pinned release,
    is that release's parser: the value is one another release offers (the documentation of the newest one), not a
    setting the user misspelt. ``memo`` remembers, per option, the last answer (``_latest_remembered``)."""
    if not option:
        return ""
    found = _latest_remembered(memo, option, start,
                               lambda at, floor: _typing_command(buf, at, option, floor=floor))
    m = _PINNED_IMAGE.search(found[1]) if found else None
    return m.group(0) if m else ""


# the argv a launcher prints for a worker (a Python list: DeepSpeed's "spawned with command: [...]" and its
# sigkill_handler report): the script, the launcher's own rank option, then one config file and nothing else
_LONE_CONFIG_AFTER_RANK = rb"', '--local[_-]rank=\d+', '[^'\n]{1,400}\.ya?ml'\]"


def config_hidden_by_launcher(buf, start: int, prog: str, memo: dict | None = None) -> bool:
    """Did a launcher, before ``start``, print the argv it gave ``prog`` as [..., prog, --local_rank=N, one .yaml]?

    Scripts built on HfArgumentParser read their settings from a config file only when it is their sole argument
    (``len(sys.argv) == 2``); a launcher that inserts its own ``--local_rank=N`` (the DeepSpeed launcher) turns
    ``train.py config.yaml`` into three arguments, so the script parses the command line instead and reports every
    required option missing: how it was launched is at fault, not the config. False without such a record.
    ``memo`` (one per input) remembers the last answer, so that every rank's copy of the error line searches only
    the bytes since the previous one, not the whole look-back again (each search was up to 1 MiB per line)."""
    if not prog or start <= 0:
        return False
    rx = _lone_config_argv(prog)

    def latest_record(at: int, floor: int) -> tuple[int, str] | None:
        last = None
        for m in rx.finditer(buf, max(0, at - COMMAND_LOOKBACK_BYTES, floor), at):
            last = m
        return None if last is None else (last.start(), "")

    return _latest_remembered({} if memo is None else memo, ("launcher argv", prog), start, latest_record) is not None


@lru_cache(maxsize=64)
def _lone_config_argv(prog: str) -> regex.Pattern:
    """The launcher's argv record for ``prog`` (a quoted list item or a path ending in it), compiled once a program."""
    return regex.compile(rb"[/']" + regex.escape(prog.encode("utf-8", "surrogatepass")) + _LONE_CONFIG_AFTER_RANK)
