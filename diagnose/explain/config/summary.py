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
_ITEM = re.compile(r"^\s+(\w+): (.*?)(?:  \(Mcore default: .*\))?\s*$")


def parse_summary(lines: list[LogLine], view: ConfigView | None = None) -> ConfigView:
    view = view or ConfigView()
    section: str | None = None
    started = False
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
            continue
        if section is None:
            continue
        m = _ITEM.match(text.rstrip())
        if m:
            view.set(f"{section}.{m.group(1)}", parse_scalar(m.group(2)), f"log:{line.lineno}")
        elif (stripped and not stripped.startswith("-") and stripped != "Other Configuration Values:"
              and not text.startswith(" ")):
            break  # a log line from something else: the block is over
    return view
