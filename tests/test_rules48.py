"""rules48: old NCCL and nccl-tests wordings, enroot's runtime directory, coreutils errors, CUDA in a forked child.

Logs are synthetic, in the formats of the messages they quote (hosts, pids, paths invented)."""

from __future__ import annotations

from conftest import root_finding

from diagnose.match import match_text
from diagnose.normalize.facts.nccl import is_nccl_warn, parse_nccl_warn

# ------------------------------------------------------------ NCCL <= 2.2: `WARN` without the `NCCL` word


def test_old_nccl_warn_header_is_parsed():
    f = parse_nccl_warn("e66aa18dc444:3171:3171 [0] include/socket.h:311 WARN Socket creation failed : "
                        "Address family not supported by protocol")
    assert f is not None
    assert (f["host"], f["pid"], f["device"], f["file"], f["line"]) == ("e66aa18dc444", 3171, 0, "include/socket.h", 311)
    assert f["message"] == "Socket creation failed : Address family not supported by protocol"


def test_warn_alone_needs_nccls_whole_header():
    assert not is_nccl_warn("2024-05-01 10:00:00 WARN Socket creation failed")
    assert not is_nccl_warn("[0] include/socket.h:311 WARN Socket creation failed")
    assert parse_nccl_warn("node1 WARN something") is None
    assert is_nccl_warn("node01:1:2 [0] misc/socket.cc:49 NCCL WARN socketProgress: x")


_OLD_NCCL_TESTS = [
    "# nThread 1 nGpus 2 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 validation: 1",
    "",
    "node1:11:11 [0] misc/ibvwrap.cu:61 WARN Failed to open libibverbs.so[.1]",
    "",
    "node1:11:11 [0] include/socket.h:311 WARN Socket creation failed : Address family not supported by protocol",
    "NCCL failure common.cu:874 'unhandled system error'",
]


def test_old_nccl_tests_failure_is_the_root_with_the_old_warn_as_its_cause(builtin_catalogue):
    """nccl-tests before 2019 printed `NCCL failure file:line 'error'` (no host, no `Test `): NC022 reads it, and
    the NCCL 2.2 WARN before it (not the InfiniBand probe, which PY009 keeps as harmless) joins its evidence."""
    f = root_finding(builtin_catalogue, _OLD_NCCL_TESTS)
    assert f.rule == "NC022" and f.category == "nccl_error"
    texts = [e.text for e in f.evidence]
    assert "Socket creation failed" in texts[0] and "NCCL failure common.cu:874" in texts[1]
    assert not any("libibverbs" in t for t in texts)


def test_old_nccl_warn_alone_is_the_catch_all(builtin_catalogue):
    f = root_finding(builtin_catalogue, _OLD_NCCL_TESTS[:5])
    assert f.rule == "PY007" and "Socket creation failed" in f.evidence[0].text


# ------------------------------------------------ enroot's runtime directory; coreutils' file errors as a catch-all

_ENROOT = [
    "user@gn07:~$ enroot list",
    "mkdir: cannot create directory ‘/run/user/150731’: Permission denied",
]


def test_enroot_runtime_dir_mkdir_failure_is_slurm(builtin_catalogue):
    """enroot creates ${XDG_RUNTIME_DIR}/enroot with mkdir -p before anything else: with enroot in the log, the
    mkdir failure of /run/user/<uid> is SL215 (category slurm, the pyxis/enroot convention), phase init."""
    f = root_finding(builtin_catalogue, _ENROOT)
    assert (f.rule, f.category, f.phase) == ("SL215", "slurm", "init")
    assert f.facts["path"] == "/run/user/150731"


def test_the_same_mkdir_failure_without_enroot_is_the_catch_all(builtin_catalogue):
    f = root_finding(builtin_catalogue, _ENROOT[1:])
    assert (f.rule, f.category) == ("CA011", "other")


def test_coreutils_file_errors_are_never_silent(builtin_catalogue):
    for line in ("cp: cannot stat 'configs/llama3_8b.yaml': No such file or directory",
                 "tar: /data/shards/part-0001.tar: Cannot open: Input/output error",
                 "ln: failed to create symbolic link '/workspace/data': Read-only file system"):
        assert root_finding(builtin_catalogue, [line]).rule == "CA011", line


def test_rm_of_a_missing_file_is_no_failure(builtin_catalogue):
    report = match_text("rm: cannot remove 'nohup.out': No such file or directory\n", builtin_catalogue)
    assert report.root_cause is None


# ------------------------------------------------------------------ CUDA in a forked child: the start method

_FORKED = [
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.10/multiprocessing/process.py", line 314, in _bootstrap',
    "    self.run()",
    '  File "/home/u/{where}", line 123, in init_device',
    "    torch.cuda.set_device(self.device)",
    '  File "/usr/lib/python3.10/site-packages/torch/cuda/__init__.py", line 279, in _lazy_init',
    "    raise RuntimeError(",
    "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the"
    " 'spawn' start method",
]


def test_cuda_in_a_forked_child_is_the_launchers_start_method(builtin_catalogue):
    f = root_finding(builtin_catalogue, [line.format(where="train.py") for line in _FORKED])
    assert (f.rule, f.category, f.phase) == ("LA299", "launcher", "init")
    assert not any(e.name == "VLLM_WORKER_MULTIPROC_METHOD" for e in f.fix.env)


def test_in_vllms_workers_the_fix_is_vllms_start_method(builtin_catalogue):
    f = root_finding(builtin_catalogue, [line.format(where="site-packages/vllm/worker/worker.py") for line in _FORKED])
    assert (f.rule, f.category) == ("LA300", "launcher")
    assert [(e.name, e.value) for e in f.fix.env] == [("VLLM_WORKER_MULTIPROC_METHOD", "spawn")]
