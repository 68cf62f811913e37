"""Root-cause ranking: the first real error beats the cascade that followed it; a lone cascade is still a root."""

from __future__ import annotations

import pytest
from conftest import make_catalogue, make_rule

from diagnose.match import TextSource, load_catalogue, match_text, scan_and_match
from diagnose.present.text import collapsed_line

OOM = make_rule("OOM1", "CUDA out of memory", r"CUDA out of memory", category="cuda_oom", confidence=0.9)
NCCL = make_rule("NC1", "Watchdog caught", r"Watchdog caught collective operation timeout", role="cascade",
                 category="nccl_timeout", title="NCCL watchdog timeout", confidence=0.9)
CHILD = make_rule("LA1", "ChildFailedError", r"ChildFailedError", role="cascade", category="launcher",
                  title="torchrun ChildFailedError")
GENERIC = make_rule("PY1", "Error: ", r"\w+Error: .*", category="other", confidence=0.3)
CKPT = make_rule("CK1", "checkpoint format", r"checkpoint format", category="checkpoint_format")
CAT = make_catalogue(GENERIC, OOM, NCCL, CHILD, CKPT)


def _nccl(rank: int) -> str:
    return f"[rank{rank}]:[E1129 15:25:31.000 ProcessGroupNCCL.cpp:683] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)"


def test_the_rank_that_oomed_beats_511_nccl_timeouts_after_it():
    lines = [f"[rank{r}]: iteration 10 ok" for r in range(512)]
    lines.append("[rank137]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB")
    lines += [_nccl(r) for r in range(512) if r != 137]
    lines.append("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:")
    report = match_text("\n".join(lines), CAT)
    root = report.root
    assert root is not None and root.rule == "OOM1" and root.role == "root" and root.ranks == [137]
    assert report.root_cause == 0
    nccl = next(f for f in report.findings if f.rule == "NC1")
    assert nccl.role == "cascade" and nccl.cause_of == 0 and len(nccl.ranks) == 511 and nccl.count == 511
    assert next(f for f in report.findings if f.rule == "LA1").role == "cascade"
    assert collapsed_line(nccl, root) == "NCCL watchdog timeout on 511 ranks, caused by the OOM above"
    # cascades come last
    assert [f.role for f in report.findings][-2:] == ["cascade", "cascade"]


def test_a_lone_nccl_timeout_is_the_root_when_nothing_else_explains():
    report = match_text("\n".join(_nccl(r) for r in range(8)), CAT)
    assert report.root is not None and report.root.rule == "NC1" and report.root.role == "root"
    assert report.root.confidence < 0.9  # chosen only because nothing else matched
    assert report.root.ranks == list(range(8))


def test_earliest_real_error_wins_by_line():
    text = "checkpoint format mismatch\nCUDA out of memory\n"
    assert match_text(text, CAT).root.rule == "CK1"
    text = "CUDA out of memory\ncheckpoint format mismatch\n"
    report = match_text(text, CAT)
    assert report.root.rule == "OOM1"
    second = next(f for f in report.findings if f.rule == "CK1")
    assert second.role == "context" and second.cause_of is None


def test_earlier_timestamp_in_another_file_wins():
    a = TextSource("rank0.log", b"2026-11-29 15:30:00,000 checkpoint format mismatch\n", rank_hint=0)
    b = TextSource("rank1.log", b"2026-11-29 15:20:00,000 CUDA out of memory\n", rank_hint=1)
    report = scan_and_match([a, b], CAT).report
    assert report.root.rule == "OOM1" and report.root.ranks == [1]


def test_a_catch_all_loses_to_a_specific_error_even_when_earlier():
    text = "ValueError: something generic\nCUDA out of memory\n"
    report = match_text(text, CAT)
    assert report.root.rule == "OOM1"
    assert next(f for f in report.findings if f.rule == "PY1").role == "context"


def test_catch_all_is_root_when_alone():
    report = match_text("ValueError: something generic\n", CAT)
    assert report.root.rule == "PY1"


def test_warnings_only_is_no_failure():
    warn = make_rule("W1", "deprecated", "deprecated", severity="warning")
    report = match_text("this is deprecated\n", make_catalogue(warn))
    assert report.root_cause is None and report.findings[0].role == "context"


