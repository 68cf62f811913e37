"""QA round 11 (docs/qa-report-11.md): the TUI, the output formats and multi-file inputs, and the newest logs.

Each test failed on the tree before its fix. Output tests run the real command line (tests/cli_run.py)."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from diagnose.match import engine
from diagnose.normalize import decode, normalize_line
from tests.cli_run import ROOT, finding_words, root_finding, run, write


class _Recording(bytes):
    """A log buffer that remembers the lowest byte offset any search started from."""

    lowest: int

    def rfind(self, sub, start=None, end=None):  # type: ignore[override]
        self.lowest = min(getattr(self, "lowest", len(self)), 0 if start is None else start)
        return super().rfind(sub, start, end)

    def find(self, sub, start=None, end=None):  # type: ignore[override]
        self.lowest = min(getattr(self, "lowest", len(self)), 0 if start is None else start)
        return super().find(sub, start, end)


def test_a_traceback_look_back_near_the_end_of_a_big_log_reads_only_its_window() -> None:
    """A 1.5 GB log of iteration lines whose only failure is at its end: the first look-back for a traceback
    searched the whole file from byte 0 (peak RSS 1.5 GB: the log faulted in a second time), though only the last
    TRACEBACK_LOOKBACK_BYTES can answer. It must search no further back than that window, and still find the
    traceback inside it."""
    filler = b"[rank0]: iteration 1 | lm loss: 2.3 | grad norm: 0.8\n" * (3 * engine.TRACEBACK_LOOKBACK_BYTES // 50)
    tail = b'[rank0]: Traceback (most recent call last):\n[rank0]:   File "train.py", line 9, in step\n'
    last = b"[rank0]: torch.OutOfMemoryError: CUDA out of memory.\n"
    buf = _Recording(filler + tail + last)
    start = len(buf) - len(last)
    stream = normalize_line(decode(last.rstrip()), "big.log", 0, None).stream
    assert engine._stream_has_traceback_before(engine._LineReader(buf, "big.log"), start, stream)
    assert buf.lowest >= start - engine.TRACEBACK_LOOKBACK_BYTES


def test_tui_on_a_pipe_that_has_not_ended_says_it_is_reading_standard_input(tmp_path) -> None:
    """``tail -f job.log | diagnose tui -``: the TUI spools the pipe before drawing, so a pipe that does not end
    left a blank terminal on which no key did anything, with no word. It must say on the terminal that it reads
    standard input until the pipe ends, and how to stop or follow a growing file instead."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DIAGNOSE_NO_CONFIG": "1", "DIAGNOSE_SKIP_SLURM": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "diagnose", "tui", "-"], stdin=subprocess.PIPE, stdout=slave,
                            stderr=slave, env=env, cwd=tmp_path, start_new_session=True)
    os.close(slave)
    seen = b""
    try:
        assert proc.stdin is not None
        proc.stdin.write((ROOT / "sample_logs" / "b042_first_iter_oom.log").read_bytes())
        proc.stdin.flush()  # and kept open: the pipe has not ended
        deadline = time.monotonic() + 30
        while b"standard input" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
            if proc.poll() is not None:
                break
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(master)
    text = seen.decode("utf-8", "replace")
    assert "standard input" in text and "--follow" in text, text


def test_a_missing_megatron_fused_softmax_kernel_is_not_told_to_install_apex(tmp_path: Path) -> None:
    """ci-gpt-neox-fused-kernels-configured-not-installed-exits-without-training: IM020 takes
    scaled_upper_triang_masked_softmax_cuda, a kernel of Megatron's own megatron/fused_kernels (GPT-NeoX builds it
    with megatron/fused_kernels/setup.py), not apex's. Every word said apex or gradient accumulation fusion; the
    thread: build the fused kernels, or turn the softmax / bias-gelu fusions off in the config."""
    finding = root_finding(tmp_path, (
        "Traceback (most recent call last):\n"
        '  File "/gpt-neox/megatron/model/fused_softmax.py", line 191, in forward_fused_softmax\n'
        "    import scaled_upper_triang_masked_softmax_cuda\n"
        "ModuleNotFoundError: No module named 'scaled_upper_triang_masked_softmax_cuda'\n"))
    words = finding_words(finding)
    assert "fused_kernels/setup.py" in words
    assert "scaled_upper_triang_masked_softmax_fusion" in words
    assert "fused kernels" in finding["title"] and "fused kernels" in finding["fix"]["summary"]


def test_an_early_timeout_with_one_silent_rank_names_main_process_set_up_work(tmp_path: Path) -> None:
    """ck-accelerate-mlm-no-trainer-...-tokenize-exceeds-30min, ck-diffusers-controlnet-flux-..., cm-trl-dpo-...
    (NC002): rank 0 tokenised the dataset (or cached embeddings) under main_process_first while the other ranks
    waited 30 minutes in the first collective. The steps named no such work and no Accelerate timeout; the
    threads: preprocess before the launch, or InitProcessGroupKwargs(timeout=...)."""
    finding = root_finding(tmp_path, "".join(
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:563] [Rank {r}] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800621 "
        "milliseconds before timing out.\n" for r in (1, 2, 3)))
    assert finding["rule"] == "NC002"
    steps = " ".join(finding["fix"]["steps"])
    assert "main_process_first" in steps and "InitProcessGroupKwargs" in steps


