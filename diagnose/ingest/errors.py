"""One-line input errors: a path is shown with control characters escaped, so a file named "a\\nb" or one holding
an escape sequence cannot break the message over lines or drive the terminal."""

from __future__ import annotations

import errno

from diagnose.model import DiagnoseError


def shown(path: object) -> str:
    text = path if isinstance(path, str) else repr(path)
    if text.isprintable():
        return text
    # ascii() spells each other character \n, \t, \xNN, \uNNNN or \UNNNNNNNN; a carriage return stays \x0d
    return "".join(ch if ch.isprintable() else "\\x0d" if ch == "\r" else ascii(ch)[1:-1] for ch in text)


def input_error(path: object, reason: str) -> DiagnoseError:
    return DiagnoseError(f"{shown(path)}: {reason}")


def os_error(path: object, err: OSError, doing: str = "open", denied: str = "no read access") -> DiagnoseError:
    """The one wording of an OSError met while ingesting ``path``: "<path>: <what went wrong>".

    ``doing`` names the step that failed ("open", "read", "map", "list folder"); ``denied`` says what a permission
    error means at that step ("no read access", "cannot list folder", "cannot reach this path").
    """
    if isinstance(err, FileNotFoundError):
        return input_error(path, "no such file or directory")
    if isinstance(err, PermissionError):
        return input_error(path, f"permission denied ({denied})")
    if isinstance(err, IsADirectoryError):
        return input_error(path, "is a directory")
    if err.errno in (errno.EMFILE, errno.ENFILE):
        error = input_error(path, f"cannot {doing}: too many open files (each log over 1 MiB keeps one open; "
                                  "raise the limit with `ulimit -n`)")
        error.about_the_file = False  # the limit, not this file: skipping it would lose every later rank too
        return error
    return input_error(path, f"cannot {doing} ({err.strerror or err})")
