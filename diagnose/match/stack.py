"""The software stack a job ran, from the evidence its log carries: the packages of its tracebacks' frames.

A rule's fix may be written in one stack's words (Megatron-Bridge overrides, Megatron-LM flags); a job that ran
another stack (plain PyTorch, HF Trainer, DeepSpeed) needs the rule's stack-neutral words instead. The matcher reads
the frames of the tracebacks its hits end (``stack_of_frames``) and the report keeps one answer (``decide_stack``);
the presenters choose the fix's words from it (``diagnose.explain.render.fix_style``) and never read the log.

Names: "megatron-bridge", "nemo", "nemo-rl", "verl", "megatron-lm" (Megatron Core or Megatron-LM's training loop,
no wrapper above it), "torchtitan", "deepspeed", "lightning", "transformers", "accelerate", "torch-fsdp",
"pytorch" (a traceback of Python frames, none of the above: the job's own training code on PyTorch).
"""

from __future__ import annotations

from collections.abc import Iterable

from diagnose.match.frames import frame_file, is_library

# (name, path fragments of a frame's file), most decisive first: a wrapper's frames decide over those of the
# Megatron Core it runs on (NeMo, verl and Bridge jobs call megatron/core), Megatron's over the libraries it calls
_STACKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("megatron-bridge", ("megatron/bridge/",)),
    ("nemo-rl", ("nemo_rl/",)),
    ("nemo", ("/nemo/collections/", "/nemo/lightning/", "/nemo/core/", "/nemo/utils/", "nemo_automodel/")),
    ("verl", ("/verl/",)),
    ("megatron-lm", ("megatron/core/", "megatron/training/", "megatron/legacy/", "megatron/model/",
                     "pretrain_gpt.py", "pretrain_bert.py", "pretrain_t5.py", "pretrain_mamba.py")),
    ("torchtitan", ("torchtitan/",)),
    ("deepspeed", ("/deepspeed/",)),
    ("lightning", ("/lightning/", "/pytorch_lightning/", "/lightning_fabric/")),
    ("transformers", ("/transformers/", "/trl/", "llamafactory/", "/peft/")),
    ("accelerate", ("/accelerate/",)),
    ("torch-fsdp", ("torch/distributed/fsdp/", "torch/distributed/_composable/fsdp/")),
    ("pytorch", ()),  # decided apart: PyTorch's frames under the job's own code (_own_code_on_torch)
)
_ORDER = {name: i for i, (name, _) in enumerate(_STACKS)}
MEGATRON = frozenset({"megatron-bridge", "megatron-lm"})  # stacks whose override words the rules' fixes are written in


def stack_of_frames(frames: Iterable[str]) -> str:
    """The most decisive stack the Python frames (their log text) name; "" when none names one. "pytorch" needs
    both a frame of the job's own code (a file no library's: frames.is_library) and one of PyTorch's: a traceback of
    PyTorch's frames alone (a watchdog or worker thread) says nothing of the code that drove it."""
    best = ""
    own = torch = False
    for text in frames:
        path = frame_file(text)
        if not path:
            continue
        path = "/" + path  # the fragments below read a relative path (torch/...) as one under a root
        torch = torch or "/torch/" in path
        own = own or not is_library(path[1:])
        for name, fragments in _STACKS:
            if best and _ORDER[name] >= _ORDER[best]:
                break
            if any(f in path for f in fragments):
                best = name
                break
    return best or ("pytorch" if own and torch else "")


def decide_stack(named: Iterable[str]) -> str | None:
    """One stack for the job from those its tracebacks named (``stack_of_frames`` per hit): the most decisive;
    None when no traceback named any (a job with no evidence keeps the fix words of a Megatron-Bridge job)."""
    found = [n for n in named if n in _ORDER]
    return min(found, key=_ORDER.__getitem__) if found else None
