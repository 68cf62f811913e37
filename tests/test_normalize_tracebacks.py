"""tracebacks.rebuild / traceback_ending_at on real interleaved output, chains, carets, C++ stacks; fuzzed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.normalize import normalize_line
from diagnose.normalize.tracebacks import rebuild, traceback_ending_at

# Excerpt of ../shared/real_logs/nccl_duplicate_gpu.log (torchrun --tee 3, two ranks interleaving line by line).
INTERLEAVED = """\
[default0]:[rank0]: Traceback (most recent call last):
[default1]:[rank1]: Traceback (most recent call last):
[default0]:[rank0]:   File "/workspace/repro.py", line 101, in <module>
[default0]:[rank0]:     torch.distributed.barrier()
[default0]:[rank0]:   File "/opt/venv/lib/python3.12/site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper
[default0]:[rank0]:     return func(*args, **kwargs)
[default1]:[rank1]:   File "/workspace/repro.py", line 101, in <module>
[default1]:[rank1]:     torch.distributed.barrier()
[default0]:[rank0]:            ^^^^^^^^^^^^^^^^^^^^^
[default0]:[rank0]:   File "/opt/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 5030, in barrier
[default0]:[rank0]:     work = group.barrier(opts=opts)
[default1]:[rank1]:   File "/opt/venv/lib/python3.12/site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper
[default1]:[rank1]:     return func(*args, **kwargs)
[default1]:[rank1]:            ^^^^^^^^^^^^^^^^^^^^^
[default1]:[rank1]:   File "/opt/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 5030, in barrier
[default0]:[rank0]:            ^^^^^^^^^^^^^^^^^^^^^^^^
[default0]:[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9
[default0]:[rank0]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
[default1]:[rank1]:     work = group.barrier(opts=opts)
[default1]:[rank1]:            ^^^^^^^^^^^^^^^^^^^^^^^^
[default1]:[rank1]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9
[default1]:[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
[default1]:[rank1]: Last error:
[default1]:[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60
[default0]:[rank0]: Last error:
[default0]:[rank0]: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60
[default1]:[rank1]:[W1129 15:26:44.448687069 ProcessGroupNCCL.cpp:1575] Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources.
W1129 15:26:45.353000 1098 torch/distributed/elastic/multiprocessing/api.py:1012] Sending process 1123 closing signal SIGTERM
"""

CHAINED = """\
Traceback (most recent call last):
  File "/w/train.py", line 10, in load
    state = torch.load(path)
            ^^^^^^^^^^^^^^^^
FileNotFoundError: [Errno 2] No such file or directory: '/ckpt/iter_0000100'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/w/train.py", line 30, in <module>
    main()
  File "/w/train.py", line 12, in load
    raise RuntimeError("cannot resume") from None
RuntimeError: cannot resume

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/w/run.py", line 3, in <module>
    x[0] + y
    ~~~~~^~~
SystemExit: 3
"""

CPP_WATCHDOG = """\
[rank3]:[E1129 15:25:31.123456789 ProcessGroupNCCL.cpp:683] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.
[rank3]: terminate called after throwing an instance of 'c10::DistBackendError'
[rank3]:   what():  [PG 0 Rank 3] Process group watchdog thread terminated with exception: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.
[rank3]: Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:635 (most recent call first):
[rank3]: frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f00 in /usr/lib/libc10.so)
[rank3]: frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout() + 0x1d2 (0x7f01 in /usr/lib/libtorch_cuda.so)
[rank3]: frame #2: <unknown function> + 0x94ac3 (0x7f02 in /lib/x86_64-linux-gnu/libc.so.6)
[rank3]: 
"""


def functions(tb) -> list[str]:
    """The functions of a traceback's frames, outermost first."""
    return [f.function for f in tb.frames]


def _lines(text: str, path: str = "t.log"):
    return [normalize_line(raw, path, i + 1) for i, raw in enumerate(text.splitlines())]


def test_interleaved_ranks_are_rebuilt_per_stream():
    tbs = rebuild(_lines(INTERLEAVED))
    assert [tb.stream[1:] for tb in tbs] == [("rank", 0), ("rank", 1)]
    for tb in tbs:
        assert tb.exc_type == "torch.distributed.DistBackendError"
        assert [f.function for f in tb.frames] == ["<module>", "wrapper", "barrier"]
        assert tb.frames[2].code == "work = group.barrier(opts=opts)"  # caret lines skipped
        assert tb.message.splitlines()[1:3] == [
            "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
            "Last error:",
        ]
        assert tb.message.splitlines()[-1].startswith("Duplicate GPU detected : rank")
        assert tb.exc_line.text.startswith("torch.distributed.DistBackendError: NCCL error in:")
    assert tbs[0].exc_line.lineno == 17 and tbs[1].exc_line.lineno == 21
    # The warning with a glog header ends rank 1's message; the launcher line is not in any traceback.
    owned = {ln.lineno for tb in tbs for ln in tb.lines}
    assert 27 not in owned and 28 not in owned


def test_frame_keeps_its_log_line():
    tb = rebuild(_lines(INTERLEAVED))[1]
    assert [f.log_line.lineno for f in tb.frames] == [7, 12, 15]
    assert tb.frames[0].text.startswith('File "/workspace/repro.py", line 101, in <module>')


def test_chained_exceptions_are_linked():
    tbs = rebuild(_lines(CHAINED))
    assert [tb.exc_type for tb in tbs] == ["FileNotFoundError", "RuntimeError", "SystemExit"]
    first, second, third = tbs
    assert second.cause is first and second.chain_kind == "context"
    assert third.cause is second and third.chain_kind == "cause"
    assert third.chain == [first, second]
    assert third.frames[0].code == "x[0] + y"  # ~~~~~^~~ is a caret line, not code
    assert first.message == "[Errno 2] No such file or directory: '/ckpt/iter_0000100'"


def test_cpp_terminate_block():
    tbs = rebuild(_lines(CPP_WATCHDOG))
    assert len(tbs) == 1
    tb = tbs[0]
    assert tb.exc_type == "c10::DistBackendError"
    assert tb.message.startswith("[PG 0 Rank 3] Process group watchdog thread terminated")
    assert tb.exc_line.lineno == 3
    assert tb.cpp_raised_from.startswith("checkTimeout at /pytorch/")
    assert len(tb.cpp_frames) == 3 and tb.cpp_frames[1].startswith("c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout")


def test_python_exception_with_cpp_stack_in_message():
    text = """\
Traceback (most recent call last):
  File "/w/t.py", line 5, in <module>
    torch.ones(1, device="cuda")
RuntimeError: CUDA error: out of memory
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:43 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x1 in libc10.so)
frame #1: c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool) + 0x1 (0x2 in libc10_cuda.so)
after the stack
"""
    (tb,) = rebuild(_lines(text))
    assert tb.exc_type == "RuntimeError" and tb.message.startswith("CUDA error: out of memory")
    assert len(tb.cpp_frames) == 2
    assert all(ln.text != "after the stack" for ln in tb.lines)


def test_traceback_ending_at_picks_the_matched_ranks_traceback():
    lines = _lines(INTERLEAVED)
    index = next(i for i, ln in enumerate(lines) if ln.rank == 1 and ln.text.startswith("ncclInvalidUsage"))
    tb = traceback_ending_at(lines[: index + 1], index)
    assert tb is not None and tb.stream[1:] == ("rank", 1)
    assert functions(tb) == ["<module>", "wrapper", "barrier"]
    assert traceback_ending_at(lines, len(lines) - 1) is None  # the launcher line
    assert traceback_ending_at(lines, 10_000) is None


def test_window_cut_inside_a_traceback_is_headless():
    lines = _lines(INTERLEAVED)[4:]
    index = next(i for i, ln in enumerate(lines) if ln.rank == 0 and "DistBackendError" in ln.text)
    tb = traceback_ending_at(lines, index)
    assert tb is not None and tb.headless and functions(tb)[-1] == "barrier"


LINE_POOL = st.sampled_from(
    [
        "Traceback (most recent call last):",
        '  File "/a/b.py", line 3, in f',
        "    x = f()",
        "        ^^^^^",
        "ValueError: bad",
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
        "",
        "terminate called after throwing an instance of 'c10::Error'",
        "  what():  boom",
        "Exception raised from f at a.cpp:1 (most recent call first):",
        "frame #0: f() + 0x1",
        "continuation text",
        "E1129 15:24:33.203000 421 f.py:986] glog",
    ]
)
PREFIX = st.sampled_from(["", "[rank0]: ", "[rank1]: ", "[default2]:", " 3: "])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(PREFIX, LINE_POOL | st.text(max_size=40)), max_size=60))
def test_rebuild_never_raises_and_accounts_for_every_line(pairs):
    lines = [normalize_line(p + t, "f.log", i + 1) for i, (p, t) in enumerate(pairs)]
    tbs = rebuild(lines)
    owners: dict[int, int] = {}
    for k, tb in enumerate(tbs):
        for ln in tb.lines:
            assert id(ln) not in owners, "a line belongs to two tracebacks"
            owners[id(ln)] = k
        if tb.exc_line is not None:
            assert any(ln is tb.exc_line for ln in tb.lines)
        assert all(ln.stream == tb.stream for ln in tb.lines)


