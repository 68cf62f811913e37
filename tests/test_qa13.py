"""QA round 13 (docs/qa-report-13.md): a Megatron FSDP user with the real H200 logs (sample_logs/ holds the same
bytes as the captures), then the newest dev answers.

Each test failed on the tree before its fix. Output tests run the real command line (tests/cli_run.py)."""

from __future__ import annotations

from tests.cli_run import ROOT, run

B042 = str(ROOT / "sample_logs" / "b042_first_iter_oom.log")


def test_a_list_value_of_the_config_is_spelt_out_not_shown_as_empty() -> None:
    """b042_first_iter_oom.log's Configuration Summary says "recompute_modules: ['core_attn']". analyze -v and the
    markdown report printed "model.recompute_modules: []  (log:70)": an empty list, which in megatron-core means
    selective recompute recomputes nothing. A list (or mapping) must be shown with its items; an empty one stays []."""
    verbose = run("analyze", "-v", "--color", "never", "--no-progress", B042).stdout
    markdown = run("analyze", "--format", "markdown", "--no-progress", B042).stdout
    for text in (verbose, markdown):
        line = next(ln for ln in text.splitlines() if "model.recompute_modules:" in ln)
        assert "core_attn" in line, line
        empty = next(ln for ln in text.splitlines() if "model.cuda_graph_scope:" in ln)
        assert "[]" in empty, empty
