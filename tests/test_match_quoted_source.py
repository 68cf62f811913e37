"""qa-report-7 L4: a rule never takes a traceback's quoted source line when the exception line below it says the same.

Python quotes the code of each frame under it: ``raise RuntimeError(f"Missing key in checkpoint state_dict:
{fqn}.")``. A pattern written for the message matches that code too, and the finding's evidence became the code
(``{fqn}``) instead of the message with the key (``dataloader.dp_rank_8.``)."""

from __future__ import annotations

from conftest import make_catalogue, make_rule

from diagnose.match import match_text

PLANNER = "/app/.venv/lib/python3.10/site-packages/torch/distributed/checkpoint/default_planner.py"
RAISE = '    raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")'


def _traceback(rank: int, *, message: bool = True, carets: bool = False) -> list[str]:
    lines = ["Traceback (most recent call last):", f'  File "{PLANNER}", line 233, in create_local_plan',
             "    return create_default_local_load_plan(",
             f'  File "{PLANNER}", line 354, in create_default_local_load_plan', RAISE]
    if carets:
        lines.append("    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^")
    if message:
        lines.append(f"RuntimeError: Missing key in checkpoint state_dict: dataloader.dp_rank_{rank}.")
    return [f"[rank{rank}]: {line}" for line in lines]


def test_the_evidence_is_the_exception_line_not_the_quoted_source(builtin_catalogue):
    text = "\n".join(_traceback(8) + _traceback(11, carets=True)) + "\n"
    report = match_text(text, builtin_catalogue)
    assert report.root.rule == "CK009"
    ck = [f for f in report.findings if f.rule == "CK009"]
    assert len(ck) == 1  # one finding: the quoted line is no second group
    assert all("dataloader.dp_rank_" in e.text and "{fqn}" not in e.text for e in ck[0].evidence)


def test_a_quoted_line_that_nothing_below_repeats_still_matches():
    # an assertion with no message: the quoted code is all the log says, so a rule written for it keeps it
    rule = make_rule("T1", "assert args.num_layers", r"assert args\.num_layers % \w+", category="config_validation")
    text = "\n".join(["Traceback (most recent call last):", '  File "/w/megatron/training/arguments.py", line 9, in f',
                      "    assert args.num_layers % args.pipeline_model_parallel_size == 0", "AssertionError"]) + "\n"
    report = match_text(text, make_catalogue(rule))
    assert report.root is not None and report.root.rule == "T1"
    # and the same for a rule whose message the exception line does not repeat (a traceback cut short)
    cut = "\n".join(_traceback(3, message=False)) + "\n"
    missing = make_rule("CK1", "Missing key in checkpoint", r"Missing key in checkpoint state_dict", category="other")
    assert match_text(cut, make_catalogue(missing)).root.rule == "CK1"
