"""Settings implied by an error message, for logs that fail before printing their config.

Validation failures happen before Megatron-Bridge prints its configuration, so those logs carry no config block.
The message itself still pins a few settings (``num_attention_heads (7) must be a multiple of
tensor_model_parallel_size (2)`` means 7 heads and TP=2). What each message states is written once, in the rule
that matches it (``[rule.implies]`` in ``rules/``: the settings, from the rule's named groups or fixed, and the
validator check that prints the message); the finding carries it. Those values get the origin
``implied:log:<line>``: replay merges them under whatever part of the config the log printed (the log wins where it
states a value). When the validator then prints the same failure, replay says "reproduced (from the settings the
error states)" (``implied: true``). Only values the message states are set; nothing is invented.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from diagnose.configview import ConfigView
from diagnose.model import Finding, Implies

SET = "(set)"  # a path the message proves was set, without saying which
NOT_ONE = "(not 1)"  # an environment variable the message proves was not 1 (unset or another value)

_INT_AFTER = re.compile(r"\d+")


def stated_settings(implies: Implies, facts: dict[str, Any]) -> dict[str, Any]:
    """The settings ``implies`` states, read from the finding's facts; a setting whose fact the message did not
    carry is left out (the rule matched another wording)."""
    out: dict[str, Any] = {}
    for s in implies.settings:
        if not s.fact:
            out[s.key] = s.value
            continue
        text = facts.get(s.fact)
        if not isinstance(text, str):
            continue
        if s.after:
            at = text.find(s.after)
            m = _INT_AFTER.match(text, at + len(s.after)) if at >= 0 else None
            text = m.group(0) if m else ""
        if text.isdigit():
            out[s.key] = int(text)
    return out


def stated_checks(finding: Finding) -> set[str]:
    """Names of the validator checks that print the finding's message (any release's wording)."""
    implies = finding.implies
    return {implies.check} if implies is not None and implies.check else set()


def implied_view(findings: Iterable[Finding]) -> ConfigView:
    """Settings stated by the findings' error messages (first statement of a key wins)."""
    view = ConfigView()
    for finding in findings:
        if finding.implies is None:
            continue
        settings = stated_settings(finding.implies, finding.facts)
        if not settings:
            continue
        for line in finding.implied_lines or [finding.first_line]:  # every kept line that states it
            for key, value in settings.items():
                if not view.has(key):
                    view.set(key, value, f"implied:log:{line}")
            source = f"implied:log:{line} error message"
            if source not in view.sources:
                view.sources.append(source)
    return view
