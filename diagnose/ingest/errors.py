"""One-line input errors: a path is shown with control characters escaped, so a file named "a\\nb" or one holding
an escape sequence cannot break the message over lines or drive the terminal."""

from __future__ import annotations

from diagnose.model import DiagnoseError


def shown(path: object) -> str:
    text = path if isinstance(path, str) else repr(path)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
    return "".join(out)


def input_error(path: object, reason: str) -> DiagnoseError:
    return DiagnoseError(f"{shown(path)}: {reason}")
