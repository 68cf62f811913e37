"""Round 30 of hostile use, through the real command line (docs/qa-report-6.md).

Each test failed before its fix. A compressed log cut short (copied while the job still wrote it) was refused
whole; now the part that is there is diagnosed, with one warning naming where the archive ends, while garbage
(not the format at all, or corrupt mid-stream) still gets the one-line error.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_logs" / "ddp_wrap_oom.log"
TIMEOUT = 60


def _env(**extra: str) -> dict:
    return {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "COLUMNS": "200", "DIAGNOSE_SKIP_SLURM": "1",
            **extra}


def run(*args: str, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagnose", *args], cwd=ROOT, env=_env(), timeout=TIMEOUT,
                          stdin=stdin, capture_output=True, text=True)


def _log_with_oom_then_more() -> bytes:
    """The OOM sample, then ~400 KB of ordinary lines (the part a cut archive loses)."""
    rng = random.Random(30)
    words = ["iteration", "loss", "lr", "grad", "norm", "tokens", "throughput", "elapsed", "skipped", "nan"]
    tail = "".join(f"[rank0]: {' '.join(rng.choice(words) for _ in range(8))} {rng.random():.6f}\n"
                   for _ in range(8000))
    return SAMPLE.read_bytes() + tail.encode()


_COMPRESS = {
    ".gz": lambda data: gzip.compress(data, compresslevel=6),
    ".bz2": lambda data: bz2.compress(data, compresslevel=1),  # 100 kB blocks: a cut keeps the first whole ones
    ".xz": lambda data: lzma.compress(data),
}


@pytest.mark.parametrize("suffix", sorted(_COMPRESS))
def test_a_compressed_log_cut_short_is_diagnosed_with_a_warning(tmp_path, suffix):
    packed = _COMPRESS[suffix](_log_with_oom_then_more())
    cut = tmp_path / f"job.log{suffix}"
    cut.write_bytes(packed[: len(packed) * 3 // 4])
    res = run("analyze", "--format", "json", str(cut))
    assert res.returncode == 1, res.stderr  # a failure found, not exit 2 "corrupt or truncated"
    report = json.loads(res.stdout)
    assert report["findings"][report["root_cause"]]["rule"] == "OOM102"
    warnings = [w for w in report.get("warnings", []) if "ends early" in w]
    assert len(warnings) == 1 and str(cut) in warnings[0] and "bytes" in warnings[0], report.get("warnings")
    text = run("analyze", str(cut))
    assert "archive ends early" in text.stdout and text.returncode == 1


def test_a_cut_archive_read_from_stdin_warns_too(tmp_path):
    packed = gzip.compress(_log_with_oom_then_more())
    res = run("analyze", "-", stdin=open(_write(tmp_path / "in", packed[: len(packed) // 2]), "rb"))
    assert res.returncode == 1 and "-: the gzip archive ends early" in res.stdout, res.stdout + res.stderr


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name, data", [
    ("mid-stream.log.gz", None),  # a gzip corrupted in its middle
    ("header-only.log.gz", b"\x1f\x8b\x08\x00\x00\x00"),  # cut before any output: nothing to read
    ("not-gzip.log.gz", b"just text, named .gz\n" * 20),
])
def test_garbage_archives_still_get_the_one_line_error(tmp_path, name, data):
    if data is None:
        packed = bytearray(gzip.compress(_log_with_oom_then_more()))
        middle = len(packed) // 2
        packed[middle:middle + 64] = bytes(64)
        data = bytes(packed)
    path = _write(tmp_path / name, data)
    res = run("analyze", str(path))
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and str(path) in res.stderr, res.stderr


# ------------------------------------------------------------------------ YAML configs parsed by libyaml

def _yaml_config(tmp_path: Path, blend: int) -> Path:
    import yaml

    cfg = yaml.safe_load((ROOT / "examples" / "run_config.yaml").read_text())
    cfg["dataset"] = {**(cfg.get("dataset") or {}), "blend": [f"/data/shard_{i:07d}" for i in range(blend)]}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_yaml_config_is_parsed_by_libyaml_not_the_pure_python_parser(tmp_path, monkeypatch):
    """``check cfg.yaml`` of a 10 MB config (a 450,000-path blend) took 14 s in PyYAML's pure-Python parser
    (30 s for qa-report-5's flow-style one); libyaml parses it, within the same limits."""
    import yaml

    from diagnose.explain.config import safe_yaml
    from diagnose.explain.config.extract import load_config
    from diagnose.model import DiagnoseError

    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml")

    def no_pure_python(*_a, **_k):
        raise AssertionError("the YAML config went through PyYAML's pure-Python parser")

    monkeypatch.setattr(safe_yaml.InertSafeLoader, "get_single_node", no_pure_python)
    config = load_config(str(_yaml_config(tmp_path, blend=2000)))
    assert config.values["model.num_layers"].value == 32
    with pytest.raises(DiagnoseError, match="more than 500000 nodes"):  # refused from the events, no graph built
        safe_yaml.safe_load("[" + "1," * 500_001 + "]")
    with pytest.raises(DiagnoseError, match="more than 256 aliases"):
        safe_yaml.safe_load("a: &a x\nb: [" + "*a, " * 300 + "]")


_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))

