"""Refuse a config the real loaders refuse: unknown sections, misspelt keys and flags, wrong value types.

Bridge's YAML loader builds dataclasses (an unknown field is an error, ``'abc'`` for an int is an error), Hydra's
struct mode refuses ``Could not override '<key>'``, Megatron-LM's argparse refuses an unknown flag. The tool used to
drop or keep such values silently and then call the config valid. What we can know is refused here, one line, with
a did-you-mean: a top-level section that ``ConfigContainer`` does not have, a dotted top-level key (which would
override the nested value), a key or flag close to a known one but not one, and a value of the wrong type for a
field whose type we know. A key we do not know and that is close to none stays (our field list is not complete).
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import os
from collections.abc import Iterable
from typing import Any

from diagnose.explain.config.bridge_yaml import META_KEYS
from diagnose.explain.config.defaults import COMMON_DEFAULTS
from diagnose.explain.config.mlm_args import INVERTED, MLM_TO_BRIDGE
from diagnose.explain.config.providers import table
from diagnose.model import DiagnoseError

# Megatron-Bridge ConfigContainer's fields (knowledge/megatron-bridge.md §1.5) and the meta keys of a dump
SECTIONS = frozenset({
    "env_vars", "rng", "rerun_state_machine", "train", "model", "optimizer", "ddp", "validation", "scheduler",
    "dataset", "logger", "tokenizer", "checkpoint", "dist", "ft", "straggler", "nvrx_straggler", "profiling", "peft",
    "comm_overlap", "mixed_precision", "tensor_inspect", "inprocess_restart",
}) | META_KEYS
# integer fields beyond those whose release default is an int (COMMON_DEFAULTS)
INT_FIELDS = frozenset({
    "model.num_layers", "model.hidden_size", "model.ffn_hidden_size", "model.num_attention_heads",
    "model.num_query_groups", "model.kv_channels", "model.seq_length", "model.max_position_embeddings",
    "model.vocab_size", "model.num_moe_experts", "model.moe_router_topk", "model.virtual_pipeline_model_parallel_size",
    "model.expert_tensor_parallel_size", "model.recompute_num_layers", "model.mtp_num_layers",
    "train.micro_batch_size", "train.global_batch_size", "train.train_iters", "train.eval_iters",
    "checkpoint.save_interval", "dataset.seq_length",
})
CUTOFF = 0.9  # "tensor_model_paralel_size" scores 0.98, "use_megatron_fdsp" 0.94; real neighbours score lower
# megatron-core's config classes, read as source (no torch import): their fields are never called a typo
_MCORE_SOURCES = {
    "model": ("core/transformer/transformer_config.py", "core/model_parallel_config.py"),
    "ddp": ("core/distributed/distributed_data_parallel_config.py",),
    "optimizer": ("core/optimizer/optimizer_config.py",),
}


def _typed_fields() -> dict[str, type]:
    out: dict[str, type] = dict.fromkeys(INT_FIELDS, int)
    for key, value in COMMON_DEFAULTS.items():
        if isinstance(value, bool):
            out[key] = bool
        elif isinstance(value, int):
            out[key] = int
        elif isinstance(value, float):
            out[key] = float
    return out


def known_keys() -> set[str]:
    import diagnose.explain.validate  # noqa: F401 - registers the checks, which fill KNOWN_KEYS
    from diagnose.explain.validate.registry import KNOWN_KEYS

    keys = set(COMMON_DEFAULTS) | set(INT_FIELDS) | KNOWN_KEYS
    for paths in MLM_TO_BRIDGE.values():
        keys.update(paths)
    keys |= mcore_fields()
    keys |= provider_fields()
    return keys


_mcore_fields: set[str] | None = None


def mcore_fields() -> set[str]:
    """``section.field`` for every field megatron-core's config dataclasses declare, when it is installed."""
    global _mcore_fields
    if _mcore_fields is not None:
        return _mcore_fields
    found: set[str] = set()
    try:
        spec = importlib.util.find_spec("megatron")
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
    except (ImportError, ValueError):
        roots = []
    for section, files in _MCORE_SOURCES.items():
        for root in roots:
            for name in files:
                try:
                    with open(os.path.join(root, name), encoding="utf-8") as fh:
                        tree = ast.parse(fh.read())
                except (OSError, SyntaxError, ValueError):
                    continue
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        found.update(f"{section}.{st.target.id}" for st in node.body
                                     if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name))
    _mcore_fields = found
    return found


def did_you_mean(name: str, choices: Iterable[str], cutoff: float = CUTOFF) -> str | None:
    close = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=cutoff)
    return close[0] if close else None