NCCLERR = make_rule("NC9", "NCCL error in:", r"NCCL error in: .*unhandled (?:cuda|system) error", category="nccl_error",
                    title="NCCL error")
XID = make_rule("HW9", "NVRM: Xid", r"NVRM: Xid \(PCI:[^)]*\): 79,", category="hardware", title="GPU fell off the bus")
HW_CAT = make_catalogue(GENERIC, OOM, NCCL, CHILD, CKPT, NCCLERR, XID)
_NCCL_ERR = "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error"
_XID = "[Mon Jun  3 08:14:22 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=2211, GPU has fallen off the bus."


def test_a_hardware_fault_printed_after_the_nccl_error_it_caused_still_leads():
    # the training log first, then the kernel log pasted under it: the Xid explains the NCCL error
    report = match_text(f"{_NCCL_ERR}\n$ dmesg -T | grep -i xid\n{_XID}\n", HW_CAT)
    assert report.root is not None and report.root.rule == "HW9" and report.root.category == "hardware"
    assert next(f for f in report.findings if f.rule == "NC9").role == "context"


def test_hardware_does_not_jump_ahead_of_an_earlier_non_communication_error():
    # an OOM first, then an Xid: the order decides as usual (only NCCL errors and timeouts yield to hardware)
    report = match_text(f"torch.OutOfMemoryError: CUDA out of memory.\n{_XID}\n", HW_CAT)
    assert report.root.rule == "OOM1"
    # without any hardware line the NCCL error stays the root
    assert match_text(f"{_NCCL_ERR}\n", HW_CAT).root.rule == "NC9"


SMI = make_rule("HW8", "Unable to determine the device handle", r"Unable to determine the device handle for GPU\S*: Unknown Error",
                category="hardware", tier="generic", title="nvidia-smi cannot reach a GPU")
SMI_CAT = make_catalogue(GENERIC, OOM, NCCL, CHILD, CKPT, NCCLERR, XID, SMI)
_SMI = "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"


def test_a_generic_hardware_symptom_after_watchdog_timeouts_is_not_swallowed_by_the_timeouts():
    # a generic error printed after the first watchdog timeout is usually its consequence, but a GPU that nvidia-smi
    # can no longer reach is why the collective never finished
    report = match_text("\n".join([_nccl(r) for r in range(4)] + ["$ nvidia-smi", _SMI]), SMI_CAT)
    assert report.root.rule == "HW8" and report.root.category == "hardware"
    # and it leads a specific NCCL error too, while the driver's own Xid line, when present, is the one cited
    assert match_text(f"{_NCCL_ERR}\n{_SMI}\n", SMI_CAT).root.rule == "HW8"
    assert match_text(f"{_NCCL_ERR}\n{_SMI}\n{_XID}\n", SMI_CAT).root.rule == "HW9"


CUDA_ERR = make_rule("PY9", "CUDA error: ", r"CUDA error: \S.*", category="hardware", confidence=0.4,
                     reports="device_symptom", title="CUDA error")
SYMPTOM_CAT = make_catalogue(GENERIC, OOM, NCCL, CHILD, CKPT, NCCLERR, XID, SMI, CUDA_ERR)


def test_a_device_fault_leads_the_generic_cuda_error_it_explains():
    # qa-report-7 L5: nvidia-smi cannot reach a GPU (generic tier), then a rank's CUDA call fails with an error that
    # names no cause (specific tier, device_symptom): the lost GPU is why, wherever either line is
    for text in (f"{_SMI}\nRuntimeError: CUDA error: unknown error\n",
                 f"RuntimeError: CUDA error: unknown error\n$ nvidia-smi\n{_SMI}\n"):
        report = match_text(text, SYMPTOM_CAT)
        assert report.root.rule == "HW8"
        assert next(f for f in report.findings if f.rule == "PY9").role == "context"
    # the driver's own Xid line, when there, is the fault cited
    assert match_text(f"RuntimeError: CUDA error: unknown error\n{_XID}\n{_SMI}\n", SYMPTOM_CAT).root.rule == "HW9"
    # alone the CUDA error stays the root, and it still kills its rank for its peers' NCCL errors
    assert match_text("RuntimeError: CUDA error: unknown error\n", SYMPTOM_CAT).root.rule == "PY9"
    assert match_text(f"{_NCCL_ERR}\nRuntimeError: CUDA error: unknown error\n", SYMPTOM_CAT).root.rule == "PY9"
    # with both behind an NCCL error, the device fault leads the symptom
    assert match_text(f"{_NCCL_ERR}\nRuntimeError: CUDA error: unknown error\n{_SMI}\n",
                      SYMPTOM_CAT).root.rule == "HW8"


