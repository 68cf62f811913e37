"""Issue 19: what a new user and a hostile input hit, through the real command line.

Each test ran against the tree before its fix and failed there; each says which item it keeps fixed.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_hostile_cli import OOM, ROOT, assert_clean_error, cli

SAMPLE = ROOT / "sample_logs" / "ddp_wrap_oom.log"


def run_shell(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "DIAGNOSE_SKIP_SLURM": "1"}
    return subprocess.run(["bash", "-c", script], capture_output=True, cwd=cwd, env=env, timeout=120)


# ---------------------------------------------------------------------------------------------- item 1


def test_item1_output_that_is_the_file_on_stdin_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(SAMPLE.read_bytes())
    res = run_shell(f'{sys.executable} -m diagnose analyze - -o job.log < job.log', tmp_path)
    assert res.returncode == 2, res.stderr
    assert b"standard input" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert log.read_bytes() == SAMPLE.read_bytes()


# ---------------------------------------------------------------------------------------------- item 2


def test_item2_gzip_on_stdin_and_without_suffix_is_decompressed(tmp_path: Path) -> None:
    packed = gzip.compress(SAMPLE.read_bytes())
    res = cli("analyze", "-", stdin=packed)
    assert res.returncode == 1 and b"ROOT CAUSE" in res.stdout, res.stderr
    plain_name = tmp_path / "job.log"
    plain_name.write_bytes(packed)
    res = cli("analyze", str(plain_name))
    assert res.returncode == 1 and b"ROOT CAUSE" in res.stdout, res.stderr


def test_item2_utf16_with_bom_is_decoded(tmp_path: Path) -> None:
    for encoding in ("utf-16", "utf-16-be", "utf-32"):
        path = tmp_path / f"{encoding}.log"
        bom = {"utf-16-be": b"\xfe\xff"}.get(encoding, b"")
        path.write_bytes(bom + SAMPLE.read_text(encoding="utf-8").encode(encoding))
        res = cli("analyze", str(path))
        assert res.returncode == 1 and b"ROOT CAUSE" in res.stdout, (encoding, res.stderr)


def test_item2_zstd_random_bytes_and_empty_inputs_are_refused(tmp_path: Path) -> None:
    zst = tmp_path / "job.log.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(200))
    assert_clean_error(cli("analyze", str(zst)), "zstd")
    noise = tmp_path / "noise.log"
    noise.write_bytes(os.urandom(100_000))
    assert_clean_error(cli("analyze", str(noise)), "binary data")
    assert_clean_error(cli("analyze", "-", stdin=os.urandom(5000)), "binary data")
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert_clean_error(cli("analyze", str(empty)), "empty")


def test_item2_nul_padding_left_by_a_crash_is_still_a_log(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    path.write_bytes(b"\x00" * 4096 + OOM.encode() + b"\n" + b"\x00" * 8192)
    res = cli("analyze", str(path))
    assert res.returncode == 1, res.stderr


def test_item2_one_empty_rank_in_a_folder_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_bytes(b"")
    (tmp_path / "rank1.log").write_text(OOM + "\n")
    res = cli("analyze", str(tmp_path))
    assert res.returncode == 1, res.stderr
    assert b"1 of 2 inputs are empty" in res.stdout


# ---------------------------------------------------------------------------------------------- item 3

_TRUNCATE_AFTER_MAP = """
import os, sys
from diagnose.ingest import sources
from diagnose.present.cli import entry
real = sources._map_file
def map_then_truncate(path, display_path, **hints):
    source = real(path, display_path, **hints)
    os.truncate(path, 0)  # another program empties the log once we mapped it (copytruncate)
    return source
sources._map_file = map_then_truncate
sys.argv = ["diagnose", *sys.argv[1:]]
sys.exit(entry())
"""


def test_item3_a_log_truncated_while_read_is_one_line_not_sigbus(tmp_path: Path) -> None:
    log = tmp_path / "old.log"
    log.write_bytes(b"x" * 100 + b"\n" * (4 << 20) + SAMPLE.read_bytes())  # over 1 MiB: memory-mapped
    os.utime(log, (1, 1))  # not a live file: mapped in place, not copied first
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DIAGNOSE_SKIP_SLURM": "1", "NO_COLOR": "1"}
    env.pop("DIAGNOSE_NO_FORK", None)
    res = subprocess.run([sys.executable, "-c", _TRUNCATE_AFTER_MAP, "analyze", str(log)], capture_output=True,
                         env=env, timeout=120)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert b"truncated" in res.stderr and len(res.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------- item 4

GOOD_CFG = """model:
  tensor_model_parallel_size: 2
  num_layers: 4
  hidden_size: 256
  num_attention_heads: 8