_DOCS = {
    "billion laughs": _LAUGHS,
    "a cycle": "a: &a [*a]\n",
    "a big anchored string used often": "s: &s " + "x" * 400_000 + "\nl: [" + "*s, " * 200 + "]\n",
    "python tags": "a: !!python/object/apply:os.system ['true']\nb: !custom {k: 1}\nc: !!python/name:os.getcwd ''\n",
    "merge keys": "base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n",
    "duplicate keys": "a: 1\nb: 2\na: 3\n",
    "deep nesting": "[" * 5000 + "]" * 5000,
    "nesting past the C bound": "[" * 150 + "]" * 150,
    "a tab": "a:\n\tb: 1\n",
    "an undefined alias": "a: *nowhere\n",
    "two documents": "a: 1\n---\nb: 2\n",
    "empty": "",
    "a long integer": "n: " + "9" * 5000 + "\n",
    "a 13th month": "d: 2024-13-01\n",
    "scalars": "i: 0x1f\nf: 1e3\nb: yes\nn: ~\nt: 2024-01-02\ns: '007'\ninf: .inf\nbin: !!binary aGk=\n",
    "unclosed flow": "a: [1, 2\n",
}


@pytest.mark.parametrize("name", sorted(_DOCS))
@pytest.mark.parametrize("strict", [False, True])
def test_libyaml_answers_as_the_pure_python_loader_does(name, strict):
    """The C path's value or one-line refusal is the pure-Python loader's, for hostile and odd documents."""
    from diagnose.explain.config import safe_yaml
    from diagnose.model import DiagnoseError

    def answer(load):
        try:
            return ("value", load())
        except DiagnoseError as e:
            return ("refused", str(e))

    text = _DOCS[name]
    pure = answer(lambda: safe_yaml._load(safe_yaml.InertSafeLoader, text, "cfg", strict))
    assert answer(lambda: safe_yaml.safe_load(text, what="cfg", strict_keys=strict)) == pure


# --------------------------------------------------------------- a log shown (not followed) cut shorter

_SHOWN_THEN_CUT = r"""
import os, sys, time
from diagnose.present.tui.logindex import LogIndex
path = sys.argv[1]
index = LogIndex(path).start()
assert index.done.wait(20)
count = index.line_count
with open(path, "r+b") as fh:
    fh.truncate(4096)  # copytruncate, or a job restarted into the same file, while the TUI shows it
    fh.seek(0)
    fh.write(b"the job started again\n")
print(repr(index.line_text(count - 1)))  # the view scrolled into the part that is gone (End)
print(index.search("iteration 39999", 0))  # a search over the old text
deadline = time.monotonic() + 20
while index.truncations == 0 and time.monotonic() < deadline:
    time.sleep(0.01)
print(index.line_count, index.line_text(0), index.follow_note, sep="|")
index.close()
"""


def test_a_shown_log_cut_shorter_is_read_again_not_sigbus(tmp_path):
    """``diagnose tui job.log`` (not following), the file cut shorter, then End: the TUI read the old lines
    through its map of the file, and the pages past the cut are gone: SIGBUS (qa-report-5 L1). Now each read of
    the map checks the file's size first; a cut file is read again from its start and the status line says so."""
    log = tmp_path / "job.log"
    log.write_bytes(b"".join(b"[rank0]: iteration %d of a job shown\n" % i for i in range(40_000)))  # > 1 MiB: mapped
    old = time.time() - 3600
    os.utime(log, (old, old))  # not a live file: ingest maps the file itself rather than a snapshot of it
    res = subprocess.run([sys.executable, "-c", _SHOWN_THEN_CUT, str(log)], cwd=ROOT, env=_env(),
                         timeout=TIMEOUT, capture_output=True, text=True)
    assert res.returncode == 0, (res.returncode, res.stderr[-500:])  # before: -7 (SIGBUS)
    gone, search, state = res.stdout.splitlines()
    assert gone == "''" and search == "None"
    count, first, note = state.split("|")
    assert int(count) > 0 and first == "the job started again", res.stdout
    assert "cut shorter" in note and "read again" in note


