"""Fact parsers: real and documented messages, the PARSERS registry, and parse(render(fact)) == fact."""

from __future__ import annotations

import re

from fact_renderers import (
    format_cuda_error_oom,
    format_cuda_oom,
    format_nccl_error,
    format_nccl_watchdog,
    format_size,
    format_torchrun_agent,
    format_torchrun_failure,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.model import LogLine
from diagnose.normalize import normalize_line
from diagnose.normalize.facts import PARSERS
from diagnose.normalize.facts.nccl import parse_nccl_error, parse_nccl_warn, parse_nccl_watchdog
from diagnose.normalize.facts.oom import KEYS as OOM_KEYS
from diagnose.normalize.facts.oom import parse_cuda_error_oom, parse_cuda_oom
from diagnose.normalize.facts.sizes import parse_size
from diagnose.normalize.facts.slurm import expand_task_list, parse_slurmstepd, parse_srun_error
from diagnose.normalize.facts.torchrun import parse_torchrun_agent, parse_torchrun_failure

GiB, MiB = 1 << 30, 1 << 20

# From ../shared/real_logs/ddp_wrap_oom.log (torch 2.11, H200).
REAL_OOM = (
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 135.33 GiB. GPU 0 has a total capacity "
    "of 139.80 GiB of which 3.80 GiB is free. Including non-PyTorch memory, this process has 136.00 GiB memory in "
    "use. Of the allocated memory 135.33 GiB is allocated by PyTorch, and 1.47 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF="
    "expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  "
    "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)


def test_real_oom_line_through_normalize_and_registry():
    line = normalize_line(REAL_OOM, "ddp_wrap_oom.log", 34)
    facts = PARSERS["cuda_oom"](line)
    assert facts["exception"] == "torch.OutOfMemoryError" and facts["device"] == "CUDA"
    assert facts["gpu"] == 0 and facts["template"] == "2.1+"
    assert facts["requested_bytes"] == round(135.33 * GiB)
    assert facts["total_bytes"] == round(139.80 * GiB)
    assert facts["free_bytes"] == round(3.80 * GiB)
    assert facts["process_in_use_bytes"] == round(136.00 * GiB)
    assert facts["allocated_bytes"] == round(135.33 * GiB)
    assert facts["reserved_unallocated_bytes"] == round(1.47 * MiB)
    assert facts["hint"] == "expandable_segments" and facts["alloc_conf_env"] == "PYTORCH_CUDA_ALLOC_CONF"
    assert format_cuda_oom(facts) == line.text  # byte-exact rendering of a real message
    assert PARSERS["cuda_oom"](line.text) == facts  # the engine may pass the text alone


def test_oom_2_1_typo_and_split_hint():
    text = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 3 has a total capacty of "
        "79.15 GiB of which 1.25 MiB is free. Process 1234 has 40.00 GiB memory in use. Process 99 has 39.10 GiB "
        "memory in use. Of the allocated memory 38.00 GiB is allocated by PyTorch, and 500.00 MiB is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
        "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
    )
    f = parse_cuda_oom(text)
    assert f["capacity_typo"] is True and f["gpu"] == 3 and f["hint"] == "max_split_size_mb"
    assert f["process_in_use_bytes"] is None
    assert f["other_processes"] == [{"pid": 1234, "bytes": 40 * GiB}, {"pid": 99, "bytes": round(39.10 * GiB)}]
    assert format_cuda_oom(f) == text


def test_oom_private_pools_allowed_and_new_env_name_on_hip():
    text = (
        "HIP out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 191.98 GiB of which 0 bytes "
        "is free. Including non-PyTorch memory, this process has 191.00 GiB memory in use. 150.00 GiB allowed; Of "
        "the allocated memory 149.00 GiB is allocated by PyTorch, with 12.00 GiB allocated in private pools (e.g., "
        "CUDA Graphs), and 2.00 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
        "large try setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )
    f = parse_cuda_oom(text)
    assert f["device"] == "HIP" and f["exception"] is None and f["free_bytes"] == 0
    assert f["allowed_bytes"] == 150 * GiB and f["private_pool_bytes"] == 12 * GiB
    assert f["reserved_bytes"] == 151 * GiB and f["alloc_conf_env"] == "PYTORCH_ALLOC_CONF"
    assert format_cuda_oom(f) == text


def test_oom_old_templates():
    old = (
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity; 77.23 GiB "
        "already allocated; 3.06 MiB free; 1.50 GiB allowed; 78.01 GiB reserved in total by PyTorch) If reserved "
        "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for "
        "Memory Management and PYTORCH_CUDA_ALLOC_CONF"
    )
    f = parse_cuda_oom(old)
    assert f["template"] == "<=2.0" and f["allowed_bytes"] == round(1.5 * GiB)
    assert f["reserved_unallocated_bytes"] == round(78.01 * GiB) - round(77.23 * GiB)
    assert format_cuda_oom(f) == old
    cached = "CUDA out of memory. Tried to allocate 2.00 MiB (GPU 1; 10.76 GiB total capacity; 9.67 GiB already allocated; 0 bytes free; 9.84 GiB cached)"
    g = parse_cuda_oom(cached)
    assert g["old_reserved_word"] == "cached" and g["gpu"] == 1 and format_cuda_oom(g) == cached


def test_not_an_oom():
    assert parse_cuda_oom("CUDA out of memory") is None
    assert PARSERS["cuda_oom"]("hello") is None
    assert parse_cuda_error_oom("RuntimeError: CUDA error: out of memory") == {
        "exception": "RuntimeError",
        "device": "CUDA",
        "kind": "cuda_error",
    }
    assert parse_cuda_error_oom(format_cuda_error_oom({"exception": "torch.AcceleratorError", "device": "CUDA"}))[
        "exception"
    ] == "torch.AcceleratorError"


def test_size_format_matches_torch():
    # Exactly 1 GiB is "1024.00 MiB" in torch (the unit switches above, not at, the power of two).
    assert format_size(GiB) == "1024.00 MiB"
    assert [format_size(n) for n in (0, 1024, 1025, 20 * MiB, int(79.15 * GiB))] == [
        "0 bytes",
        "1024 bytes",
        "1.00 KiB",
        "20.00 MiB",
        "79.15 GiB",
    ]
    assert parse_size("1.47 MiB") == round(1.47 * MiB) and parse_size("12 parsecs") is None


# ---------------------------------------------------------------------------------------------- NCCL


def test_watchdog_prefix_styles():
    base = "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=78, OpType=BROADCAST, NumelIn=80, NumelOut=80, Timeout(ms)=600000) ran for 600096 milliseconds before timing out."
    real = "[rank1]:[E810 03:04:11.061727749 ProcessGroupNCCL.cpp:683] [Rank 1] " + base
    f = PARSERS["nccl_watchdog"](normalize_line(real))
    assert (f["rank"], f["seq_num"], f["op_type"], f["numel_in"], f["timeout_ms"], f["ran_for_ms"]) == (
        1, 78, "BROADCAST", 80, 600000, 600096,
    )
    assert f["prefix_style"] == "rank"
    g = parse_nccl_watchdog("[PG ID 0 PG GUID 0(default_pg) Rank 3] " + base)
    assert (g["prefix_style"], g["pg"], g["pg_guid"], g["pg_desc"], g["rank"]) == ("pg_id", 0, "0", "default_pg", 3)
    h = parse_nccl_watchdog("[PG 2 Rank 5] " + base)
    assert (h["prefix_style"], h["pg"], h["rank"]) == ("pg", 2, 5)
    assert parse_nccl_watchdog("no work here") is None


def test_nccl_error_with_context_lines():
    lines = [
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9",
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
        "Last error:",
        "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60",
    ]
    logged = [LogLine("f", i + 1, "[rank1]: " + t, t, rank=1) for i, t in enumerate(lines)]
    f = PARSERS["nccl_error"](logged[0], logged[1:])
    assert f["reason"].startswith("invalid usage") and f["version"] == "2.28.9" and f["line"] == 93
    assert f["code"] == "ncclInvalidUsage" and f["last_error"].startswith("Duplicate GPU detected")
    assert format_nccl_error(f) == lines
    assert PARSERS["nccl_error"](lines[0])["code"] is None  # without context the detail is unknown


def test_nccl_warn():
    f = parse_nccl_warn("node01:1234:5678 [0] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'")
    assert (f["host"], f["pid"], f["device"], f["file"], f["line"]) == ("node01", 1234, 0, "include/alloc.h", 228)
    assert f["cuda_error"] == {"code": 2, "text": "out of memory"}
    assert parse_nccl_warn("NCCL INFO fine") is None


# ------------------------------------------------------------------------------------------ torchrun

REAL_SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
repro.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_15:26:45
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 1123)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_15:26:45
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 1124)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 1124
============================================================
after the block
  rank      : 99 (local_rank: 9)
