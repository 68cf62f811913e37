"""Running Slurm's client commands: argument lists only (never a shell), a timeout, and clear one-line errors."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from diagnose.model import DiagnoseError

DEFAULT_TIMEOUT_S = 30.0


class SlurmUnavailable(DiagnoseError):
    """A Slurm command is not installed, or the cluster does not answer."""


@dataclass(slots=True)
class CommandResult:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def first_error_line(self) -> str:
        lines = (line.strip() for line in (self.stderr or self.stdout).splitlines())
        return next((line[:300] for line in lines if line), f"exit status {self.returncode}")


def run_slurm(argv: list[str], timeout: float = DEFAULT_TIMEOUT_S) -> CommandResult:
    """Run one Slurm client command (``argv[0]`` looked up on PATH) and capture its output as text.

    Raises SlurmUnavailable when the command is missing or times out; a non-zero exit is returned, not raised,
    because "Invalid job id specified" is an answer the callers handle.
    """
    program = shutil.which(argv[0])
    if program is None:
        raise SlurmUnavailable(
            f"{argv[0]} not found on PATH: run this on a Slurm login node (or start a local cluster with "
            "scripts/slurm-local.sh up and source its slurm.env)"
        )
    env = dict(os.environ)
    env["LC_ALL"] = "C"  # Slurm's own messages and dates in one fixed form
    env.pop("SLURM_TIME_FORMAT", None)  # sacct/scontrol dates stay ISO 8601
    try:
        done = subprocess.run([program, *argv[1:]], capture_output=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL, check=False, encoding="utf-8", errors="replace")
    except subprocess.TimeoutExpired:
        what = f"{' '.join(argv[:3])} did not answer within {timeout:.0f} s (is slurmctld up?)"
        raise SlurmUnavailable(what) from None
    except OSError as e:
        raise SlurmUnavailable(f"cannot run {argv[0]}: {e.strerror or e}") from None
    return CommandResult(list(argv), done.returncode, done.stdout, done.stderr)
