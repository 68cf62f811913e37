"""What to do next for a generic finding whose category was read from the evidence (the catalogue's category fixes).

A generic rule (an uncaught exception, an assertion, a native crash) knows that the run failed, not how; its own fix
can only say "read the traceback". Once an ``[[infer]]`` table (or a later reading) has read the kind of failure
from the frames and words, the user's next step depends on that kind: a memory failure is sized, a version skew is
pinned, a node is drained. ``rules/06_category_fixes.toml`` words that step once per category; this pass gives it
to each such finding that still carries its generic rule's fix, for the generic rules that file names
(``replaces_fix_of``: those whose fix only says to read the evidence). A generic rule with a fix of its own (HW001's
``CUDA_LAUNCH_BLOCKING=1`` to find the kernel) and every specific rule keep theirs.

A named rule's environment variables stay with the category's fix: a setting that makes any such failure readable
holds whatever the category turns out to be.

The category's words hold for any stack; the traceback names the one place to start. When it showed where the
exception was raised, "the frames above it" in a step becomes that frame (``mbridge/core/util.py:83 in
build_model``) and ``PACKAGE`` the package whose code raised (``pip show mbridge``): the step the user reads is the
step they run.
"""

from __future__ import annotations

import copy

from diagnose.match.rules import Catalogue
from diagnose.model import Finding

RAISED_AT = "raised_at"  # fact: where the exception was raised (inference.raised_at), set on inferred findings
RAISING_PACKAGE = "raising_package"  # fact: the package whose code raised (inference.package_of its frame)
FRAMES_WORDS = "the frames above it"
PACKAGE_WORD = "PACKAGE"


def give_category_fixes(findings: list[Finding], catalogue: Catalogue) -> None:
    """Replace the generic rule's fix of every inferred generic finding by its category's fix, where there is one,
    keeping the rule's environment variables."""
    if not catalogue.category_fixes:
        return
    for f in findings:
        rule = catalogue.by_code(f.rule)
        if (rule is None or rule.code not in catalogue.category_fix_rules or rule.tier != "generic"
                or f.basis != "inferred" or f.fix != rule.fix):
            continue
        fix = catalogue.category_fixes.get(f.category)
        if fix is not None:
            f.fix = copy.deepcopy(fix)
            f.fix.env = copy.deepcopy(rule.fix.env)
            f.fix.steps = [_named(step, f.facts) for step in f.fix.steps]


def _named(step: str, facts: dict) -> str:
    """A category step with the traceback's own place and package in it, where the finding knows them."""
    where, package = str(facts.get(RAISED_AT) or ""), str(facts.get(RAISING_PACKAGE) or "")
    if where and FRAMES_WORDS in step:
        step = step.replace(FRAMES_WORDS, f"the frame that raised it ({where})", 1)
    if package and PACKAGE_WORD in step:
        step = step.replace(PACKAGE_WORD, package)
    return step
