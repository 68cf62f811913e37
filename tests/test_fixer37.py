"""Fixer round 37: what qa-report-9 left (L1-L5), qa-report-8 L3 and stop 36's leftovers.

Each test failed on the tree before its fix. Logs are small, shaped as the corpus logs read."""

from __future__ import annotations

from pathlib import Path

from diagnose.explain.memory.verdict import OomNumbers, buys_one_allocation, decide, fragmented
from diagnose.pipeline import AnalyzeOptions, analyze

GIB = 1 << 30
MIB = 1 << 20


def _analyze(tmp_path: Path, text: str, name: str = "job.log"):
    log = tmp_path / name
    log.write_text(text)
    return analyze([str(log)], AnalyzeOptions())


# --- qa-report-9 L1: fragmentation on a nearly full GPU -------------------------------------------------------------

# cc-colossalai-coati-ppo-stage3-llama7b-lora64-cuda-oom: 45.12 of 47.54 GiB allocated, 0.49 GiB asked for; the
# thread's fix was a smaller LoRA rank
COATI_OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 500.00 MiB (GPU 0; 47.54 GiB total capacity; "
    "45.12 GiB already allocated; 315.06 MiB free; 46.21 GiB reserved in total by PyTorch) If reserved memory is >> "
    "allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management "
    "and PYTORCH_CUDA_ALLOC_CONF")


def test_slack_that_buys_one_allocation_on_a_nearly_full_gpu_is_not_fragmentation():
    n = OomNumbers(requested=500 * MIB, capacity=int(47.54 * GIB), free=int(315.06 * MIB),
                   allocated=int(45.12 * GIB), reserved_unallocated=int((46.21 - 45.12) * GIB))
    assert not fragmented(n)
    assert buys_one_allocation(n)
    assert decide(n, "training", None, None, None, int(47.54 * GIB)) != "fragmentation"
    # bz-nemorl-sft-packed-seq-reserved-fragmentation-oom: 139.75 GiB cached, 4.50 GiB asked for: fragmentation
    real = OomNumbers(requested=int(4.5 * GIB), capacity=int(178.35 * GIB), free=int(1.62 * GIB),
                      allocated=int(18.74 * GIB), reserved_unallocated=int(139.75 * GIB))
    assert fragmented(real) and not buys_one_allocation(real)


def test_a_nearly_full_gpus_fix_is_the_memory_lever_with_the_allocator_as_a_step(tmp_path):
    report = _analyze(tmp_path, "Traceback (most recent call last):\n"
                                '  File "/opt/app/train.py", line 10, in <module>\n    loss.backward()\n'
                                + COATI_OOM + "\n")
    root = report.root
    assert root is not None and root.category == "cuda_oom"
    assert report.memory is not None and report.memory.verdict != "fragmentation"
    shown = root.proven_fix or root.fix
    assert "Fragmentation" not in (shown.summary or "")
    steps = root.fix.steps + root.fix.other_stacks
    assert any("expandable_segments:True" in s and "0.91 GiB" in s for s in steps), steps
    assert "may get this allocation through" in report.memory.explanation


# --- qa-report-9 L3: torch's ExceptionWrapper (DataLoader worker, pin memory thread) -----------------------------------

def _wrapped_log(where: str) -> str:
    return ("Traceback (most recent call last):\n"
            '  File "/ws/train.py", line 88, in train_step\n    batch = next(data_iterator)\n'
            '  File "/env/lib/python3.9/site-packages/torch/utils/data/dataloader.py", line 1359, in _process_data\n'
            "    data.reraise()\n"
            '  File "/env/lib/python3.9/site-packages/torch/_utils.py", line 543, in reraise\n'
            "    raise exception\n"
            f"RuntimeError: Caught RuntimeError {where}.\n"
            "Original Traceback (most recent call last):\n"
            '  File "/env/lib/python3.9/site-packages/torch/utils/data/_utils/collate.py", line 141, in default_collate\n'
            "    return torch.stack(batch, 0, out=out)\n"
            "RuntimeError: stack expects each tensor to be equal size, but got [2049] at entry 0 and [1186] at entry 3\n")


def test_a_dataloader_worker_wrapper_reads_as_the_exception_it_wraps(tmp_path):
    for where in ("in DataLoader worker process 1", "in pin memory thread for device 0"):
        report = _analyze(tmp_path, _wrapped_log(where))
        root = report.root
        assert root is not None
        assert [e.text for e in root.evidence][0].startswith("RuntimeError: stack expects each tensor"), where
        assert root.facts.get("wrapped_in") == where
        assert not any("Caught RuntimeError" in e.text for f in report.findings for e in f.evidence), where


