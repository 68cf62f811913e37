"""QA round 17 (helper qa17): a new user following README.md to the letter, from a fresh venv.
Each test failed before its fix."""

from __future__ import annotations

import re
from pathlib import Path

from cli_run import ROOT, run

README = (Path(ROOT) / "README.md").read_text(encoding="utf-8")


def _sections(text: str) -> dict[str, str]:
    """The text report's sections by their upper-case heading (ROOT CAUSE, MEMORY, CONFIG, ...), in order."""
    out: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        m = re.match(r"^([A-Z][A-Z ]+[A-Z])\b", line)
        if m and not line.startswith(" "):
            name = m.group(1)
            out.setdefault(name, "")
        elif name:
            out[name] += line + "\n"
    return out


def test_readme_names_the_section_that_holds_ddp_wrap_ooms_memory_verdict():
    """README said `diagnose analyze sample_logs/ddp_wrap_oom.log` "ends with the memory verdict": the report ends
    with CONFIG and its footer; the verdict is in MEMORY, the section before. The claim must name where it is."""
    m = re.search(r"`diagnose analyze sample_logs/ddp_wrap_oom\.log`\s+(ends with|gives, in its (\w+) section,) the"
                  r"\s+memory verdict \(\"([^\"]+?) \.\.\.\"\)", README)
    assert m, "README no longer describes ddp_wrap_oom.log's memory verdict"
    verdict = " ".join(m.group(3).split())
    sections = _sections(run("analyze", "sample_logs/ddp_wrap_oom.log").stdout)
    named = list(sections)[-1] if m.group(1) == "ends with" else m.group(2)
    assert verdict in " ".join(sections.get(named, "").split()), (named, list(sections))
