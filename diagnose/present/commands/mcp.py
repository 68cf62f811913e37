"""``diagnose mcp``: serve the diagnose tools to a coding agent over the Model Context Protocol (stdio).

Needs the ``mcp`` package (``pip install mcp``, the checkout's ``[agent]`` extra); without it: one line on stderr,
exit 2.
The tools and their bounds: ``diagnose.present.mcp_server``.
"""

from __future__ import annotations

from typing import Any


def run(args: Any) -> int:
    from diagnose.present.mcp_server import _import_server_class, serve

    _import_server_class()  # a missing SDK is a one-line DiagnoseError before anything starts
    serve()
    return 0
