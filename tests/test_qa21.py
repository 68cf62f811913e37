"""QA round 21 (docs/qa-report-21.md): the TUI and analyze on big and hostile logs."""

from __future__ import annotations

from types import SimpleNamespace

from rich.text import Text

from diagnose.inert import inert, inert_block
from diagnose.model import Evidence
from diagnose.present.tui.detail import evidence_text


def test_inert_makes_a_file_names_lone_surrogate_visible():
    # os.fsdecode of a name holding the byte 0xff gives U+DCFF; a terminal cannot show it (the TUI driver wrote
    # "\udcff", six cells, where rich had counted one)
    assert inert("job_\udcff.log") == "job_\\udcff.log"
    assert inert_block("a\ud800\nb") == "a\\ud800\nb"
    assert inert("ok é ✓") == "ok é ✓"


def test_tui_evidence_of_a_log_whose_name_has_undecodable_bytes_keeps_every_word():
    f = SimpleNamespace(evidence=[Evidence(path="/tmp/evil_\udcff.log", line=54,
                                           text="torch.OutOfMemoryError: CUDA out of memory.")])
    text = evidence_text(f, {})  # type: ignore[arg-type]
    assert isinstance(text, Text)
    plain = text.plain
    assert "\udcff" not in plain and "evil_\\udcff.log:54" in plain
    assert text.cell_len == len(plain)  # what rich measures is what the terminal gets
    plain.encode("utf-8")  # strict: no surrogate left to be backslash-replaced by the driver
