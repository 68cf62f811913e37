"""``diagnose rules list`` and ``rules show``: what a user reads, log text made inert."""

from __future__ import annotations

import dataclasses
import json

from diagnose.match.rules import Context, Pattern, load_catalogue
from diagnose.present.cli import main
from diagnose.present.commands.rules import CONTEXT_MEANING, PATTERN_MEANING


def test_list_text(capsys):
    assert main(["rules", "list"]) == 0
    out = capsys.readouterr().out
    for code in ("PY001", "MB101", "OOM102", "SL003", "NC010"):
        assert code in out
    assert "rules" in out.splitlines()[-1]


def test_list_json(capsys):
    assert main(["rules", "list", "--format", "json"]) == 0
    rules = json.loads(capsys.readouterr().out)
    assert len(rules) >= 60
    mb101 = next(r for r in rules if r["code"] == "MB101")
    assert mb101 == {
        "code": "MB101", "slug": "fsdp2-pg-collection-typeerror", "title": mb101["title"], "category": "fsdp_config",
        "phase": "dp_wrap", "severity": "error", "role": "root", "confidence": mb101["confidence"], "fix_safety": "unsafe",
        "versions": mb101["versions"], "source": "30_megatron_fsdp.toml",
    }


def test_show_doc_page(capsys):
    assert main(["rules", "show", "mb101"]) == 0
    out = capsys.readouterr().out
    assert "MB101" in out and "Torch FSDP2 wrap fails" in out
    for section in ("In short", "Details", "Fix", "Patterns", "Examples that match", "Examples that must not match"):
        assert section in out
    assert "dist.use_torch_fsdp2=false" in out and "ddp.use_megatron_fsdp=true" in out
    assert "safety: unsafe" in out
    assert "pg_collection" in out


def test_show_unknown_code_is_one_line_usage_error(capsys):
    assert main(["rules", "show", "ZZ999"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ZZ999" in err[0]


def test_show_makes_example_log_text_inert(tmp_path, capsys):
    (tmp_path / "50_mine.toml").write_text(
        '[[rule]]\ncode = "US002"\nslug = "escape-demo"\ntitle = "Escape demo"\ncategory = "other"\n'
        'patterns = [ { anchor = "BoomError", regex = "BoomError" } ]\nexplanation = "x"\n'
        '[rule.fix]\nsummary = "y"\n'
        '[rule.examples]\nmatch = ["\\u001b[31mBoomError\\u001b]0;pwned\\u0007"]\nno_match = ["calm"]\n',
        encoding="utf-8",
    )
    assert main(["rules", "show", "US002", "--rules", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[31mBoomError" in out


def test_show_a_slurm_job_rule(capsys):
    """Slurm's own findings (SJ0xx) are catalogue rules too: `rules show SJ006` has a page (issue 17)."""
    assert main(["rules", "show", "SJ006"]) == 0
    out = capsys.readouterr().out
    assert "SJ006" in out and "slurm-nonzero-exit" in out and "75_slurm_job.toml" in out
    assert "Reads" in out and "outcome FAILED" in out and "Patterns" not in out
    assert "JobState=FAILED" in out  # its examples are scontrol records


def _first_rule_setting_each_field(cls, default, values_of) -> dict[str, str]:
    """For every field of ``cls``, the code of the first catalogue rule on which it differs from ``default``."""
    found: dict[str, str] = {}
    for rule in load_catalogue().rules:
        for obj in values_of(rule):
            for f in dataclasses.fields(cls):
                if getattr(obj, f.name) != getattr(default(obj), f.name):
                    found.setdefault(f.name, rule.code)
    return found


def test_show_names_every_context_condition_a_rule_sets(capsys):
    # no hand-kept list: every Context field that some built-in rule sets, shown on that rule's page
    found = _first_rule_setting_each_field(Context, lambda _: Context(), lambda r: [r.context])
    assert len(found) >= 2  # the catalogue uses conditions, or this test would check nothing
    for name, code in found.items():
        assert main(["rules", "show", code]) == 0
        out = capsys.readouterr().out
        assert f"{name} = " in out.split("\nContext\n", 1)[-1], (name, code)


def test_show_names_every_pattern_condition_a_rule_sets(capsys):
    found = _first_rule_setting_each_field(Pattern, lambda p: Pattern(p.anchor, p.regex), lambda r: r.patterns)
    assert {"levels_any", "fault_on"} <= set(found)
    for name, code in found.items():
        assert main(["rules", "show", code]) == 0
        assert f"{name} = " in capsys.readouterr().out, (name, code)


def test_every_condition_has_its_meaning():
    assert set(CONTEXT_MEANING) == {f.name for f in dataclasses.fields(Context)}
    assert set(PATTERN_MEANING) == {f.name for f in dataclasses.fields(Pattern)} - {"anchor", "regex"}


def test_show_the_rule_attributes_that_change_the_reading(capsys):
    assert main(["rules", "show", "HW131"]) == 0
    out = capsys.readouterr().out
    assert "reports = link_failure" in out and "fault_on = other_node" in out
    assert main(["rules", "show", "NC015"]) == 0
    assert "fault_on = own_node" in capsys.readouterr().out
