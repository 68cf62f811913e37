"""A native crash that UCX's signal handler reported (``Caught signal`` and its backtrace) is read like a traceback:
its frames decide the inferred category and the phase (diagnose/match/frames.py, engine._frames, IF310)."""

from __future__ import annotations

from conftest import lines_after

from diagnose.match import load_catalogue, match_text
from diagnose.match.frames import ucx_backtrace_frames

CATALOGUE = load_catalogue()

CRASH = "[node-7:4242:0:4242] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x10)"
INIT_BACKTRACE = [
    "==== backtrace (tid:   4242) ====",
    " 0  /usr/lib/x86_64-linux-gnu/libucs.so.0(ucs_handle_error+0x2e4) [0x7f3c1a2e1fd4]",
    " 1  /usr/lib/x86_64-linux-gnu/libucs.so.0(+0x24fb7) [0x7f3c1a2e4fb7]",
    " 2  /lib/x86_64-linux-gnu/libc.so.6(+0x42520) [0x7f3f0cd9e520]",
    " 3  /opt/nvshmem/lib/nvshmem_transport_ibgda.so.3(+0x1b2c4) [0x7f3b8e61b2c4]",
    " 4  /opt/nvshmem/lib/nvshmem_transport_ibgda.so.3(nvshmemt_init+0x8c1) [0x7f3b8e613e11]",
    " 5  /opt/nvshmem/lib/libnvshmem_host.so.3(nvshmemi_transport_init+0x3aa) [0x7f3b9a2a51ca]",
    "==================================",
]
DEBUG_BACKTRACE = [
    "==== backtrace (tid:  57187) ====",
    " 0 0x0000000000042520 __sigaction()  ???:0",
    " 1 0x000000000007e6d1 ncclGroupEnd()  ???:0",
    " 2 0x0000000000125bb4 clone()  ???:0",
    "=================================",
]


def test_native_frames_innermost_last_without_the_handler_and_unnamed_offsets():
    frames = ucx_backtrace_frames(lines_after(INIT_BACKTRACE))
    assert [f.text.strip() for f in frames] == [
        'File "/opt/nvshmem/lib/libnvshmem_host.so.3", line 0, in nvshmemi_transport_init',
        'File "/opt/nvshmem/lib/nvshmem_transport_ibgda.so.3", line 0, in nvshmemt_init',
    ]
    assert frames[-1].lineno == 7  # the frame keeps its own log line


def test_the_debug_info_form_is_read_too():
    frames = ucx_backtrace_frames(lines_after(DEBUG_BACKTRACE))
    assert [f.text.strip() for f in frames] == ['File "???", line 0, in clone', 'File "???", line 0, in ncclGroupEnd']


def test_no_backtrace_no_frames():
    assert ucx_backtrace_frames(lines_after(["", "some other output", "more", "and more", "still more"])) == []


def test_a_crash_inside_a_librarys_init_reads_as_a_mismatched_build():
    root = match_text("\n".join(["python tests/test_internode.py", CRASH, *INIT_BACKTRACE]), CATALOGUE).root
    assert root is not None and root.rule == "PY180"
    assert root.category == "import_version" and root.phase == "init"


def test_a_crash_whose_innermost_native_frame_is_nccls_reads_as_an_nccl_error():
    # was "stays undecided" (other); since IF505 the frames decide: NCCL's own function crashed. The one dev log of
    # this shape was blamed on the Fabric Manager by its thread, which the log cannot show: other was no nearer.
    root = match_text("\n".join([CRASH, *DEBUG_BACKTRACE]), CATALOGUE).root
    assert root is not None and root.rule == "PY180" and root.category == "nccl_error"


def test_a_crash_in_an_unknown_native_frame_stays_undecided():
    stack = [DEBUG_BACKTRACE[0], " 0 0x0000000000042520 __sigaction()  ???:0", " 1 0x000000000007e6d1 do_work()  ???:0",
             " 2 0x0000000000125bb4 clone()  ???:0", DEBUG_BACKTRACE[-1]]
    root = match_text("\n".join([CRASH, *stack]), CATALOGUE).root
    assert root is not None and root.rule == "PY180" and root.category == "other"


def test_a_short_pid_padded_by_ucx_still_reads_as_its_signal_line():
    # UCX left-justifies the pid in five columns: "[host:2714 :0:2803]"; the line and its native stack are read the same
    from diagnose.match.frames import UCX_SIGNAL
    padded = "[3c9d01f7aa52:2714 :0:2803] Caught signal 7 (Bus error: nonexistent physical address)"
    assert UCX_SIGNAL.match(padded) is not None
    report = match_text("\n".join([padded, *DEBUG_BACKTRACE]) + "\n", CATALOGUE)
    assert any(f.rule == "NC210" for f in report.findings)  # a bus error whose native frames are NCCL's own


NCCL_BUS_ERROR_LOG = "\n".join([
    "[node-2:2714 :0:2803] Caught signal 7 (Bus error: nonexistent physical address)",
    "==== backtrace (tid:   2803) ====",
    " 0 0x0000000000014420 __funlockfile()  ???:0",
    " 1 0x000000000006929c ncclGroupEnd()  ???:0",
    " 2 0x0000000000050853 ncclGetUniqueId()  ???:0",
    "=================================",
    "Fatal Python error: Bus error",
    "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -7) local_rank: 3 (pid: 2714) of binary: "
    "/opt/conda/bin/python",
]) + "\n"


def test_a_bus_error_inside_nccl_leads_over_the_launchers_report_of_the_same_signal():
    # the launcher's exitcode -7 (OOM191, a rank killer) reports the death NCCL's own SIGBUS caused: NCCL leads
    report = match_text(NCCL_BUS_ERROR_LOG, CATALOGUE)
    assert report.root is not None and report.root.rule == "NC210" and report.root.category == "nccl_error"
    assert any(f.rule == "OOM191" and f.role != "root" for f in report.findings)
    # without NCCL's frames the signal is the shared-memory kill OOM191 names
    plain = match_text(NCCL_BUS_ERROR_LOG.replace("nccl", "libc_"), CATALOGUE)
    assert plain.root is not None and plain.root.category == "host_oom"