FUNC = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)


@st.composite
def interleaved_tracebacks(draw):
    """Several ranks each print one well-formed traceback; the lines interleave in a random order."""
    ranks = draw(st.lists(st.integers(0, 4095), min_size=1, max_size=5, unique=True))
    per_rank = {}
    for r in ranks:
        funcs = draw(st.lists(FUNC, min_size=1, max_size=6))
        body = ["Traceback (most recent call last):"]
        for f in funcs:
            body += [f'  File "/m/{f}.py", line 1, in {f}', f"    {f}()", "    ^^^^^"]
        exc = f"RuntimeError: rank {r} failed"
        body.append(exc)
        per_rank[r] = (funcs, exc, [f"[rank{r}]: {t}" for t in body])
    order = draw(st.permutations([r for r in ranks for _ in per_rank[r][2]]))
    cursors = {r: 0 for r in ranks}
    merged = []
    for r in order:
        merged.append(per_rank[r][2][cursors[r]])
        cursors[r] += 1
    return per_rank, merged


@settings(max_examples=200, deadline=None)
@given(interleaved_tracebacks())
def test_interleaving_never_loses_an_exception_line(case):
    per_rank, merged = case
    lines = [normalize_line(t, "f.log", i + 1) for i, t in enumerate(merged)]
    tbs = {tb.stream[2]: tb for tb in rebuild(lines)}
    assert set(tbs) == set(per_rank)
    for r, (funcs, exc, _) in per_rank.items():
        assert tbs[r].exc_line is not None and tbs[r].exc_line.text == exc
        assert functions(tbs[r]) == funcs
        assert len(tbs[r].lines) == 2 + 3 * len(funcs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=60), max_size=40), st.integers(-5, 50))
