"""QA round 14 (docs/qa-report-14.md): a hostile new user: README's commands, hostile inputs, the CI formats.

Each test failed on the tree before its fix. Output tests run the real command line (tests/cli_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_run import ROOT, run, write

OOM = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
       "of 79.11 GiB of which 1.00 GiB is free.\n")


def test_the_ci_formats_point_at_the_line_the_rule_first_matched(tmp_path: Path) -> None:
    """A loss that turns NaN and stays NaN: the text report says "3 lines, first at line 2" and -q shows line 2, but
    --format jsonl, github and sarif pointed at line 4 (the last evidence line): a CI annotation on the third NaN,
    not the first."""
    lines = [f"Epoch 0:  {i}%|#  | {10 * i}/3125 [00:0{i}<05:32, 8.05it/s, loss={loss}, v_num=0]"
             for i, loss in enumerate(["2.31", "nan", "nan", "nan"], start=1)]
    log = str(write(tmp_path, "job.log", "\n".join(lines) + "\n"))
    quiet = run("analyze", "-q", "--color", "never", log).stdout
    assert f"{log}:2:" in quiet, quiet
    row = json.loads(run("analyze", "--format", "jsonl", log).stdout.splitlines()[0])
    assert (row["rule"], row["line"]) == ("NU005", 2), row
    assert ",line=2," in run("analyze", "--format", "github", log).stdout.splitlines()[0]
    sarif = json.loads(run("analyze", "--format", "sarif", log).stdout)
    assert sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"] == {"startLine": 2}


def test_a_log_that_starts_with_a_hole_of_nuls_is_read_after_the_hole(tmp_path: Path) -> None:
    """A log truncated while the trainer kept writing at its offset (``> train.log``, logrotate's copytruncate)
    starts with a run of NULs as long as the old log, then the new text. Its first 64 KiB are all NUL, so it was
    refused: "binary data, not a text log (a core dump, a checkpoint, or compressed?)", exit 2. The text after the
    hole is the log (written NULs here; a sparse hole, skipped without reading it, in the second file)."""
    written = tmp_path / "written.log"
    written.write_bytes(b"\x00" * (1 << 20) + OOM.encode())
    sparse = tmp_path / "sparse.log"
    with open(sparse, "wb") as fh:
        fh.truncate(256 << 20)
        fh.seek(256 << 20)
        fh.write(OOM.encode())
    for log in (written, sparse):
        proc = run("analyze", "--format", "json", "--no-progress", str(log))
        assert proc.returncode == 1, proc.stderr
        report = json.loads(proc.stdout)
        assert report["findings"][report["root_cause"]]["rule"].startswith("OOM"), report["findings"]


def test_a_file_of_nuls_only_is_called_that_not_a_core_dump(tmp_path: Path) -> None:
    """A file allocated and never written (``truncate -s``, ``fallocate``) holds only NULs: it was called "binary
    data ... (a core dump, a checkpoint, or compressed?)". Still refused in one line, exit 2, saying what it holds."""
    empty = tmp_path / "zeros.log"
    with open(empty, "wb") as fh:
        fh.truncate(8 << 20)
    proc = run("analyze", "--no-progress", str(empty), code=(2,))
    assert "only NUL bytes" in proc.stderr and "core dump" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_sarif_names_a_log_by_a_uri_not_by_a_raw_path(tmp_path: Path) -> None:
    """SARIF 2.1.0's artifactLocation.uri is a URI reference. A log named "run 1%20#2.log" was written as the raw
    path: a space (invalid), "%20" (decodes to a space: another file) and "#" (starts a fragment). Encoded, an
    absolute path as a file:// URI; a relative one stays relative."""
    from urllib.parse import unquote, urlsplit

    log = write(tmp_path, "run 1%20#2.log", OOM)
    sarif = json.loads(run("analyze", "--format", "sarif", str(log)).stdout)
    uri = sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    parts = urlsplit(uri)
    assert (parts.scheme, parts.fragment, parts.query) == ("file", "", ""), uri
    assert " " not in uri and unquote(parts.path) == str(log), uri
    relative = json.loads(run("analyze", "--format", "sarif", log.name, cwd=tmp_path).stdout)
    assert relative["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
        "run%201%2520%232.log"


def test_standard_input_named_twice_is_read_once(tmp_path: Path) -> None:
    """``cat job.log | diagnose analyze - -`` read the pipe for the first "-" and an empty second one: "warning: 1
    of 2 inputs are empty (0 bytes), e.g. -: those ranks wrote nothing". Named twice, read once, as a file is."""
    import os
    import subprocess
    import sys

    from tests.cli_run import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT), "DIAGNOSE_SKIP_SLURM": "1", "DIAGNOSE_NO_CONFIG": "1"}
    proc = subprocess.run([sys.executable, "-m", "diagnose", "analyze", "--format", "json", "-", "-"], input=OOM,
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert [i["path"] for i in report["inputs"]] == ["-"], report["inputs"]
    assert not any("empty" in w for w in report["warnings"]), report["warnings"]
    assert any("named twice, read once (e.g. standard input)" in w for w in report["warnings"]), report["warnings"]


def test_a_log_line_cannot_issue_a_ci_workflow_command_through_the_report(tmp_path: Path) -> None:
    """GitHub Actions reads a workflow command from any output line that starts, after white space, with "::", and
    (legacy form) from "##[" anywhere. The text report wraps a long evidence line at its width, so a log line
    carrying " ::error title=PWNED::..." printed a line "            ::error title=PWNED::fake1 ...": a forged
    annotation (or ``::add-mask::``, ``::stop-commands::``) in the step that ran diagnose. Markdown showed a log
    line starting with "::" as it was. Now shown as an escape (\\x3a:), as a control character is."""
    import re

    forged = " ".join(f"::error title=PWNED::fake{i}" for i in range(6))
    log = str(write(tmp_path, "job.log", OOM.rstrip("\n") + " " + forged + " ##[error]legacy\n"
                    "::warning::a line of its own\n"))
    command = re.compile(r"^\s*(?:\x1b\[[0-9;]*m\s*)*::|##\[", re.MULTILINE)
    for args in (("-v",), (), ("-q",), ("--color", "always"), ("--format", "markdown", "-v")):
        out = run("analyze", *args, "--no-progress", log).stdout
        assert not command.search(out), (args, [ln for ln in out.splitlines() if command.search(ln)])
    text = run("analyze", "-v", "--no-progress", log).stdout
    assert "\\x3a:error title=PWNED" in text


def test_a_typo_d_layer_count_is_not_built_layer_by_layer(monkeypatch) -> None:
    """``check`` on a Megatron-LM args file with ``--num-layers 100000`` (a typo) sat silent past 2 minutes: the
    meta-device child built 100,000 layers (about 10 ms each) until its timeout, since only layers x experts was
    capped; then every plan sized every layer one by one. No real model has more than ~130 layers: the analytic
    count stands at once, and a layer is sized once per kind (dense, MoE), not once per layer per plan."""
    from diagnose.explain.memory import meta_count
    from diagnose.explain.memory import shape as shape_mod
    from diagnose.explain.memory.shape import ModelShape

    typo = ModelShape(num_layers=100_000, hidden_size=1024, num_attention_heads=8)
    assert not meta_count.buildable(typo)
    assert meta_count.buildable(ModelShape(num_layers=126, hidden_size=16384, num_attention_heads=128))
    calls = []
    real = shape_mod._layer_at
    monkeypatch.setattr(shape_mod, "_layer_at", lambda *a: calls.append(a) or real(*a))
    moe = ModelShape(num_layers=48, hidden_size=1024, num_attention_heads=8, num_moe_experts=8, moe_layer_freq=2)
    shape_mod.stage_counts(moe, pp=4)
    assert len(calls) == 2, len(calls)  # one dense layer, one MoE layer


# --- qa-report-14 L5, L6 (lead) ---------------------------------------------------------------------------------------

def test_a_file_of_overrides_is_refused_with_the_way_to_give_them(tmp_path) -> None:
    """qa-report-14 L5: `check` on a file of Hydra-style KEY=VALUE lines was refused as not a config without saying
    that such lines are given with --set."""
    f = tmp_path / "overrides.txt"
    f.write_text("# my overrides\nmodel.tensor_model_parallel_size=2\ntrain.micro_batch_size=4\n")
    r = run("check", str(f), "--gpus", "8", code=(2,))
    assert "--set KEY=VALUE" in r.stderr and "Traceback" not in r.stderr
    other = tmp_path / "notes.txt"
    other.write_text("hello: world\n")
    assert "--set" not in run("check", str(other), "--gpus", "8", code=(2,)).stderr


def test_the_check_table_shows_the_fsdp_buffers_and_says_what_peak_is() -> None:
    """qa-report-14 L6: a Megatron FSDP plan's row showed state + activations well under its peak: the buffers in
    flight were in no column, and nothing said the peak is a maximum over phases, not a sum."""
    out = run("check", str(ROOT / "sample_logs" / "b042_first_iter_oom.log"), "--gpus", "8", "--color", "never").stdout
    header = next(ln for ln in out.splitlines() if "strategy" in ln and "peak" in ln)
    assert header.split()[:7] == ["#", "strategy", "dp/tp/pp/cp", "state", "bufs", "activ.", "peak"], header
    assert "not the sum of the columns" in " ".join(out.split())


def test_activations_walk_a_model_s_layers_once_per_pipeline_size_not_once_per_plan(monkeypatch) -> None:
    """qa-report-14 L1: after the build was capped, `check` on the 100,000-layer typo still took ~50 s: every plan's
    activation sizing walked every layer of every stage again. The layers of each kind per stage are counted once
    per shape and pipeline size."""
    from diagnose.explain.memory import shape as shape_mod
    from diagnose.explain.memory.activations import Workload, activation_bytes
    from diagnose.explain.memory.shape import ModelShape

    walks = []
    real = ModelShape.stage_layer_ids
    monkeypatch.setattr(ModelShape, "stage_layer_ids", lambda self, pp: walks.append(pp) or real(self, pp))
    shape_mod._stage_layer_kinds_cached.cache_clear()  # the count activations share with the parameter count
    typo = ModelShape(num_layers=100_000, hidden_size=1024, num_attention_heads=8)
    work = Workload(micro_batch_size=1, seq_length=4096)
    sizes = {activation_bytes(typo, work, tp=1, pp=4) for _ in range(50)}
    assert len(sizes) == 1 and walks.count(4) == 1, walks[:10]
