"""qa-report-4 L1: Slurm installed but no controller to talk to. One line that says what to do, exit 2, and Slurm's
program name said once (it used to read ``sacct: sacct: error: ...``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.ingest.slurm.commands import CommandResult

REPO = Path(__file__).resolve().parents[1]
HINT = "is SLURM_CONF set / slurm.conf present? (for a local test cluster: scripts/slurm-local.sh up, in a diagnose checkout)"


def _diagnose(conf: str, *args: str, stubs: Path | None = None) -> subprocess.CompletedProcess:
    """``diagnose ARGS`` with SLURM_CONF=``conf``; with ``stubs``, Slurm's commands found there first on PATH."""
    env = dict(os.environ, SLURM_CONF=conf, PYTHONPATH=str(REPO), NO_COLOR="1")
    env.pop("DIAGNOSE_SKIP_SLURM", None)
    if stubs is not None:
        env["PATH"] = f"{stubs}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([sys.executable, "-m", "diagnose", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def _one_line_exit_2(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    return lines[0]


def _slurm_stubs(tmp_path: Path) -> Path:
    """A folder of stand-ins for Slurm's commands: the test reads the same whether or not Slurm's client is installed
    here (scripts/slurm-local.sh installs it; without it, the line was "sacct not found on PATH", qa-report-14 L7).
    They are never run: a SLURM_CONF naming no file is refused before any command starts (a run says so)."""
    stubs = tmp_path / "stub-bin"
    stubs.mkdir(exist_ok=True)
    for program in ("sacct", "scontrol", "squeue", "sinfo"):
        stub = stubs / program
        stub.write_text(f"#!/bin/sh\necho '{program} stub ran' >&2\nexit 99\n")
        stub.chmod(0o755)
    return stubs


@pytest.mark.parametrize("args", [("slurm", "123456"), ("slurm", "--failed"), ("fleet", "scan", "--sacct")])
def test_a_slurm_conf_that_is_not_there(tmp_path, args):
    """SLURM_CONF naming no file: Slurm would retry for 60 s; the tool says so at once, for any Slurm command."""
    extra = ("--store", str(tmp_path / "f.db")) if args[0] == "fleet" else ()
    line = _one_line_exit_2(_diagnose(str(tmp_path / "missing" / "slurm.conf"), *args, *extra,
                                      stubs=_slurm_stubs(tmp_path)))
    assert line == (f"diagnose: error: cannot reach the Slurm controller: SLURM_CONF={tmp_path}/missing/slurm.conf "
                    f"is not a file; {HINT}")


@pytest.mark.skipif(not (shutil.which("scontrol") and shutil.which("sacct")), reason="Slurm's commands not installed")
@pytest.mark.parametrize("args", [("slurm", "123456"), ("slurm", "--failed")])
def test_an_empty_slurm_conf_gives_slurms_first_line_and_what_to_do(tmp_path, args):
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    line = _one_line_exit_2(_diagnose(str(conf), *args))
    assert line.startswith("diagnose: error: cannot reach the Slurm controller: ") and line.endswith(HINT)
    program = "scontrol" if args[1].isdigit() else "sacct"
    assert f'{program}: s_p_parse_file: file "{conf}" is empty' in line  # Slurm's own first line, as it said it
    assert f"{program}: {program}:" not in line


def test_slurms_words_for_no_controller_become_the_hint():
    for stderr in ("sacct: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
                   "sacct: fatal: Could not establish a configuration source\n",
                   "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"):
        message = str(CommandResult(["sacct"], 1, "", stderr).failure("sacct"))
        assert message == f"cannot reach the Slurm controller: {stderr.splitlines()[0]}; {HINT}"


def test_other_errors_keep_slurms_words_with_the_program_named_once():
    done = CommandResult(["sacct"], 1, "", "sacct: error: Invalid user id: bob\n")
    assert str(done.failure("sacct")) == "sacct: error: Invalid user id: bob"
    done = CommandResult(["scontrol"], 1, "", "scontrol: error: Permission denied\n")
    assert str(done.failure("scontrol show job 7")) == "scontrol show job 7: error: Permission denied"
