"""The ``Configuration Summary (Non-Default Values vs Megatron Core)`` block (Megatron-Bridge >= 0.3.1).

Format (``ConfigContainer.log_non_default_values``, config.py ~L1809)::

    [ddp] Non-default values (vs Mcore DistributedDataParallelConfig):
      use_megatron_fsdp: True  (Mcore default: False)
    ----------------------------------------------------------------------
    Other Configuration Values:
    ...
    [checkpoint]:
      ckpt_format: 'fsdp_dtensor'
    ======================================================================

Only non-defaults of [optimizer]/[ddp]/[model] are listed (the rest are megatron-core defaults); ``cfg.dist`` is
never printed.
"""

from __future__ import annotations

import re

from diagnose.configview import ConfigView
from diagnose.explain.config.values import parse_scalar
from diagnose.model import LogLine

_SECTION = re.compile(r"^\[(\w+)\](?::| Non-default values)")
# TransformerConfig fields that move the parameter count, at megatron-core's default: the [model] list names every
# TransformerConfig field that differs from it, so one it does not name is known to be this (not an assumption).
# GPTModel's own arguments (tied embeddings, position embedding) are no TransformerConfig fields: never listed.
_UNLISTED_IS_DEFAULT = {"gated_linear_unit": False, "normalization": "LayerNorm", "add_bias_linear": True}
_ITEM = re.compile(r"^\s+(\w+): (.*?)(?:  \(Mcore default: .*\))?\s*$")


def parse_summary(lines: list[LogLine], view: ConfigView | None = None) -> ConfigView:
    view = view or ConfigView()
    section: str | None = None
    started = False
    model_header: int | None = None  # the line of "[model] Non-default values (vs Mcore TransformerConfig)"
    for line in lines[1:]:
        text = line.text.rstrip("\n")
        stripped = text.strip()
        if stripped.startswith("=" * 20):
            if started:
                break
            continue
        m = _SECTION.match(stripped)
        if m:
            section, started = m.group(1), True
            if section == "model" and "Non-default values" in stripped:
                model_header = line.lineno
            continue
        if section is None:
            continue
        m = _ITEM.match(text.rstrip())
        if m:
            view.set(f"{section}.{m.group(1)}", parse_scalar(m.group(2)), f"log:{line.lineno}")
        elif (stripped and not stripped.startswith("-") and stripped != "Other Configuration Values:"
              and not text.startswith(" ")):
            break  # a log line from something else: the block is over
    if model_header is not None:
        for key, value in _UNLISTED_IS_DEFAULT.items():
            if view.get(f"model.{key}") is None:
                view.set(f"model.{key}", value, f"log:{model_header} not listed: megatron-core's default")
    return view