def test_traceback_ending_at_never_raises(texts, index):
    lines = [normalize_line(t, "f", i + 1) for i, t in enumerate(texts)]
    traceback_ending_at(lines, index)


def test_cut_traceback_followed_by_blank_lines_claims_no_exception():
    # Found by the atheris target (tests/fuzz/fuzz_normalize.py): a traceback cut off mid-frame, many blank lines,
    # then the tail of another line. The tail is not this traceback's exception.
    text = (
        'Traceback (most recent call last):\n  File "/w/train.py", line 21, in <module>\n    main()\n'
        '  File "/usr/local/lib/python3.12/dist-packages/megatron/bridge/training/\n'
        + "\n" * 70
        + 'config.py", line 1346, in validate\n    self._validate_and_apply_megatron_fsdp_configs()\n'
    )
    lines = _lines(text)
    tbs = rebuild(lines)
    assert all(tb.exc_line is None or not tb.exc_line.text.startswith('config.py"') for tb in tbs)
    from fuzz import fuzz_normalize as fuzz

    fuzz.check(text.encode())  # the invariant that failed: a window finds the same traceback


def test_a_blank_line_from_another_process_inside_frames_is_tolerated():
    text = 'Traceback (most recent call last):\n  File "a.py", line 1, in f\n\n    f()\nValueError: x\n'
    (tb,) = rebuild(_lines(text))
    assert tb.exc_type == "ValueError" and functions(tb) == ["f"]


