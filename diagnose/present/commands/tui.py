"""``diagnose tui``: open the Textual UI on logs, on a pasted log, or (``--slurm``) on recent failed jobs.

Textual is imported here and only here, so ``diagnose --help`` and the other commands never load it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from diagnose.model import DiagnoseError


def _spool_stdin() -> str:
    """Copy a piped log to a temp file and give the TUI the terminal back as its keyboard."""
    if sys.stdin is None or sys.stdin.isatty():
        raise DiagnoseError("'-' reads a log from a pipe, but stdin is a terminal (run `diagnose tui` to paste one)")
    fd, path = tempfile.mkstemp(prefix="diagnose-stdin-", suffix=".log")
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
    try:
        tty = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        os.unlink(path)
        raise DiagnoseError("the TUI needs a terminal for the keyboard; use `diagnose analyze -` in a pipe") from None
    os.dup2(tty, 0)
    os.close(tty)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - fd 0 now is the terminal
    return path


def run(args) -> int:
    paths: list[str] = list(getattr(args, "paths", []) or [])
    rules_dirs: list[str] = list(getattr(args, "rules", []) or [])
    for path in paths:
        if path != "-" and not os.path.exists(path):
            raise DiagnoseError(f"no such file or folder: {path}")
    if paths.count("-") > 1:
        raise DiagnoseError("'-' (stdin) can be given only once")

    display: dict[str, str] = {}
    temp: list[str] = []
    if "-" in paths:
        spooled = _spool_stdin()
        temp.append(spooled)
        display[spooled] = "stdin"
        paths = [spooled if p == "-" else p for p in paths]

    from diagnose.present.tui.app import DiagnoseApp, pipeline_analyzer

    try:
        if getattr(args, "slurm", False):
            from diagnose.present.tui.slurmjobs import slurm_app

            # --since/--user are read when the parser offers them for tui (as it does for `slurm --failed`)
            app = slurm_app(rules_dirs, getattr(args, "since", None) or "1d", getattr(args, "user", None))
        else:
            app = DiagnoseApp(
                paths, analyzer=pipeline_analyzer(rules_dirs), display_names=display, paste=not paths
            )
        app.run()
    finally:
        for path in temp:
            try:
                os.unlink(path)
            except OSError:
                pass
    if app.return_code:
        return int(app.return_code)
    report = getattr(app, "report", None)
    if report is None:
        return 2 if getattr(app, "error", None) else 0
    return 1 if report.root_cause is not None else 0
