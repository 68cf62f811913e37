"""fixer45: one walk back over a traceback serves its frames and its raising code line; the rest of the lead's
known-left list (stop 42)."""

from __future__ import annotations

from pathlib import Path

from conftest import analyzed_root as _root

from diagnose.pipeline import AnalyzeOptions, analyze


def test_the_assert_statement_is_found_past_other_ranks_output(tmp_path: Path) -> None:
    # rank 1 prints 250 lines between rank 0's assert statement and its AssertionError: the raising code is read
    # from the traceback the frames were read from, not from a fixed 200 lines of the whole input
    noise = "".join(f"[rank1]: still waiting for peers ({i})\n" for i in range(250))
    text = (
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/opt/app/train.py", line 40, in <module>\n'
        "[rank0]:     main()\n"
        '[rank0]:   File "/opt/app/engine.py", line 1919, in _load_checkpoint\n'
        "[rank0]:     assert len(self.ckpt_list) > 0\n"
        + noise
        + "[rank0]: AssertionError\n"
    )
    root = _root(tmp_path, text)
    assert root.rule == "PY002"
    lines = [e.text.strip() for e in root.evidence]
    assert lines[:2] == ["[rank0]: AssertionError", "[rank0]:     assert len(self.ckpt_list) > 0"], lines
    assert [e.line for e in root.evidence[:2]] == [256, 5]


def test_preceding_keeps_the_two_nearest_matches_in_file_order(tmp_path: Path) -> None:
    # three of the hook's errors above its exit status, within the window: the two nearest are shown, above the
    # matched line, in file order; a line of another stream in between does not count against the window
    text = """\
slurmstepd: error: pyxis:     mkdir: cannot create directory '/a': Permission denied
slurmstepd: error: pyxis:     mkdir: cannot create directory '/b': Permission denied
1: unrelated output of task 1
slurmstepd: error: pyxis:     [INFO] retrying
slurmstepd: error: pyxis:     mkdir: cannot create directory '/c': Permission denied
slurmstepd: error: pyxis:     [ERROR] /etc/enroot/hooks.d/10-shadow.sh exited with return code 1
"""
    root = _root(tmp_path, text)
    assert root.rule == "SL016"
    shown = [e.text for e in root.evidence]
    assert not any("'/a'" in t for t in shown), shown
    b = next(i for i, t in enumerate(shown) if "'/b'" in t)
    c = next(i for i, t in enumerate(shown) if "'/c'" in t)
    assert b < c


def test_activations_and_parameters_count_the_same_layers_of_a_short_hybrid_pattern() -> None:
    # a pattern shorter than num_layers (megatron-core refuses it: the validator's hybrid_pattern_length says so):
    # the activations counted only the pattern's layers, the parameters every layer (those past it as MLP)
    from diagnose.explain.memory.activations import _stage_kinds
    from diagnose.explain.memory.shape import ModelShape, stage_layer_kinds

    short = ModelShape(num_layers=6, hidden_size=1024, num_attention_heads=8, hybrid_pattern="M*ME")
    for pp in (1, 2):
        for stage in range(pp):
            params = sum(n for n, _first in stage_layer_kinds(short, pp)[stage].values())
            assert sum(_stage_kinds(short, pp, stage)) == params == 6 // pp
    assert _stage_kinds(short, 1, 0) == (5, 1)  # the E layer is the MoE one; the two past the pattern are dense


def test_the_last_layer_moe_reads_as_the_list_of_moe_layers() -> None:
    from diagnose.explain.memory.shape import ModelShape

    shapes = [
        ModelShape(num_layers=6, hidden_size=64, num_attention_heads=8, hybrid_pattern="M*ME"),
        ModelShape(num_layers=4, hidden_size=64, num_attention_heads=8, hybrid_pattern="M*ME"),
        ModelShape(num_layers=3, hidden_size=64, num_attention_heads=8, hybrid_pattern="M*ME"),
        ModelShape(num_layers=7, hidden_size=64, num_attention_heads=8, num_moe_experts=8, moe_layer_freq=2),
        ModelShape(num_layers=8, hidden_size=64, num_attention_heads=8, num_moe_experts=8, moe_layer_freq=2),
        ModelShape(num_layers=5, hidden_size=64, num_attention_heads=8, num_moe_experts=8, moe_layer_freq=(0, 1)),
        ModelShape(num_layers=2, hidden_size=64, num_attention_heads=8, num_moe_experts=8, moe_layer_freq=(0, 1)),
        ModelShape(num_layers=4, hidden_size=64, num_attention_heads=8),
    ]
    # as the list of MoE layers reads it; past a short hybrid pattern (shapes[0]), as the layer counts read it (MLP)
    assert [s.last_layer_moe() for s in shapes[1:]] == [bool(s.moe_layers()[-1:] == [True]) for s in shapes[1:]]
    assert [s.last_layer_moe() for s in shapes] == [False, True, False, True, False, False, True, False]