train:
  micro_batch_size: 1
  global_batch_size: 8
ddp:
  use_distributed_optimizer: true
"""


def test_item4_broken_configs_are_refused_with_did_you_mean(tmp_path: Path) -> None:
    cases = {
        "typo.yaml": (GOOD_CFG.replace("tensor_model_parallel_size", "tensor_model_paralel_size"),
                      "did you mean model.tensor_model_parallel_size"),
        "section.yaml": (GOOD_CFG.replace("train:", "trian:"), "did you mean train:"),
        "dup.yaml": (GOOD_CFG + "model:\n  num_layers: 8\n", "duplicate key 'model'"),
        "dotted.yaml": (GOOD_CFG + "model.num_layers: 999\n", "nest it under model:"),
        "type.yaml": (GOOD_CFG.replace("num_layers: 4", "num_layers: four"), "could not be converted to Integer"),
        "args.txt": ("--tensor-model-paralel-size 2 --num-layers 4 --hidden-size 256 --num-attention-heads 8\n",
                     "did you mean --tensor-model-parallel-size"),
    }
    for name, (text, words) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        assert_clean_error(cli("replay", str(path)), words)
    assert_clean_error(cli("check", str(tmp_path / "typo.yaml"), "--gpus", "8"), "did you mean")
    good = tmp_path / "good.yaml"
    good.write_text(GOOD_CFG)
    assert cli("replay", str(good)).returncode == 0
    assert_clean_error(cli("replay", str(good), "--set", "model.tensor_model_parallel_size=abc"),
                       "could not be converted to Integer")


# ---------------------------------------------------------------------------------------------- item 5


def test_item5_gpu_memory_without_unit_is_refused_and_a_wrong_one_is_not_silent(tmp_path: Path) -> None:
    assert_clean_error(cli("analyze", str(SAMPLE), "--gpu-memory", "80"), "no unit")
    res = cli("analyze", str(SAMPLE), "--gpu-memory", "80GiB", "--format", "json")
    import json

    data = json.loads(res.stdout)
    assert any("ignored" in w and "139.80 GiB" in w for w in data["warnings"]), data["warnings"]
    assert "169 %" not in res.stdout.decode() and data["memory"]["gpu_capacity_bytes"] > 139 << 30
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(GOOD_CFG)
    res = cli("check", str(cfg), "--gpus", "8", "--gpu-memory", "80GB")
    assert b"--gpu h100-80gb" in res.stdout.replace(b"\n", b" "), res.stdout[-800:]


# ---------------------------------------------------------------------------------------------- item 7


def test_item7_missing_config_file_is_one_line_exit_2(tmp_path: Path) -> None:
    res = cli("analyze", str(SAMPLE), "--config", str(tmp_path / "nope.yaml"))
    assert_clean_error(res, "--config", "no such file")
    assert res.stdout == b""


# ---------------------------------------------------------------------------------------------- item 20


def test_item20_a_closed_pipe_keeps_the_diagnosis_exit_code(tmp_path: Path) -> None:
    clean = tmp_path / "clean.log"
    clean.write_text("hello\nworld\n")
    # the reader is gone before we write: rich used to turn the EPIPE into exit 1 ("failure diagnosed")
    def script(log: Path) -> str:
        return f"{sys.executable} -m diagnose analyze {log} | (exec 0<&-; sleep 1); echo rc=${{PIPESTATUS[0]}}"

    res = run_shell(script(clean), tmp_path)
    assert b"rc=0" in res.stdout, (res.stdout, res.stderr)
    res = run_shell(script(SAMPLE), tmp_path)
    assert b"rc=1" in res.stdout, (res.stdout, res.stderr)
    assert b"Traceback" not in res.stderr and b"error" not in res.stderr


# ---------------------------------------------------------------------------------------------- item 23


def test_item23_full_disk_and_closed_stdout_are_one_line_errors(tmp_path: Path) -> None:
    for command in ("analyze", "rules"):
        args = f"analyze {SAMPLE}" if command == "analyze" else "rules list"
        res = run_shell(f"{sys.executable} -m diagnose {args} > /dev/full", tmp_path)
        assert res.returncode == 2 and b"No space left" in res.stderr and b"internal error" not in res.stderr, res
        res = run_shell(f"{sys.executable} -m diagnose {args} >&-", tmp_path)
        assert res.returncode == 2 and b"standard output is closed" in res.stderr, res


def test_item23_usage_errors_point_at_the_right_help_and_suggest(tmp_path: Path) -> None:
    res = cli()
    assert res.returncode == 2 and res.stdout == b"" and b"usage: diagnose" in res.stderr
    assert_clean_error(cli("analyze", str(SAMPLE), "--bogus"), "diagnose analyze --help")
    assert_clean_error(cli("rules", "show", "OOM10"), "did you mean")
    assert_clean_error(cli("analyze", str(SAMPLE), "--rules", "/dev/zero"), "not a folder")


def test_item23_zero_width_characters_are_shown_not_passed_raw(tmp_path: Path) -> None:
    log = tmp_path / "zw.log"
    log.write_text(OOM.replace("Tried to allocate", "Tried\u200b to\u2060 allocate\u00ad") + "\n", encoding="utf-8")
    for fmt in ("text", "markdown"):
        res = cli("analyze", str(log), "--format", fmt)
        out = res.stdout.decode("utf-8")
        assert res.returncode == 1, res.stderr
        assert not any(ch in out for ch in "\u200b\u200c\u200d\u2060\u00ad"), fmt
        assert "\\u200b" in out, fmt


# ---------------------------------------------------------------------------------------------- item 12


def test_item12_markdown_escapes_file_names_and_slurm_cells(tmp_path: Path) -> None:
    from diagnose.present.commands.slurm import failed_markdown

    log = tmp_path / "a`b <img src=x> @alice.log"
    log.write_text(OOM + "\n")
    res = cli("analyze", str(log), "--format", "markdown")
    line = next(ln for ln in res.stdout.decode().splitlines() if ln.startswith("Input: "))
    assert "`` " in line and "a`b <img src=x> @alice.log ``" in line, line  # one code span holds the whole name
    table = failed_markdown([{"job_id": "7", "name": "<img src=x> **bold** @alice", "state": "FAILED", "end": "-",
                              "diagnosis": "see [here](http://x) | ok"}])
    row = table.splitlines()[2]
    assert "\\<img" in row and "**bold**" not in row and "\\@alice" in row and "\\[here\\]" in row, row
    assert " <img" not in row and " @alice" not in row and "[here]" not in row, row
    assert row.count(" | ") == 4, row


# ---------------------------------------------------------------------------------------------- item 13


def test_item13_an_anchored_big_string_used_many_times_is_refused(tmp_path: Path) -> None:
    big = "x" * (1 << 20)
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text("\n".join(["model:", "  num_layers: 4", "train:", f"  a: &s {big}"]
                             + [f"  k{i}: *s" for i in range(40)]) + "\n")
    res = cli("replay", str(cfg), "--format", "json")
    assert_clean_error(res, "alias")
    assert len(res.stdout) < 1 << 20


# ---------------------------------------------------------------------------------------------- item 14


def test_item14_traceback_look_back_is_linear() -> None:
    """40k matching lines with no traceback: each used to search 1 MiB back for one (quadratic up to 1 MiB)."""
    from diagnose.match import engine

    class Buf(bytes):
        searched = 0

        def rfind(self, sub, lo=0, hi=None):  # count the bytes searched backwards for markers
            hi = len(self) if hi is None else hi
            if sub in engine._TRACEBACK_MARKERS:
                Buf.searched += max(0, hi - lo)
            return bytes.rfind(self, sub, lo, hi)

    data = Buf(b"ValueError: x\n" * 40_000)
    reader = engine._LineReader(data, "x.log")
    for start in range(0, len(data), 14):
        engine._stream_has_traceback_before(reader, start, ())
    # each byte is searched a bounded number of times (quadratic before: about 20 GB for this 0.5 MB)
    assert Buf.searched <= 8 * len(data), Buf.searched


def test_item14_a_huge_line_costs_little(tmp_path: Path) -> None:
    log = tmp_path / "blob.log"
    log.write_bytes(b"RuntimeError: " + b"y" * (40 << 20) + b"\n" + OOM.encode() + b"\n")
    res = cli("analyze", str(log), "--no-replay", "--format", "json")
    assert res.returncode == 1, res.stderr
    import json

    data = json.loads(res.stdout)
    assert data["findings"][data["root_cause"]]["rule"].startswith("OOM")
    assert data["inputs"][0]["lines"] == 2


def test_item14_windows_scan_head_and_tail_of_a_long_line() -> None:
    from diagnose.match.anchors import windows

    buf = b"a\n" + b"x" * 5000 + b"TAIL\n" + b"b\n"
    got = list(windows(buf, size=1000, max_line=400))
    text = b"".join(w for _, w in got)
    assert b"TAIL" in text and text.count(b"\n") == 3 and len(text) < 1000


# ---------------------------------------------------------------------------------------------- item 15


def test_item15_one_broken_file_in_a_folder_is_skipped_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text(OOM + "\n")
    (tmp_path / "rank1.log").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop.log").symlink_to(tmp_path / "loop.log")
    os.mkfifo(tmp_path / "rank3.log")  # no writer: must not be waited on
    (tmp_path / "rank0.log.1").write_text("older part\n")
    res = cli("analyze", str(tmp_path), "--format", "json")
    assert res.returncode == 1, res.stderr
    import json

    warnings = json.loads(res.stdout)["warnings"]
    assert any("3 files skipped" in w for w in warnings), warnings
    assert any("rotated log not read" in w and "rank0.log.1" in w for w in warnings), warnings


def test_item15_binary_stdin_stops_at_once() -> None:
    res = subprocess.run(f"{sys.executable} -m diagnose analyze - < /dev/zero", shell=True, capture_output=True,
                         timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert_clean_error(res, "binary data")


def test_item15_a_fifo_writer_that_pauses_loses_nothing(tmp_path: Path, monkeypatch) -> None:
    import threading
    import time

    from diagnose.ingest import sources

    monkeypatch.setattr(sources, "FIFO_TIMEOUT_S", 0.2)
    monkeypatch.setattr(sources, "FIFO_IDLE_AFTER_DATA_S", 2.0)
    fifo = tmp_path / "job.log"
    os.mkfifo(fifo)

    def writer() -> None:
        with open(fifo, "w") as fh:
            fh.write("first\n")
            fh.flush()
            time.sleep(0.6)  # longer than FIFO_TIMEOUT_S: used to end the read with an error
            fh.write("second\n")

    thread = threading.Thread(target=writer)
    thread.start()
    with sources.open_inputs([str(fifo)]) as (source,):
        assert bytes(source.buffer[:]) == b"first\nsecond\n"
    thread.join()


# ---------------------------------------------------------------------------------------------- item 18


def test_item18_option_values_are_validated(tmp_path: Path) -> None:
    assert_clean_error(cli("analyze", str(SAMPLE), "--bridge-version", "banana"), "release number")
    assert_clean_error(cli("analyze", str(SAMPLE), "--jobs", "0"), "at least 1")
    assert cli("analyze", str(SAMPLE), "--bridge-version", "0.4.0", "--no-replay").returncode == 1


def test_item18_a_step_the_job_does_not_have_is_an_error(tmp_path: Path) -> None:
    import pytest
    from test_slurm_parse import _runner_for, _train_job

    from diagnose.ingest.slurm.job import lookup_job
    from diagnose.ingest.slurm.jobid import parse_job_id
    from diagnose.model import DiagnoseError

    scontrol, rows = _train_job(tmp_path)
    runner = _runner_for(scontrol, rows, None)
    with pytest.raises(DiagnoseError, match=r"job 31 has no step 5 \(its steps: batch, 0\)"):
        lookup_job(parse_job_id("31", "5"), runner, settle_s=0, sleep=lambda s: None)
    assert lookup_job(parse_job_id("31", "0"), runner, settle_s=0, sleep=lambda s: None).steps


# ---------------------------------------------------------------------------------------------- item 6


def test_item6_logs_of_different_jobs_are_not_merged_silently(tmp_path: Path) -> None:
    logs = ROOT / "sample_logs"
    res = cli("analyze", str(logs / "b042_first_iter_oom.log"), str(logs / "ddp_wrap_oom.log"), "--no-replay", "-f",
              "json")
    assert b"these inputs hold 2 jobs" in res.stdout, res.stdout[-600:]  # one report each: test_issue19_jobs.py
    # two such logs in one folder: unsure (per-node logs of one job look alike), one report and the warning
    (tmp_path / "mixed").mkdir()
    for name in ("b042_first_iter_oom.log", "ddp_wrap_oom.log"):
        (tmp_path / "mixed" / name).write_text((logs / name).read_text())
    res = cli("analyze", str(tmp_path / "mixed"), "--no-replay", "-f", "json")
    assert b"look like logs of different jobs" in res.stdout, res.stdout[-600:]
    # ranks of one job, one file each: no such warning
    (tmp_path / "rank0.log").write_text((ROOT / "tests" / "slurm_jobs" / "task_oom.log").read_text())
    (tmp_path / "rank1.log").write_text((ROOT / "tests" / "slurm_jobs" / "task_nccl_timeout.log").read_text())
    res = cli("analyze", str(tmp_path), "--no-replay")
    assert res.returncode == 1 and b"different jobs" not in res.stdout


# ---------------------------------------------------------------------------------------------- item 8


def test_item8_default_report_is_short_with_the_fix_on_the_first_screen() -> None:
    res = cli("analyze", str(SAMPLE.relative_to(ROOT)), env_extra={"COLUMNS": "100"})
    lines = res.stdout.decode().splitlines()
    # 62: the evidence now carries the allocating code line (`self.grad_data = torch.zeros(`), which the memory
    # model reads to name the buffer (fixer47); the fix itself must stay within the first 24 lines (below)
    assert res.returncode == 1 and len(lines) <= 62, len(lines)
    first = "\n".join(lines[:24])
    assert "ROOT CAUSE  OOM" in first and "line 34" in first and "Bridge CLI  ddp.use_megatron_fsdp=true" in first
    assert "Launch      torchrun --nnodes=1 --nproc-per-node=8" in first  # conventions: the launch line
    assert "  fix:" not in res.stdout.decode() and "render:" not in res.stdout.decode()
    verbose = cli("analyze", str(SAMPLE), "-v", env_extra={"COLUMNS": "100"}).stdout.decode()
    assert "CONFIG\n  version: <=0.4.x" in verbose and "    YAML" in verbose and "  Facts" in verbose
    quiet = cli("analyze", str(SAMPLE), "-q", env_extra={"COLUMNS": "100"}).stdout.decode().splitlines()
    assert 2 <= len(quiet) <= 6 and quiet[0].startswith("OOM") and any("fix: ddp.use_megatron_fsdp" in q for q in quiet)


def test_item8_markdown_folds_the_detail() -> None:
    md = cli("analyze", str(SAMPLE), "--format", "markdown").stdout.decode()
    assert md.count("<details><summary>") >= 3 and md.count("</details>") == md.count("<details>")
    head = md.split("<details>", 1)[0]
    assert "Root cause" in head and "**Evidence**" in head and "Bridge command line" in head


# ---------------------------------------------------------------------------------------------- item 9


def test_item9_follow_keeps_the_jobs_output_off_stdout(monkeypatch, capsys) -> None:
    from types import SimpleNamespace

    from diagnose import slurm_follow as follow
    from diagnose.model import Report
    from diagnose.present.cli import main

    def fake_follow(ref, options, on_text=None, **_kw):
        on_text("step 1 of the job's own output\n")
        return follow.FollowResult(SimpleNamespace(job=None, report=Report()), "job ended", 1.0)

    monkeypatch.setattr(follow, "follow_job", fake_follow)
    assert main(["slurm", "123", "--follow"]) == 0
    out, err = capsys.readouterr()
    assert "job's own output" not in out and "job's own output" in err
    assert "No failure found" in out


# ---------------------------------------------------------------------------------------------- item 17


def test_item17_the_readmes_example_rule_lints_clean(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    toml = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "mine.toml").write_text(toml)
    res = cli("rules", "lint", "--rules", str(tmp_path), "--only-user")
    assert res.returncode == 0, (res.stdout[-800:], res.stderr)
    assert b"USR001" in toml.encode() and b"duplicate" not in res.stdout
    (tmp_path / "mine.toml").write_text(toml.replace("USR001", "MB150"))
    res = cli("rules", "lint", "--rules", str(tmp_path), "--only-user")
    assert b"duplicate code" in res.stdout or b"codes beginning with U" in res.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_kill_9_of_diagnose_leaves_no_worker_behind():
    """The supervisor forks a worker (bus errors become one line); a SIGKILL of diagnose must take the worker too,
    or a killed epilog or fleet scan keeps writing behind the scheduler's back."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "diagnose", "analyze", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    children: list[int] = []
    for _ in range(100):
        try:
            children = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        except OSError:
            children = []
        if children:
            break
        time.sleep(0.05)
    assert children, "no worker forked"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for _ in range(100):
        if not Path(f"/proc/{children[0]}").exists() or "Z" in _state(children[0]):
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{children[0]}").exists() or "Z" in _state(children[0])
    proc.stdin.close()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