def test_a_wrapper_never_takes_a_later_tracebacks_exception(tmp_path):
    """The wrapped line is the first exception line after the wrapper: a later traceback's exception of the wrapper's
    class (here a chained one, after a wrapped line of another class) is not taken as the wrapped one."""
    log = _wrapped_log("in DataLoader worker process 1").replace(
        "RuntimeError: stack expects each tensor to be equal size, but got [2049] at entry 0 and [1186] at entry 3\n",
        "ValueError\n\nDuring handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File \"/ws/train.py\", line 99, in <module>\n    save()\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    report = _analyze(tmp_path, log)
    cuda = [f for f in report.findings if any("illegal memory access" in e.text for e in f.evidence)]
    assert cuda and all("wrapped_in" not in f.facts for f in cuda)
    assert any("Caught RuntimeError" in e.text for f in report.findings for e in f.evidence)


# --- qa-report-9 L4, L5: the barrier on a guessed GPU, FSDP's requires_grad uniformity -----------------------------------

def test_fsdp_nonuniform_requires_grad_is_answered_with_use_orig_params(tmp_path):
    report = _analyze(tmp_path, "Traceback (most recent call last):\n"
                                '  File "/env/lib/python3.10/site-packages/torch/distributed/fsdp/_flat_param.py", '
                                "line 714, in _validate_tensors_to_flatten\n    raise ValueError(\n"
                                "ValueError: Must flatten tensors with uniform `requires_grad` when "
                                "`use_orig_params=False`\n")
    root = report.root
    assert root is not None and root.rule == "MB242"
    assert (root.category, root.phase) == ("fsdp_config", "dp_wrap")
    assert any("use_orig_params=True" in s for s in root.fix.steps)


def test_a_barrier_on_a_guessed_gpu_is_context_beside_the_hang(tmp_path):
    warn = ("[W ProcessGroupNCCL.cpp:2291] Warning: Rank {r} using GPU 0 to perform barrier as devices used by this "
            "process are currently unknown. This can potentially cause a hang if this rank to GPU mapping is "
            "incorrect.Specify device_ids in barrier() to force use of a particular device. (function operator())\n")
    report = _analyze(tmp_path, "".join(warn.format(r=r) for r in range(4)) + "\n" * 3 + "ok\n")
    found = [f for f in report.findings if f.rule == "NC506"]
    assert found and found[0].role == "context" and found[0].facts.get("device") == "0"
    assert report.root is None  # printed by healthy jobs too: never the root cause by itself


# --- qa-report-9 L2: NCCL's libibverbs probe is harmless; a Docker bridge address is the multi-node fact --------------

PROBE_HANG = """\
a81d07e44c20:91:91 [0] NCCL INFO Bootstrap : Using [0]eth0:172.17.0.2<0>
a81d07e44c20:91:91 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
a81d07e44c20:91:91 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]
a81d07e44c20:91:91 [0] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>
NCCL version 2.4.8+cuda10.1
a81d07e44c20:91:130 [0] NCCL INFO Setting affinity for GPU 0 to ffff,ffffffff
^CTraceback (most recent call last):
  File "train.py", line 63, in main
    dist.broadcast(ps, 0)
  File "/opt/conda/lib/python3.6/site-packages/torch/distributed/distributed_c10d.py", line 842, in broadcast
    work = _default_pg.broadcast([tensor], opts)
KeyboardInterrupt
"""


def test_the_libibverbs_probe_is_not_the_root_and_the_docker_bridge_address_is_named(tmp_path):
    report = _analyze(tmp_path, PROBE_HANG)
    root = report.root
    assert root is not None and root.rule != "PY007"
    assert "libibverbs" not in root.evidence[0].text
    probe = [f for f in report.findings if any("libibverbs" in e.text for e in f.evidence)]
    assert probe and all(f.rule == "PY009" for f in probe)
    assert any("172.17" in s for s in root.fix.steps)


# --- qa-report-8 L3: the checkpoint_format category fix holds for a save too -----------------------------------------

SAVE_SHARED_TENSORS = """\
Traceback (most recent call last):
  File "/home/u/train.py", line 214, in <module>
    trainer.train()
  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line 2918, in _maybe_log_save_evaluate
    self._save_checkpoint(model, trial, metrics=metrics)
  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line 3719, in _save
    safetensors.torch.save_file(
  File "/env/lib/python3.10/site-packages/safetensors/torch.py", line 488, in _flatten
    raise RuntimeError(
RuntimeError: Some tensors share memory, this will lead to duplicate memory on disk and potential differences when \
loading them again: [{'lm_head.weight', 'model.embed_tokens.weight'}].
"""


def test_a_checkpoint_format_failure_while_saving_is_not_told_to_load_another_checkpoint(tmp_path):
    report = _analyze(tmp_path, SAVE_SHARED_TENSORS)
    root = report.root
    assert root is not None and root.category == "checkpoint_format"
    assert not root.fix.summary.startswith("Load ")
    assert any(s.startswith("saving:") for s in root.fix.steps)


# --- stop 36's leftover: merge_adjacent caps the lines it shows and keeps what later lines add ------------------------

def test_a_run_of_same_pattern_lines_merges_with_capped_evidence_and_keeps_their_values(builtin_catalogue):
    from diagnose.match import match_text
    from diagnose.match.findings import EVIDENCE_KEPT, MERGED_KEPT

    reasons = ["internal error", "invalid usage", "invalid argument", "in progress", "timeout"]
    lines = [f"RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:{1271 + i}, {r}, "
             "NCCL version 2.14.3" for i, r in enumerate(reasons)]
    report = match_text("\n".join(["step 1", *lines, "done"]) + "\n", builtin_catalogue)
    found = [f for f in report.findings if f.rule == "PY006"]
    merged = [f for f in found if f.first_line == 2]
    assert merged, [(f.rule, f.first_line) for f in report.findings]
    f = merged[0]
    assert f.count == 1 and len(f.evidence) == 1 + MERGED_KEPT <= EVIDENCE_KEPT  # five lines, three shown
    assert [e.line for e in f.evidence] == list(range(2, 2 + len(f.evidence)))
    assert f.facts["reason"] == "internal error"
    assert f.facts.get("reason_more") and len(f.facts["reason_more"]) <= MERGED_KEPT