# ----------------------------------------------------------------- non-UTF-8 file names in JSON output

def _strict_json(text: str):
    """Parse as a strict reader does (serde_json, Go, jq refuse a lone surrogate): every string must encode."""
    def walk(value):
        if isinstance(value, str):
            value.encode("utf-8")  # UnicodeEncodeError on "\udcff"
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k)
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
    data = json.loads(text)
    walk(data)
    return data


@pytest.mark.parametrize("command", ["analyze", "verify"])
def test_a_file_name_that_is_not_utf8_is_written_as_escaped_bytes(tmp_path, command):
    """``LANG=C diagnose analyze --format json $'h_\\xff\\xfe.log'``: the path came out as ``"\\udcff\\udcfe"``,
    lone surrogates a strict JSON reader refuses (qa-report-5 L5). Now its bytes are written ``\\xff\\xfe``."""
    name = os.fsencode(tmp_path) + b"/h_\xff\xfe.log"
    with open(name, "wb") as fh:
        fh.write(SAMPLE.read_bytes())
    res = subprocess.run([sys.executable, "-m", "diagnose", command, "--format", "json", name], cwd=ROOT,
                         env=_env(LANG="C", LC_ALL="C"), timeout=TIMEOUT, capture_output=True)
    assert res.returncode in (0, 1), res.stderr
    text = res.stdout.decode("ascii")
    assert "\\udc" not in text
    data = _strict_json(text)
    if command == "analyze":
        assert data["inputs"][0]["path"].endswith("/h_\\xff\\xfe.log"), data["inputs"]
    assert "h_\\xff\\xfe.log" in json.dumps(data, ensure_ascii=False).replace("\\\\", "\\")


def test_unicode_clean_keeps_text_and_escapes_only_what_is_not_unicode():
    from diagnose.present.json_text import dumps

    value = {"a\udcffb": ["caf\u00e9 \U0001f600", "\ud800 alone", ("t",)], "n": 1, "p": Path("/x/\udcfe")}
    data = _strict_json(dumps(value, default=str))
    assert data == {"a\\xffb": ["caf\u00e9 \U0001f600", "\\xed\\xa0\\x80 alone", ["t"]], "n": 1, "p": "/x/\\xfe"}


# ----------------------------------------------------------------------------------------- Slurm job ids

@pytest.mark.parametrize("job_id", ["0", "4294967296", "0.batch", "0_1", "4294967294"])
def test_a_job_id_slurm_reads_as_every_job_is_refused(job_id):
    """``diagnose slurm 0`` (or 4294967296, which Slurm's 32-bit ids wrap to 0): ``scontrol show job 0`` lists
    every job, and the first one (another user's, another job) was shown as "SLURM JOB 0". Refused before any
    Slurm command runs, so no cluster is needed here."""
    res = run("slurm", job_id)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("diagnose: error: not a Slurm job id") and len(res.stderr.splitlines()) == 1


def test_job_ids_slurm_gives_are_still_accepted():
    from diagnose.ingest.slurm.jobid import parse_job_id

    assert str(parse_job_id("1")) == "1" and str(parse_job_id("4294967293_0.batch")) == "4294967293_0.batch"
    assert str(parse_job_id("123+1", step="0")) == "123+1.0"


# ------------------------------------------------------- check: Megatron-LM flags and Bridge overrides mixed