def test_the_builtin_catalogue_leads_a_lost_gpu_over_the_cuda_error_it_explains(builtin_catalogue):
    text = "\n".join(["+ nvidia-smi -L", "GPU 0: Tesla V100-SXM2-32GB (UUID: GPU-6f1e9c2a)", _SMI,
                      "Traceback (most recent call last):", '  File "train.py", line 188, in main',
                      "    torch.cuda.set_device(local_rank)",
                      '  File "/env/lib/python3.8/site-packages/torch/cuda/__init__.py", line 261, in set_device',
                      "    torch._C._cuda_setDevice(device)",
                      '  File "/env/lib/python3.8/site-packages/torch/cuda/__init__.py", line 172, in _lazy_init',
                      "    torch._C._cuda_init()", "RuntimeError: CUDA error: unknown error"]) + "\n"
    report = match_text(text, builtin_catalogue)
    assert (report.root.rule, report.root.category) == ("HW052", "hardware")
    cuda = next(f for f in report.findings if f.rule == "PY005")
    assert cuda.role == "context"
    # nvidia-smi's line tells no phase: the CUDA error it explains says when the job met the fault
    assert report.root.phase == cuda.phase != "unknown"


OOMKILL = make_rule("OOM9", "Out of memory: Killed process", r"Out of memory: Killed process \d+", category="host_oom",
                    confidence=0.9, title="The kernel OOM killer killed a process")
ALLOC = make_rule("OOM8", "Cannot allocate memory", r"Cannot allocate memory", category="host_oom", confidence=0.7,
                  title="Host memory allocation failed")
KILL_CAT = make_catalogue(GENERIC, OOM, NCCL, CHILD, CKPT, NCCLERR, XID, OOMKILL, ALLOC)
_OOMKILL = "[Fri Apr 18 02:31:44 2025] Out of memory: Killed process 4242 (python) total-vm:900000000kB"


def test_a_host_oom_kill_leads_the_nccl_failures_of_its_peers_wherever_its_line_is():
    # the killed rank never joins its next collective: its peers' NCCL error (or watchdog timeouts) come after
    for text in (f"{_NCCL_ERR}\n$ dmesg -T\n{_OOMKILL}\n", f"{_OOMKILL}\n{_NCCL_ERR}\n"):
        report = match_text(text, KILL_CAT)
        assert report.root is not None and report.root.rule == "OOM9" and report.root.category == "host_oom"
        assert next(f for f in report.findings if f.rule == "NC9").role == "context"
    # a hardware fault, when both are present, is named first (it also explains the kill's pressure on peers)
    assert match_text(f"{_NCCL_ERR}\n{_OOMKILL}\n{_XID}\n", KILL_CAT).root.rule == "HW9"


def test_a_failed_host_allocation_is_not_a_kill_and_does_not_jump_ahead_of_an_nccl_error():
    # "Cannot allocate memory" can be NCCL's own memory registration failing: the order decides as usual
    assert match_text(f"{_NCCL_ERR}\nRuntimeError: Cannot allocate memory\n", KILL_CAT).root.rule == "NC9"
    # nor does a host OOM kill jump ahead of an earlier error that is not a communication failure
    assert match_text(f"checkpoint format mismatch\n{_OOMKILL}\n", KILL_CAT).root.rule == "CK1"


DATAERR = make_rule("DA9", "Server Disconnected", r"ConnectionError: Server Disconnected", category="data", tier="generic",
                    title="The data stream failed")
STREAM = make_rule("DA8", "Got disconnected from remote data host", r"Got disconnected from remote data host", category="data",
                   severity="warning", title="A streamed dataset lost its host")
DATA_CAT = make_catalogue(GENERIC, OOM, NCCL, CHILD, CKPT, DATAERR, STREAM)
_STREAM = "datasets.iterable_dataset - WARNING - Got disconnected from remote data host. Retrying in 5sec [3/20]"


