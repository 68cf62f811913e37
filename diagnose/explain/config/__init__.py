"""Config extraction: the job's configuration from its log and files, as one ConfigView with provenance.

Public names:
- ``ConfigView`` / ``ConfigValue`` (``diagnose/configview.py``, stage-neutral: ``Report.config`` is one): flat
  Megatron-Bridge dotted paths, each value with its origin.
- ``CAPTURES`` (captures.py): the CaptureSpecs the scanner collects for us.
- ``from_blocks(blocks, findings=None)`` / ``load_config(path)`` (extract.py): build a view from captured
  blocks or from a file (Bridge YAML / run_config.yaml, Megatron-LM args dump or argument list, or a log).
- ``apply_overrides(view, overrides)`` / ``parse_set("k=v")`` (overrides.py).
- ``apply_defaults(view, version)`` (defaults.py): fill release defaults (origin "default").
"""

from __future__ import annotations

from diagnose.configview import ConfigValue, ConfigView
from diagnose.explain.config.captures import CAPTURES
from diagnose.explain.config.defaults import apply_defaults, family_of, version_range, version_tuple
from diagnose.explain.config.overrides import apply_overrides, normalize_overrides, parse_set

__all__ = [
    "CAPTURES",
    "ConfigValue",
    "ConfigView",
    "apply_defaults",
    "apply_overrides",
    "family_of",
    "from_blocks",
    "load_config",
    "normalize_overrides",
    "parse_set",
    "version_range",
    "version_tuple",
]


def __getattr__(name: str):  # extraction pulls in the YAML/regex parsers: load on first use
    if name in ("from_blocks", "load_config"):
        from diagnose.explain.config import extract

        return getattr(extract, name)
    raise AttributeError(name)
