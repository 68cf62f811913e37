"""Rule files read once are cached by content (issue 15): a hit gives exactly the rules a fresh parse gives, a
damaged or stale entry is a miss, and a file with a broken rule is never cached (its error shows every time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose import toml_cache as rule_cache
from diagnose.match.rules import default_rules_dir, load_catalogue, load_rule_file

RULE = """
[[rule]]
code = "ZZ1"
slug = "zz"
title = "zz"
category = "{category}"
explanation = "x"
patterns = [{{ anchor = "boom", regex = '{regex}' }}]
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DIAGNOSE_NO_CACHE", raising=False)
    return tmp_path / "cache"


def test_a_cached_catalogue_is_the_parsed_catalogue(cache):
    fresh = load_catalogue()
    assert len(list(cache.glob("rules-*.json"))) == len(list(default_rules_dir().glob("*.toml")))
    again = load_catalogue()
    assert again.rules == fresh.rules and not again.errors


def test_a_damaged_entry_is_a_miss(cache, tmp_path):
    f = tmp_path / "r.toml"
    f.write_text(RULE.format(category="cuda_oom", regex="boom (?P<n>\\d+)"))
    first = load_rule_file(f).rules
    (entry,) = cache.glob("rules-*.json")
    entry.write_text("{not json")
    assert load_rule_file(f).rules == first
    entry.write_text("[1, 2]")
    assert load_rule_file(f).rules == first


def test_a_file_with_a_broken_rule_is_never_cached_and_keeps_failing(cache, tmp_path):
    f = tmp_path / "r.toml"
    f.write_text(RULE.format(category="cuda_oom", regex="boom ("))
    for _ in range(2):
        loaded = load_rule_file(f)
        rules, errors = loaded.rules, loaded.errors
        assert not rules and "regex does not compile" in errors[0]
    assert not list(cache.glob("rules-*.json"))


def test_an_edited_file_is_parsed_again(cache, tmp_path):
    f = tmp_path / "r.toml"
    f.write_text(RULE.format(category="cuda_oom", regex="boom"))
    assert load_rule_file(f).rules[0].category == "cuda_oom"
    f.write_text(RULE.format(category="nccl_error", regex="boom"))
    assert load_rule_file(f).rules[0].category == "nccl_error"


def test_no_cache_folder_still_loads(monkeypatch, tmp_path):
    monkeypatch.setenv("DIAGNOSE_NO_CACHE", "1")
    assert rule_cache.get("x") is None
    rule_cache.put("x", {"rule": []})  # no-op
    assert load_catalogue().rules
    assert not Path(tmp_path).joinpath("cache").exists()
