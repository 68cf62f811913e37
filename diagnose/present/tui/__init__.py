"""The Textual terminal UI behind ``diagnose tui``.

Only ``diagnose.present.commands.tui`` imports this package, so ``diagnose --help`` never loads Textual.
The pure helpers (``logindex``, ``fixrender``, ``fmt``) import no Textual and are tested on their own.
"""