def test_a_port_in_use_fix_covers_a_program_that_sets_the_port_itself(tmp_path: Path) -> None:
    """cn-mochi-xdit-3gpu-hardcoded-master-port-29500-eaddrinuse (LA010): the pipeline hard-codes port 29500 for
    the process group its Ray actors start, so "use a free MASTER_PORT" (every step) changed nothing; the thread:
    patch the port the program sets, or stop the process holding it."""
    finding = root_finding(tmp_path, (
        "[W1205 18:20:49.511402170 socket.cpp:759] [c10d] The server socket has failed to bind to [::]:29500 "
        "(errno: 98 - Address already in use).\n"))
    assert finding["rule"] == "LA010"
    steps = " ".join(finding["fix"]["steps"])
    assert "changes nothing" in steps and "init_method" in steps


def test_a_timeout_during_training_names_a_slow_save_and_a_group_without_the_set_timeout(tmp_path: Path) -> None:
    """cn-mlm-distributed-timeout-minutes-ignored-by-new-group-600s-watchdog, cn-nemo-async-ckpt-save-... (NC007):
    the ranks timed out after 'saving checkpoint', at Timeout(ms)=600000 though the job set 120 minutes (a
    new_group made without it). NC007 had no step at all past 'find the rank that stopped'; the threads: pass the
    timeout to every group, or make the save faster."""
    finding = root_finding(tmp_path, (
        "  distributed_timeout_minutes ..................... 120\n"
        " [2025-03-18 10:46:20] iteration      500/   50000 | consumed samples:       512000 | elapsed time per "
        "iteration (ms): 9125.3 | learning rate: 1.500000E-04 | global batch size:  1024 | lm loss: 2.3600\n"
        "saving checkpoint at iteration     500 to /nfs/proj/ckpt/gpt13b\n"
        + "".join(f"[rank{r}]:[E1030 09:24:09.100333 ProcessGroupNCCL.cpp:583] [Rank {r}] Watchdog caught collective "
                  "operation timeout: WorkNCCL(SeqNum=8841, OpType=_ALLGATHER_BASE, NumelIn=16777216, "
                  "NumelOut=16777216, Timeout(ms)=600000) ran for 600080 milliseconds before timing out.\n"
                  for r in (1, 9, 17))))
    assert finding["rule"] == "NC007"
    steps = " ".join(finding["fix"]["steps"])
    assert "saving checkpoint" in steps and "new_group" in steps


def test_the_help_screen_keeps_a_gap_between_every_key_and_its_words() -> None:
    """`?` in the TUI: the key column was a fixed 16 characters, so the plan's "c e (in the table)" ran into its
    description ("c e (in the table)copy the highlighted ..."). Every key must be followed by at least two spaces
    on the screen Textual draws (Pilot)."""
    import asyncio

    from textual.widgets import Static

    from diagnose.model import Report
    from diagnose.present.tui.app import DiagnoseApp
    from diagnose.present.tui.screens import HelpScreen

    async def shown() -> str:
        app = DiagnoseApp([], report=Report())
        async with app.run_test(size=(140, 60)) as pilot:
            await pilot.pause()
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            return "\n".join(str(w.render()) for w in app.screen.query(Static))

    text = asyncio.run(shown())
    for key, what in HelpScreen.KEY_HELP:
        if what:
            assert f"  {key}  " in text, key


def _rss_file_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise AssertionError("no RssFile")


def test_the_tui_log_index_does_not_keep_the_whole_log_resident(tmp_path: Path) -> None:
    """`diagnose tui` on a 1.5 GB log: indexing, a search count and a rank filter read every page of the map and
    kept them, peak RSS 1.69 GB for a screen of lines (analysis itself stays at ~60 MB). Once indexed, searched
    or scanned, the pages go back to the kernel; what is drawn faults back in from the page cache."""
    import pytest

    from diagnose.present.tui.logindex import LogIndex

    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc (Linux)")
    line = b"[rank0]: iteration 1 | lm loss: 2.3 | grad norm: 0.8 | consumed samples: 512 | learning rate: 3e-4\n"
    path = tmp_path / "big.log"
    with path.open("wb") as fh:
        for _ in range(64):
            fh.write(line * ((1 << 20) // len(line)))
        fh.write(b"[rank0]: torch.OutOfMemoryError: CUDA out of memory.\n")
    size_kib = path.stat().st_size >> 10
    before = _rss_file_kib()
    index = LogIndex(str(path)).build_now()
    try:
        assert index.line_count > 600_000
        indexed = _rss_file_kib() - before
        lines, complete = index.match_lines("OutOfMemoryError", cap=10)  # reads every window
        assert index.search("outofmemoryerror", 0) == index.line_count - 1
        searched = _rss_file_kib() - before
        assert list(lines) == [index.line_count - 1] and complete
    finally:
        index.close()
    assert indexed < size_kib // 2, (indexed, size_kib)
    assert searched < size_kib // 2, (searched, size_kib)


def test_markdown_keeps_a_fix_steps_code_spans_as_code(tmp_path: Path) -> None:
    """`--format markdown` escaped every backtick of a rule's step, so "`hostname -i`" (LA051) or "`diagnose check
    CONFIG --gpus N`" showed as literal backticks in a GitHub issue instead of code. A step's code spans stay code;
    the text around them stays escaped."""
    log = write(tmp_path, "job.log", "  what():  [/opt/conda/conda-bld/pytorch/work/third_party/gloo/gloo/transport/"
                "tcp/pair.cc:724] connect [127.0.1.1]:43907: Connection refused\n")
    steps = [line for line in run("analyze", "--format", "markdown", str(log)).stdout.splitlines()
             if line.startswith("- ") and "hostname" in line]
    assert steps, "no step names hostname"
    assert "`hostname -i`" in steps[0] and "\\`" not in steps[0]
