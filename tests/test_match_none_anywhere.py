"""A line that reports one of two things, read by what the rest of the input says ([rule.context] none_anywhere).

ProcessGroupNCCL prints "Some NCCL operations have failed or timed out" and "To avoid data inconsistency, we are
taking the entire process down" for any exception its work holds. A timeout is always logged before them
("Watchdog caught collective operation timeout: ... before timing out."), an NCCL error is not: with no timeout
wording anywhere in the input the teardown follows a failed collective (NC024, nccl_error); with one, before or
after it (another rank's lines interleave), it stays the timeout's teardown (NC003, nccl_timeout)."""

from __future__ import annotations

from conftest import analyzed_root, make_catalogue, make_rule

from diagnose.match import match_text
from diagnose.match.rules import load_catalogue

FAILED = ("[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the asynchronous nature "
          "of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
DOWN = "[E ProcessGroupNCCL.cpp:460] To avoid data inconsistency, we are taking the entire process down."
TIMEOUT = ("[E ProcessGroupNCCL.cpp:587] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, "
           "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1803170 milliseconds before timing out.")


def test_teardown_without_a_timeout_anywhere_is_an_nccl_error(tmp_path):
    root = analyzed_root(tmp_path, "compiling the model... (takes a ~minute)\n" + FAILED + "\n" + DOWN + "\n")
    assert (root.rule, root.category) == ("NC024", "nccl_error")


def test_teardown_after_a_timeout_stays_the_timeout(tmp_path):
    root = analyzed_root(tmp_path, TIMEOUT + "\n" + FAILED + "\n" + DOWN + "\n")
    assert root.category == "nccl_timeout"


def test_a_timeout_printed_after_the_teardown_counts_too(tmp_path):
    """Ranks interleave: one rank's teardown can come before another's timeout line."""
    text = FAILED + "\n" + DOWN + "\n" + TIMEOUT.replace("[Rank 1]", "[Rank 3]") + "\n"
    codes = {f.rule for f in match_text(text, load_catalogue()).findings}
    assert "NC024" not in codes and "NC003" in codes


def test_none_anywhere_context_for_any_rule():
    catalogue = make_catalogue(
        make_rule("ZZ920", "link lost", r"link lost", category="nccl_timeout"),
        make_rule("ZZ921", "link lost", r"link lost", category="nccl_error", context={"none_anywhere": ["timed out"]}),
    )
    assert [f.rule for f in match_text("start\nlink lost\n", catalogue).findings] == ["ZZ921"]
    assert [f.rule for f in match_text("link lost\nop timed out\n", catalogue).findings] == ["ZZ920"]
    assert [f.rule for f in match_text("op timed out\nlink lost\n", catalogue).findings] == ["ZZ920"]
