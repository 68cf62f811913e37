"""``diagnose rules lint``: clean on the built-in catalogue; a user's bad rules give one line each naming the rule."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from diagnose.match.lint import lint, load_for_lint
from diagnose.present.cli import main

GOOD_RULE = """
[[rule]]
code = "{code}"
slug = "{slug}"
title = "My team's data loader crash"
category = "data"
phase = "init"
patterns = [ {{ anchor = "MyLoaderError", regex = '{regex}' }} ]
explanation = "Our loader failed."
[rule.fix]
summary = "Check the shard list"
[rule.examples]
match = ["{match}"]
no_match = ["MyLoader started"]
"""


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _rule(code="US001", slug="my-loader-crash", regex=r"MyLoaderError: (?P<shard>\S+)", match="MyLoaderError: shard-7"):
    return GOOD_RULE.format(code=code, slug=slug, regex=regex, match=match)


def test_builtin_catalogue_is_clean():
    catalogue, problems = load_for_lint()
    result = lint(catalogue, problems)
    assert [str(p) for p in result.problems] == []


def test_cli_lint_builtin_exit_0(capsys):
    assert main(["rules", "lint"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "0 error(s), 0 warning(s)" in captured.err


def test_good_user_rule_is_clean(tmp_path, capsys):
    _write(tmp_path, "50_mine.toml", _rule())
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 0
    assert "1 rules checked: 0 error(s)" in capsys.readouterr().err


def test_schema_error_is_one_line_naming_the_rule(tmp_path, capsys):
    _write(tmp_path, "50_mine.toml", _rule().replace('category = "data"', 'category = "storage"'))
    assert main(["rules", "lint", "--rules", str(tmp_path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert "rule US001" in out[0] and "category 'storage'" in out[0] and "50_mine.toml" in out[0]


def test_invalid_toml_is_one_line(tmp_path, capsys):
    _write(tmp_path, "50_mine.toml", "[[rule]\ncode = ")
    assert main(["rules", "lint", "--rules", str(tmp_path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "invalid TOML" in out[0] and "50_mine.toml" in out[0]


def test_missing_folder_is_a_usage_error(tmp_path, capsys):
    assert main(["rules", "lint", "--rules", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]


def test_duplicate_code_with_builtin(tmp_path, capsys):
    _write(tmp_path, "50_mine.toml", _rule(code="MB101"))
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 1
    out = capsys.readouterr().out
    assert "rule MB101: duplicate code" in out


def test_anchor_missing_from_match(tmp_path, capsys):
    _write(tmp_path, "50_mine.toml", _rule(regex=r"Loader\w*: (?P<shard>\S+)", match="MyLoaderError: shard-7 and LoaderX: s"))
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 1
    out = capsys.readouterr().out
    assert "rule US001: pattern 1: anchor 'MyLoaderError' is not in its match 'LoaderX: s'" in out


def test_example_that_does_not_match(tmp_path, capsys):
    _write(tmp_path, "50_mine.toml", _rule(match="MyLoaderError happened"))
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 1
    out = capsys.readouterr().out
    assert "rule US001: match example 1 is not found (got nothing)" in out


def test_non_re2_regex_is_a_warning_for_user_rules(tmp_path, capsys):
    pytest.importorskip("re2")
    _write(tmp_path, "50_mine.toml", _rule(regex=r"MyLoaderError: (?!skip)(?P<shard>\S+)"))
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("warning: ") and "not RE2-compatible" in out


def test_missing_examples_and_unknown_parser(tmp_path, capsys):
    text = _rule().replace('no_match = ["MyLoader started"]', "").replace('phase = "init"', 'phase = "init"\nparser = "nope"')
    _write(tmp_path, "50_mine.toml", text)
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 1
    out = capsys.readouterr().out
    assert "no 'no_match' example" in out and "parser 'nope'" in out


def test_user_rule_refines_builtin(tmp_path):
    """A user rule matching the same line as a built-in one wins (it comes later in the catalogue)."""
    from diagnose.match import match_text
    from diagnose.match.rules import load_catalogue

    rule = _rule(regex=r"No module named .transformer_engine.", match="ModuleNotFoundError: No module named 'transformer_engine'")
    _write(tmp_path, "50_mine.toml", rule.replace('anchor = "MyLoaderError"', 'anchor = "transformer_engine"'))
    catalogue = load_catalogue([tmp_path])
    found = [f.rule for f in match_text("ModuleNotFoundError: No module named 'transformer_engine'", catalogue, backend="python").findings]
    assert found == ["US001"]


def test_mandatory_literals():
    from diagnose.match.lint import mandatory_literals

    assert mandatory_literals(r"CUDA out of memory\. Tried to allocate (?P<n>[\d.]+ GiB)") == ["CUDA out of memory. Tried to allocate ", " GiB"]
    assert mandatory_literals(r"(?:lm )?loss: (?P<v>nan|inf)") == ["loss: "]
    assert mandatory_literals(r"Killed +(?P<c>.*)") == ["Killed "]
    assert mandatory_literals(r"(?i:error) here") == [" here"]


def test_anchor_in_optional_part_is_a_warning_for_user_rules(tmp_path, capsys):
    _write(tmp_path, "50_mine.toml", _rule(regex=r"(?:MyLoaderError: )?shard (?P<shard>\S+)", match="MyLoaderError: shard s-7"))
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 0
    out = capsys.readouterr().out
    assert "warning:" in out and "anchor 'MyLoaderError' is not provably in every match" in out


def test_a_retired_code_is_never_reused(tmp_path, capsys):
    _write(tmp_path, "50_mine.toml", _rule(code="ZZ001"))
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 1
    assert "rule ZZ001: code is retired" in capsys.readouterr().out


def test_user_codes_outside_the_reserved_range_are_warned(tmp_path, capsys):
    _write(tmp_path, "50_mine.toml", _rule(code="DA900"))
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("warning: ") and "rule DA900" in out[0] and "beginning with U" in out[0]


def test_builtin_rules_may_not_take_user_codes_or_rule_references_that_do_not_exist(tmp_path):
    from diagnose.match import lint as lint_module
    from diagnose.match.rules import Catalogue

    catalogue, _ = load_for_lint()
    nc002 = catalogue.by_code("NC002")
    mb101 = catalogue.by_code("MB101")
    assert nc002 is not None and mb101 is not None
    nc002.during_training = "NC999"
    mb101.code = "U100"
    problems = [str(p) for p in lint_module.lint(Catalogue([nc002, mb101]), run_examples=False).problems]
    assert any("rule NC002: during_training 'NC999' is not a log rule" in p for p in problems)
    assert any("rule U100: codes beginning with U are reserved for users" in p for p in problems)


def test_a_user_slurm_job_rule_is_refused(tmp_path, capsys):
    text = _rule().replace('phase = "init"', 'phase = "init"\ninput = "slurm_job"\nslurm_outcome = "FAILED"')
    text = text.replace("""patterns = [ { anchor = "MyLoaderError", regex = 'MyLoaderError: (?P<shard>\\S+)' } ]\n""", "")
    _write(tmp_path, "50_mine.toml", text)
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 1
    assert "slurm_job rules are built in" in capsys.readouterr().out


def test_implies_must_name_a_check_and_facts_its_patterns_have(tmp_path, capsys):
    text = _rule().replace("[rule.fix]", """[rule.implies]
settings = [ { key = "data.shard", fact = "nope" }, { key = "flat", value = 1 } ]
[rule.fix]""")
    _write(tmp_path, "50_mine.toml", text)
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 1
    out = capsys.readouterr().out
    assert "implies: no 'check'" in out and "fact 'nope'" in out and "key 'flat' is not a config path" in out


def test_an_anchor_inside_a_launchers_line_prefix_is_an_error(tmp_path, capsys):
    _write(tmp_path, "50_mine.toml", _rule(regex=r"\[rank\d+\]: MyLoaderError: (?P<shard>\S+)",
                                           match="[rank3]: MyLoaderError: shard-7").replace(
        'anchor = "MyLoaderError"', 'anchor = "]: "'))
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 1
    assert "anchor ']: ' is in the prefix '[rank0]: ' that every line of some logs carries" in capsys.readouterr().out
