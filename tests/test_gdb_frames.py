"""A crash gdb stopped on (``received signal SIGSEGV``) is read from the stack gdb printed, like a traceback's frames:
the native frames decide the rule (NC210's shared-memory SIGBUS) and the inferred category (IF505: NCCL's own
frames) (diagnose/match/frames.py, engine._frames)."""

from __future__ import annotations

from conftest import lines_after

from diagnose.match import load_catalogue, match_text
from diagnose.match.frames import GDB_SIGNAL, gdb_backtrace_frames
from diagnose.model import LogLine

CATALOGUE = load_catalogue()
NCCL = "/usr/lib/x86_64-linux-gnu/libnccl.so.2"

SESSION = [
    "[Switching to Thread 0x7f10c2bfe640 (LWP 2210)]",
    f"0x00007f11a0c41e2b in ncclShmOpen(char*, unsigned long, void**, void**, int, void**) () from {NCCL}",
    "(gdb) bt",
    "#0  0x00007f11a0c41e2b in ncclShmOpen(char*, unsigned long, void**, void**, int, void**) ()",
    f"   from {NCCL}",
    f"#1  0x00007f11a0c3f5c1 in ncclProxyService(void*) () from {NCCL}",
    "#2  0x00007f11b43a2ac3 in ?? () from /lib/x86_64-linux-gnu/libc.so.6",
    "#3  0x00007f11b43a2ac3 in start_thread (arg=<optimized out>) at ./nptl/pthread_create.c:442",
    "(gdb) quit",
    "A debugging session is active.",
]


def _functions(frames: list[LogLine]) -> list[str]:
    return [f.text.rsplit(", in ", 1)[1] for f in frames]


def test_the_bt_stack_innermost_last_with_each_frames_library():
    frames = gdb_backtrace_frames(lines_after(SESSION))
    assert _functions(frames) == ["start_thread", "ncclProxyService", "ncclShmOpen"]  # the ?? frame is left out
    assert frames[-1].text == f'  File "{NCCL}", line 0, in ncclShmOpen'  # its library from the next line
    assert frames[0].text.startswith('  File "./nptl/pthread_create.c", line 0')
    assert frames[-1].lineno == 5  # the #0 line, shown as evidence


def test_without_bt_the_location_it_stopped_at_is_the_one_frame():
    frames = gdb_backtrace_frames(lines_after(SESSION[:2] + ["(gdb) quit"]))
    assert _functions(frames) == ["ncclShmOpen"]
    assert gdb_backtrace_frames(lines_after(["some other output"] * 10 + SESSION)) == []  # not gdb's report
    assert gdb_backtrace_frames([]) == []


def test_only_crash_signals_are_gdbs_crash_reports():
    assert GDB_SIGNAL.match('Thread 787 "imagenet_fake_d" received signal SIGBUS, Bus error.')
    assert GDB_SIGNAL.match("Program received signal SIGSEGV, Segmentation fault.")
    assert not GDB_SIGNAL.match('Thread 3 "python" received signal SIGINT, Interrupt.')
    assert not GDB_SIGNAL.match("Program received signal SIGPIPE, Broken pipe.")


def _log(signal_line: str, session: list[str]) -> str:
    return "\n".join(["(gdb) run", "Starting program: /usr/bin/python3 train.py", signal_line, *session]) + "\n"


def test_a_bus_error_in_ncclshmopen_is_nccl_shared_memory():
    root = match_text(_log('Thread 412 "python3" received signal SIGBUS, Bus error.', SESSION), CATALOGUE).root
    assert root is not None and root.rule == "NC210" and root.category == "nccl_error"
    assert "--shm-size" in root.fix.summary


def test_a_segfault_in_ncclshmopen_is_nccl_shared_memory_too():
    root = match_text(_log("Program received signal SIGSEGV, Segmentation fault.", SESSION), CATALOGUE).root
    assert root is not None and root.rule == "NC505" and root.category == "nccl_error"
    assert "--shm-size" in root.fix.summary


def test_a_segfault_in_nccl_own_frames_is_an_nccl_crash():
    proxy = ["(gdb) bt", f"#0  0x00007f11a0c3f5c1 in ncclProxyProgress(void*) () from {NCCL}",
             "#1  0x00007f11b43a2ac3 in start_thread (arg=<optimized out>) at ./nptl/pthread_create.c:442"]
    root = match_text(_log("Program received signal SIGSEGV, Segmentation fault.", proxy), CATALOGUE).root
    assert root is not None and root.rule == "PY505"
    assert root.category == "nccl_error" and root.basis_detail.startswith("IF505")


def test_a_segfault_elsewhere_stays_uncategorised():
    libc = ["#0  0x00007f11a0c41e2b in __memmove_avx_unaligned_erms () from /lib/x86_64-linux-gnu/libc.so.6",
            "#1  0x00007f11b4a01d77 in at::native::copy_impl(at::Tensor&, at::Tensor const&, bool) ()",
            "   from /opt/torch/lib/libtorch_cpu.so"]
    root = match_text(_log("Program received signal SIGSEGV, Segmentation fault.", ["(gdb) bt", *libc]), CATALOGUE).root
    assert root is not None and root.rule == "PY505" and root.category == "other"
    root = match_text(_log("Program received signal SIGBUS, Bus error.", ["(gdb) bt", *libc]), CATALOGUE).root
    assert root is not None and root.rule == "PY505"  # a bus error outside NCCL is not NCCL's shared memory
