"""Issue 19 conventions: the launch lines when a fix needs more GPUs (torchrun / srun with the node and GPU
counts) in text, markdown, JSON and ``check``; the one-line hint when the pure-Python scanner read a large log."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_hostile_cli import ROOT, cli

from diagnose.explain.render import launch_commands, node_split

SAMPLE = ROOT / "sample_logs" / "ddp_wrap_oom.log"  # fits on 8 GPUs with Megatron FSDP; the job ran on 1


def test_node_split_and_commands() -> None:
    assert node_split(8) == (1, 8) and node_split(3) == (1, 3) and node_split(16) == (2, 8)
    assert node_split(12) == (2, 6) and node_split(16, 4) == (4, 4) and node_split(7, 4) == (7, 1)
    two = launch_commands(16)
    assert two["torchrun"].startswith("torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d ")
    assert two["srun"].startswith("srun --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 ")
    assert "--rdzv" not in launch_commands(8)["torchrun"]


def test_analyze_prints_the_launch_lines_in_every_format() -> None:
    text = cli("analyze", str(SAMPLE), env_extra={"COLUMNS": "100"}).stdout.decode()
    assert ("    Launch      torchrun --nnodes=1 --nproc-per-node=8 TRAIN_SCRIPT [ARGS...]  (srun: --nodes=1 "
            "--ntasks-per-node=8 --gpus-per-node=8)") in text
    lines = text.splitlines()
    assert len(lines) <= 62 and any("torchrun --nnodes" in x for x in lines[:24])  # still on the first screen
    verbose = cli("analyze", str(SAMPLE), "-v", env_extra={"COLUMNS": "100"}).stdout.decode()
    assert "    Launch      needs >= 8 GPUs: launch with world size 8 (1 node x 8 GPUs)" in verbose
    assert "    torchrun    torchrun --nnodes=1 --nproc-per-node=8 TRAIN_SCRIPT [ARGS...]" in verbose
    assert "    srun        srun --nodes=1 --ntasks-per-node=8 --gpus-per-node=8 TRAIN_SCRIPT [ARGS...]" in verbose
    md = cli("analyze", str(SAMPLE), "-f", "markdown").stdout.decode()
    head = md.split("<details>", 1)[0]  # in the open, not folded
    assert "Launch:" in head and "torchrun --nnodes=1 --nproc-per-node=8" in head and "srun --nodes=1" in head
    render = json.loads(cli("analyze", str(SAMPLE), "-f", "json").stdout)["replay"]["render"]
    assert render["torchrun"].startswith("torchrun --nnodes=1 --nproc-per-node=8")
    assert render["srun"].startswith("srun --nodes=1 --ntasks-per-node=8 --gpus-per-node=8")


def test_the_jobs_node_size_from_the_log_sets_the_split(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("SLURM_GPUS_ON_NODE=4\n" + SAMPLE.read_text())  # 4-GPU nodes: 8 GPUs are 2 nodes
    render = json.loads(cli("analyze", str(log), "-f", "json").stdout)["replay"]["render"]
    assert "(2 nodes x 4 GPUs)" in render["launch"]
    assert render["srun"].startswith("srun --nodes=2 --ntasks-per-node=4 --gpus-per-node=4")


def test_check_names_the_launch_when_only_more_gpus_fit() -> None:
    res = cli("check", str(ROOT / "examples" / "run_config.yaml"), "--gpus", "1", "-f", "json")
    notes = json.loads(res.stdout)["memory"]["notes"]
    launch = next(n for n in notes if n.startswith("launch on "))
    gpus = int(launch.split()[2])
    assert gpus > 1 and f"torchrun --nnodes=1 --nproc-per-node={gpus}" in launch
    assert f"srun --nodes=1 --ntasks-per-node={gpus} --gpus-per-node={gpus}" in launch


@pytest.mark.parametrize("scanner, hinted", [("python", True), ("auto", False)])
def test_slow_scanner_hint_through_the_cli(scanner: str, hinted: bool, monkeypatch, capsys) -> None:
    """The hint exists (pipeline.slow_scanner_hint, >= 256 MiB); here the threshold is lowered so that a small log
    shows it through the real command (main()), in the text report and in JSON."""
    from diagnose import pipeline
    from diagnose.present.cli import main

    if scanner == "auto" and not any(__import__("importlib").util.find_spec(m) for m in ("hyperscan", "re2")):
        pytest.skip("no Hyperscan or RE2 here: auto is the pure-Python scanner")
    monkeypatch.setattr(pipeline, "SLOW_HINT_MIN_BYTES", 1000)
    monkeypatch.setenv("DIAGNOSE_SCANNER", scanner)
    monkeypatch.setattr(sys, "argv", ["diagnose"])
    assert main(["analyze", str(SAMPLE), "--no-replay", "--color", "never"]) == 1
    text = capsys.readouterr().out
    assert ("with the pure-Python scanner: pip install google-re2 numpy" in text) is hinted
    main(["analyze", str(SAMPLE), "--no-replay", "-f", "json"])
    warnings = json.loads(capsys.readouterr().out).get("warnings", [])
    assert any("pure-Python scanner" in w for w in warnings) is hinted


def test_default_report_with_an_srun_line_but_no_torchrun_line() -> None:
    """A fix rendered with only an srun line: the default report shows the note and that line (no KeyError)."""
    from types import SimpleNamespace

    from diagnose.present.text import _launch_texts

    rendered = {"launch": "# needs >= 8 GPUs", "srun": "srun --nodes=1 --ntasks-per-node=8 TRAIN_SCRIPT [ARGS...]"}
    report = SimpleNamespace(replay=SimpleNamespace(rendered=rendered))
    lines = [t.plain for t in _launch_texts(report, verbose=False)]  # type: ignore[arg-type]
    assert lines == ["    Launch      needs >= 8 GPUs",
                     "    srun        srun --nodes=1 --ntasks-per-node=8 TRAIN_SCRIPT [ARGS...]"]