# What a finding reports beyond its category is its rule's `reports` attribute: the ranking reads only that
_UCX = "[node-3:120443:0:120443] Caught signal 7 (Bus error: nonexistent physical address)"
_LINK = "n03:1:2 [2] NCCL WARN NET/IB : Got completion from peer 10.42.6.14<51337> with status=5 opcode=1"


def _sigbus(**fields):
    return make_rule("NC8", "] Caught signal 7 (Bus error", r"^\[[^\]\s:]+:\d+ *:\d+:\d+\] Caught signal 7 \(Bus error",
                     category="nccl_error", title="SIGBUS inside NCCL", **fields)


def _link(**fields):
    return make_rule("HW7", "Got completion from peer", r"Got completion from peer \S+ with status=5", category="hardware",
                     title="IB work requests flushed mid-run", **fields)


def test_a_host_oom_kill_does_not_lead_a_finding_that_reports_the_process_own_death():
    # the launcher's report of the signal that killed the process is that same death, not a kill that explains it
    own = make_catalogue(GENERIC, NCCLERR, XID, OOMKILL, _sigbus(reports="own_death"))
    assert match_text(f"{_UCX}\n{_OOMKILL}\n", own).root.rule == "NC8"
    # a device fault still leads it
    assert match_text(f"{_UCX}\n{_OOMKILL}\n{_XID}\n", own).root.rule == "HW9"
    # without the attribute the same line is an NCCL failure like any other: the kill leads it
    plain = make_catalogue(GENERIC, NCCLERR, XID, OOMKILL, _sigbus())
    assert match_text(f"{_UCX}\n{_OOMKILL}\n", plain).root.rule == "OOM9"
    # the attribute, not the line's shape, decides: an NCCL error rule that says so keeps the lead too
    said = make_rule("NC9", "NCCL error in:", r"NCCL error in: .*unhandled (?:cuda|system) error", category="nccl_error",
                     reports="own_death")
    assert match_text(f"{_NCCL_ERR}\n{_OOMKILL}\n", make_catalogue(GENERIC, said, OOMKILL)).root.rule == "NC9"


def test_a_link_failure_read_as_hardware_does_not_lead_the_nccl_error_before_it():
    text = f"{_NCCL_ERR}\n{_LINK}\n"
    linked = make_catalogue(GENERIC, NCCLERR, _link(reports="link_failure"))
    report = match_text(text, linked)
    assert report.root.rule == "NC9" and next(f for f in report.findings if f.rule == "HW7").category == "hardware"
    # the same hardware finding without the attribute is a device fault: it explains the NCCL error printed before it
    assert match_text(text, make_catalogue(GENERIC, NCCLERR, _link())).root.rule == "HW7"
    # nor does it leave a timeout cascade when it is the only error after it
    timeouts = "\n".join([_nccl(1), _nccl(2), _LINK])
    assert match_text(timeouts, make_catalogue(GENERIC, NCCL, _link(reports="link_failure"))).root.rule == "HW7"


def test_reports_is_one_of_its_values_and_a_bad_one_is_a_one_line_catalogue_error(tmp_path):
    assert _sigbus().reports == "failure"  # the default: what the category says
    with pytest.raises(ValueError, match="reports 'device' is not one of failure, own_death, link_failure"):
        _sigbus(reports="device")
    (tmp_path / "user.toml").write_text(
        '[[rule]]\ncode = "USR001"\nslug = "x"\ntitle = "x"\ncategory = "hardware"\nreports = 1\n'
        'explanation = "x"\npatterns = [{ anchor = "xyz", regex = "xyz" }]\n'
    )
    catalogue = load_catalogue([tmp_path], include_default=False)
    assert catalogue.rules == [] and len(catalogue.errors) == 1 and "\n" not in catalogue.errors[0]
    assert "rule USR001: reports 1 is not one of failure, own_death, link_failure" in catalogue.errors[0]


