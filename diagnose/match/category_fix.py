"""What to do next for a generic finding whose category was read from the evidence (the catalogue's category fixes).

A generic rule (an uncaught exception, an assertion, a native crash) knows that the run failed, not how; its own fix
can only say "read the traceback". Once an ``[[infer]]`` table (or a later reading) has read the kind of failure
from the frames and words, the user's next step depends on that kind: a memory failure is sized, a version skew is
pinned, a node is drained. ``rules/06_category_fixes.toml`` words that step once per category; this pass gives it
to each such finding that still carries its generic rule's fix. A specific rule's fix is never replaced.

A few generic rules know one setting that makes any such failure readable (HW001's ``CUDA_LAUNCH_BLOCKING=1`` for an
asynchronous device-side error, whose frames are otherwise not the failing call's; PY050's ``HYDRA_FULL_ERROR=1``,
without which Hydra hides the traceback). That setting holds whatever the category turns out to be, so the category's
fix keeps the rule's environment variables.
"""

from __future__ import annotations

import copy

from diagnose.match.rules import Catalogue
from diagnose.model import Finding


def give_category_fixes(findings: list[Finding], catalogue: Catalogue) -> None:
    """Replace the generic rule's fix of every inferred generic finding by its category's fix, where there is one,
    keeping the rule's environment variables."""
    if not catalogue.category_fixes:
        return
    for f in findings:
        rule = catalogue.by_code(f.rule)
        if rule is None or rule.tier != "generic" or f.basis != "inferred" or f.fix != rule.fix:
            continue
        fix = catalogue.category_fixes.get(f.category)
        if fix is not None:
            f.fix = copy.deepcopy(fix)
            f.fix.env = copy.deepcopy(rule.fix.env)
