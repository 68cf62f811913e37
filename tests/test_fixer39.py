"""Fixer round 39: what qa-report-11 left (L1-L5), qa-report-10 L6 and qa-report-9 L2.

Each test failed on the tree before its fix."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for_file

from diagnose.explain.memory.verdict import OomNumbers, allocator_is_a_step, cache_share, fragmented
from diagnose.pipeline import AnalyzeOptions, analyze

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT / "corpus" / "dev"
GIB = 1 << 30


def _dev(name: str):
    return analyze([str(DEV / f"{name}.log")], AnalyzeOptions())


# --- qa-report-11 L1 (qa-report-10 L2): fragmentation only when the unallocated cache is a real share -------------

# the OOM lines of the named dev logs, and what their threads did instead of the allocator setting
SMALL_SHARE = [
    # 13B full fine-tuning on one A100: 5.46 of 66.94 GiB reserved unallocated (8.2 %), 12.99 GiB asked for
    "ci-baichuan2-13b-full-finetune-zero3-single-a100-optimizer-states-cuda-oom",
    # empty the cache before the gather: 5.03 of 76.87 GiB (6.5 %)
    "cj-nemo-aligner-ppo-gather-list-alloc-cuda-oom-peers-watchdog",
    # offload or shorter sequences: 4.83 of 76.73 GiB (6.3 %)
    "ck-xtuner-internlm2-20b-full-sft-zero3-8xa800-backward-cuda-oom",
    # a leaked 16-bit state dict at every save: 3.66 of 76.84 GiB (4.8 %)
    "ce-deepspeed-zero3-oom-after-several-16bit-checkpoint-saves",
]


def test_a_small_unallocated_share_is_not_fragmentation():
    xtuner = OomNumbers(requested=int(1.56 * GIB), capacity=int(79.33 * GIB), free=int(1.05 * GIB),
                        allocated=int(71.90 * GIB), reserved_unallocated=int(4.83 * GIB))
    assert cache_share(xtuner) == pytest.approx(4.83 / 76.73, rel=1e-3)
    assert not fragmented(xtuner) and allocator_is_a_step(xtuner)
    # bz-nemorl-sft-packed-seq-reserved-fragmentation-oom (88 % unallocated) and the Gemini placement thread (11 %)
    # stay fragmentation
    assert fragmented(OomNumbers(requested=int(4.5 * GIB), capacity=int(178.35 * GIB), free=int(1.62 * GIB),
                                 allocated=int(18.74 * GIB), reserved_unallocated=int(139.75 * GIB)))
    assert fragmented(OomNumbers(requested=int(3.41 * GIB), capacity=int(31.75 * GIB), free=int(2.31 * GIB),
                                 allocated=int(24.62 * GIB), reserved_unallocated=int(3.18 * GIB)))


@pytest.mark.parametrize("name", SMALL_SHARE)
def test_the_named_dev_ooms_lead_with_the_memory_lever(name):
    report = _dev(name)
    root = report.root
    assert root is not None and root.category == "cuda_oom"
    assert report.memory is not None and report.memory.verdict != "fragmentation"
    shown = root.shown_fix
    assert "expandable_segments" not in shown.summary and "Fragmentation" not in shown.summary, shown.summary
    assert not any(e.name == "PYTORCH_CUDA_ALLOC_CONF" for e in shown.env)
    # the allocator setting is still offered, as a step that says why it is not the fix
    assert any("expandable_segments:True" in s for s in shown.steps + shown.other_stacks), shown.steps
    assert "expandable_segments" in report.memory.explanation


def test_the_fragmentation_rule_on_a_nearly_full_gpu_takes_the_categorys_memory_lever():
    # OOM190 reads "2.47 GiB unallocated against a 448 MiB request" from the words; 94.6 % of the GPU was allocated
    report = _dev("ck-thunder-litgpt-fsdp-8gpu-activation-checkpointing-regression-oom-backward")
    root = report.root
    assert root is not None and root.rule == "OOM190"
    shown = root.shown_fix
    assert "expandable segments" not in shown.summary and shown.summary.startswith("Make the step fit")
    assert not shown.env
    assert any("expandable_segments:True" in s and "2.11 GiB" in s for s in shown.steps)


def test_a_real_fragmentation_oom_still_leads_with_the_allocator():
    report = _dev("bz-nemorl-sft-packed-seq-reserved-fragmentation-oom")
    assert report.memory is not None and report.memory.verdict == "fragmentation"
    assert report.root is not None
    assert "expandable_segments:True" in report.root.shown_fix.summary


# --- qa-report-11 L5 / L7: SIGTERM stops a run in one line, exit 143, and leaves no scratch folder ----------------

def _read_all(fd: int) -> bytes:
    out = b""
    while select.select([fd], [], [], 0.5)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the other end closed (EIO on a pty)
            break
        if not chunk:
            break
        out += chunk
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the supervising fork is Linux/POSIX only")
@pytest.mark.parametrize("command", ["analyze", "tui"])
def test_sigterm_stops_a_run_reading_stdin_with_one_line(tmp_path, command):
    """``timeout`` / ``kill`` of ``diagnose analyze -`` or ``tui -`` while it spools an open pipe: before, the worker
    died of the signal with no word; now it cleans up, says so in one line and dies of SIGTERM (143 in a shell), and
    the parent removes its scratch folder."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DIAGNOSE_SKIP_SLURM": "1", "DIAGNOSE_NO_CONFIG": "1",
           "DIAGNOSE_NO_CACHE": "1", "TMPDIR": str(tmpdir)}
    master, slave = pty.openpty()  # the TUI wants a terminal for its output
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "diagnose", command, "-"], cwd=ROOT, env=env, stdin=read_end,
                            stdout=slave, stderr=slave)
    os.close(read_end)
    os.close(slave)
    try:
        os.write(write_end, (ROOT / "sample_logs" / "ddp_wrap_oom.log").read_bytes() * 800)  # 4.5 MB; stays open
        wait_for_file(tmpdir)  # the worker is spooling stdin, inside the command
        proc.send_signal(signal.SIGTERM)  # to the parent only, as timeout and kill do
        rc = proc.wait(timeout=30)
        text = _read_all(master).decode("utf-8", "replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(write_end)
        os.close(master)
    assert rc == -signal.SIGTERM, (rc, text)  # it dies the way it was told to: 143 in a shell
    assert text.strip().splitlines()[-1] == "diagnose: terminated", text
    assert "Traceback" not in text
    assert list(tmpdir.iterdir()) == []



# --- qa-report-11 L2 / qa-report-10 L10: the fusion override only for the module it concerns ----------------------

def _root_of(tmp_path: Path, text: str):
    log = tmp_path / "job.log"
    log.write_text(text)
    root = analyze([str(log)], AnalyzeOptions()).root
    assert root is not None
    return root


@pytest.mark.parametrize("module", ["fused_layer_norm_cuda", "scaled_upper_triang_masked_softmax_cuda", "amp_C"])
def test_a_missing_kernel_the_fusion_does_not_concern_gets_no_fusion_override(tmp_path, module):
    root = _root_of(tmp_path, f"ModuleNotFoundError: No module named '{module}'\n")
    assert root.rule == "IM020"
    assert not any(o.key == "model.gradient_accumulation_fusion" for o in root.fix.overrides)


def test_a_missing_fused_wgrad_extension_is_offered_the_fusion_override(tmp_path):
    root = _root_of(tmp_path, "ModuleNotFoundError: No module named 'fused_weight_gradient_mlp_cuda'\n")
    assert root.rule == "IM022" and root.category == "import_version"
    assert [(o.key, o.value) for o in root.fix.overrides] == [("model.gradient_accumulation_fusion", False)]


def test_the_gpt_neox_softmax_log_has_no_bridge_override():
    root = _dev("ci-gpt-neox-fused-kernels-configured-not-installed-exits-without-training").root
    assert root is not None and root.rule == "IM020"
    assert not root.shown_fix.overrides


# --- qa-report-10 L6: a scan that lost the race to another writer says so -------------------------------------------

def test_jobs_another_scan_stored_meanwhile_are_not_called_the_same_job_as_another_file(tmp_path):
    from diagnose.fleet.scan import ScanOptions, list_files, scan
    from diagnose.fleet.store import FleetStore
    from diagnose.present.commands.fleet import scan_line

    logs = tmp_path / "logs"
    logs.mkdir()
    oom = (ROOT / "sample_logs" / "ddp_wrap_oom.log").read_text()
    (logs / "a.log").write_text(oom)
    (logs / "b.log").write_text(oom.replace("rank0", "rank1"))
    (logs / "copy-of-a.log").write_text(oom)
    db = str(tmp_path / "fleet.db")

    def other_writer(records):  # another `fleet scan` stores two of these jobs between our listing and our write
        with FleetStore(db) as other:
            other.add([r for r in records if not r.source.endswith("copy-of-a.log")])

    with FleetStore(db) as store:
        summary = scan(store, list_files([str(logs)]), ScanOptions(before_write=other_writer))
        total = store.count()
    assert (summary.listed, summary.skipped, summary.added) == (3, 0, 0)
    assert summary.duplicates == 1 and summary.stored_elsewhere == 2
    line = scan_line(summary, total)
    assert "(0 unreadable, 1 the same job as another file, 2 stored meanwhile by another scan)" in line, line
    assert line.endswith("the store has 2 jobs")


# --- qa-report-11 L4: the job's own short collective timeout leads NC002's fix --------------------------------------

@pytest.mark.parametrize("name", ["cj-mlm-dsv4-cp4-pp2-first-step-p2p-recv-timeout-5min",
                                  "cj-mlm-dsv4-cp8-allgather-cp-skew-5min-timeout-node3"])
def test_a_timeout_set_below_the_default_is_the_headline(name):
    root = _dev(name).root
    assert root is not None and root.rule == "NC002"
    fix = root.shown_fix
    assert fix.summary.startswith("Raise the collective timeout: this job set it to 5 minutes"), fix.summary
    assert [(o.key, o.value) for o in fix.overrides] == [("dist.distributed_timeout_minutes", 10)]
    assert fix.steps[0].startswith("If it still times out: find the rank")


@pytest.mark.parametrize(("minutes", "headline"), [(10, "Find the rank"), (30, "Find the rank"),
                                                   (3, "Raise the collective timeout: this job set it to 3 minutes")])
def test_only_a_timeout_below_the_default_leads(tmp_path, minutes, headline):
    line = ("[rank1]:[E810 03:04:11.061727749 ProcessGroupNCCL.cpp:683] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=80, NumelOut=80, "
            f"Timeout(ms)={minutes * 60000}) ran for {minutes * 60000 + 96} milliseconds before timing out.\n")
    args = ("------------------------ arguments ------------------------\n"
            "  context_parallel_size ........................... 1\n"
            f"  distributed_timeout_minutes ..................... {minutes}\n"
            "  pipeline_model_parallel_size .................... 1\n"
            "-------------------- end of arguments ---------------------\n")
    root = _root_of(tmp_path, args + line)
    assert root.rule == "NC002"
    assert root.shown_fix.summary.startswith(headline), root.shown_fix.summary


# --- qa-report-9 L2: NCCL on Docker's bridge network -------------------------------------------------------------

@pytest.mark.parametrize("name", ["cc-arcface-torch-master-node-hangs-broadcast-docker-bridge-ip",
                                  "cc-arcface-torch-two-node-docker-bridge-net-nccl-unhandled-system-error"])
def test_a_docker_bridge_address_is_named_beside_the_root(name):
    report = _dev(name)
    assert report.root is not None and report.root.rule != "NC030"  # context: on one node it is harmless
    bridge = [f for f in report.findings if f.rule == "NC030"]
    assert bridge and "--network=host" in bridge[0].fix.summary
