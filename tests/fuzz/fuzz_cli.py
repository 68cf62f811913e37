"""Fuzz target: the command line, in-process (``diagnose.present.cli.main``), on fuzzed log bytes, file names,
option values, user rules and ``[tool.diagnose]`` config files.

Each input picks a command (``analyze`` in every format, ``check``, ``replay``, ``rules show``, ``verify``), writes
its payload as the log or config under a fuzzed file name in a fresh folder, adds fuzzed option values, and runs
``main(argv)`` there with HOME, the XDG folders, TMPDIR and the cache pointed inside that folder.

Invariants: the exit code is 0, 1 or 2 and no "internal error" is printed (``main`` turns any exception into that
line, so it is this target's traceback); stdout and stderr hold no escape character and no other control,
bidi or zero-width character (colour is allowed only as the SGR sequences ``--color always`` asks for); no file is
written outside the folder (the checkout and the working folder's parent are listed before and after).

    python3 tests/fuzz/fuzz_cli.py --seconds 1800 --crash-dir /tmp/fuzz-cli
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # run as a script from a checkout: import the checkout's package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # the harness beside it, also from the test suite
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Choices, encode  # noqa: E402

from diagnose.present.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("analyze", "analyze", "analyze", "check", "replay", "rules-show", "verify", "analyze-stdin")
FORMATS = ("text", "json", "markdown", "jsonl", "sarif", "github")
SUFFIXES = (".log", ".log.gz", ".yaml", ".txt", "", ".json", ".out")
GPU_MEMORY = ("80GiB", "80", "80GB", "0", "-1GiB", "1e400GiB", "nan", "141 GiB", "[b]1[/b]", "\x1b[31m80GiB")
OPTION_VALUES = ("0.4.0", "banana", "OOM,NC002", "LA004", "*.log", "model.tensor_model_parallel_size=abc",
                 "train.micro_batch_size=2", "h200", "h100-80gb", "8", "0", "-3", "[/]", "a=b=c", "=", "\u202e")
ENV_KEYS = ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "TMPDIR", "DIAGNOSE_CACHE_DIR", "NO_COLOR", "COLUMNS",
            "DIAGNOSE_SKIP_SLURM", "DIAGNOSE_DEBUG")
# C0 and C1 controls other than newline and tab, DEL, bidi controls, zero-width and other invisible characters.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069"
                     "\u2028\u2029\ufeff\u00ad\u180e]")
_SGR = re.compile(r"\x1b\[[0-9;]*m")
LAST: list = []  # the last argv and exit code, for the smoke test


def _name(c: Choices, suffix: str) -> str:
    stem = c.text(48).replace("/", "_").replace("\x00", "_") or "job"
    name = stem + suffix
    return "x" + name if name.startswith("-") or name in (".", "..") else name


def _value(c: Choices) -> str:
    return c.text(32) if c.flag() else c.pick(OPTION_VALUES)


def _argv(c: Choices, work: str, payload: bytes) -> list[str]:
    command = c.pick(COMMANDS)
    suffix = c.pick(SUFFIXES)
    path = os.path.join(work, _name(c, suffix))
    with open(os.fsencode(path), "wb") as fh:
        fh.write(payload)
    rel = os.path.basename(path)
    if command.startswith("analyze"):
        argv = ["analyze", "-" if command == "analyze-stdin" else rel, "--format", c.pick(FORMATS), "--no-progress"]
        if c.flag():
            argv.append("--no-replay")
        if c.flag():
            argv += ["--gpu-memory", c.pick(GPU_MEMORY) if c.flag() else c.text(16)]
        for option in ("--select", "--ignore", "--bridge-version", "--config", "--include"):
            if c.byte() % 6 == 5:
                argv += [option, rel if option == "--config" and c.flag() else _value(c)]
        argv += [c.pick(["-q", "-v", "--exit-zero", "--color=always", "--color=never", "-o", ""])]
        if argv[-1] == "-o":
            argv.append(_name(c, ".md"))
    elif command in ("check", "replay"):
        argv = [command, rel]
        if command == "check" or c.flag():
            argv += ["--gpus", c.pick(["8", "1", "0", "64", "3", "abc"])]
        if command == "check" and c.flag():
            argv += ["--gpu", _value(c)] if c.flag() else ["--gpu-memory", c.pick(GPU_MEMORY)]
        for _ in range(c.byte() % 3):
            argv += ["--set", _value(c)]
        argv += ["--format", c.pick(["text", "json"])]
    elif command == "rules-show":
        argv = ["rules", "show", c.text(12) if c.flag() else c.pick(["OOM103", "oom10", "MB1", "NC002", "x"])]
    else:
        argv = ["verify", rel] + (["--format", "json"] if c.flag() else [])
    argv = [a for a in argv if a != ""]
    if c.byte() % 8 == 7:  # a user rules file whose regex and fields come from the input
        rules = os.path.join(work, "user_rules.toml")
        with open(rules, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(f'[[rule]]\ncode = "U9{c.byte() % 100:02d}"\nslug = "u"\ntitle = "{_toml(c.text(24))}"\n'
                     f'category = "other"\nphase = "training"\nrole = "root"\nseverity = "error"\n'
                     f'explanation = "{_toml(c.text(24))}"\n[[rule.patterns]]\nanchor = "{_toml(c.text(8))}"\n'
                     f'regex = "{_toml(c.text(24))}"\n')
        if argv[0] == "analyze":
            argv += ["--rules", rules]
    if c.byte() % 8 == 7:  # a project config file in the working folder
        with open(os.path.join(work, "pyproject.toml"), "wb") as fh:
            fh.write(b"[tool.diagnose]\n" + c.text(60).encode("utf-8", "surrogateescape") + b"\n")
    return argv


def _toml(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_EDITS = re.compile(r"\.py$|^__pycache__$|^(slow-unit|crash|oom|timeout|leak)-")  # a developer's, libFuzzer's


def _listing(folder: Path) -> set[str]:
    """Names in ``folder``, less source files and fuzzer artifacts (someone editing the checkout during a long run
    is not the tool writing there)."""
    try:
        return {p.name for p in folder.iterdir() if not _EDITS.search(p.name)}
    except OSError:
        return set()


def check(data: bytes) -> None:
    c = Choices(data)
    root = Path(tempfile.mkdtemp(prefix="fuzz-cli-"))
    work = root / "work"
    work.mkdir()
    for sub in ("home", "config", "cache", "tmp", "dcache"):
        (root / sub).mkdir()
    payload_at = min(len(data), 96)  # choices come from the first bytes, the rest is the file
    argv = _argv(Choices(data[:payload_at]), str(work), data[payload_at:])
    del c
    watched = (ROOT, ROOT / "tests", ROOT / "diagnose", ROOT / "diagnose" / "_rules", root)
    before = [_listing(p) for p in watched]
    saved_env = {k: os.environ.get(k) for k in ENV_KEYS}
    saved_cwd, saved_tempdir, saved_stdin = os.getcwd(), tempfile.tempdir, sys.stdin
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.update(HOME=str(root / "home"), XDG_CONFIG_HOME=str(root / "config"),
                          XDG_CACHE_HOME=str(root / "cache"), TMPDIR=str(root / "tmp"),
                          DIAGNOSE_CACHE_DIR=str(root / "dcache"), DIAGNOSE_SKIP_SLURM="1", COLUMNS="100")
        os.environ.pop("NO_COLOR", None)
        os.environ.pop("DIAGNOSE_DEBUG", None)
        tempfile.tempdir = str(root / "tmp")
        os.chdir(work)
        sys.stdin = io.TextIOWrapper(io.BytesIO(data[payload_at:]), encoding="utf-8", errors="surrogateescape")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
        LAST[:] = [argv, rc]
    finally:
        os.chdir(saved_cwd)
        tempfile.tempdir, sys.stdin = saved_tempdir, saved_stdin
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        after = [_listing(p) for p in watched]
        leftovers = [n for n in os.listdir(root / "tmp") if not n.startswith("torchinductor_")]  # torch's own
        shutil.rmtree(root, ignore_errors=True)
    stdout, stderr = out.getvalue(), err.getvalue()
    where = f"argv={argv!r}\nstderr={stderr[-600:]!r}"
    assert rc in (0, 1, 2), f"exit code {rc!r}; {where}"
    internal = re.search(r"internal error: (\w+)", stderr)
    assert internal is None, f"internal error {internal.group(1) if internal else ''}; {where}"
    assert "Traceback" not in stderr, where
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        shown = _SGR.sub("", text) if "--color=always" in argv else text
        bad = _UNSAFE.search(shown)
        assert bad is None, f"raw {bad.group()!r} in {name}: {shown[max(0, bad.start() - 80):bad.end() + 40]!r}; {where}"
    new = [sorted(a - b) for a, b in zip(after, before)]
    assert not any(new), f"files appeared outside the work folder: {new}; {where}"
    assert not leftovers, f"left in TMPDIR: {leftovers}; {where}"


def _sample(name: str, limit: int = 4000) -> bytes:
    return (ROOT / "sample_logs" / name).read_bytes()[:limit]


def _pad(*parts: int | str | bytes) -> bytes:
    """A seed: the choices, padded to the fixed 96-byte choice area, then the file's content."""
    *head, body = parts
    choices = encode(*head)[:96]
    return choices + b"\x00" * (96 - len(choices)) + (body if isinstance(body, bytes) else encode(body))


