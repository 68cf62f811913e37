"""Single log lines that carry config: environment assignments, world size, the DDP config repr, param counts."""

from __future__ import annotations

import re

from diagnose.configview import ConfigView
from diagnose.explain.config.values import parse_scalar
from diagnose.model import LogLine

ENV_NAMES = ("CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# Only lines that ARE an assignment (env dump, `export`, `set -x`): never messages that mention a setting,
# like the OOM hint "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".
_ENV_LINE = re.compile(
    r"^\s*(?:\+\s*)?(?:export\s+|declare\s+-x\s+|setenv\s+)?(?P<name>[A-Z_][A-Z0-9_]*)[= ]"
    r"(?P<value>\"[^\"]*\"|'[^']*'|\S*)\s*$"
)
_WORLD = re.compile(
    r"using world size: (?P<world>\d+), data-parallel size: (?P<dp>\d+), context-parallel size: (?P<cp>\d+),"
)
# Megatron-LM 0.9+ prints "tensor-model-parallel size: 2, encoder-tensor-model-parallel size: 0, pipeline-model-
# parallel size: 2, encoder-pipeline-model-parallel size: 0": the job's own sizes are the ones no "encoder-" precedes
_TP = re.compile(r"(?<![\w-])tensor-model-parallel size: (?P<n>\d+)")
_PP = re.compile(r"(?<![\w-])pipeline-model-parallel size: (?P<n>\d+)")
_PARAMS = re.compile(r"number of parameters on \(([^)]*)\) model parallel rank \(([^)]*)\):\s*(\d+)")
_SLURM = {"SLURM_NTASKS": "launch.world_size", "SLURM_NNODES": "launch.nnodes", "SLURM_JOB_NUM_NODES": "launch.nnodes",
          "SLURM_NTASKS_PER_NODE": "launch.nproc_per_node", "SLURM_GPUS_ON_NODE": "launch.gpus_per_node"}


def parse_env_line(line: LogLine, view: ConfigView) -> bool:
    m = _ENV_LINE.match(line.text)
    if not m:
        return False
    name, value = m.group("name"), m.group("value")
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    origin = f"log:{line.lineno}"
    if name in ENV_NAMES:
        view.set(f"env.{name}", value, origin)
        return True
    if name in _SLURM:
        n = parse_scalar(value.split("(")[0])
        if isinstance(n, int) and not view.has(_SLURM[name]):
            view.set(_SLURM[name], n, origin)
            return True
    return False


def parse_world_size(line: LogLine, view: ConfigView) -> bool:
    m = _WORLD.search(line.text)
    tp = _TP.search(line.text, m.end()) if m else None
    pp = _PP.search(line.text, m.end()) if m else None
    if not m or not tp or not pp:
        return False
    origin = f"log:{line.lineno}"
    view.set("launch.world_size", int(m.group("world")), origin)
    view.set("model.tensor_model_parallel_size", int(tp.group("n")), origin)
    view.set("model.pipeline_model_parallel_size", int(pp.group("n")), origin)
    view.set("model.context_parallel_size", int(m.group("cp")), origin)
    view.framework = view.framework or "megatron-lm"
    return True


def parse_num_parameters(line: LogLine, view: ConfigView) -> bool:
    """Keep the largest per-rank parameter count seen (the most loaded model-parallel rank)."""
    m = _PARAMS.search(line.text)
    if not m:
        return False
    n = int(m.group(3))
    if n > (view.get("launch.num_parameters") or 0):
        view.set("launch.num_parameters", n, f"log:{line.lineno}")
    return True


def parse_ddp_repr(line: LogLine, view: ConfigView) -> bool:
    """``Setting up DistributedDataParallel with config DistributedDataParallelConfig(a=1, b='x', ...)``."""
    text = line.text
    at = text.find("DistributedDataParallelConfig(")
    if at < 0:
        return False
    body = text[at + len("DistributedDataParallelConfig("):]
    if body.endswith(")"):
        body = body[:-1]
    origin = f"log:{line.lineno}"
    for key, raw in split_repr_fields(body):
        if re.fullmatch(r"[A-Za-z_]\w*", key):
            view.set(f"ddp.{key}", parse_scalar(raw), origin)
    return True


def split_repr_fields(body: str) -> list[tuple[str, str]]:
    """``a=1, b=(1, 2), c='x,y'`` -> [("a", "1"), ("b", "(1, 2)"), ("c", "'x,y'")], bracket and quote aware."""
    fields: list[tuple[str, str]] = []
    depth, quote, start = 0, "", 0
    pieces: list[str] = []
    for i, ch in enumerate(body):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            pieces.append(body[start:i])
            start = i + 1
    pieces.append(body[start:])
    for piece in pieces:
        if "=" in piece:
            k, v = piece.split("=", 1)
            fields.append((k.strip(), v.strip()))
    return fields
