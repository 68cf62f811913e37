"""A fix line copied from a report (or the TUI's what-if line) and given back to `--set` means the same value."""

from __future__ import annotations

import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.explain.config.overrides import hydra_quoted, parse_set
from diagnose.explain.render import cli_token
from diagnose.model import Override

texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)


@settings(max_examples=400, deadline=None)
@given(texts)
def test_any_string_value_reads_back_through_set(value: str) -> None:
    word = shlex.split(cli_token(Override("model.name", value)))
    assert len(word) == 1
    assert parse_set(word[0]).value == value


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.booleans(), st.none(), st.integers(-10**12, 10**12), st.sampled_from(["fsdp_dtensor", "a/b.c"])))
def test_typed_values_read_back_as_their_type(value) -> None:
    word = shlex.split(cli_token(Override("ddp.x", value)))[0]
    back = parse_set(word).value
    assert back == value and type(back) is type(value)


def test_hydra_quoting_by_hand() -> None:
    assert hydra_quoted('"a \\"b\\""') == 'a "b"'
    assert hydra_quoted("'it\\'s'") == "it's"
    assert hydra_quoted('"c:\\dir\\\\"') == "c:\\dir\\"  # literal backslash inside, halved run before the end
    assert hydra_quoted('"\\${x}"') == "${x}"  # OmegaConf's escaped interpolation is literal text
    assert hydra_quoted('"a" "b"') is None and hydra_quoted('"a') is None and hydra_quoted("plain") is None
    assert parse_set('model.name="true"').value == "true"  # quoted: a string, not a bool
    assert parse_set("model.name=true").value is True
