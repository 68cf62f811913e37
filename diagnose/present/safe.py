"""Make text that came from a log harmless to show.

A log is untrusted input: it can carry terminal escape sequences (colour, cursor moves, OSC 8 hyperlinks, OSC 52
clipboard writes, window-title changes), other control characters and Unicode bidi overrides that make a line
read differently from what it contains ("Trojan Source"). Everything a presenter shows from a log goes through
:func:`inert` first, which replaces each such character by a visible escape (``\\x1b``, ``\\u202e``), so the
sequence is shown, never executed. Rich output uses :func:`log_text`, a ``Text`` object, so ``[bold]`` in a log
line is shown as typed and never read as markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diagnose.inert import inert, inert_block, shorten

if TYPE_CHECKING:  # rich is imported lazily: safe.py is used on fast paths too
    from rich.text import Text

__all__ = ["block_text", "inert", "inert_block", "log_text", "shorten"]


def log_text(text: str, style: str = "", limit: int | None = None) -> Text:
    """A rich ``Text`` holding a log line, inert, never interpreted as markup."""
    from rich.text import Text

    s = inert(text)
    if limit is not None:
        s = shorten(s, limit)
    return Text(s, style=style, no_wrap=False)


def block_text(text: str, style: str = "") -> Text:
    """A rich ``Text`` for multi-line text from a log or rule (newlines kept), never interpreted as markup."""
    from rich.text import Text

    return Text(inert_block(text), style=style)
