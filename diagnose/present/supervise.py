"""Run the command in a child process so that a bus error becomes a one-line message.

Logs over 1 MiB are memory-mapped. If another program truncates one while we read it (logrotate's copytruncate, a
job restarted into the same file, ``truncate -s 0``), touching the vanished pages raises SIGBUS, which Python cannot
catch: the process died with exit 135 and no word, leaving a TUI's terminal in the alternate screen. The console
script and ``python -m diagnose`` therefore fork: the child does the work, the parent waits and, if the child died
of SIGBUS, restores the terminal and says what happened in one line (exit 2). Any other way the child ends is
passed on unchanged (its exit code, or the same signal). ``main()`` called in-process (tests, embedding) does not
fork.

The parent also owns the child's temporary folder. A child killed by a signal (``timeout``'s SIGTERM, a closed
terminal's SIGHUP, the kernel's OOM killer) runs no ``finally``: ``yes | diagnose analyze -`` stopped by ``timeout``
left its 12 GB spool in /tmp. The child's ``tempfile`` root is a folder the parent made and removes once the child
has ended, however it ended.

SIGTERM (``timeout``, a scheduler, ``kill``) stops the worker as SIGINT does: every clean-up that runs for ^C runs
and one line says so ("diagnose: terminated"); then the worker, and the parent after it, die of SIGTERM as they were
told to, so a shell sees 143 (128 + 15) and a caller's wait sees the signal.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable

EXIT_USAGE = 2
TRUNCATED = ("diagnose: error: an input log was truncated or replaced while it was being read (log rotation? a job "
             "still writing?): run again, or on a copy of the log")
_RESET_TERMINAL = "\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?2004l\x1b[?1049l\x1b[?25h\x1b[0m"
_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class Terminated(KeyboardInterrupt):
    """SIGTERM in the worker: a KeyboardInterrupt, so that whatever cleans up after ^C cleans up after it too."""


EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 128 + int(signal.SIGTERM)


def stopped(error: KeyboardInterrupt) -> int:
    """The one line and exit code of a command stopped by SIGINT (130) or SIGTERM (143)."""
    terminated = isinstance(error, Terminated)
    with contextlib.suppress(OSError, ValueError):
        print("diagnose: terminated" if terminated else "diagnose: interrupted", file=sys.stderr)
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


def supervised(main: Callable[[], int]) -> int:
    if not hasattr(os, "fork") or os.environ.get("DIAGNOSE_NO_FORK") == "1":
        return _interruptible(main)
    # SIGINT is held back from before the fork until each side has its handler: one arriving in between used to
    # end the parent with a traceback (and the child with it, through PR_SET_PDEATHSIG)
    interruptible = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not if started ignoring it
    try:
        saved_tty = _save_tty()
        parent = os.getpid()
        scratch = _scratch_folder()
        _hold_sigint(True)
    except KeyboardInterrupt:
        return _interrupted()
    try:
        pid = os.fork()
    except OSError:
        _hold_sigint(False)
        _remove(scratch)
        return _interruptible(main)
    if pid == 0:  # the child: do the work, exit through the normal interpreter shutdown (flushes, atexit)
        os.environ["DIAGNOSE_NO_FORK"] = "1"
        if scratch is not None:  # this process and its forks only: a detached worker keeps the usual TMPDIR
            tempfile.tempdir = scratch
        _die_with(parent)
        if interruptible:
            signal.signal(signal.SIGINT, _interrupt_once)
        _catch_sigterm()
        _hold_sigint(False)
        sys.exit(_interruptible(main))
    try:
        return _wait_for(pid, saved_tty, lambda: _remove(scratch), forward_sigint=interruptible)
    finally:
        _remove(scratch)


def _hold_sigint(hold: bool) -> None:
    """SIGINT and SIGTERM held back (``hold``) or let through: from before the fork until each side has its
    handlers, so that neither ends the parent before it can remove the scratch folder (qa-report-11 L7)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no pthread_sigmask: the window stays
        signal.pthread_sigmask(signal.SIG_BLOCK if hold else signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _interruptible(main: Callable[[], int]) -> int:
    """``main`` turns a KeyboardInterrupt into one line and 130 once a command runs; this covers what comes before
    (argument parsing, the command's imports), where ^C printed a traceback. SIGTERM the same way, with 143."""
    try:
        _catch_sigterm()
        code = main()
    except KeyboardInterrupt as e:
        code = stopped(e)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN and _TERMINATED:
        _die_of_sigterm()
    return code


def _interrupted() -> int:
    return stopped(KeyboardInterrupt())


def _catch_sigterm() -> None:
    """SIGTERM raises Terminated in this (the working) process, unless it was started ignoring SIGTERM or has a
    handler of its own."""
    with contextlib.suppress(OSError, ValueError):  # not the main thread: left as it is
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _terminate_once):
            signal.signal(signal.SIGTERM, _terminate_once)


