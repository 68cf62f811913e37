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

    def failure(self, what: str) -> SlurmUnavailable:
        """The one-line error for a failed command: what to do when no controller answers, else ``what: <Slurm's
        first line>`` (without repeating the program's name when Slurm's line starts with it)."""
        line = self.first_error_line()
        if any(sign in (self.stderr or self.stdout) for sign in _NO_CONTROLLER):
            return no_controller(line)
        program = what.split(None, 1)[0]
        if line.startswith(f"{program}: "):  # "sacct: error: ..." under "sacct": said once
            line = line[len(program) + 2 :]
        return SlurmUnavailable(f"{what}: {line}")


# What Slurm says (any line) when it has no configuration or no controller answers (seen with 22.05): the DNS SRV
# lookup of a configless cluster, a missing or empty slurm.conf, a controller that refuses or does not answer.
_NO_CONTROLLER = ("resolve_ctls_from_dns_srv", "Could not establish a configuration source",
                  "Unable to process configuration file", "s_p_parse_file: ", "Unable to contact slurm controller")


def no_controller(slurm_line: str) -> SlurmUnavailable:
    return SlurmUnavailable(f"cannot reach the Slurm controller: {slurm_line}; is SLURM_CONF set / slurm.conf "
                            "present? (for a local test cluster: scripts/slurm-local.sh up, in a diagnose checkout)")


def run_slurm(argv: list[str], timeout: float = DEFAULT_TIMEOUT_S) -> CommandResult:
    """Run one Slurm client command (``argv[0]`` looked up on PATH) and capture its output as text.

    Raises SlurmUnavailable when the command is missing or times out; a non-zero exit is returned, not raised,
    because "Invalid job id specified" is an answer the callers handle.
    """
    program = shutil.which(argv[0])
    if program is None:
        raise SlurmUnavailable(
            f"{argv[0]} not found on PATH: run this on a Slurm login node (or, in a diagnose checkout, start a local "
            "test cluster with scripts/slurm-local.sh up and source its slurm.env)"
        )
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):  # Slurm itself would retry for 60 s before saying so
        raise no_controller(f"SLURM_CONF={conf[:200]} is not a file")
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
