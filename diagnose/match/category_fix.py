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
        if (rule is None or rule.code not in catalogue.category_fix_rules or rule.tier != "generic"
                or f.basis != "inferred" or f.fix != rule.fix):
            continue
        fix = catalogue.category_fixes.get(f.category)
        if fix is not None:
            f.fix = copy.deepcopy(fix)
            f.fix.env = copy.deepcopy(rule.fix.env)
