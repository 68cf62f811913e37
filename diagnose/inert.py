"""Make text that came from a log harmless to show: the one place that knows which characters are unsafe.

A log is untrusted input: it can carry terminal escape sequences (colour, cursor moves, OSC 8 hyperlinks, OSC 52
clipboard writes, window-title changes), other control characters and Unicode bidi overrides that make a line
read differently from what it contains ("Trojan Source"). :func:`inert` replaces each such character by a visible
escape (``\\x1b``, ``\\u202e``), so the sequence is shown, never executed. This module is stage-neutral (no rich,
no presenter): match keeps its evidence lines inert with it, and ``diagnose.present.safe`` builds the rich objects
on top of it.
"""

from __future__ import annotations

import re

# Unicode characters that change how surrounding text is laid out or read: bidi embeddings/overrides/isolates,
# direction marks, line/paragraph separators, and the BOM/zero-width no-break space in the middle of a line.
# Zero-width and invisible characters (U+200B-U+200D, U+2060-U+2064, the soft hyphen U+00AD) too: they hide inside
# a key or a path, so what is shown would not be what is typed back.
_INVISIBLE_LAYOUT = (
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029\ufeff"
    "\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\u00ad\u180e"
)


def _build_table(keep_newlines: bool) -> dict[int, str]:
    table: dict[int, str] = {}
    for code in list(range(0x20)) + [0x7F] + list(range(0x80, 0xA0)):
        table[code] = f"\\x{code:02x}"
    table[0x09] = "    " if not keep_newlines else "\t"
    if keep_newlines:
        del table[0x0A]
    for ch in _INVISIBLE_LAYOUT:
        table[ord(ch)] = f"\\u{ord(ch):04x}"
    # lone surrogates (a file name's undecodable bytes under surrogateescape): no terminal can show one; the TUI
    # measured it as one cell while its driver wrote the six characters of "\udcff", so the words that the extra
    # cells pushed past the pane's edge were lost (qa-report-21)
    for code in range(0xD800, 0xE000):
        table[code] = f"\\u{code:04x}"
    return table


_ONE_LINE = _build_table(keep_newlines=False)
_MULTI_LINE = _build_table(keep_newlines=True)


def inert(text: str) -> str:
    """Return ``text`` with every control character, escape sequence introducer and bidi control made visible.

    ESC becomes the four characters ``\\x1b`` (so ``\\x1b[31m`` is shown, not applied), other C0/C1 controls and
    DEL become ``\\xNN``, bidi and layout controls become ``\\uNNNN``, a tab becomes four spaces and a newline
    becomes ``\\x0a`` (one log line stays one line). Everything else is unchanged. Never raises.
    """
    return str(text).translate(_ONE_LINE)


def inert_block(text: str) -> str:
    """Like :func:`inert` but keeps newlines and tabs: for multi-line text (an explanation, a config dump)."""
    return str(text).translate(_MULTI_LINE)


def shorten(text: str, limit: int = 400) -> str:
    """Cut an (already inert) line to ``limit`` characters, marking the cut; huge log lines stay readable."""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


# A CI runner reads its own commands out of a step's output: GitHub Actions a line that starts, after leading
# white space, with "::" (``::error::``, ``::add-mask::``, ``::stop-commands::``), and "##[" anywhere in a line (its
# legacy form; Azure Pipelines' "##vso["). A report printed in such a step shows log lines, and a line wrapped at
# the report's width can start with a log's "::" even when the log line did not.
_CI_LINE_COMMAND = re.compile(r"^([ \t]*(?:\x1b\[[0-9;]*m[ \t]*)*)::", re.MULTILINE)
_CI_ANYWHERE_COMMAND = re.compile(r"##(?=\[|vso\[)")


def no_ci_commands(text: str) -> str:
    """``text`` (rendered report lines) with every CI workflow command defused, shown as an escape as :func:`inert`
    shows a control character: a line's leading "::" as ``\\x3a:``, "##[" as ``#\\x23[``. Other text is unchanged."""
    if "::" not in text and "##" not in text:
        return text
    return no_ci_commands_inside(_CI_LINE_COMMAND.sub(lambda m: m.group(1) + "\\x3a:", text))


def no_ci_commands_inside(text: str) -> str:
    """``text`` with the commands a CI runner reads anywhere in a line ("##[", "##vso[") defused as
    :func:`no_ci_commands` does; a line's leading "::" is left: for lines that are workflow commands of their own
    (``-f github``), whose properties and message carry a file name or a job's label."""
    return _CI_ANYWHERE_COMMAND.sub("#\\\\x23", text) if "##" in text else text
