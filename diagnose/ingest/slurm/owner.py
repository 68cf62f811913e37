"""Read a job's output only when it is the job's own: a guard for root (the fleet Epilog) and for other users.

The job's owner chooses where its output goes (``--output``, a symlink named ``slurm-%j.out``). A process with
more rights than the owner (root in a per-node ``Epilog``, an admin running ``diagnose slurm``) that follows that
path could read a file the owner cannot, and a matched line would come back to the owner in the job's comment.
So, when we are root or not the job's owner, an output file is read only if the descriptor we open is a regular
file owned by the job's user (``st_uid``). A symlink the user made to their own file is fine: the check is on the
file opened, not on the name. Devices and FIFOs are refused before they are opened (opening some devices has side
effects). When root and Slurm did not say who owns the job, nothing is read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass

REFUSED = "not read:"  # how every refusal starts: the epilog logs these lines (never the job's comment)
_USER_ID = re.compile(r"^(?P<name>[^()]*)\((?P<uid>\d+)\)$")


@dataclass(frozen=True, slots=True)
class JobOwner:
    """The job's user as Slurm names it, and whether its files must be checked before we read them."""

    name: str = ""
    uid: int | None = None

    @property
    def must_check(self) -> bool:
        """Root reads anything, so root always checks; so does anyone who is not the job's user."""
        euid = os.geteuid()
        return euid == 0 or (self.uid is not None and self.uid != euid)


def owner_from_scontrol(user_id: str | None) -> JobOwner:
    """scontrol's ``UserId=alice(1001)``; a bare name is looked up in the password database."""
    text = (user_id or "").strip()
    m = _USER_ID.match(text)
    if m is not None:
        return JobOwner(m.group("name"), int(m.group("uid")))
    return owner_from_name(text)


def owner_from_name(name: str | None) -> JobOwner:
    """sacct's ``User`` (a name; a uid when the name is unknown to slurmdbd's host)."""
    name = (name or "").strip()
    if not name:
        return JobOwner()
    try:
        return JobOwner(name, pwd.getpwnam(name).pw_uid)
    except KeyError:
        return JobOwner(name, int(name)) if name.isdigit() else JobOwner(name)


def _open_no_follow(path: str, flags: int, owner: JobOwner) -> int:
    """Open ``path``; a final symlink is followed only when the job's user made it (its target is checked after)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno != errno.ELOOP:  # the last component is a symlink
            raise
    if os.lstat(path).st_uid != owner.uid:
        raise PermissionError(f"a symbolic link not made by the job's user {owner.name or '?'}")
    return os.open(path, flags)


def checked_fd(path: str, owner: JobOwner) -> tuple[int | None, str | None]:
    """(a descriptor open on ``path``, None) when it may be read for this job, else (None, why: one line that
    quotes nothing of the file). Without the need to check (our own job, not root) the descriptor is None too."""
    if not owner.must_check:
        return None, None
    who = f"{owner.name or '?'} (uid {owner.uid})"
    if owner.uid is None:
        return None, f"{REFUSED} Slurm did not say which user owns the job, so the file's owner cannot be checked"
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None, f"{REFUSED} not a regular file"  # not opened: opening some devices does something
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
        fd = _open_no_follow(path, flags, owner)
    except OSError as e:
        return None, f"{REFUSED} {e.strerror or e}"
    st = os.fstat(fd)  # the file we hold, whatever the name points at by now
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = f"{REFUSED} not a regular file"
    elif st.st_uid != owner.uid:
        why = f"{REFUSED} owned by uid {st.st_uid}, not by the job's user {who}"
    if why is not None:
        os.close(fd)
        return None, why
    return fd, None


def refusal(path: str, owner: JobOwner) -> str | None:
    """Why ``path`` must not be read for this job (one line, no content of the file), or None when it may be."""
    fd, why = checked_fd(path, owner)
    if fd is not None:
        os.close(fd)
    return why


@contextlib.contextmanager
def pinned(paths: list[str], owner: JobOwner) -> Iterator[tuple[dict[str, str], list[str]]]:
    """The inputs to read, each checked again and held open: ``({name to open: path to show}, refusals)``.

    When the owner must be checked, the name to open is ``/proc/self/fd/N`` of the descriptor that passed the
    check, so a symlink swapped after it (to a root-only file) changes nothing that is read. Closed on exit.
    """
    names: dict[str, str] = {}
    refused: list[str] = []
    held: list[int] = []
    proc = os.path.isdir("/proc/self/fd")
    try:
        for path in paths:
            fd, why = checked_fd(path, owner)
            if why is not None:
                refused.append(f"{path}: {why}")
            elif fd is None or not proc:
                names[path] = path
            else:
                held.append(fd)
                names[f"/proc/self/fd/{fd}"] = path
            if fd is not None and not proc:
                os.close(fd)
        yield names, refused
    finally:
        for fd in held:
            os.close(fd)
