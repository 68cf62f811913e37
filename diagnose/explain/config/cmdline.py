"""Launch command lines: torchrun / ``python -m torch.distributed.run`` / ``python script.py``.

Reads the launcher's ``--nproc_per_node`` / ``--nnodes`` (world size = their product when both are fixed
numbers), environment assignments before the command (``CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun ...``), and the
script's arguments: Hydra-style ``key=value`` overrides (Megatron-Bridge ``run_recipe.py`` and friends), the
``run_recipe.py`` short flags (``-tp 2``, ``-gb 256``...), or a Megatron-LM argument list (``pretrain_*.py``).
"""

from __future__ import annotations

import re
import shlex

from diagnose.configview import ConfigView
from diagnose.explain.config.mlm_args import MLM_TO_BRIDGE, parse_arg_list
from diagnose.explain.config.overrides import KEY_RE
from diagnose.explain.config.values import as_int, parse_scalar
from diagnose.model import LogLine

MAX_COMMAND_CHARS = 64 * 1024
_ENV_TOKEN = re.compile(r"[A-Z_][A-Z0-9_]*=.*")

# scripts/training/run_recipe.py flags (Megatron-Bridge) -> Bridge paths
RECIPE_FLAGS: dict[str, str] = {
    "-tp": "model.tensor_model_parallel_size", "--tensor_model_parallel_size": "model.tensor_model_parallel_size",
    "-pp": "model.pipeline_model_parallel_size", "--pipeline_model_parallel_size": "model.pipeline_model_parallel_size",
    "-cp": "model.context_parallel_size", "--context_parallel_size": "model.context_parallel_size",
    "-vp": "model.virtual_pipeline_model_parallel_size",
    "-ep": "model.expert_model_parallel_size", "-etp": "model.expert_tensor_parallel_size",
    "-gb": "train.global_batch_size", "--global_batch_size": "train.global_batch_size",
    "-mb": "train.micro_batch_size", "--micro_batch_size": "train.micro_batch_size",
    "-sl": "model.seq_length", "--seq_length": "model.seq_length",
    "-ms": "train.train_iters", "--max_steps": "train.train_iters",
    "--save_dir": "checkpoint.save", "--load_dir": "checkpoint.load", "--save_interval": "checkpoint.save_interval",
    "--pretrained_checkpoint": "checkpoint.pretrained_checkpoint",
    "--use_megatron_fsdp": "ddp.use_megatron_fsdp", "--nccl_ub": "ddp.nccl_ub",
}
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def join_continuations(lines: list[LogLine]) -> tuple[str, int]:
    """The command starting at ``lines[0]``, with ``\\``-continued lines joined; returns (text, lineno)."""
    parts: list[str] = []
    for line in lines:
        text = line.text.rstrip()
        if text.endswith("\\"):
            parts.append(text[:-1])
            if sum(map(len, parts)) > MAX_COMMAND_CHARS:
                break
            continue
        parts.append(text)
        break
    return " ".join(p.strip() for p in parts), lines[0].lineno if lines else 0


def split_command(text: str) -> list[str]:
    text = text[:MAX_COMMAND_CHARS]
    try:
        return shlex.split(text, comments=False, posix=True)
    except ValueError:
        return text.split()


def parse_command(text: str, origin: str, view: ConfigView | None = None) -> ConfigView:
    """Parse one launch command line onto ``view``."""
    view = view or ConfigView()
    tokens = split_command(text)
    # strip shell noise: "+ " (set -x), "srun ...", "env", "export"
    start = 0
    for i, tok in enumerate(tokens):
        base = tok.rsplit("/", 1)[-1]
        if base in ("torchrun",) or tok in _LAUNCHERS or re.fullmatch(r"python[0-9.]*", base):
            start = i
            break
    else:
        return view
    prefix = tokens[:start]
    for tok in prefix:
        if _ENV_TOKEN.fullmatch(tok):
            name, value = tok.split("=", 1)
            view.set(f"env.{name}", value, origin)
    direct = tokens[start].rsplit("/", 1)[-1].startswith("python") and not any(
        t in _LAUNCHERS for t in tokens[start:start + 3]
    )
    if direct and any(t.rsplit("/", 1)[-1] == "srun" for t in prefix):
        _parse_srun(prefix, origin, view)  # one process per task: the task count is the world size
    tokens = tokens[start:]
    script_at = _find_script(tokens)
    launcher_args = tokens[:script_at] if script_at is not None else tokens
    _parse_launcher(launcher_args, origin, view)
    if script_at is None:
        return view
    script = tokens[script_at]
    args = tokens[script_at + 1:]
    _parse_script_args(script, args, origin, view)
    return view


def _options(tokens: list[str], short: dict[str, str] | None = None) -> dict[str, str]:
    """A launcher's ``--key=value`` and ``--key value`` options (``-n value`` for a ``short`` alias), with ``_`` for
    ``-`` in the keys."""
    short = short or {}
    opts: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--") and "=" in tok:
            k, v = tok[2:].split("=", 1)
            opts[k.replace("-", "_")] = v
        elif (tok.startswith("--") or tok in short) and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            opts[short.get(tok, tok[2:]).replace("-", "_")] = tokens[i + 1]
            i += 1
        i += 1
    return opts