def test_a_data_loading_error_printed_after_the_timeouts_is_not_their_consequence():
    # the stalled rank's traceback flushes after its peers' watchdogs fired: it was reading data, not in the collective
    text = "\n".join([_nccl(r) for r in (2, 5)] + ["[rank3]: ConnectionError: Server Disconnected"])
    report = match_text(text, DATA_CAT)
    assert report.root.rule == "DA9" and report.root.category == "data" and report.root.ranks == [3]
    assert next(f for f in report.findings if f.rule == "NC1").role == "cascade"
    # any other generic error after the first timeout stays part of the cascade
    text = "\n".join([_nccl(r) for r in (2, 5)] + ["[rank3]: ValueError: something generic"])
    assert match_text(text, DATA_CAT).root.rule == "NC1"


def test_a_stalled_data_stream_leads_a_timeout_cascade_that_nothing_else_explains():
    report = match_text("\n".join([_nccl(r) for r in (2, 5)] + [_STREAM]), DATA_CAT)
    assert report.root.rule == "DA8" and report.root.severity == "error" and report.root.confidence <= 0.6
    # the launcher's summary printed before the timeouts (its agent's log first) does not hide it
    text = "\n".join(["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", _nccl(2), _STREAM])
    assert match_text(text, DATA_CAT).root.rule == "DA8"
    # a failure that is no timeout (the launcher's line alone) is not blamed on a retrying stream
    text = "\n".join([_STREAM, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"])
    assert match_text(text, DATA_CAT).root.rule == "LA1"
    # alone the retry warning is no failure (the retry may succeed)
    report = match_text(f"{_STREAM}\n", DATA_CAT)
    assert report.root_cause is None
    # and a real error still leads it
    assert match_text(f"{_STREAM}\nCUDA out of memory\n" + _nccl(1), DATA_CAT).root.rule == "OOM1"


def test_a_catch_all_before_the_programs_completion_line_does_not_speak():
    warn = make_rule("CA1", "NCCL WARN ", r"NCCL WARN .+", category="nccl_error", tier="catchall", severity="warning",
                     role="context")
    done = make_rule("PYD", "0 OK", r"^# Out of bounds values : 0 OK", severity="info", role="context", completes=True)
    cat = make_catalogue(warn, done)
    before = "host1:1:2 [0] misc/x.cc:1 NCCL WARN something odd\n# Out of bounds values : 0 OK\n"
    assert match_text(before, cat).root is None  # the run completed: the warning ended nothing
    after = "# Out of bounds values : 0 OK\nhost1:1:2 [0] misc/x.cc:1 NCCL WARN something odd\n"
    report = match_text(after, cat)
    assert report.root is not None and report.root.rule == "CA1"  # after the completion it still speaks
    alone = "host1:1:2 [0] misc/x.cc:1 NCCL WARN something odd\n"
    assert match_text(alone, cat).root.rule == "CA1"


def test_completes_is_only_for_information_lines():
    with pytest.raises(ValueError, match="completes"):
        make_rule("PYX", "0 OK", r"0 OK", completes=True)  # an error rule cannot say the program completed


_FIRST_KILLED = (
    "E1208 03:12:51.771000 81190 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
    "local_rank: 6 (pid: 81210) of binary: /opt/conda/bin/python"
)


def test_a_worker_torchrun_saw_fail_first_by_sigkill_leads_its_peers_watchdog_timeouts():
    # torchrun's agent names the first failure (the least timestamp) before its own SIGTERMs: a SIGKILL there came
    # from outside the job (the OOM killer), and the rank it took never reached the collective its peers time out on
    timeouts = "\n".join(
        f"[rank{r}]:[E1208 03:12:4{r}.818739732 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
        "1800427 milliseconds before timing out." for r in range(6))
    report = match_text(f"{timeouts}\n{_FIRST_KILLED}\n", load_catalogue())
    assert report.root is not None and (report.root.rule, report.root.category) == ("LA291", "host_oom")
    # alone it is the root too, and a specific error before it (not a communication failure) still leads
    assert match_text(f"{_FIRST_KILLED}\n", load_catalogue()).root.rule == "LA291"
    text = f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB\n{_FIRST_KILLED}\n"
    assert match_text(text, load_catalogue()).root.category == "cuda_oom"
    # a worker that failed first by an abort (-6, a watchdog's own) is no kill from outside
    aborted = _FIRST_KILLED.replace("exitcode: -9", "exitcode: -6")
    assert match_text(f"{timeouts}\n{aborted}\n", load_catalogue()).root.category == "nccl_timeout"