def test_other_streams_between_frames_and_exception():
    # From an atheris input: rank 0's frames, then 70 unprefixed lines of another process, then rank 0's caret and
    # exception lines. The traceback still ends at rank 0's exception; the other lines belong to no traceback.
    text = (
        '[rank0]: Traceback (most recent call last):\n[rank0]:   File "/t/x.py", line 128, in call\n'
        "[rank0]:     buf0 = empty_strided_cuda((\n" + "\n" * 70 + "8192, 256, 14336), torch.bfloat16)\n"
        "[rank0]:            ^^^^^^^^^^^^^^^^^^^\n"
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 56.00 GiB.\n"
    )
    lines = _lines(text)
    (tb,) = rebuild(lines)
    assert tb.exc_line is lines[-1] and functions(tb) == ["call"]
    found = traceback_ending_at(lines, len(lines) - 1)
    assert found is not None and found.exc_line is lines[-1] and functions(found) == ["call"]


RICH = """\
[rank1]: ╭──────────── Traceback (most recent call last) ────────────╮
[rank1]: │ /w/train.py:12 in <module>                                 │
[rank1]: │                                                            │
[rank1]: │   11 │   cfg = load()                                        │
[rank1]: │ ❱ 12 │   run(cfg)                                            │
[rank1]: │                                                            │
[rank1]: │ /env/lib/python3.11/site-packages/pkg/very/long/modu       │
[rank1]: │ le_name.py:305 in run                                      │
[rank1]: │                                                            │
[rank1]: │ /env/lib/python3.11/site-packages/pkg/core.py:9 in         │
[rank1]: │ check                                                      │
[rank1]: ╰────────────────────────────────────────────────────────────╯
[rank1]: AssertionError: Check batch related parameters. train_batch_size is not
[rank1]: equal to micro_batch_per_gpu * gradient_acc_step * world_size 64 != 4 *
[rank1]: 8 * 1
[rank1]: after the box
"""


def test_rich_boxed_traceback_frames_wrapped_locations_and_message():
    (tb,) = [t for t in rebuild(_lines(RICH)) if t.exc_type]
    assert [(f.file, f.line, f.function) for f in tb.frames] == [
        ("/w/train.py", 12, "<module>"),
        ("/env/lib/python3.11/site-packages/pkg/very/long/module_name.py", 305, "run"),
        ("/env/lib/python3.11/site-packages/pkg/core.py", 9, "check"),
    ]
    assert tb.exc_type == "AssertionError"
    assert tb.message.startswith("Check batch related parameters.") and tb.message.endswith("8 * 1\nafter the box")
    assert tb.frames[1].log_line.lineno == 8  # the row where the wrapped location ends


def test_a_rich_box_cut_off_by_other_output_is_not_swallowed():
    text = RICH.splitlines()[:5] + ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "/w/x.py", line 3, in f',
                                    "[rank1]: ValueError: boom"]
    tbs = rebuild(_lines("\n".join(text)))
    assert any(t.exc_type == "ValueError" and t.frames and t.frames[0].file == "/w/x.py" for t in tbs)


# torchrun's ChildFailedError summary with the worker's error file (@record): the traceback is a field of the block.
TORCHRUN_SUMMARY = """\
Root Cause (first observed failure):
[0]:
  time      : 2024-12-05_10:00:08
  host      : node1
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 201)
  error_file: /tmp/torchelastic_ab12/none_cd34/attempt_0/0/error.json
  traceback : Traceback (most recent call last):
    File "/usr/local/lib/python3.10/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper
      return f(*args, **kwargs)
    File "/workspace/train.py", line 61, in main
      trainer = build_trainer(cfg)
  ValueError: expert_model_parallel_size (3) must divide num_experts (8)

============================================================
"""


def test_the_traceback_inside_torchruns_summary_is_rebuilt_with_its_frames():
    tbs = rebuild(_lines(TORCHRUN_SUMMARY))
    assert len(tbs) == 1
    tb = tbs[0]
    assert tb.exc_type == "ValueError" and tb.message == "expert_model_parallel_size (3) must divide num_experts (8)"
    assert [f.function for f in tb.frames] == ["wrapper", "main"]
    assert tb.frames[1].code == "trainer = build_trainer(cfg)"
    assert tb.exc_line.lineno == 13
    owned = {ln.lineno for tb in tbs for ln in tb.lines}
    assert 15 not in owned  # the summary's closing rule is not part of the message


def test_a_two_space_line_in_an_ordinary_traceback_stays_code():
    text = TORCHRUN_SUMMARY.replace("  traceback : Traceback (most recent call last):", "Traceback (most recent call last):")
    tb = rebuild(_lines(text))[0]
    assert tb.exc_type != "ValueError"  # only torchrun's field shifts the exception line by two spaces
