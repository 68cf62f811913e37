"""Two earlier facts a line needs ([rule.context] also_before_any), and a misspelt condition refused.

CK016 reads Megatron's "will start from random" after a restart as lost progress only when a checkpoint was saved
before it: a restart before the first save lost nothing a checkpoint held, and the restart's own cause is the story.
"""

from __future__ import annotations

import pytest
from conftest import analyzed_root, make_catalogue, make_rule

from diagnose.match import match_text
from diagnose.match.rules import load_catalogue

RESTART = "[default] Worker group FAILED. 3/3 attempts left; will restart worker group"
RANDOM = "    will not load any checkpoints and will start from random"
SAVED = "saving checkpoint at iteration     200 to /scratch/run7 in torch_dist format"
STEP = " iteration      200/  5000 | lm loss: 2.41E+00 |"


def test_a_restart_after_a_save_that_starts_from_random_lost_progress(tmp_path):
    root = analyzed_root(tmp_path, "\n".join([STEP, SAVED, RESTART, RANDOM]) + "\n")
    assert (root.rule, root.category) == ("CK016", "checkpoint_io")


def test_a_restart_before_any_save_is_not_lost_progress(tmp_path):
    text = "\n".join([STEP, RESTART, RANDOM]) + "\n"
    codes = {f.rule for f in match_text(text, load_catalogue()).findings}
    assert "CK016" not in codes


def test_both_lists_must_hold_within_the_window():
    catalogue = make_catalogue(make_rule("ZZ930", "boom", r"boom", context={
        "before_any": ["first"], "also_before_any": ["second"], "before_window": 3}))

    def codes(text: str) -> list[str]:
        return [f.rule for f in match_text(text, catalogue).findings]
    assert codes("first\nsecond\nboom\n") == ["ZZ930"]
    assert codes("second\nfirst\nboom\n") == ["ZZ930"]  # order between the two does not matter
    assert codes("first\nboom\n") == []
    assert codes("second\nboom\n") == []
    assert codes("second\nx\nx\nx\nfirst\nboom\n") == []  # "second" is outside the 3-line window


def test_a_misspelt_context_condition_is_refused():
    with pytest.raises(ValueError, match="unknown context condition"):
        make_rule("ZZ931", "boom", r"boom", context={"before_anny": ["first"]})