def test_bridge_overrides_in_a_megatron_lm_argument_list_are_not_dropped_silently(tmp_path):
    """``check args.txt --gpus 8`` where the flag list ends in ``model.num_layers=4 ddp.use_megatron_fsdp=true``:
    both were skipped without a word and the 32-layer config passed as if they were not there. Now one line says
    where they belong (``--set`` on a Megatron-LM list is applied: tests/test_check_cli.py)."""
    mixed = tmp_path / "args.txt"
    mixed.write_text((ROOT / "examples" / "mlm_args.txt").read_text() + " model.num_layers=4 ddp.use_megatron_fsdp=true\n")
    res = run("check", str(mixed), "--gpus", "8")
    assert res.returncode == 2 and res.stdout == "", res.stdout
    assert "'model.num_layers=4' (and 1 more) is a Megatron-Bridge override" in res.stderr
    assert "--set" in res.stderr and len(res.stderr.splitlines()) == 1


# ---------------------------------------------------------------------------- standard input a terminal

def test_analyze_dash_at_a_terminal_says_what_it_waits_for_then_reads_the_paste():
    """``diagnose analyze -`` typed at a terminal waited in silence (the TUI has a paste screen; analyze had not
    a word). Now one line on stderr says to paste and end with Ctrl-D; the paste is then diagnosed. The terminal
    is util-linux ``script``'s (its child's controlling terminal, as a user's shell gives)."""
    import shutil

    if shutil.which("script") is None:
        pytest.skip("no util-linux script to give the command a terminal")
    paste = b"".join(line[:1000] + b"\n" for line in SAMPLE.read_bytes().splitlines()) + b"\x04"
    res = subprocess.run(["script", "-qec", f"{sys.executable} -m diagnose analyze - -q --color never",
                          "/dev/null"], cwd=ROOT, env=_env(TERM="dumb"), input=paste, capture_output=True,
                         timeout=TIMEOUT)
    out = res.stdout.decode("utf-8", "replace")
    assert "reading a log from the terminal: paste it, then press Ctrl-D" in out, out[-2000:]
    assert res.returncode == 1 and "fix:" in out, out[-2000:]  # 1: a failure found in the paste (empty: 2)


# ------------------------------------------------------------------------------------------------- fleet

def test_fleet_scan_counts_add_up_when_two_files_are_one_job(tmp_path):
    """``fleet scan DIR`` where two files hold the same job (a copy kept next to the log): "2 jobs listed,
    0 already stored, 1 added (0 unreadable)", one job unaccounted for. Now the summary names it."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("job.log", "job-copy.log"):
        (logs / name).write_bytes(SAMPLE.read_bytes())
    res = run("fleet", "scan", str(logs), "--store", str(tmp_path / "fleet.db"), "--no-progress", "--jobs", "1")
    assert res.returncode == 0, res.stderr
    assert "2 jobs listed, 0 already stored, 1 added (0 unreadable, 1 the same job as another file)" in res.stderr
    assert res.stderr.rstrip().endswith("the store has 1 job"), res.stderr


@pytest.mark.parametrize("args", [("fleet", "report"), ("fleet", "scan", "sample_logs", "--no-progress")])
def test_a_folder_as_the_fleet_store_says_so(tmp_path, args):
    """``--store /tmp``: "is not a usable fleet store: disk I/O error" (report) or "unable to open database file"
    (scan), SQLite's words for a folder. Now one line says to name the store's file."""
    res = run(*args, "--store", str(tmp_path))
    assert res.returncode == 2 and res.stderr.strip() == (
        f"diagnose: error: {tmp_path} is a folder, not a fleet store: name the store's file (e.g. "
        f"{tmp_path / 'fleet.db'})"), res.stderr


# ------------------------------------------------------------------------------------- a config on stdin

def test_check_reads_the_config_from_stdin_with_a_dash(tmp_path):
    """``cat run_config.yaml | diagnose check - --gpus 8``: "config file not found: -" (``analyze -`` reads
    stdin; ``check /dev/stdin`` worked). Now ``-`` is standard input for a config (``check``, ``replay``)."""
    config = (ROOT / "examples" / "run_config.yaml").read_bytes()
    piped = subprocess.run([sys.executable, "-m", "diagnose", "check", "-", "--gpus", "8", "--format", "json"],
                           cwd=ROOT, env=_env(), input=config, capture_output=True, timeout=TIMEOUT)
    assert piped.returncode in (0, 1), piped.stderr  # 2 before: "config file not found: -"
    report = json.loads(piped.stdout)
    assert report["schema"] == "diagnose/check@1" and report["memory"]["params"] > 1e9
    empty = run("check", "-", "--gpus", "8")
    assert empty.returncode == 2 and empty.stderr.strip() == "diagnose: error: config -: standard input is empty"