# ---------------------------------------------------------------------------------------------- item 22


def test_item22_context_is_labelled_and_the_odd_rank_is_the_headline() -> None:
    text = cli("analyze", str(SAMPLE), env_extra={"COLUMNS": "100"}).stdout.decode()
    assert "CONTEXT  LA004" in text and "INFO  LA004" not in text
    desync = cli("analyze", str(ROOT / "sample_logs" / "nccl_desync_seqnum.log"),
                 env_extra={"COLUMNS": "100"}).stdout.decode().splitlines()
    assert desync[4].startswith("  Rank 11 timed out on SeqNum 2452"), desync[:6]


def test_item22_fragmentation_sentence_claims_only_what_the_numbers_show() -> None:
    from diagnose.explain.memory.analysis import fragmentation_sentence
    from diagnose.explain.memory.verdict import OomNumbers

    gib = 1 << 30
    cache_too_small = fragmentation_sentence(OomNumbers(requested=4 * gib, reserved_unallocated=3 * gib, free=2 * gib))
    assert "add up to more than" in cache_too_small and "neither held it in one block" in cache_too_small
    cache_enough = fragmentation_sentence(OomNumbers(requested=1 * gib, reserved_unallocated=3 * gib, free=0))
    assert "more than the 1.00 GiB request" in cache_enough


