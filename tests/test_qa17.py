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


def test_replay_of_a_moved_field_override_shows_the_migration_not_the_refused_key_as_the_fix():
    """README: on Bridge >= 0.7.0 "a config or override setting `dist.use_megatron_fsdp` is flagged
    (`stale_moved_field`) and the migration is proven by replay". `replay examples/run_config.yaml --bridge-version
    0.7.0 --set dist.use_megatron_fsdp=true` printed the refused key itself as the fix ("fix:
    dist.use_megatron_fsdp=true", python `cfg.dist.use_megatron_fsdp = True`) and "no complete fix found", never
    the migration the validator suggests."""
    out = run("replay", "examples/run_config.yaml", "--bridge-version", "0.7.0",
              "--set", "dist.use_megatron_fsdp=true", code=(1,)).stdout
    assert "stale_moved_field" in out
    assert "cfg.dist.use_megatron_fsdp = True" not in out
    assert not re.search(r"^fix: dist\.use_megatron_fsdp=true", out, re.M)
    line = next(x for x in out.splitlines() if x.startswith("instead of dist.use_megatron_fsdp (suggested by the "
                                                              "validator): "))
    assert line.endswith(": ddp.use_megatron_fsdp=true")  # your override is dropped, nothing to delete
    # the migration it names passes as given: replay proves it
    again = run("replay", "examples/run_config.yaml", "--bridge-version", "0.7.0",
                "--set", "ddp.use_megatron_fsdp=true", code=(0, 1)).stdout
    assert "stale_moved_field" not in again
