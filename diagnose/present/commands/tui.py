"""``diagnose tui``: open the Textual UI on logs (``--follow``: one growing log), on a pasted log, (``--slurm``) on
recent failed jobs, or (``--check CONFIG --gpus N [--gpu NAME | --gpu-memory SIZE] [--set K=V]``) on a config's
memory plan with a what-if editor.

Textual is imported here and only here, so ``diagnose --help`` and the other commands never load it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from diagnose.model import DiagnoseError

READING_STDIN = ("diagnose tui: reading the log from standard input until the pipe ends (ctrl-c stops; a log "
                 "still being written: diagnose tui --follow FILE)")


def _tell(text: str) -> bool:
    """Write ``text`` to the terminal on stderr (nothing when stderr is not a terminal); True when written."""
    stream = sys.stderr
    try:
        if stream is None or not stream.isatty():
            return False
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        return False
    return True


def _spool_stdin() -> str:
    """Copy a piped log to a temp file and give the TUI the terminal back as its keyboard."""
    if sys.stdin is None or sys.stdin.isatty():
        raise DiagnoseError("'-' reads a log from a pipe, but stdin is a terminal (run `diagnose tui` to paste one)")
    from diagnose.ingest.sources import spool_pipe

    fd, path = tempfile.mkstemp(prefix="diagnose-stdin-", suffix=".log")
    os.close(fd)
    # the screen stays blank until the pipe ends (``tail -f job.log | diagnose tui -`` never does): say so, and
    # erase the line once the log is read
    told = _tell(READING_STDIN)
    try:
        spool_pipe(sys.stdin.buffer, path)
    except BaseException:  # refused (binary, too large, disk full) or interrupted: nothing left behind
        with contextlib.suppress(OSError):
            os.unlink(path)
        if told:
            _tell("\n")
        raise
    if told:
        _tell("\r\x1b[2K")
    try:
        tty = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        os.unlink(path)
        raise DiagnoseError("the TUI needs a terminal for the keyboard; use `diagnose analyze -` in a pipe") from None
    os.dup2(tty, 0)
    os.close(tty)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - fd 0 now is the terminal
    return path


def _need_terminal() -> None:
    """The TUI draws on a terminal and waits for keys: without one it drew into the redirect and waited forever."""
    if not (sys.stdout is not None and sys.stdout.isatty()):
        raise DiagnoseError("tui needs a terminal (standard output is not one): use 'diagnose analyze' for a "
                            "report to a file or a pipe")


def _run_check(args) -> int:
    """``--check CONFIG``: the config is read (and bad input refused, exit 2) before the terminal is taken."""
    from diagnose.checking import load_view
    from diagnose.explain.config import parse_set
    from diagnose.present.commands.check import capacity_from_args
    from diagnose.present.tui.plan import PlanApp, gpus_from_view

    config = str(args.check)
    if getattr(args, "paths", None):
        raise DiagnoseError("--check opens a config, not logs: give either a config with --check or log paths")
    if getattr(args, "gpu", None) and getattr(args, "gpu_memory", None):
        raise DiagnoseError("give --gpu or --gpu-memory, not both")
    capacity, where = capacity_from_args(args)
    view = load_view(config)
    gpus = getattr(args, "gpus", None)
    if gpus is None:
        gpus = gpus_from_view(view, 0)
        if gpus < 1:
            raise DiagnoseError("--check needs --gpus N (the number of GPUs the job will use)")
    if int(gpus) < 1:
        raise DiagnoseError("--gpus must be at least 1")
    sets = [parse_set(s) for s in (getattr(args, "sets", None) or [])]
    from diagnose.explain.config.keycheck import check_overrides

    check_overrides(sets)
    app = PlanApp(view, int(gpus), capacity, title=os.path.basename(config) or config, capacity_label=where,
                  sets=sets, bridge_version=getattr(args, "bridge_version", None))
    _need_terminal()  # after every input check: bad input is refused the same way with or without a terminal
    app.run()
    return int(app.return_code or 0)


def run(args) -> int:
    if getattr(args, "check", None):
        return _run_check(args)
    only_check = [name for name, attr in (("--gpus", "gpus"), ("--gpu", "gpu"), ("--gpu-memory", "gpu_memory"),
                                          ("--set", "sets"), ("--bridge-version", "bridge_version"))
                  if getattr(args, attr, None)]
    if only_check:
        raise DiagnoseError(f"{', '.join(only_check)} apply only with --check CONFIG (the memory plan of a config)")
    paths: list[str] = list(getattr(args, "paths", []) or [])
    rules_dirs: list[str] = list(getattr(args, "rules", []) or [])
    for path in paths:
        if path != "-" and not os.path.exists(path):
            raise DiagnoseError(f"no such file or folder: {path}")
    if paths.count("-") > 1:
        raise DiagnoseError("'-' (stdin) can be given only once")
    follow = bool(getattr(args, "follow", False))
    if follow:
        from diagnose.present.tui.logindex import follow_refusal

        if len(paths) != 1 or getattr(args, "slurm", False) or getattr(args, "fleet", None):
            raise DiagnoseError("--follow follows one log file: give exactly one path (no --slurm, no --fleet)")
        refused = follow_refusal(paths[0])
        if refused:
            raise DiagnoseError(refused)
    opened = None
    if paths and not getattr(args, "slurm", False) and not getattr(args, "fleet", None):
        from diagnose.pipeline import refuse_unreadable

        # empty, binary, a folder without logs: one line before the screen, as `analyze`; what it opened is the
        # first analysis's input (read once), closed below if the screen never got to analyse it
        opened = refuse_unreadable(paths, keep=True)
    try:
        return _run_screen(args, paths, rules_dirs, follow, opened)
    finally:
        if opened is not None:
            opened.close()


def _run_screen(args, paths: list[str], rules_dirs: list[str], follow: bool, opened) -> int:
    if rules_dirs:  # a broken user rule is a usage error before the screen opens, as in `analyze`
        from diagnose.match.rules import load_catalogue

        load_catalogue(rules_dirs, strict=True)
    if getattr(args, "fleet", None):  # a missing or foreign store: one line, before the terminal is asked for
        from diagnose.fleet.store import FleetStore

        FleetStore(args.fleet, readonly=True).close()

    _need_terminal()
    display: dict[str, str] = {}
    temp: list[str] = []
    if "-" in paths:
        spooled = _spool_stdin()
        temp.append(spooled)
        display[spooled] = "stdin"
        paths = [spooled if p == "-" else p for p in paths]

    from diagnose.present.tui.app import DiagnoseApp, pipeline_analyzer

    try:
        if getattr(args, "fleet", None):
            from diagnose.present.tui.fleet import fleet_app

            if paths or getattr(args, "slurm", False):
                raise DiagnoseError("--fleet opens a store: give no log paths and no --slurm with it")
            app = fleet_app(args.fleet, getattr(args, "since", None) or "7d", rules_dirs)
        elif getattr(args, "slurm", False):
            # --since/--user are read when the parser offers them for tui (as it does for `slurm --failed`)
            app = DiagnoseApp([], slurm=(getattr(args, "since", None) or "1d", getattr(args, "user", None)),
                              rules_dirs=rules_dirs)
        else:
            app = DiagnoseApp(paths, analyzer=pipeline_analyzer(rules_dirs, opened), display_names=display,
                              paste=not paths, rules_dirs=rules_dirs, follow=follow)
        app.run()
    finally:
        for path in temp:
            with contextlib.suppress(OSError):
                os.unlink(path)
    if app.return_code:
        return int(app.return_code)
    report = getattr(app, "report", None)
    if report is None:
        return 2 if getattr(app, "error", None) else 0
    return 1 if report.root_cause is not None else 0