# ---------------------------------------------------------------------------------------------- items 10, 19


def test_item10_tui_refuses_without_a_terminal_and_check_options_without_check() -> None:
    assert_clean_error(cli("tui", str(SAMPLE)), "needs a terminal")
    assert_clean_error(cli("tui", "--gpus", "8", str(SAMPLE)), "only with --check")


def test_item19_piped_output_follows_columns_and_rules_list_has_no_trailing_blanks() -> None:
    wide = cli("analyze", str(SAMPLE), env_extra={"COLUMNS": "200"}).stdout.decode().splitlines()
    assert max(len(line) for line in wide) > 120  # laid out at 200, not cut at 100
    listing = cli("rules", "list", env_extra={"COLUMNS": "200"}).stdout.decode().splitlines()
    assert listing and not any(line != line.rstrip() for line in listing)


# ---------------------------------------------------------------------------------------------- conventions


def test_conventions_select_ignore_exit_zero_and_short_version() -> None:
    assert cli("analyze", str(SAMPLE), "--select", "NC,SL", "--no-replay").returncode == 0  # no OOM rule ran
    ignored = cli("analyze", str(SAMPLE), "--ignore", "LA004", "--no-replay", "-f", "json")
    assert ignored.returncode == 1 and b'"LA004"' not in ignored.stdout
    assert cli("analyze", str(SAMPLE), "--exit-zero", "--no-replay").returncode == 0
    assert_clean_error(cli("analyze", str(SAMPLE), "--ignore", "OOM10X"), "did you mean")
    res = cli("-V")
    assert res.returncode == 0 and res.stdout.startswith(b"diagnose ")


