"""``diagnose analyze`` through the real CLI: formats, exit codes, --output, --rules, stdin, errors as one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.match import engine
from diagnose.model import DiagnoseError
from diagnose.present.cli import main
from diagnose.present.commands import analyze

ROOT = Path(__file__).resolve().parents[1]
OOM_LOG = (
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/w/pretrain.py", line 10, in train_step\n'
    "[rank0]:     loss.backward()\n"
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
    "of 79.10 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory in use. "
    "Of the allocated memory 70.01 GiB is allocated by PyTorch, and 6.53 GiB is reserved by PyTorch but unallocated.\n"
)
USER_RULE = '''
[[rule]]
code = "USR001"
slug = "my-oom"
title = "Our cluster's OOM"
category = "cuda_oom"
explanation = "Ours."
patterns = [ { anchor = "CUDA out of memory", regex = 'CUDA out of memory' } ]
'''


@pytest.fixture
def oom_log(tmp_path):
    p = tmp_path / "job.log"
    p.write_text(OOM_LOG)
    return p


def test_json_format_and_exit_code_1(oom_log, capsys):
    assert main(["analyze", str(oom_log), "-f", "json", "--no-replay"]) == 1
    data = json.loads(capsys.readouterr().out)
    root = data["findings"][data["root_cause"]]
    assert root["category"] == "cuda_oom"
    assert root["evidence"][-1]["line"] == 4


def test_clean_log_exits_0(tmp_path, capsys):
    p = tmp_path / "ok.log"
    p.write_text(" iteration        1/     100 | lm loss: 7.0 |\nall done\n")
    assert main(["analyze", str(p), "--no-replay"]) == 0
    assert "No failure found." in capsys.readouterr().out


def test_output_file_and_markdown(oom_log, tmp_path, capsys):
    out = tmp_path / "report.md"
    assert main(["analyze", str(oom_log), "-f", "markdown", "-o", str(out), "--no-replay"]) == 1
    assert capsys.readouterr().out == ""
    assert out.read_text().startswith("## diagnose:")


def test_missing_file_is_one_line_exit_2(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope.log")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diagnose: error:") and err.count("\n") == 1


def test_bad_gpu_memory_is_a_usage_error(oom_log, capsys):
    assert main(["analyze", str(oom_log), "--gpu-memory", "lots"]) == 2
    assert "--gpu-memory" in capsys.readouterr().err


def test_parse_size():
    """analyze --gpu-memory reads sizes with gpus.parse_gpu_memory."""
    from diagnose.explain.memory.gpus import parse_gpu_memory

    def parse_size(text):
        return parse_gpu_memory(text)[0]

    assert parse_size("80GiB") == 80 << 30
    assert parse_size("80G") == 80 << 30
    assert parse_size("141GB") == 141 * 10**9
    assert parse_size("85899345920") == 80 << 30
    with pytest.raises(DiagnoseError, match="no unit"):  # issue 19 item 5: "80" is not 80 bytes
        parse_size("80")
    with pytest.raises(DiagnoseError):
        parse_size("0GiB")


def test_user_rules_refine_builtin_ones(oom_log, tmp_path, capsys):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "99_mine.toml").write_text(USER_RULE)
    assert main(["analyze", str(oom_log), "--rules", str(rules), "-f", "json", "--no-replay"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["findings"][data["root_cause"]]["rule"] == "USR001"  # last match wins: user rules come last


def test_catastrophic_user_rule_is_reported_not_hanging(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(engine, "REGEX_TIMEOUT_S", 0.05)
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "evil.toml").write_text(USER_RULE.replace("USR001", "EVIL01").replace(
        "{ anchor = \"CUDA out of memory\", regex = 'CUDA out of memory' }", "{ anchor = \"aaaa\", regex = '^(a|aa)+$' }"))
    log = tmp_path / "x.log"
    log.write_text("a" * 40 + "!\n" + OOM_LOG)
    assert main(["analyze", str(log), "--rules", str(rules), "-f", "json", "--no-replay"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert any("EVIL01" in w for w in data["warnings"])
    assert data["findings"][data["root_cause"]]["category"] == "cuda_oom"


def test_stdin_dash_and_python_dash_m():
    proc = subprocess.run(
        [sys.executable, "-m", "diagnose", "analyze", "-", "-f", "json", "--no-replay"],
        input=OOM_LOG.encode(), capture_output=True, cwd=ROOT, timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["root_cause"] == 0


def test_progress_bar_only_for_large_inputs(capsys):
    update, stop = analyze._progress_bar(True)
    update(10, 100)  # small input: nothing drawn
    assert capsys.readouterr().err == ""
    update(analyze.PROGRESS_MIN_BYTES, analyze.PROGRESS_MIN_BYTES * 2)
    stop()
    none_update, _ = analyze._progress_bar(False)
    assert none_update is None


def test_one_size_parser_for_every_command():
    """--gpu-memory of analyze and check read sizes with diagnose.units (issue 17: three parsers had drifted)."""
    from diagnose import units
    from diagnose.explain.memory import gpus

    for text in ("80GiB", "80G", "141GB", "79.15 GiB", "2t"):
        assert gpus.parse_gpu_memory(text)[0] == units.parse_size(text)
    assert units.parse_size("1024") == 1024  # --gpu-memory refuses it (issue 19 #5)
    assert units.parse_size("80 parsecs") is None and units.format_bytes(145309481042) == "135.33 GiB"
    assert units.format_gib_short(None) == "?" and units.format_gib_short(3 << 30) == "3.0G"
