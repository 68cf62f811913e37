"""QA round 12 (docs/qa-report-12.md): README followed to the letter, and the config side of check and replay.

Each test failed on the tree before its fix. Output tests run the real command line (tests/cli_run.py)."""

from __future__ import annotations

from pathlib import Path

from tests.cli_run import ROOT, run, write


def test_a_config_key_that_is_not_a_field_name_is_refused_not_ignored(tmp_path: Path) -> None:
    """A key under model: holding markup and escape sequences ('[bold]hidden_sise', an OSC title) is no field of
    any config dataclass, so Bridge's loader refuses it. check dropped it and said 'Validation: passes'. It must be
    one line naming the key inertly, exit 2."""
    text = (ROOT / "examples" / "run_config.yaml").read_text(encoding="utf-8")
    text = text.replace("  bf16: true\n", '  bf16: true\n  "\\x1b]0;PWN\\x07[bold]hidden_sise": 4\n')
    proc = run("check", str(write(tmp_path, "run.yaml", text)), "--gpus", "8", code=(2,))
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert "unknown key 'model.\\x1b]0;PWN\\x07[bold]hidden_sise'" in proc.stderr
    assert "\x1b" not in proc.stderr