def test_conventions_the_examples_folder_runs_as_the_readme_says() -> None:
    res = cli("check", "examples/run_config.yaml", "--gpus", "8", "--gpu", "h100-80gb")
    assert res.returncode == 1 and b"does NOT fit" in res.stdout, res.stderr
    res = cli("check", "examples/mlm_args.txt", "--gpus", "8")
    assert res.returncode == 0 and b"fits" in res.stdout, res.stderr


# ---------------------------------------------------------------------------------------------- item 16


def test_item16_check_answers_a_megatron_lm_list_in_flags() -> None:
    res = cli("check", "examples/mlm_args.txt", "--gpus", "8", "--gpu-memory", "40GiB", env_extra={"COLUMNS": "300"})
    out = res.stdout.decode()
    assert res.returncode == 1, res.stderr
    changes = [ln for ln in out.splitlines() if ln[:2].strip().isdigit()]
    assert changes and any("--use-megatron-fsdp" in ln for ln in changes)
    assert not any("ddp.use_megatron_fsdp=" in ln for ln in changes), changes


def test_conventions_ci_formats(tmp_path: Path) -> None:
    import json

    lines = cli("analyze", str(SAMPLE), "--no-replay", "-f", "jsonl").stdout.decode().splitlines()
    first = json.loads(lines[0])
    assert first["root_cause"] is True and first["rule"].startswith("OOM") and first["line"] == 34
    sarif = json.loads(cli("analyze", str(SAMPLE), "--no-replay", "-f", "sarif").stdout)
    result = sarif["runs"][0]["results"][0]
    assert sarif["version"] == "2.1.0" and result["level"] == "error"
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == 34
    # a hostile log cannot issue a workflow command of its own through an annotation
    log = tmp_path / "x,y:z.log"
    log.write_text(OOM.replace("Tried to allocate", "::warning::pwned%0A Tried to allocate") + "\n")
    out = cli("analyze", str(log), "--no-replay", "-f", "github").stdout.decode().splitlines()
    assert out[0].startswith("::error file=") and "%2C" in out[0] and "%3A" in out[0].split("::", 2)[1]
    assert all(line.startswith("::") and line.count("\n") == 0 for line in out)


