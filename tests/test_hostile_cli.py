"""Hostile and broken input through the real command line (issue 8).

Every case runs `python -m diagnose ...` as a user would and checks the contract: the documented exit code, at most
one line on stderr that says what was wrong with what, no Python traceback, nothing from the log able to drive the
terminal, and an answer within a bounded time (the subprocess timeout).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 120
ESC = "\x1b"
OOM = (
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
    "of 79.11 GiB of which 1.00 GiB is free. Including non-PyTorch memory, this process has 78.00 GiB memory in use. "
    "Of the allocated memory 70.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated."
)


def cli(*args: str, stdin: bytes | None = None, preexec=None, env_extra: dict | None = None, close_stdin=False):
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    env.update(env_extra or {})

    def pre():
        if close_stdin:
            os.close(0)
        if preexec:
            preexec()

    return subprocess.run(
        [sys.executable, "-m", "diagnose", *args],
        input=stdin,
        stdin=None if stdin is not None else (subprocess.DEVNULL if not close_stdin else None),
        capture_output=True,
        timeout=TIMEOUT,
        cwd=ROOT,
        env=env,
        preexec_fn=pre if (close_stdin or preexec) else None,
    )


def assert_clean_error(res, *words: str) -> str:
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 2, (res.returncode, err, res.stdout[-500:])
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for w in words:
        assert w.lower() in lines[0].lower(), lines[0]
    return lines[0]


def assert_inert(out: bytes) -> None:
    text = out.decode("utf-8", "replace")
    assert ESC not in text, "an escape sequence from the log reached the terminal"
    assert "\x07" not in text and "\x9b" not in text


# ------------------------------------------------------------------------------------------- paths


def test_empty_file_is_an_error_not_a_clean_run(tmp_path):
    # issue 19 item 2: a job that died before writing its log is not "no failure" (this test said exit 0 before)
    p = tmp_path / "empty.log"
    p.write_bytes(b"")
    assert_clean_error(cli("analyze", str(p)), "empty.log is empty")


def test_empty_stdin_is_an_error():
    assert_clean_error(cli("analyze", "-", stdin=b""), "standard input is empty")


def test_missing_path(tmp_path):
    assert_clean_error(cli("analyze", str(tmp_path / "nope.log")), "nope.log")


def test_directory_without_logs(tmp_path):
    (tmp_path / "sub").mkdir()
    assert_clean_error(cli("analyze", str(tmp_path / "sub")), "sub")


def test_file_without_read_permission(tmp_path):
    p = tmp_path / "secret.log"
    p.write_text(OOM + "\n")
    p.chmod(0o000)
    prefix: list[str] = []
    if os.geteuid() == 0:
        # root reads anything: drop the capabilities that let it, as an ordinary user would run the tool
        setpriv = shutil.which("setpriv")
        if not setpriv:
            pytest.skip("running as root without setpriv: cannot make a file unreadable")
        prefix = [setpriv, "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [*prefix, sys.executable, "-m", "diagnose", "analyze", str(p)],
        capture_output=True, timeout=TIMEOUT, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
    )
    assert_clean_error(res, "secret.log")


def test_fifo_is_read_or_refused_cleanly(tmp_path):
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"printf '%s\\n' '{OOM}' > '{fifo}'"])
    try:
        res = cli("analyze", str(fifo))
    finally:
        writer.kill()
        writer.wait()
    err = res.stderr.decode()
    assert "Traceback" not in err
    assert res.returncode in (1, 2), err
    if res.returncode == 2:
        assert len(err.strip().splitlines()) == 1


def test_stdin_closed():
    res = cli("analyze", "-", close_stdin=True)
    assert "Traceback" not in res.stderr.decode()
    assert res.returncode in (0, 2)
    if res.returncode == 2:
        assert len(res.stderr.decode().strip().splitlines()) == 1


# -------------------------------------------------------------------------------------- content


def test_binary_nul_and_invalid_utf8_inside_a_traceback(tmp_path):
    body = (
        b"[rank0]: Traceback (most recent call last):\n"
        b'[rank0]:   File "/w/train.py", line 3, in <module>\n'
        b"[rank0]:     x = \xff\xfe\x00\x01 bad bytes \xc3\x28\n"
        + b"\x00\x01\x02\x03" * 64 + b"\n"
        + OOM.encode() + b" tail \xff\xfe\x00 end\n"
    )
    p = tmp_path / "bin.log"
    p.write_bytes(body)
    res = cli("analyze", "--format", "json", str(p))
    assert res.returncode == 1, res.stderr
    report = json.loads(res.stdout)
    root = report["findings"][report["root_cause"]]
    assert root["category"] == "cuda_oom"
    assert report["inputs"][0]["lines"] == 5
    assert "\\xff\\xfe" in root["evidence"][0]["text"]  # invalid bytes shown escaped, the line kept
    text = cli("analyze", str(p))
    assert "\\xff\\xfe" in text.stdout.decode()
    assert b"\x00" not in text.stdout


def test_a_200_mb_line_without_newline(tmp_path):
    p = tmp_path / "oneline.log"
    with open(p, "wb") as f:
        chunk = b"A" * (1 << 20)
        for _ in range(200):
            f.write(chunk)
        f.write(b" " + OOM.encode())  # no trailing newline either
    res = cli("analyze", "--format", "json", str(p))
    assert "Traceback" not in res.stderr.decode()
    assert res.returncode in (0, 1), res.stderr
    report = json.loads(res.stdout)
    assert report["inputs"][0]["bytes"] == p.stat().st_size


@pytest.mark.parametrize(
    "payload",
    [
        "\x1b]0;pwned title\x07",
        "\x1b[2J\x1b[H",
        "\x1b]52;c;ZWNobyBwd25lZA==\x07",
        "\x1b[10A\x1b[999C",
        "\x9b31m",
        "\x1bP+q\x1b\\",
    ],
    ids=["osc-title", "clear-screen", "osc52-clipboard", "cursor-moves", "c1-csi", "dcs"],
)
@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_escape_sequences_are_printed_inert(tmp_path, payload, fmt):
    p = tmp_path / "esc.log"
    p.write_text(f"[rank0]: RuntimeError: boom {payload} end\n{OOM} {payload}\n", encoding="utf-8")
    res = cli("analyze", "--format", fmt, str(p))
    assert res.returncode == 1, res.stderr
    assert_inert(res.stdout)
    assert_inert(res.stderr)


def test_rich_markup_in_log_lines_is_shown_literally(tmp_path):
    p = tmp_path / "markup.log"
    p.write_text(f"{OOM} [bold red]shout[/] [link=https://evil.example]click[/link]\n")
    res = cli("analyze", "--color", "always", str(p))
    out = res.stdout.decode()
    assert res.returncode == 1, res.stderr
    assert "\x1b]8;" not in out  # no hyperlink escape made from the log's markup
    flat = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", out).split())  # our own colours off, wrapping undone
    assert "[bold red]shout[/]" in flat
    assert "[link=https://evil.example]click[/link]" in flat


# ---------------------------------------------------------------------------------------- rules


def _user_rule(tmp_path: Path, regex: str, code: str = "UX001") -> Path:
    d = tmp_path / "myrules"
    d.mkdir(exist_ok=True)
    (d / "mine.toml").write_text(
        f"""