"""


def test_torchrun_summary():
    lines = [normalize_line(t, "f", i + 1) for i, t in enumerate(REAL_SUMMARY.splitlines())]
    f = PARSERS["torchrun_failure"](lines[0], lines[1:])
    assert f["script"] == "repro.py" and not f["no_other_failures"]
    root = f["root_cause"]
    assert (root["rank"], root["local_rank"], root["exitcode"], root["pid"], root["signal"]) == (1, 1, -6, 1124, "SIGABRT")
    assert root["host"] == "localhost" and root["time"] == "2026-11-29_15:26:45"
    (other,) = f["failures"]
    assert (other["rank"], other["exitcode"], other["signal"]) == (0, 1, None)
    assert PARSERS["torchrun_failure"]("plain line") is None


def test_torchrun_summary_with_child_traceback():
    lines = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-29_15:25:31",
        "  host      : node01.cluster",
        "  rank      : 3 (local_rank: 3)",
        "  exitcode  : 1 (pid: 12345)",
        "  error_file: /tmp/torchelastic_abc/error.json",
        "  traceback : Traceback (most recent call last):",
        '    File "/w/train.py", line 10, in main',
        "      step()",
        "  RuntimeError: CUDA error: an illegal memory access was encountered",
        "============================================================",
    ]
    root = parse_torchrun_failure(lines)["root_cause"]
    assert root["traceback"].splitlines() == [
        "Traceback (most recent call last):",
        'File "/w/train.py", line 10, in main',
        "step()",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    assert root["rank"] == 3 and root["error_file"].endswith("error.json")


def test_torchrun_agent_lines():
    f = parse_torchrun_agent("failed (exitcode: 1) local_rank: 0 (pid: 447) of binary: /usr/bin/python")
    assert f == {"event": "worker_failed", "exitcode": 1, "local_rank": 0, "pid": 447, "binary": "/usr/bin/python"}
    g = PARSERS["torchrun_agent"](normalize_line("W1129 15:26:45.353000 1098 torch/distributed/elastic/multiprocessing/api.py:1012] Sending process 1123 closing signal SIGTERM"))
    assert g == {"event": "closing_signal", "pid": 1123, "signal": "SIGTERM"}
    h = parse_torchrun_agent("[default] Worker group FAILED. 3/3 attempts left; will restart worker group")
    assert parse_torchrun_agent(format_torchrun_agent(h)) == h and h["attempts_left"] == 3


# -------------------------------------------------------------------------------------------- Slurm


def test_slurmstepd_banners():
    f = parse_slurmstepd("slurmstepd: error: *** JOB 123 ON node01 CANCELLED AT 2026-01-01T12:00:00 DUE TO TIME LIMIT ***")
    assert (f["event"], f["entity"], f["job_id"], f["step"], f["node"], f["reason"]) == (
        "cancelled", "JOB", "123", None, "node01", "time_limit",
    )
    g = parse_slurmstepd("slurmstepd: error: *** STEP 123.0 ON node02 CANCELLED AT 2026-01-01T12:00:00 DUE TO PREEMPTION ***")
    assert (g["step"], g["reason"]) == ("0", "preemption")
    h = parse_slurmstepd("slurmstepd: error: *** STEP 7.1 ON n3 CANCELLED AT 2026-01-01T12:00:00 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***")
    assert h["reason"] == "node_failure"
    i = parse_slurmstepd("slurmstepd: error: *** STEP 7.1 ON n3 CANCELLED AT 2026-01-01T12:00:00 DUE to SIGNAL Terminated ***")
    assert (i["reason"], i["signal"]) == ("signal", "Terminated")
    j = parse_slurmstepd("slurmstepd: error: *** JOB 9 ON n4 CANCELLED AT 2026-01-01T12:00:00 ***")
    assert j["reason"] is None and j["event"] == "cancelled"
    k = parse_slurmstepd("slurmstepd: error: *** JOB 9 ON n4 FAILED (non-zero exit code or other failure mode) ***")
    assert k["event"] == "failed"


def test_cgroup_oom_kill_both_wordings():
    old = parse_slurmstepd("slurmstepd: error: Detected 2 oom-kill event(s) in StepId=55.0. Some of your processes may have been killed by the cgroup out-of-memory handler.")
    new = parse_slurmstepd("slurmstepd: error: Detected 1 oom_kill event in StepId=55.batch. Some of the step tasks have been OOM Killed.")
    assert (old["event"], old["count"], old["job_id"], old["step"]) == ("oom_kill", 2, "55", "0")
    assert (new["count"], new["step"]) == (1, "batch")


def test_srun_error_lines():
    f = parse_srun_error("srun: error: node01: tasks 0-3,7: Killed")
    assert f["tasks"] == [0, 1, 2, 3, 7] and f["signal_name"] == "Killed" and f["exit_code"] is None
    g = parse_srun_error("srun: error: node01: task 3: Exited with exit code 1")
    assert (g["tasks"], g["exit_code"], g["signal_name"]) == ([3], 1, None)
    h = parse_srun_error("srun: error: gpu-7: task 1: Segmentation fault (core dumped)")
    assert h["core_dumped"] and h["signal_name"] == "Segmentation fault"
    assert parse_srun_error("srun: error: n: task 1: Out Of Memory")["out_of_memory"]
    assert expand_task_list("5-2,x,9") == [9]


def test_every_registered_parser_survives_junk():
    junk = ["", "\x00\x1b[2J", "x" * 10000, "WorkNCCL(SeqNum=", "*** JOB", "NCCL error in: :", None, 12]
    for name, parser in PARSERS.items():
        for item in junk:
            out = parser(item, [item] if isinstance(item, str) else [])
            assert out is None or isinstance(out, dict), name


# ------------------------------------------------------------------------------------ round trips

SIZES = st.integers(0, 1 << 41)
NONE_OR_SIZE = st.none() | SIZES


@st.composite
def oom_facts(draw):
    template = draw(st.sampled_from(["2.1+", "<=2.0"]))
    f = {k: None for k in OOM_KEYS}
    f.update(
        exception=draw(st.sampled_from([None, "torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError", "RuntimeError"])),
        device=draw(st.sampled_from(["CUDA", "HIP"])),
        template=template,
        capacity_typo=False,
        gpu=draw(st.integers(0, 15)),
        requested_bytes=draw(SIZES),
        total_bytes=draw(SIZES),
        free_bytes=draw(SIZES),
        other_processes=[],
        allocated_bytes=draw(SIZES),
        allowed_bytes=draw(NONE_OR_SIZE),
    )
    if template == "2.1+":
        f["capacity_typo"] = draw(st.booleans())
        f["process_in_use_bytes"] = draw(NONE_OR_SIZE)
        f["other_processes"] = draw(st.lists(st.fixed_dictionaries({"pid": st.integers(1, 10**7), "bytes": SIZES}), max_size=3))
        f["private_pool_bytes"] = draw(NONE_OR_SIZE)
        f["reserved_unallocated_bytes"] = draw(SIZES)
        f["reserved_bytes"] = f["allocated_bytes"] + f["reserved_unallocated_bytes"]
        f["hint"] = draw(st.sampled_from([None, "expandable_segments", "max_split_size_mb"]))
        if f["hint"] == "expandable_segments":
            f["alloc_conf_env"] = draw(st.sampled_from(["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"]))
            f["docs_url"] = draw(st.sampled_from([None, "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables"]))
    else:
        f["reserved_bytes"] = draw(SIZES)
        f["reserved_unallocated_bytes"] = max(0, f["reserved_bytes"] - f["allocated_bytes"])
        f["old_reserved_word"] = draw(st.sampled_from([None, "cached"]))
        f["hint"] = draw(st.sampled_from([None, "max_split_size_mb"]))
    return f


_DERIVED = {"reserved_bytes", "reserved_unallocated_bytes"}


@settings(max_examples=400, deadline=None)
@given(oom_facts())
def test_cuda_oom_round_trip(raw):
    parsed = parse_cuda_oom(format_cuda_oom(raw))
    assert parsed is not None
    assert parse_cuda_oom(format_cuda_oom(parsed)) == parsed  # exact on what torch can print
    for key, value in raw.items():
        if key in _DERIVED:
            continue
        if key.endswith("_bytes") and value is not None:
            assert abs(parsed[key] - value) <= value * 0.005 + 1, key  # two decimals of the printed unit
        elif key == "other_processes":
            assert [p["pid"] for p in parsed[key]] == [p["pid"] for p in value]
        else:
            assert parsed[key] == value, key


OPS = st.sampled_from(["BROADCAST", "ALLREDUCE", "ALLGATHER", "_ALLGATHER_BASE", "REDUCE_SCATTER", "BARRIER", "SEND", "RECV"])


@st.composite
def watchdog_facts(draw):
    style = draw(st.sampled_from([None, "rank", "pg", "pg_id"]))
    f = {
        "prefix_style": style,
        "rank": None if style is None else draw(st.integers(0, 100000)),
        "pg": draw(st.integers(0, 999)) if style in ("pg", "pg_id") else None,
        "pg_guid": draw(st.from_regex(r"[0-9A-Za-z:_-]{1,12}", fullmatch=True)) if style == "pg_id" else None,
        "pg_desc": draw(st.none() | st.from_regex(r"[a-z_]{0,12}", fullmatch=True)) if style == "pg_id" else None,
        "seq_num": draw(st.integers(0, 10**9)),
        "op_type": draw(OPS),
        "numel_in": draw(st.integers(-1, 10**12)),
        "numel_out": draw(st.integers(-1, 10**12)),
        "timeout_ms": draw(st.integers(0, 10**8)),
        "ran_for_ms": draw(st.none() | st.integers(0, 10**9)),
    }
    return f


@settings(max_examples=300, deadline=None)
@given(watchdog_facts(), st.sampled_from(["", "[rank7]:[E1129 15:25:31.123456789 ProcessGroupNCCL.cpp:683] "]))
def test_nccl_watchdog_round_trip(facts, transport):
    line = normalize_line(transport + format_nccl_watchdog(facts))
    assert PARSERS["nccl_watchdog"](line) == facts


TEXT = st.text(alphabet=st.characters(codec="ascii", min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "exception": st.none() | st.just("torch.distributed.DistBackendError"),
            "file": st.from_regex(r"/[a-z/]{1,20}\.cpp", fullmatch=True),
            "line": st.integers(1, 10**5),
            "reason": st.sampled_from(["unhandled cuda error (run with NCCL_DEBUG=INFO for details)", "invalid usage (run with NCCL_DEBUG=WARN for details)", "remote process exited or there was a network error"]),
            "version": st.from_regex(r"2\.\d{1,2}\.\d{1,2}", fullmatch=True),
            "code": st.none() | st.sampled_from(["ncclUnhandledCudaError", "ncclSystemError", "ncclRemoteError"]),
            "detail": st.none(),
            "last_error": st.none() | TEXT,
        }
    )
)
def test_nccl_error_round_trip(facts):
    if facts["code"] is not None:
        facts["detail"] = "Call to CUDA function failed."
    lines = format_nccl_error(facts)
    assert parse_nccl_error(lines[0], lines[1:]) == facts


# A child's traceback (with @record) continues on indented lines; those lines are free text, except that a line that
# itself reads like a summary field or border would be ambiguous for any reader.
TRACEBACK_LINE = st.from_regex(r"[A-Za-z][\w.,:()'/-]{0,30}( [\w.,:()'/-]{1,10}){0,3}", fullmatch=True).filter(
    lambda t: not re.match(r"(time|host|rank|exitcode|error_file|traceback)\s*:", t) and not t.endswith(" FAILED")
)

ENTRY = st.fixed_dictionaries(
    {
        "index": st.integers(0, 4096),
        "time": st.from_regex(r"20\d\d-\d\d-\d\d_\d\d:\d\d:\d\d", fullmatch=True),
        "host": st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
        "rank": st.integers(0, 100000),
        "local_rank": st.integers(0, 7),
        "exitcode": st.integers(-64, 255),
        "pid": st.integers(1, 10**7),
        "signal": st.none() | st.sampled_from(["SIGABRT", "SIGKILL", "SIGTERM", "SIGSEGV"]),
        "error_file": st.sampled_from(["<N/A>", "/tmp/torchelastic_x/error.json"]),
        "traceback": st.lists(TRACEBACK_LINE, min_size=1, max_size=4).map("\n".join),
    }
)


@settings(max_examples=80, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "script": st.from_regex(r"[a-z_/]{1,20}\.py", fullmatch=True),
            "failures": st.lists(ENTRY, max_size=4),
            "root_cause": st.none() | ENTRY,
            "no_other_failures": st.booleans(),
        }
    )
)
def test_torchrun_failure_round_trip(facts):
    lines = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", *format_torchrun_failure(facts)]
    assert parse_torchrun_failure(lines) == facts
    # The same through the registry, after the [rank]-free normaliser, with lines following the block.
    logged = [normalize_line(t, "f", i + 1) for i, t in enumerate(lines + ["next line", "  host      : other"])]
    assert PARSERS["torchrun_failure"](logged[0], logged[1:]) == facts


def test_parsers_are_linear_on_huge_lines():
    # Shapes that made unanchored regexes quadratic before (a 100 KB word took seconds); 2 MB must take well
    # under a second per parser now.
    import time

    for item in ["x" * 2_000_000, "a." * 1_000_000, "Error" * 400_000, "x: " * 600_000, "1" * 2_000_000]:
        for name, parser in PARSERS.items():
            start = time.perf_counter()
            parser(item, [item])
            assert time.perf_counter() - start < 10.0, name  # hang guard (quadratic = minutes), not a speed test


def test_watchdog_status_and_heartbeat():
    new = PARSERS["nccl_watchdog_status"](
        "[PG ID 0 PG GUID 0(default_pg) Rank 3]  failure detected by watchdog at work sequence id: 5 PG status: "
        "last enqueued work: 5, last completed work: 4"
    )
    assert new == {"event": "watchdog_status", "rank": 3, "seq_num": 5, "last_enqueued": 5, "last_completed": 4}
    old = PARSERS["nccl_watchdog_status"](
        "[Rank 1] Timeout at NCCL work: 78, last enqueued NCCL work: 78, last completed NCCL work: 77."
    )
    assert (old["rank"], old["seq_num"], old["last_completed"]) == (1, 78, 77)
    hang = PARSERS["nccl_watchdog_status"](
        "[PG ID 0 PG GUID 0 Rank 2] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress "
        "in monitoring enqueued collectives."
    )
    assert hang == {"event": "heartbeat_hang", "stuck_seconds": 480}
    assert PARSERS["nccl_watchdog_status"]("all good") is None


def test_torchrun_heading_alone_is_no_fact():
    assert PARSERS["torchrun_failure"]("Root Cause (first observed failure):") is None
    assert PARSERS["torchrun_failure"]("Failures:", ["  <NO_OTHER_FAILURES>"]) is None