def test_conventions_tool_diagnose_config_file(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.diagnose]\nignore = ["LA004"]\nformat = "json"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    env.pop("DIAGNOSE_NO_CONFIG", None)
    res = subprocess.run([sys.executable, "-m", "diagnose", "analyze", str(SAMPLE), "--no-replay"], cwd=tmp_path,
                         env=env, capture_output=True, timeout=120)
    assert res.returncode == 1 and res.stdout.startswith(b"{") and b'"LA004"' not in res.stdout, res.stderr
    res = subprocess.run([sys.executable, "-m", "diagnose", "analyze", str(SAMPLE), "--no-replay", "-f", "text"],
                         cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert res.stdout.startswith(b"diagnose \xc2\xb7")  # the command line wins
    (tmp_path / "pyproject.toml").write_text('[tool.diagnose]\nignroe = ["LA004"]\n')
    res = subprocess.run([sys.executable, "-m", "diagnose", "analyze", str(SAMPLE)], cwd=tmp_path, env=env,
                         capture_output=True, timeout=120)
    assert_clean_error(res, "did you mean 'ignore'")


# ---------------------------------------------------------------------------------------------- item 21


def test_item21_failed_list_names_who_cancelled_like_the_job_view() -> None:
    from diagnose.ingest.slurm.commands import CommandResult
    from diagnose.ingest.slurm.listing import _FIELDS, list_failed_jobs

    fields = _FIELDS.split(",")
    row = {"JobID": "42", "JobName": "train", "User": "root", "State": "CANCELLED by 0", "ExitCode": "0:15"}
    sacct = "|".join(fields) + "\n" + "|".join(row.get(f, "") for f in fields) + "\n"
    (job,) = list_failed_jobs("1d", "root", runner=lambda argv: CommandResult(argv, 0, sacct, ""))
    assert job.state_text() == "CANCELLED by root"


def test_item21_fix_steps_name_the_known_job_id() -> None:
    from diagnose.model import Finding, Fix, Report
    from diagnose.explain.words import fill_job_id

    shared = Fix(steps=["sacct -j JOBID -o JobID,State,ExitCode,Reason"])
    finding = Finding(rule="SL002", name="x", title="t", category="slurm", phase="unknown", severity="error",
                      role="context", confidence=0.9, fix=shared)
    report = Report(findings=[finding])
    fill_job_id(report, "117")
    assert report.findings[0].fix.steps == ["sacct -j 117 -o JobID,State,ExitCode,Reason"]
    assert shared.steps == ["sacct -j JOBID -o JobID,State,ExitCode,Reason"]  # the rule's own fix is untouched


def test_item21_a_job_whose_log_is_gone_says_so_in_the_list() -> None:
    from diagnose.model import Finding, Report, SlurmFacts, SlurmOutputFacts
    from diagnose.present.commands.slurm import one_line_diagnosis

    root = Finding(rule="SJ006", name="x", title="Slurm job state FAILED", category="slurm", phase="unknown",
                   severity="error", role="root", confidence=0.9)
    output = SlurmOutputFacts(path="/gone/x.out", stream="stdout", exists=False, readable=False)
    report = Report(findings=[root], root_cause=0, slurm=SlurmFacts(outputs=[output]))
    assert one_line_diagnosis(report).endswith("(log not found: from Slurm's record only)")
    output.exists = output.readable = True
    assert "log not found" not in one_line_diagnosis(report)


def test_conventions_completion_and_man_page_come_from_the_parser() -> None:
    from diagnose.present.cli import build_parser

    script = cli("completion", "bash").stdout.decode()
    analyze_opts = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices
                        and "analyze" in a.choices).choices["analyze"]
    for option in ("--select", "--exit-zero", "--gpu-memory"):
        assert option in script and any(option in a.option_strings for a in analyze_opts._actions)
    res = subprocess.run(["bash", "-c", script + '\nCOMP_WORDS=(diagnose analyze --exit); COMP_CWORD=2; _diagnose; '
                          'echo "${COMPREPLY[@]}"'], capture_output=True, text=True, timeout=30)
    assert res.stdout.split() == ["--exit-zero"], res
    man = cli("man").stdout.decode()
    assert man.startswith(".TH DIAGNOSE 1") and ".SS diagnose analyze" in man and "\\-\\-exit\\-zero" in man


