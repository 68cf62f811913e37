"""qa-report-8 L4: the memory model's sentence for an OOM it cannot size (no parameter count, no model shape) names
sharding in the words of the job's stack, the same decision as the fix's words (render.fix_style on Report.stack):
the distributed optimizer or Megatron FSDP for a Megatron job, ZeRO or FSDP for any other."""

from __future__ import annotations

import pytest

from diagnose.pipeline import analyze

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.11 GiB of which 300.00 MiB is free. Including non-PyTorch memory, this process has 78.80 GiB memory in use. "
       "Of the allocated memory 78.70 GiB is allocated by PyTorch, and 50.00 MiB is reserved by PyTorch but "
       "unallocated.")
SITE = "/opt/conda/lib/python3.10/site-packages"
ADAM = [f'  File "{SITE}/torch/optim/adamw.py", line 160, in step', "    self._init_group(",
        f'  File "{SITE}/torch/optim/adamw.py", line 114, in _init_group',
        '    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)']
OWN = ['  File "/home/u/train.py", line 300, in <module>', "    optimizer.step()"]
MEGATRON = ['  File "/workspace/Megatron-LM/pretrain_gpt.py", line 300, in <module>', "    pretrain(",
            '  File "/workspace/Megatron-LM/megatron/training/training.py", line 1200, in train_step',
            "    update_successful, grad_norm, num_zeros_in_grad = optimizer.step()"]


def _memory_words(tmp_path, frames: list[str]) -> tuple[str | None, str]:
    log = tmp_path / "job.log"
    log.write_text("\n".join(["Traceback (most recent call last):", *frames, *ADAM, OOM]) + "\n")
    report = analyze([str(log)])
    assert report.memory is not None and report.root is not None
    assert report.root.phase == "optimizer_step"
    return report.stack, report.memory.explanation


@pytest.mark.parametrize("frames, stack, said, unsaid", [
    (OWN, "pytorch", "ZeRO or FSDP", "Megatron FSDP"),
    (MEGATRON, "megatron-lm", "distributed optimizer or Megatron FSDP", "ZeRO"),
])
def test_unsized_oom_speaks_the_jobs_stack(tmp_path, frames, stack, said, unsaid):
    got_stack, words = _memory_words(tmp_path, frames)
    assert got_stack == stack
    assert said in words
    assert unsaid not in words
