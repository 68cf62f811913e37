"""Megatron-Bridge YAML (``run_config.yaml``, the ``Task Configuration`` banner, recipe dumps) to dotted paths.

``_target_`` keys name classes; they are never imported (the model's is kept as ``ConfigView.model_target``: its
provider defaults are looked up by ``providers.py``). A mapping that only wraps a target (``{_target_:
torch.bfloat16, _call_: false}``) is kept as the target's short name. ``env_vars`` become ``env.<NAME>``.
"""

from __future__ import annotations

import re
from typing import Any

from diagnose.configview import ConfigView
from diagnose.model import DiagnoseError

META_KEYS = {"_target_", "_partial_", "_call_", "_args_", "_recursive_", "_convert_"}
MAX_VALUES = 200_000


def flatten_bridge(data: Any, origin: str, view: ConfigView | None = None) -> ConfigView:
    """Flatten a loaded Bridge config mapping into ``view`` (new view if None)."""
    view = view or ConfigView()
    if not isinstance(data, dict):
        raise DiagnoseError("config is not a mapping of sections (expected keys like model:, ddp:, checkpoint:)")
    count = 0

    def walk(prefix: str, value: Any) -> None:
        nonlocal count
        count += 1
        if count > MAX_VALUES:
            raise DiagnoseError(f"config refused: more than {MAX_VALUES} values")
        if isinstance(value, dict):
            keys = set(map(str, value))
            if prefix == "model" and isinstance(value.get("_target_"), str):
                # the provider class: its defaults fill what the file does not set (config/providers.py)
                view.model_target = value["_target_"]
                if keys <= META_KEYS:
                    return
            if keys and keys <= META_KEYS and "_target_" in keys:
                view.set(prefix, _short_target(value["_target_"]), origin)
                return
            for k, v in value.items():
                k = str(k)
                if k in META_KEYS:
                    continue
                walk(f"{prefix}.{k}" if prefix else k, v)
            return
        view.set(prefix, value, origin)

    for section, value in data.items():
        section = str(section)
        if section in META_KEYS:
            continue
        if section == "env_vars" and isinstance(value, dict):
            for name, v in value.items():
                view.set(f"env.{name}", None if v is None else str(v), origin)
            continue
        walk(section, value)
    return view


_KEY_LINE = re.compile(r"^(\s*)([A-Za-z_][\w-]*):(\s|$)")


def key_lines(lines: list[str]) -> dict[str, int]:
    """Dotted path -> index of the line that sets it, for block-style YAML (what Bridge prints)."""
    stack: list[tuple[int, str]] = []
    out: dict[str, int] = {}
    for i, line in enumerate(lines):
        m = _KEY_LINE.match(line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        path = ".".join(k for _, k in stack)
        if stack[0][1] == "env_vars" and len(stack) == 2:
            path = f"env.{stack[1][1]}"
        out.setdefault(path, i)
    return out


def _short_target(target: Any) -> Any:
    if isinstance(target, str) and target.startswith("torch.") and target.count(".") == 1:
        return target.split(".", 1)[1]
    return target


def looks_like_bridge(data: Any) -> bool:
    return isinstance(data, dict) and any(k in data for k in ("model", "ddp", "checkpoint", "train", "dist"))