def test_conventions_include_exclude_globs_for_folders(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text((ROOT / "tests" / "slurm_jobs" / "task_oom.log").read_text())
    (tmp_path / "rank1.log").write_text((ROOT / "tests" / "slurm_jobs" / "task_nccl_timeout.log").read_text())
    only = cli("analyze", str(tmp_path), "--include", "rank1*", "--no-replay", "-q").stdout.decode()
    assert only.startswith("NC") and "rank0.log" not in only
    without = cli("analyze", str(tmp_path), "--exclude", "rank1.log", "--no-replay", "-q").stdout.decode()
    assert without.startswith("OOM")
    assert_clean_error(cli("analyze", str(tmp_path), "--include", "none*"), "--include/--exclude")


def test_conventions_a_hint_when_the_slow_scanner_read_a_large_input(tmp_path: Path, monkeypatch) -> None:
    from diagnose import pipeline

    monkeypatch.setattr(pipeline, "SLOW_HINT_MIN_BYTES", 1000)
    log = tmp_path / "job.log"
    log.write_text(OOM + "\n" + "iteration line\n" * 100)
    slow = pipeline.analyze([str(log)], pipeline.AnalyzeOptions(backend="python", replay=False))
    assert any("pure-Python scanner" in w for w in slow.warnings)
    fast = pipeline.analyze([str(log)], pipeline.AnalyzeOptions(backend="auto", replay=False))
    assert not any("pure-Python scanner" in w for w in fast.warnings)


def test_conventions_failed_list_parsable_and_noheader() -> None:
    from diagnose.present.commands.slurm import failed_parsable

    rows = [{"job_id": "42", "name": "a|b\x1b[31m", "user": "u", "state": "FAILED exit 1", "end": "2026-12-01T10:00",
             "diagnosis": "[OOM102] CUDA OOM"}]
    text = failed_parsable(rows, parsable=True, header=True).splitlines()
    assert text[0] == "JobID|JobName|User|State|End|Diagnosis"
    assert text[1] == "42|a/b\\x1b[31m|u|FAILED exit 1|2026-12-01T10:00|[OOM102] CUDA OOM"
    assert failed_parsable(rows, parsable=True, header=False).startswith("42|")
    plain = failed_parsable(rows, parsable=False, header=False)
    assert plain.startswith("42     ") and "JobID" not in plain


def test_item21_failed_json_has_a_schema() -> None:
    import json

    import jsonschema

    from diagnose.present.commands.slurm import failed_json

    schema = json.loads(cli("schema", "failed").stdout)
    doc = failed_json("1d", [{"job_id": "42", "name": "x", "user": "u", "state": "FAILED exit 1", "end": "t",
                              "diagnosis": "[OOM102] CUDA OOM", "outputs": ["/tmp/x.out"]}], False)
    jsonschema.validate(json.loads(json.dumps(doc)), schema)
    doc["jobs"][0].pop("diagnosis")
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("a job without its diagnosis validated")
