"""safe.inert: nothing from a log can drive the terminal or be read as rich markup."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from diagnose.present.safe import inert, inert_block, log_text, shorten


def test_escape_sequences_are_shown_not_applied():
    out = inert("\x1b[31mred\x1b[0m \x1b]8;;http://evil\x07link\x1b]8;;\x07 \x1b]52;c;ZXZpbA==\x07")
    assert "\x1b" not in out and "\x07" not in out
    assert out.startswith("\\x1b[31mred")
    assert "\\x1b]52;c;" in out


def test_c1_controls_and_bidi_are_visible():
    out = inert("a\x9b31mb \u202eevil\u202c \u2066x\u2069 \x7f")
    assert out == "a\\x9b31mb \\u202eevil\\u202c \\u2066x\\u2069 \\x7f"


def test_one_line_stays_one_line_but_blocks_keep_newlines():
    assert "\n" not in inert("a\nb\r")
    assert inert_block("a\nb\tc\x1b") == "a\nb\tc\\x1b"


def test_plain_text_and_unicode_unchanged():
    s = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB — ünïcode ✓"
    assert inert(s) == s


@given(st.text())
def test_inert_output_has_no_control_characters(s):
    out = inert(s)
    assert all(not (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0) for c in out)
    assert "\u202e" not in out and "\u2066" not in out


def test_rich_text_is_not_markup():
    console = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor", width=200)
    console.print(log_text("[bold red]not markup[/] \x1b[2J"))
    rendered = console.file.getvalue()
    assert "[bold red]not markup[/]" in rendered
    assert "\x1b[2J" not in rendered


def test_shorten_marks_the_cut():
    assert shorten("x" * 10, 5) == "xxxx…"
    assert shorten("abc", 5) == "abc"
