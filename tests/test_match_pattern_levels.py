"""A pattern's own levels_any: one rule reads the same message with the level word in the text (logging's
" - ERROR - ") and, by other patterns, with the level in a prefix the normaliser took off (loguru "| ERROR |")."""

from __future__ import annotations

import os
import tempfile

from diagnose.pipeline import AnalyzeOptions, analyze


def _findings(text: str):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "job.log")
        with open(path, "w") as fh:
            fh.write(text + "\n")
        return analyze([path], AnalyzeOptions(replay=False)).findings


def test_level_in_the_prefix_matches_at_error_only():
    line = "2025-03-01 10:00:01.456 | {lvl:<8} | train:main:41 - Invalid value for optimizer.lr_scheduler: cosin"
    assert "PY030" in [f.rule for f in _findings(line.format(lvl="ERROR"))]
    assert "PY030" not in [f.rule for f in _findings(line.format(lvl="INFO"))]


def test_level_word_in_the_text_needs_no_prefix_level():
    found = _findings("2025-03-01 10:00:01,456 - trainer - ERROR - Config error: train.micro_batch_size must be set")
    assert [f.rule for f in found if f.role == "root"] == ["PY030"]