_TERMINATED: list[bool] = []  # a SIGTERM was taken: the process dies of it once the command has cleaned up


def _terminate_once(_signum, _frame) -> None:
    """The first SIGTERM stops the command (Terminated); a second (a process group's, and the parent's forwarded
    copy) is ignored, so that it cannot interrupt the clean-up of the first."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _TERMINATED.append(True)
    raise Terminated


def _die_of_sigterm() -> None:
    """After the command's clean-up and its one line: end the way SIGTERM ends a process (the shell's 143)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _scratch_folder() -> str | None:
    try:
        return tempfile.mkdtemp(prefix="diagnose-")
    except OSError:  # no writable temporary folder: the child meets the same error where it needs one
        return None


def _remove(folder: str | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for(pid: int, saved_tty, cleanup: Callable[[], None] = lambda: None, forward_sigint: bool = True) -> int:
    # SIGINT is forwarded too: ``kill -INT``, ``timeout -s INT`` or a notebook's interrupt reach this process only
    # (ignoring it left such a run going to the end). A terminal's ^C reaches the child as well; the child takes
    # only the first SIGINT (``_interrupt_once``), so it stops once and says so once.
    sent: set[int] = set()

    def forward(sig: int, _frame) -> None:
        sent.add(sig)
        _forward(pid, sig)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, forward if forward_sigint else signal.SIG_IGN)
    _hold_sigint(False)
    try:
        while True:
            try:
                status = _wait_once(pid)
                if status is not None:
                    break
                if signal.SIGTERM in sent:  # again: a first one that came just before a blocking read waits
                    _forward(pid, signal.SIGTERM)  # in the worker until the read returns (it ignores repeats)
            except ChildProcessError:
                return EXIT_USAGE
            except InterruptedError:
                continue
    finally:
        for signum, handler in previous.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(signum, handler)
    cleanup()  # before this process may die of the child's signal below
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    sig = os.WTERMSIG(status)
    if sig == signal.SIGBUS:
        _restore_tty(saved_tty)
        print(TRUNCATED, file=sys.stderr)
        return EXIT_USAGE
    with contextlib.suppress(OSError, ValueError):  # SIGKILL (the OOM killer's) takes no handler and needs none
        signal.signal(sig, signal.SIG_DFL)  # die the way the child did, so the shell sees the same status
    os.kill(os.getpid(), sig)
    return 128 + sig


_POLL_S = 1.0


def _wait_once(pid: int) -> int | None:
    """The worker's wait status, or None after _POLL_S without its end: a signal whose handler Python defers until
    a blocking call returns (one that arrived just before it) then runs within _POLL_S. Without pidfd_open (not
    Linux >= 5.3): a blocking wait."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return os.waitpid(pid, 0)[1]
    try:
        import select

        select.select([fd], [], [], _POLL_S)
        done, status = os.waitpid(pid, os.WNOHANG)
        return status if done else None
    finally:
        os.close(fd)


def _interrupt_once(_signum, _frame) -> None:
    """The child's SIGINT handler: the first one stops the command (KeyboardInterrupt, "diagnose: interrupted",
    exit 130); a second one (the terminal's ^C and the parent's forwarded copy of it) is ignored, so that it cannot
    interrupt the clean-up of the first."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _die_with(parent: int) -> None:
    """A ``kill -9`` of diagnose (a scheduler's time limit, ``timeout -k``, a user) kills its worker too: the parent
    cannot forward SIGKILL, so the child asks Linux to send it one when the parent dies (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError, ValueError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(128 + int(signal.SIGKILL))


def _forward(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def _save_tty():
    try:
        import termios

        if sys.stdin is not None and sys.stdin.isatty():
            return termios.tcgetattr(sys.stdin.fileno())
    except (ImportError, OSError, ValueError):
        pass
    return None


def _restore_tty(saved) -> None:
    if saved is None:
        return
    with contextlib.suppress(ImportError, OSError, ValueError):
        import termios

        termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
        if sys.stdout is not None and sys.stdout.isatty():
            sys.stdout.write(_RESET_TERMINAL)
            sys.stdout.flush()