def _parse_srun(tokens: list[str], origin: str, view: ConfigView) -> None:
    opts = _options(tokens, {"-n": "ntasks", "-N": "nodes"})
    ntasks = as_int(parse_scalar(opts.get("ntasks", "")))
    nodes = as_int(parse_scalar(opts.get("nodes", "")))
    per_node = as_int(parse_scalar(opts.get("ntasks_per_node", "")))
    if not ntasks and nodes and per_node:
        ntasks = nodes * per_node
    if ntasks:
        view.set("launch.world_size", ntasks, origin)
    if nodes:
        view.set("launch.nnodes", nodes, origin)


def _find_script(tokens: list[str]) -> int | None:
    for i, tok in enumerate(tokens):
        if tok.endswith(".py") and i > 0:
            return i
        if tok == "-m" and i + 1 < len(tokens) and tokens[i + 1] not in _LAUNCHERS:
            return i + 1
    return None


def _parse_launcher(tokens: list[str], origin: str, view: ConfigView) -> None:
    opts = _options(tokens)
    nproc = as_int(parse_scalar(opts.get("nproc_per_node", "")))
    nnodes_raw = opts.get("nnodes", "")
    nnodes = as_int(parse_scalar(nnodes_raw)) if ":" not in nnodes_raw else None
    if nproc:
        view.set("launch.nproc_per_node", nproc, origin)
    if nnodes:
        view.set("launch.nnodes", nnodes, origin)
    if nproc and (nnodes or (not nnodes_raw)):
        view.set("launch.world_size", nproc * (nnodes or 1), origin)


# Megatron-LM flags that other training scripts spell the same way (timm's train.py: --weight-decay --clip-grad
# --min-lr; fairseq: --weight-decay --save-interval; nanoGPT-style and model-zoo scripts: --hidden-size --num-layers
# --seq-length): read as a Megatron-LM argument once the script is known to be one, they do not say that it is
_SHARED_FLAGS = frozenset({
    "weight_decay", "min_lr", "clip_grad", "adam_beta1", "adam_beta2", "hidden_size", "num_layers", "seq_length",
    "num_attention_heads", "max_position_embeddings", "hidden_dropout", "attention_dropout", "save_interval",
    "world_size", "distributed_backend",
})


def _megatron_lm_flag(flag: str) -> bool:
    """A flag of Megatron-LM's own argument list written its way (``--micro-batch-size``, ``--seq-length=4096``): a
    word of a script's arguments that says the script is Megatron-LM's. Any argparse script has hyphenated flags
    (``convert_bridge_example.py export --hf-model ... --megatron-path ...``, a Megatron-Bridge export: qa-report-8
    L2), so a hyphen alone does not, nor a Megatron-LM flag that other scripts have too (``_SHARED_FLAGS``)."""
    if not flag.startswith("--") or "-" not in flag[2:]:
        return False
    name = flag[2:].split("=", 1)[0].replace("-", "_")
    return name in MLM_TO_BRIDGE and name not in _SHARED_FLAGS


_CONFIG_FILE_FLAGS = ("--config", "--config-file", "--config_file")


def _config_file_arg(flags: list[str]) -> bool:
    """The script's arguments name a YAML config file with ``--config`` / ``--config-file`` (either spelling of the
    value: ``--config x.yaml``, ``--config=x.yaml``)."""
    for i, tok in enumerate(flags):
        key, _, value = tok.partition("=")
        if key not in _CONFIG_FILE_FLAGS:
            continue
        if not value and i + 1 < len(flags):
            value = flags[i + 1]
        if value.lower().endswith((".yaml", ".yml")):
            return True
    return False


def _parse_script_args(script: str, args: list[str], origin: str, view: ConfigView) -> None:
    hydra = [a for a in args if "=" in a and not a.startswith("-") and KEY_RE.fullmatch(a.split("=", 1)[0].lstrip("+"))]
    flags = [a for a in args if a not in hydra]
    name = script.rsplit("/", 1)[-1]
    # a YAML config file as the script's argument (``pretrain_llama3_8b.py --config-file x.yaml``) is how Bridge's
    # example and user scripts take their config; Megatron-LM's argument list has no such flag (its YAML option is
    # ``--yaml-cfg``), so ``pretrain_gpt.py --config llama3_70b.yaml`` is no Megatron-LM job (qa-report-17 L7:
    # config.framework said megatron-lm beside a traceback through megatron/bridge/training/train.py)
    bridge_like = bool(hydra) or "recipe" in name or any(f in RECIPE_FLAGS for f in flags) or _config_file_arg(flags)
    if bridge_like:
        view.framework = view.framework or "megatron-bridge"
        i = 0
        while i < len(flags):
            tok = flags[i]
            key, value = (tok.split("=", 1) + [None])[:2] if "=" in tok else (tok, None)
            if key in RECIPE_FLAGS:
                if value is None and i + 1 < len(flags) and not flags[i + 1].startswith("-"):
                    value = flags[i + 1]
                    i += 1
                if value is not None:
                    view.set(RECIPE_FLAGS[key], parse_scalar(value), origin)
            i += 1
        for a in hydra:
            key, value = a.split("=", 1)
            view.set(key.lstrip("+"), parse_scalar(value), origin)
        return
    if flags and (name.startswith("pretrain") or any(_megatron_lm_flag(f) for f in flags)):
        view.framework = view.framework or "megatron-lm"
        parse_arg_list(flags, origin, view)
