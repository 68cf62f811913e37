"""``diagnose man``: the man page, generated from the parser (see completion.py)."""

from diagnose.present.commands.completion import run

__all__ = ["run"]
