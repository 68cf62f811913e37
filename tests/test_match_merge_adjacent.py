"""qa-report-8 L5: one message that a rule reads on two consecutive lines is one finding. torch prints "NCCL error
in: ..., unhandled cuda error" and NCCL's own "ncclUnhandledCudaError: Call to CUDA function failed." under it; PY006
reads both with different patterns (different named groups), and the report listed "NCCL error, caused by the OOM
above" twice, at lines 44 and 45. The merge is match's, for any rule: same rule, adjacent first lines, same
category, phase and number of hits."""

from __future__ import annotations

from diagnose.match import match_text

NCCL = ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled cuda "
        "error, NCCL version 2.14.3")
DETAIL = "ncclUnhandledCudaError: Call to CUDA function failed."


def _py006(text: str, catalogue):
    report = match_text(text, catalogue)
    return [f for f in report.findings if f.rule == "PY006"]


def test_a_message_on_two_lines_is_one_finding(builtin_catalogue):
    found = _py006("\n".join(["step 10", NCCL, DETAIL, "Last error:", "done"]) + "\n", builtin_catalogue)
    assert len(found) == 1
    f = found[0]
    assert f.first_line == 2 and f.count == 1
    assert [e.line for e in f.evidence][:2] == [2, 3]  # both lines of the message stay in view
    assert f.facts.get("nccl_result") == "ncclUnhandledCudaError"  # the second line's facts fill the first's


def test_every_rank_printing_both_lines_is_still_one_finding(builtin_catalogue):
    lines = [f"[rank{r}]: {t}" for r in (0, 1) for t in (NCCL, DETAIL)]
    found = _py006("\n".join(lines) + "\n", builtin_catalogue)
    assert len(found) == 1
    assert found[0].count == 2 and found[0].ranks == [0, 1]


def test_lines_apart_or_printed_a_different_number_of_times_stay_apart(builtin_catalogue):
    apart = _py006("\n".join([NCCL, "something else", DETAIL]) + "\n", builtin_catalogue)
    assert len(apart) == 2
    unpaired = _py006("\n".join([NCCL, DETAIL, "step 11", DETAIL]) + "\n", builtin_catalogue)
    assert len(unpaired) == 2