[[rule]]
code = "{code}"
slug = "user-rule"
title = "A user's rule"
category = "other"
explanation = "mine"
patterns = [{{ anchor = "aaaa", regex = '''{regex}''' }}]
[rule.examples]
match = []
no_match = []
"""
    )
    return d


def test_catastrophic_user_regex_is_bounded_and_named(tmp_path):
    rules = _user_rule(tmp_path, r"(a+)+$", "UX002")
    p = tmp_path / "evil.log"
    p.write_text(OOM + "\n" + "a" * 5000 + "!\n")
    res = cli("analyze", "--rules", str(rules), "--format", "json", str(p))
    err = res.stderr.decode()
    assert "Traceback" not in err
    assert res.returncode == 1, err
    report = json.loads(res.stdout)
    assert report["findings"][report["root_cause"]]["category"] == "cuda_oom"  # the rest of the catalogue ran
    assert "UX002" in err + json.dumps(report.get("warnings", []))


def test_invalid_user_regex_is_named(tmp_path):
    rules = _user_rule(tmp_path, r"aaaa(unclosed", "UX003")
    p = tmp_path / "x.log"
    p.write_text(OOM + "\n")
    res = cli("analyze", "--rules", str(rules), str(p))
    err = res.stderr.decode()
    assert "Traceback" not in err
    # a broken user rule stops the analysis (a report without the user's rules would look clean): one line, exit 2
    assert res.returncode == 2 and res.stdout == b""
    assert len(err.strip().splitlines()) == 1 and "UX003" in err and "rules lint" in err


def test_rules_file_that_is_not_toml(tmp_path):
    d = tmp_path / "badrules"
    d.mkdir()
    (d / "x.toml").write_text("[[rule]\ncode = ")
    p = tmp_path / "x.log"
    p.write_text(OOM + "\n")
    assert_clean_error(cli("analyze", "--rules", str(d), str(p)), "x.toml")


# --------------------------------------------------------------------------------------- configs


@pytest.mark.parametrize(
    "yaml_text",
    [
        "ddp: !!python/object/apply:os.system ['touch /tmp/diagnose-pwned']\n",
        "model: !!python/object/new:subprocess.Popen [['touch', '/tmp/diagnose-pwned']]\n",
        "_target_: os.system\nmodel:\n  _target_: subprocess.Popen\n  num_layers: 2\n",
        "a: &a ['x','x','x','x','x','x','x','x','x']\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
        "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\ni: [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n",
    ],
    ids=["python-apply", "python-new", "target-keys", "billion-laughs"],
)
@pytest.mark.parametrize("command", ["replay", "check"])
def test_hostile_config_yaml_is_never_constructed(tmp_path, yaml_text, command):
    marker = Path("/tmp/diagnose-pwned")
    marker.unlink(missing_ok=True)
    cfg = tmp_path / "run_config.yaml"
    cfg.write_text(yaml_text)
    args = [command, str(cfg)] + (["--gpus", "8"] if command == "check" else [])
    res = cli(*args)
    err = res.stderr.decode()
    assert not marker.exists(), "a YAML tag executed code"
    assert "Traceback" not in err
    assert res.returncode in (0, 1, 2), err
    if res.returncode == 2:
        assert len(err.strip().splitlines()) == 1, err


# ----------------------------------------------------------------------------------------- Slurm


@pytest.mark.parametrize("jobid", ["123; rm -rf /", "$(touch /tmp/x)", "12`id`", "../etc/passwd", "-1", "1 2"])
def test_slurm_job_ids_with_shell_metacharacters(jobid):
    assert_clean_error(cli("slurm", jobid), "job")


def test_slurm_commands_missing(tmp_path):
    res = cli("slurm", "123456", env_extra={"PATH": str(tmp_path)})
    line = assert_clean_error(res)
    assert "scontrol" in line or "sacct" in line or "slurm" in line.lower()


# ------------------------------------------------------------------------------------------ gzip


def test_corrupt_gzip(tmp_path):
    p = tmp_path / "job.log.gz"
    good = gzip.compress((OOM + "\n").encode() * 100)
    p.write_bytes(good[: len(good) // 2] + b"\x00garbage" * 10)
    assert_clean_error(cli("analyze", str(p)), "job.log.gz")


def test_gzip_bomb_is_bounded(tmp_path):
    p = tmp_path / "bomb.log.gz"
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(p, "wb") as f:
        zeros = b"\0" * (1 << 24)
        for _ in range(64):  # 1 GiB of zeros, about 1 MB compressed
            f.write(comp.compress(zeros))
        f.write(comp.flush())
    res = cli("analyze", str(p), env_extra={"DIAGNOSE_GZIP_MAX_RATIO": "100"})
    err = res.stderr.decode()
    assert "Traceback" not in err
    # Either refused as a bomb (one line, exit 2) or read within the caps without blowing up.
    assert res.returncode in (0, 2), err
    if res.returncode == 2:
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [
    ["analyze", "sample_logs/ddp_wrap_oom.log", "--no-replay"],
    ["replay", "sample_logs/ddp_wrap_oom.log"],
    ["check", "tests/data/configs/llama8b_bridge.yaml", "--gpus", "8"],
    ["schema", "report"],
])
def test_an_output_file_that_cannot_be_written_is_a_one_line_error(tmp_path, command):
    target = tmp_path / "no-such-folder" / "out.txt"
    res = cli(*command, "-o", str(target), env_extra={"DIAGNOSE_EXACT_PARAMS": "0"})
    line = assert_clean_error(res, "cannot write", str(target), "no such file")
    assert "internal error" not in line and not target.exists()


@pytest.mark.parametrize("kind", ["log", "folder", "config"])
def test_output_over_an_input_is_refused_and_the_input_kept(tmp_path, kind):
    """QA2 #1: `-o job.log` used to replace the only copy of the failed job's log with the report."""
    log = tmp_path / "logs" / "job.log"
    log.parent.mkdir()
    shutil.copy(ROOT / "sample_logs" / "ddp_wrap_oom.log", log)
    config = tmp_path / "run_config.yaml"
    shutil.copy(ROOT / "tests" / "data" / "configs" / "llama8b_bridge.yaml", config)
    before = {p: p.read_bytes() for p in (log, config)}
    command = {
        "log": ["analyze", str(log), "--no-replay", "-o", str(log)],
        "folder": ["analyze", str(log.parent), "--no-replay", "-o", str(log)],
        "config": ["check", str(config), "--gpus", "8", "-o", str(tmp_path / "." / "run_config.yaml")],
    }[kind]
    res = cli(*command, env_extra={"DIAGNOSE_EXACT_PARAMS": "0"})
    assert_clean_error(res, "is one of the inputs")
    assert {p: p.read_bytes() for p in before} == before


def test_output_next_to_the_log_is_written(tmp_path):
    log = tmp_path / "job.log"
    shutil.copy(ROOT / "sample_logs" / "ddp_wrap_oom.log", log)
    res = cli("analyze", str(log), "--no-replay", "-f", "json", "-o", str(tmp_path / "report.json"))
    assert res.returncode == 1, res.stderr
    assert json.loads((tmp_path / "report.json").read_text())["root_cause"] is not None
