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
