"""A native crash's Python stack (faulthandler's dump after ``Fatal Python error``) is read like a traceback's frames:
it decides the inferred category and the phase (diagnose/match/frames.py, engine._frames)."""

from __future__ import annotations

from conftest import lines_after

from diagnose.match import load_catalogue, match_text
from diagnose.match.frames import faulthandler_frames

CATALOGUE = load_catalogue()

DUMP = [
    "",
    "Current thread 0x00007f402968d5 (most recent call first):",
    '  File "/usr/lib/python3.12/site-packages/torch/serialization.py", line 1268 in _save',
    '  File "/opt/m/megatron/core/dist_checkpointing/strategies/filesystem_async.py", line 394 in write_preloaded_data',
    '  File "/opt/m/megatron/training/checkpointing.py", line 678 in save_checkpoint',
    '  File "/opt/m/pretrain_gpt.py", line 396 in <module>',
    "",
    "Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)",
]


def test_the_crashing_threads_frames_innermost_last_in_traceback_form():
    frames = faulthandler_frames(lines_after(DUMP))
    assert [f.text.strip() for f in frames] == [
        'File "/opt/m/pretrain_gpt.py", line 396, in <module>',
        'File "/opt/m/megatron/training/checkpointing.py", line 678, in save_checkpoint',
        'File "/opt/m/megatron/core/dist_checkpointing/strategies/filesystem_async.py", line 394, in write_preloaded_data',
        'File "/usr/lib/python3.12/site-packages/torch/serialization.py", line 1268, in _save',
    ]
    assert frames[-1].lineno == 4  # the frame keeps its own log line (evidence)


def test_other_threads_and_unrelated_text_are_not_frames():
    other_thread_first = ["Thread 0x00007f11 (most recent call first):", '  File "/w/loader.py", line 9 in run', ""] + DUMP[1:]
    assert faulthandler_frames(lines_after(other_thread_first))[0].text.endswith("in <module>")
    assert faulthandler_frames(lines_after(["iteration 10/ 100 |", "more output", "", "", "x"])) == []
    assert faulthandler_frames([]) == []


def test_a_segfault_in_the_checkpoint_writer_is_checkpoint_io_at_save():
    log = "\n".join([" [2025-09-25 17:05:02] iteration     2020/  100000 | lm loss: 1.912366E+00 |",
                     "Fatal Python error: Segmentation fault", *DUMP]) + "\n"
    root = match_text(log, CATALOGUE).root
    assert root is not None and root.rule == "PY004"
    assert root.category == "checkpoint_io" and root.basis_detail.startswith("IF025")
    assert root.phase == "checkpoint_save"


def test_a_segfault_without_a_dump_stays_uncategorised():
    root = match_text("Fatal Python error: Segmentation fault\n\nprocess exited\n", CATALOGUE).root
    assert root is not None and root.rule == "PY004" and root.category == "other"


def test_a_stack_block_without_a_thread_header_is_read_too():
    """faulthandler heads the dump "Stack (most recent call first):" when it prints one thread without its id."""
    stack = ["", "Stack (most recent call first):",
             '  File "/usr/lib/python3.10/site-packages/torch/cuda/__init__.py", line 372 in _lazy_init',
             '  File "/usr/lib/python3.10/site-packages/vllm/worker/worker_base.py", line 604 in init_device', ""]
    frames = faulthandler_frames(lines_after(stack))
    assert [f.text.strip().rsplit(" in ", 1)[1] for f in frames] == ["init_device", "_lazy_init"]


def test_a_segfault_while_cuda_initialises_is_version_skew():
    log = "\n".join(["Fatal Python error: Segmentation fault", "", "Stack (most recent call first):",
                     '  File "/usr/lib/python3.10/site-packages/torch/cuda/__init__.py", line 372 in _lazy_init',
                     '  File "/w/train.py", line 12 in main', ""]) + "\n"
    root = match_text(log, CATALOGUE).root
    assert root is not None and root.rule == "PY004"
    assert root.category == "import_version" and root.basis_detail.startswith("IF390")
