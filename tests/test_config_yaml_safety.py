"""Hostile YAML is loaded inert or refused with a one-line DiagnoseError; nothing named in it is executed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diagnose.explain.config import load_config
from diagnose.explain.config.safe_yaml import safe_load
from diagnose.model import DiagnoseError

DATA = Path(__file__).parent / "data" / "configs"
PWNED = "/tmp/diagnose_yaml_pwned_dir"


def test_python_object_tags_are_loaded_as_plain_data_and_not_executed():
    if os.path.exists(PWNED):
        os.rmdir(PWNED)
    data = safe_load((DATA / "hostile_python_tag.yaml").read_text())
    assert not os.path.exists(PWNED)
    assert data["model"]["num_layers"] == [PWNED]  # the argument list, as data
    assert data["ddp"]["use_megatron_fsdp"] == "true"  # unknown tag: the scalar, untyped
    # as a config, the tag Bridge's loader would refuse is named (qa-report-12 L6), still without running anything
    with pytest.raises(DiagnoseError, match=r"model\.num_layers: YAML tag '!!python/object/apply:os\.mkdir'"):
        load_config(str(DATA / "hostile_python_tag.yaml"))
    assert not os.path.exists(PWNED)


def test_billion_laughs_is_refused():
    with pytest.raises(DiagnoseError, match="alias"):
        load_config(str(DATA / "billion_laughs.yaml"))


def test_self_referencing_and_oversized_documents_are_refused():
    with pytest.raises(DiagnoseError):
        safe_load("a: &a [*a]")
    with pytest.raises(DiagnoseError, match="larger than"):
        safe_load("a: " + "x" * (17 * 1024 * 1024))


def test_target_keys_are_never_imported(tmp_path):
    p = tmp_path / "cfg.yaml"
    p.write_text("model:\n  _target_: os.system\n  num_layers: 2\ncheckpoint:\n  _target_: subprocess.Popen\n")
    view = load_config(str(p))
    assert view.get("model.num_layers") == 2
    assert "model._target_" not in view.values


def _refused_without_a_pure_pass(monkeypatch, last_rows: list[str]) -> str:
    """The error a 20,000-row document ending in ``last_rows`` gets, with the pure-Python parser made to fail if run."""
    from diagnose.explain.config import safe_yaml

    if safe_yaml.InertCSafeLoader is None:
        pytest.skip("PyYAML without libyaml: the pure-Python parser is the only one")

    class NoPurePass:
        def __init__(self, *_a: object) -> None:
            raise AssertionError("the pure-Python parser ran")

    monkeypatch.setattr(safe_yaml, "InertSafeLoader", NoPurePass)
    rows = [f"key_{i}: value_{i}" for i in range(20000)]
    text = "\n".join(rows + last_rows) + "\n"
    assert len(text) > safe_yaml.PURE_WORDING_MAX_BYTES
    with pytest.raises(DiagnoseError) as err:
        safe_load(text, "big.yaml")
    return str(err.value)


def test_a_large_document_with_a_syntax_error_is_refused_on_libyaml_words_without_a_second_parse(monkeypatch):
    # qa-report-6: a 10 MB config with an error on its last line took 14 s, because the pure-Python parser was run
    # again only to word the error; above PURE_WORDING_MAX_BYTES libyaml's own words (and line) are the message
    message = _refused_without_a_pure_pass(monkeypatch, ["bad: [unclosed", "x: 1"])
    assert message.startswith("big.yaml is not valid YAML at line 20002: ") and "\n" not in message


def test_a_large_document_with_an_undefined_alias_is_refused_on_libyaml_words_too(monkeypatch):
    # the same bound for an error libyaml's composer finds after its events parsed (an alias to no anchor)
    message = _refused_without_a_pure_pass(monkeypatch, ["x: *nowhere"])
    assert message.startswith("big.yaml is not valid YAML at line 20001: ")