def seeds() -> list[bytes]:
    oom, nccl = _sample("ddp_wrap_oom.log"), _sample("nccl_desync_seqnum.log")
    config_bytes = (ROOT / "examples" / "run_config.yaml").read_bytes()
    return [
        _pad(0, 0, "rank0", 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, oom),  # analyze rank0.log
        _pad(1, 0, "job[b]x[/b]", 1, 1, 1, 1, 0, 5, 0, "NC002,OOM", 0, 0, 0, 0, 0, nccl),  # json, --select
        _pad(2, 0, "we`ird\x1b[31m", 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, oom),  # markdown, --color=always
        _pad(0, 2, "r", 4, 1, 1, 0, 0, 0, 0, 0, 0, 0, 5, 1, "\x1b]0;t\x07", 0, 0, gzip.compress(oom)),  # sarif
        _pad(0, 0, "g", 5, 0, 0, 0, 0, 0, 0, 0, 5, "out[b]", 7, 1, "t[/b]", "ex", "OutOfMemory", "Out.*Memory", 0,
             oom),  # github, -o, a user rule
        _pad(0, 0, "v", 0, 0, 0, 0, 0, 0, 5, 1, 0, 0, 1, 0, 0, oom),  # -v, --config rank0.log-ish
        _pad(3, 2, "run_config", 1, 0, 0, 2, 1, 10, 1, 6, 0, config_bytes),  # check --gpus 8 --gpu-memory ..
        _pad(4, 2, "cfg", 1, 1, 2, 1, 0, 1, 5, 1, config_bytes),  # replay --gpus 8 --set abc
        _pad(3, 3, "args", 1, 1, 0, 7, 0, (ROOT / "examples" / "mlm_args.txt").read_bytes()),
        _pad(5, 0, "x", 0, 0, b""),  # rules show OOM103
        _pad(6, 6, "verify", 0, _sample("clean_run.log")),
        _pad(7, 0, "stdin", 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, nccl),
        _pad(0, 0, "cfg", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, "exclude = 3\nformat = 'json'", oom),  # pyproject
    ]


if __name__ == "__main__":
    from harness import main as fuzz_main

    sys.exit(fuzz_main("cli", check, seeds()))