def test_a_workflow_command_in_the_input_s_file_name_is_not_issued_by_the_github_format(tmp_path: Path) -> None:
    # qa-report-14 L4: the file= property carried "##[" from the file name unchanged (the runner reads its legacy
    # commands anywhere in a line); a "::" there is escaped as a property's ":" is
    import re

    from tests.cli_run import run

    log = tmp_path / "run ##[error]forged ::warning::x.log"
    log.write_text("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                   "total capacity of 79.11 GiB of which 1.00 GiB is free.\n")
    lines = run("analyze", "--format", "github", str(log)).stdout.splitlines()
    assert lines
    for line in lines:
        assert "##[" not in line, line
        assert re.match(r"::(error|warning|notice) [^:]*::", line), line  # our command, its properties escaped
        assert "file=" in line and "#\\x23[error]forged %3A%3Awarning%3A%3Ax.log" in line, line


HOLE_TEXT = ("[rank0]: iteration 1/10 | lm loss: 2.5\n"
             "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
             "capacity of 79.11 GiB of which 1.00 GiB is free.\n")


def _sparse_log(tmp_path: Path, hole: int) -> Path:
    import os

    import pytest

    log = tmp_path / "hole.log"
    with open(log, "wb") as fh:
        fh.truncate(hole)  # a hole: no disk used, read as NULs
        fh.seek(hole)
        fh.write(HOLE_TEXT.encode())
    with open(log, "rb") as fh:
        try:
            data = os.lseek(fh.fileno(), 0, os.SEEK_DATA)
        except (AttributeError, OSError):
            data = 0
    if data == 0:
        pytest.skip("this file system reports no holes (SEEK_DATA)")
    return log


def test_a_hole_at_a_log_s_head_is_skipped_not_read(tmp_path: Path, monkeypatch) -> None:
    # qa-report-14 L2: a log truncated while its writer kept its offset (here a 4 GiB hole, then text): the scanner
    # mapped and read every page of the hole (seconds, and the hole's size in resident memory); SEEK_DATA tells
    # where the data starts, the scan starts there, and line numbers stay those of the file (the hole holds no
    # newline: it is the head of line 1)
    from diagnose.ingest.sources import open_inputs
    from diagnose.match import engine

    hole = 4 << 30
    log = _sparse_log(tmp_path, hole)
    with open_inputs([str(log)]) as sources:
        assert 0 < sources[0].head_hole <= hole
    starts = []
    real = engine.windows
    monkeypatch.setattr(engine, "windows", lambda buf, size, start=0, *a: starts.append(start) or real(buf, size,
                                                                                                       start, *a))
    report = analyze([str(log)], AnalyzeOptions(replay=False))
    assert starts and min(starts) > 0
    root = report.root
    assert root is not None and root.rule == "OOM001"
    assert root.headline_evidence is not None and root.headline_evidence.line == 2
    assert report.inputs[0].lines == 2
    # in worker processes (a buffer this large is scanned in chunks by -j): the chunks start after the hole too
    from diagnose.match import parallel

    assert parallel.chunks(b"\x00" * 10 + b"a\nb\n", 1, first=10) == [(10, 12), (12, 14)]
    two = analyze([str(log)], AnalyzeOptions(replay=False, jobs=2))
    assert two.root is not None and two.root.rule == "OOM001" and two.root.headline_evidence.line == 2


def test_a_log_without_a_hole_is_read_from_its_first_byte(tmp_path: Path) -> None:
    from diagnose.ingest.sources import open_inputs

    log = tmp_path / "plain.log"
    log.write_text(HOLE_TEXT * 20000)  # past the size that is mapped rather than read
    with open_inputs([str(log)]) as sources:
        assert sources[0].head_hole == 0