def check_bridge_mapping(data: dict, what: str) -> None:
    """Top-level sections of a loaded Bridge YAML: DiagnoseError for an unknown or a dotted one."""
    for raw in data:
        key = str(raw)
        if key in SECTIONS:
            continue
        if "." in key and key.split(".", 1)[0] in SECTIONS:
            raise DiagnoseError(f"{what}: top-level key '{key}' is not a section (Bridge's loader refuses it; it "
                                f"would not set {key}): nest it under {key.split('.', 1)[0]}:")
        hint = did_you_mean(key, SECTIONS - META_KEYS, cutoff=0.6)
        raise DiagnoseError(f"{what}: unknown section '{key}:'" + (f" (did you mean {hint}:?)" if hint else
                            f" (ConfigContainer has {', '.join(sorted(s for s in SECTIONS if s[0] != '_'))})"))


def check_values(values: dict[str, Any], what: str, allow: Iterable[str] = ()) -> None:
    """Flattened keys of a config file: DiagnoseError for a misspelt key or a value of the wrong type."""
    known = known_keys()
    allowed = set(allow)
    typed = _typed_fields()
    for key, value in values.items():
        if key.startswith(("env.", "env_vars.", "mlm.", "launch.")) or key in allowed:
            continue
        if key not in known:
            section = key.split(".", 1)[0] + "."
            hint = did_you_mean(key, (k for k in known if k.startswith(section)))
            if hint is not None:
                raise DiagnoseError(f"{what}: unknown key '{key}' (did you mean {hint}?)")
            if "." in key and not key.split(".")[1].isidentifier():
                # a section's fields are dataclass fields: a key that is not a Python name is none of them
                raise DiagnoseError(f"{what}: unknown key '{key}' (not a field name: Bridge's loader refuses it)")
            continue
        problem = type_problem(key, value, typed)
        if problem:
            raise DiagnoseError(f"{what}: {problem}")


def type_problem(key: str, value: Any, typed: dict[str, type] | None = None) -> str | None:
    """Why ``value`` cannot be ``key``'s type (OmegaConf's wording), or None."""
    want = (typed or _typed_fields()).get(key)
    if want is None or value is None:
        return None
    if want is bool and isinstance(value, bool):
        return None
    if want is int and isinstance(value, int) and not isinstance(value, bool):
        return None
    if want is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return None
    if want is int and isinstance(value, float) and value.is_integer():
        return None
    name = {bool: "Boolean", int: "Integer", float: "Float"}[want]
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:59] + "…"
    return f"{key}: value {shown} of type '{type(value).__name__}' could not be converted to {name}"


def check_mlm_flags(names: Iterable[str], what: str) -> None:
    """Megatron-LM flags kept as ``mlm.<name>`` that are a typo of a known flag: DiagnoseError (argparse refuses
    an unknown flag: ``unrecognized arguments``)."""
    flags = set(MLM_TO_BRIDGE) | set(INVERTED)
    real = megatron_lm_flags()
    for name in names:
        if name in real:
            continue  # a flag some Megatron-LM release accepts is never a typo, however close to another
        hint = did_you_mean(name, flags | real)
        if hint is not None and hint != name:
            raise DiagnoseError(f"{what}: unrecognized argument --{name.replace('_', '-')} (did you mean "
                                f"--{hint.replace('_', '-')}?)")


def provider_fields() -> set[str]:
    """``model.<field>`` for every field a Megatron-Bridge model provider sets (providers.json, every release)."""
    out: set[str] = set()
    for provider in (table().get("providers") or {}).values():
        for variant in provider.get("variants") or []:
            out.update(f"model.{name}" for name in variant.get("own") or {})
    return out


@functools.lru_cache(maxsize=1)
def megatron_lm_flags() -> frozenset[str]:
    """Every flag of Megatron-LM's argument parser across releases (``mlm_flags.txt``, made by
    scripts/gen_mlm_flags.py from the sources), as ``snake_case`` names."""
    from importlib import resources

    text = resources.files("diagnose.explain.config").joinpath("mlm_flags.txt").read_text(encoding="utf-8")
    return frozenset(line[2:].replace("-", "_") for line in text.splitlines() if line.startswith("--"))


def check_overrides(overrides: Iterable) -> None:
    """``--set`` values of the wrong type for their field: DiagnoseError (Hydra refuses them at load)."""
    typed = _typed_fields()
    for o in overrides:
        value = getattr(o, "value", None)
        if not isinstance(getattr(o, "key", None), str) or type(value).__name__ == "object":
            continue  # a removal (~key)
        problem = type_problem(o.key, value, typed)
        if problem:
            raise DiagnoseError(f"--set {problem}")
