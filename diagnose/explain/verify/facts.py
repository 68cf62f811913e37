"""Every log line ``diagnose verify`` reads, in one place: the capture specs the scanner collects and the regexes
that read them.

The lines are what megatron-core, Megatron-LM and Megatron-Bridge print on a run that works (sources in
../shared/knowledge/megatron-core.md §4, megatron-bridge.md §3):
- the data-parallel wrapper's start-up line ``Setting up DistributedDataParallel with config
  DistributedDataParallelConfig(...)``, logged by ``megatron.core.distributed.distributed_data_parallel`` for DDP and
  by ``megatron.core.distributed.fsdp.mcore_fsdp_adapter`` for Megatron FSDP (the class is named
  ``FullyShardedDataParallel``, a factory since Megatron-LM #5865), with the effective DDP config as its repr;
- Megatron FSDP's own set-up lines (``Setting up Megatron-FSDP MixedPrecisionPolicy``, ``Number of FSDP Parameter
  Groups``);
- the training log line ``iteration N/ M | ... | lm loss: X.XXXXXXE+XX | ...`` (a non-finite loss prints ``NAN`` or
  ``INF`` through ``{:.6E}``);
- ``saving checkpoint at iteration N to DIR in FORMAT format`` and ``successfully saved checkpoint from iteration N
  to DIR [ t i/T, p j/P ]``;
- ``setting number of microbatches to constant N`` (megatron-core num_microbatches_calculator).
The fallback warnings (Transformer Engine / Apex missing) and the environment lines are captured by
``diagnose.explain.config.captures`` already and read from there.
"""

from __future__ import annotations

import re

from diagnose.model import CaptureSpec

TP_CP_FSDP_WARNING_ANCHOR = "require different CUDA_MAX_CONNECTIONS settings"
WRAPPER_ANCHOR = "Setting up DistributedDataParallel with config"
FSDP_SETUP_ANCHORS = ("Setting up Megatron-FSDP MixedPrecisionPolicy", "Number of FSDP Parameter Groups")
ITERATION_ANCHOR = "| consumed samples:"
SAVING_ANCHOR = "saving checkpoint at iteration"
SAVED_ANCHOR = "successfully saved checkpoint from iteration"
MICROBATCHES_ANCHOR = "setting number of microbatches to constant"
NONFINITE_ANCHORS = ("loss: NAN", "loss: nan", "loss: INF", "loss: inf", "loss: -INF", "loss: -inf")

CAPTURES: list[CaptureSpec] = [
    # every wrap (one per model chunk and rank): DDP on one rank and FSDP on another is worth knowing
    CaptureSpec("verify.wrapper", WRAPPER_ANCHOR, keep="first_last"),
    *[CaptureSpec(f"verify.fsdp_setup.{i}", anchor) for i, anchor in enumerate(FSDP_SETUP_ANCHORS)],
    CaptureSpec("verify.iteration", ITERATION_ANCHOR, regex=r"iteration\s+\d+\s*/\s*\d+", keep="first_last"),
    *[CaptureSpec(f"verify.nonfinite.{i}", anchor, regex=r"iteration\s+\d+\s*/") for i, anchor in
      enumerate(NONFINITE_ANCHORS)],
    CaptureSpec("verify.saving", SAVING_ANCHOR, keep="first_last"),
    CaptureSpec("verify.saved", SAVED_ANCHOR, keep="first_last"),
    CaptureSpec("verify.microbatches", MICROBATCHES_ANCHOR),
    CaptureSpec("verify.tp_cp_warning", TP_CP_FSDP_WARNING_ANCHOR),
    CaptureSpec("verify.gpu_name", "NVIDIA ", regex=r"NVIDIA (H100|H200|H800|H20|GH200|A100|B200|B100|GB200|GB300)"),
]

# the wrapper line: which module logged it says which class was built
WRAPPER_RE = re.compile(r"(?P<logger>megatron\.core\.distributed\.[\w.]+)?\W*" + re.escape(WRAPPER_ANCHOR)
                        + r"\s+(?P<config>\w+\((?P<fields>.*)\))?")
DDP_LOGGER = "megatron.core.distributed.distributed_data_parallel"
REPR_FIELD_RE = re.compile(r"(?:^|, )(?P<key>\w+)=(?P<value>'[^']*'|\"[^\"]*\"|[^,()]+)")

ITERATION_RE = re.compile(r"iteration\s+(?P<it>\d+)\s*/\s*(?P<total>\d+)\s*\|")
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?(?:[Ee][-+]?\d+)?|nan|NAN|NaN|inf|INF|Inf)"
LOSS_RE = re.compile(r"(?P<name>[\w ]*?loss): (?P<value>" + _NUMBER + r")\s*\|")
SAVING_RE = re.compile(re.escape(SAVING_ANCHOR) + r"\s+(?P<it>\d+) to (?P<dir>\S+) in (?P<format>\w+) format")
MICROBATCHES_RE = re.compile(re.escape(MICROBATCHES_ANCHOR) + r"\s+(?P<n>\d+)")

HOPPER_OR_OLDER = re.compile(r"\b(H100|H200|H800|H20|GH200|A100|A800|A10G?|A30|A40|L40S?|L4|V100|T4)\b")
BLACKWELL = re.compile(r"\b(B200|B100|GB200|GB300|B300|RTX PRO 6000)\b")


def repr_fields(text: str) -> dict[str, str]:
    """``DistributedDataParallelConfig(a=1, b='x')`` -> {"a": "1", "b": "x"} (flat fields only; values as text)."""
    m = WRAPPER_RE.search(text)
    body = m.group("fields") if m and m.group("fields") else text
    return {f.group("key"): f.group("value").strip().strip("'\"") for f in REPR_FIELD_RE.finditer(body)}


def wrapper_kind(text: str) -> str | None:
    """"megatron_fsdp" | "ddp" | None (not a wrapper line): from the module that logged the line, else from the
    ``use_megatron_fsdp`` field of the config repr it prints."""
    m = WRAPPER_RE.search(text)
    if not m:
        return None
    logger = m.group("logger") or ""
    if ".fsdp." in logger + ".":
        return "megatron_fsdp"
    if logger == DDP_LOGGER:
        return "ddp"
    flag = repr_fields(text).get("use_megatron_fsdp")
    if flag is None:
        return None
    return "megatron_fsdp" if flag == "True" else "ddp"


def iteration(text: str) -> tuple[int, int] | None:
    m = ITERATION_RE.search(text)
    return (int(m.group("it")), int(m.group("total"))) if m else None


def losses(text: str) -> dict[str, float]:
    """The losses an iteration line reports (``lm loss``, ``mtp_1 loss``...) as floats (nan/inf kept)."""
    out: dict[str, float] = {}
    for m in LOSS_RE.finditer(text):
        name = m.group("name").strip()
        if name.endswith("loss") and "scale" not in name:
            out[name] = float(m.group("value"))
    return out
