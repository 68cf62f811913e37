"""Round 4 of the hostile new user (docs/qa-report-3.md): each defect found from a fresh plain install, through the
real command line (``diagnose.present.cli.main``); each test failed before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose.present.cli import main

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "examples" / "run_config.yaml")


@pytest.fixture(autouse=True)
def _no_exact_count(monkeypatch):
    # the megatron-core meta-device count costs seconds per shape; these tests are about refusing input
    monkeypatch.setenv("DIAGNOSE_EXACT_PARAMS", "0")


@pytest.mark.parametrize("layers", ["99999999999999999999999", "1000000000"])
def test_absurd_layer_count_is_one_line_not_a_crash_or_gigabytes(layers, capsys):
    # was: "internal error: OverflowError" for the first, an 8 GB per-layer list for the second
    rc = main(["check", CONFIG, "--gpus", "8", "--set", f"model.num_layers={layers}"])
    err = capsys.readouterr().err
    assert rc == 2 and "internal error" not in err, err
    assert err.count("\n") == 1 and "more layers than any model has" in err


def test_a_model_of_absurd_expert_count_is_not_built_on_the_meta_device():
    # was: the meta-count child built 10^9 experts' modules for minutes, GBs deep, until its 180 s timeout
    from diagnose.explain.memory.meta_count import buildable
    from diagnose.explain.memory.shape import ModelShape

    base = dict(num_layers=61, hidden_size=7168, num_attention_heads=128)
    assert buildable(ModelShape(**base, num_moe_experts=256))  # DeepSeek-V3's size is still built
    assert not buildable(ModelShape(**base, num_moe_experts=1_000_000_000))


def test_output_dash_is_standard_output(tmp_path, monkeypatch, capsys):
    # was: a file named "-" in the working folder, nothing on stdout
    monkeypatch.chdir(tmp_path)
    rc = main(["analyze", str(REPO / "sample_logs" / "ddp_wrap_oom.log"), "--format", "json", "-o", "-",
               "--no-progress"])
    assert rc == 1 and json.loads(capsys.readouterr().out)["schema"] == "diagnose/report@1"
    assert not (tmp_path / "-").exists()


def test_overriding_a_field_the_config_sets_is_not_called_a_typo(capsys):
    # was: "Could not override 'model.num_layers': no such field (did you mean model.mtp_num_layers?)", exit 1
    rc = main(["replay", CONFIG, "--set", "model.num_layers=4"])
    out = capsys.readouterr().out
    assert rc == 0 and "override_unknown_key" not in out, out


@pytest.mark.parametrize("key, hint", [("a.b.c.d=1", None), ("trian.train_iters=5", "train")])
def test_an_override_into_a_section_configcontainer_lacks_is_refused(key, hint, capsys):
    # was: `--set a.b.c.d=1` "passes validation with your overrides", exit 0
    rc = main(["replay", CONFIG, "--set", key])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 1 and "ConfigContainer has no section" in out, out
    assert (f"did you mean {hint}?" in out) if hint else "did you mean" not in out


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_terminal_that_is_not_utf8_gets_the_report(encoding):
    # was: "diagnose: internal error: UnicodeEncodeError: 'ascii' codec can't encode character '\xb7'", exit 2
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONIOENCODING=encoding, DIAGNOSE_SKIP_SLURM="1", DIAGNOSE_EXACT_PARAMS="0")
    done = subprocess.run([sys.executable, "-m", "diagnose", "analyze", str(REPO / "sample_logs" / "ddp_wrap_oom.log")],
                          capture_output=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 1 and b"internal error" not in done.stderr, done.stderr[-300:]
    assert b"ROOT CAUSE" in done.stdout and b"OOM102" in done.stdout


def test_one_line_is_not_called_lines(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"hello\n")))
    assert main(["analyze", "-", "--no-progress"]) == 0
    assert "(6 B, 1 line)" in capsys.readouterr().out


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("via", ["file", "stdin"])
def test_utf16_without_a_bom_is_decoded_not_called_clean(encoding, via, tmp_path, capsys, monkeypatch):
    # was: read with a NUL between letters, no rule matched: "No failure found.", exit 0
    import io

    data = (REPO / "sample_logs" / "ddp_wrap_oom.log").read_text().encode(encoding)
    path = tmp_path / "job.log"
    path.write_bytes(data)
    if via == "stdin":
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    rc = main(["analyze", str(path) if via == "file" else "-", "--format", "json", "--no-progress", "--no-replay"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["root_cause"] is not None
    assert report["findings"][report["root_cause"]]["rule"] == "OOM102"


def test_nul_padding_is_not_taken_for_utf16():
    from diagnose.ingest.sniff import bomless_utf16

    assert bomless_utf16(b"[rank0]: ok\n" * 50 + b"\x00" * 4000) is None  # a crashed writer's NUL run
    assert bomless_utf16(bytes(range(256)) * 16) is None
    assert bomless_utf16("line one\n".encode("utf-16-le") * 20) == "utf-16-le"


def test_a_file_named_twice_is_read_once(tmp_path, capsys):
    # was: "2 inputs", the root cause's evidence counted twice
    log = tmp_path / "job.log"
    log.write_bytes((REPO / "sample_logs" / "ddp_wrap_oom.log").read_bytes())
    rc = main(["analyze", str(log), str(tmp_path / "." / "job.log"), str(tmp_path), "--format", "json",
               "--no-progress", "--no-replay"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and len(report["inputs"]) == 1
    assert any("named twice, read once" in w for w in report["warnings"]), report["warnings"]


@pytest.mark.parametrize("argv, hint", [
    (["analyse", "job.log"], "(did you mean analyze?)"),
    (["analyze", "job.log", "--formta", "json"], "(did you mean --format?)"),
    (["analyze", "job.log", "--format", "JSON"], "(did you mean json?)"),
    (["rules", "shwo", "MB101"], "(did you mean show?)"),
    # a word for a command that has another name here (qa-report-4 L7: "explain" was "did you mean replay?")
    (["explain", "OOM102"], "(did you mean rules show CODE?)"),
    (["rules", "explain", "OOM102"], "(did you mean show CODE?)"),
    (["lint"], "(did you mean rules lint?)"),
])
def test_a_misspelt_command_choice_or_option_gets_a_did_you_mean(argv, hint, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert hint in err and err.count("\n") == 1, err


@pytest.mark.parametrize("via", ["file", "stdin"])
def test_lines_ending_in_a_lone_cr_are_lines(via, tmp_path, capsys, monkeypatch):
    # was: the file read as one progress-bar line, its last rewrite kept: "No failure found.", exit 0
    import io

    data = (REPO / "sample_logs" / "ddp_wrap_oom.log").read_bytes().replace(b"\n", b"\r")
    path = tmp_path / "job.log"
    path.write_bytes(data)
    if via == "stdin":
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    rc = main(["analyze", str(path) if via == "file" else "-", "--format", "json", "--no-progress", "--no-replay"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["findings"][report["root_cause"]]["rule"] == "OOM102"
    assert report["inputs"][0]["lines"] == 68


def test_progress_bars_stay_progress_bars():
    from diagnose.ingest.sniff import cr_lines

    assert not cr_lines(b"epoch 1\r 50%\r100%\n[rank0]: done\n")  # a newline: CRs are progress-bar rewrites
    assert cr_lines(b"line one\rline two\rline three\r")


@pytest.mark.parametrize("argv", [
    ["check", "{bad}", "--gpus", "1"],  # "<name> is not valid YAML": the name came out raw (tests/fuzz/fuzz_cli.py)
    ["check", "{missing}", "--gpus", "1"],  # "config file not found: <name>"
    ["analyze", "x.log", "--\x1b[31m"],  # argparse's "unrecognized arguments: <arg>"
])
def test_error_lines_show_control_characters_inert(argv, tmp_path, capsys):
    bad = tmp_path / "ru\x01n\x1b]0;t\x07.yaml"
    bad.write_text("model: [\n")
    argv = [a.format(bad=bad, missing=tmp_path / "no\x1b[2J.yaml") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n")
    assert "\x1b" not in err and "\x01" not in err and "\x07" not in err, repr(err)
    assert "\\x1b" in err


def test_a_megatron_lm_flag_given_two_values_is_refused_not_a_crash(tmp_path, capsys):
    # found by tests/fuzz/fuzz_cli.py: the values were kept as a list and megatron-core's validator compared it with
    # an int: "internal error: TypeError: '>' not supported between instances of 'list' and 'int'"
    args = tmp_path / "args.txt"
    args.write_text("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --pipeline-model-parallel-size 1 2\n")
    for command in (["check", str(args), "--gpus", "1"], ["replay", str(args)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "internal error" not in err and err.count("\n") == 1
        assert "model.pipeline_model_parallel_size: value [1, 2]" in err, err


def test_a_home_that_does_not_exist_is_not_created(tmp_path):
    # was: `HOME=/nonexistent diagnose analyze job.log` (as root) created /nonexistent/.cache/diagnose/
    import os
    import subprocess
    import sys

    home = tmp_path / "nonexistent"
    env = {k: v for k, v in os.environ.items() if k not in ("DIAGNOSE_CACHE_DIR", "XDG_CACHE_HOME", "DIAGNOSE_NO_CACHE")}
    env.update(HOME=str(home), DIAGNOSE_SKIP_SLURM="1", DIAGNOSE_NO_CONFIG="1")
    done = subprocess.run([sys.executable, "-m", "diagnose", "analyze", str(REPO / "sample_logs" / "ddp_wrap_oom.log"),
                           "--no-replay"], capture_output=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 1, done.stderr[-300:]
    assert not home.exists()
