"""The one fix renderer (diagnose.explain.render): every form reads back to the value it was given.

Property tests over strings, ints, floats, bools, None and small lists:

* YAML: ``yaml.safe_load`` of the rendered YAML gives the overrides back;
* Bridge CLI: ``shlex.split`` of the token gives one word ``key=...`` whose value part, read by ``hydra_read`` below,
  gives the value back;
* Python: ``ast.literal_eval`` of the right-hand side gives the value back (never eval).

``hydra_read`` implements the rules Bridge's readers apply, as diagnose/explain/render.py documents them:

1. Hydra override grammar: ``[a,b]`` is a list, ``{k:v}`` a dict (``\\x`` in a key stands for ``x``); a quoted element (``"..."`` or ``'...'``) is a string in which a
   run of backslashes before a quote of the same kind is halved (an odd run escapes the quote, an even one lets it
   close) and other backslashes are literal; an unquoted element is ``true``/``false``/``null`` (any case), an
   int, a float (``1e-05``, ``inf``, ``nan``) or else the string itself.
2. OmegaConf, on strings: ``${`` starts an interpolation; a run of backslashes before it is halved and an odd run
   makes the ``${`` literal. A rendered value must never carry a live interpolation.

When hydra-core is installed, the same property is also checked against Hydra's own parser and OmegaConf, applied
the way Bridge's ``parse_hydra_overrides`` does it.
"""

from __future__ import annotations

import ast
import math
import re
import shlex
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnose.explain.config.overrides import normalize_overrides
from diagnose.explain.render import (
    cli_line,
    cli_token,
    env_line,
    hydra_value,
    mlm_flag,
    overrides_yaml,
    python_line,
    render_fix,
)
from diagnose.model import EnvVar, Finding, Fix, Override, Report

TRICKY = ["true", "True", "NULL", "no", "1e3", "-5", ".5", "inf", "nan", "", " ", ": x", "#x", "x: y", "- x",
          "a,b", "[1]", "{a: 1}", "it's", 'say "hi"', "a\\b", "ends\\", '\\"', "${oc.env:HOME}", "\\${x}", "$HOME",
          "`id`", "a;b", "a|b", "*", "~x", "x=y", "line\nbreak", "tab\there", " lead", "trail ", "expandable_segments:True",
          "/ckpt dir/run 1", "ünïcode", "nel\x85", "ls\u2028x", "bom\ufeff", "nul\x00"]

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.sampled_from(TRICKY)
values = scalars | st.lists(scalars, max_size=4)
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same(a: Any, b: Any) -> bool:
    """Equal with the same types (True is not 1), NaN equal to NaN, tuples read back as lists."""
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


# ------------------------------------------------------------------------------------------ a Hydra-like reader

_INT = re.compile(r"[+-]?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[+-]?((\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?|inf|nan)", re.IGNORECASE)


def hydra_read(text: str) -> Any:
    value, end = _element(text, 0)
    assert end == len(text), f"trailing text after the value: {text[end:]!r}"
    return value


def _element(text: str, i: int) -> tuple[Any, int]:
    if text.startswith("[", i):
        items: list[Any] = []
        i += 1
        if text.startswith("]", i):
            return items, i + 1
        while True:
            item, i = _element(text, i)
            items.append(item)
            assert i < len(text), "unclosed list"
            if text[i] == "]":
                return items, i + 1
            assert text[i] == ",", f"expected , or ] at {i} in {text!r}"
            i += 1
    if text.startswith("{", i):
        return _dict(text, i + 1)
    if i < len(text) and text[i] in "'\"":
        return _quoted(text, i)
    end = i
    while end < len(text) and text[end] not in ",]}":
        end += 1
    word = text[i:end]
    assert word and word == word.strip() and not any(c in word for c in "'\"[]{}()=\\$ "), f"bad bare word {word!r}"
    low = word.lower()
    if low in ("true", "false"):
        return low == "true", end
    if low == "null":
        return None, end
    if _INT.fullmatch(word):
        return int(word), end
    if _FLOAT.fullmatch(word):
        return float(word), end
    return word, end


def _dict(text: str, i: int) -> tuple[dict[str, Any], int]:
    """``{key:value,...}``: a key is bare text up to an unescaped ``:``; ``\\x`` stands for ``x``."""
    out: dict[str, Any] = {}
    if text.startswith("}", i):
        return out, i + 1
    while True:
        key: list[str] = []
        while text[i] != ":":
            if text[i] == "\\":
                i += 1
            key.append(text[i])
            i += 1
        out["".join(key)], i = _element(text, i + 1)
        if text[i] == "}":
            return out, i + 1
        assert text[i] == ",", f"expected , or }} at {i} in {text!r}"
        i += 1


def _quoted(text: str, i: int) -> tuple[str, int]:
    quote = text[i]
    out: list[str] = []
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            run = len(text[j:]) - len(text[j:].lstrip("\\"))
            nxt = j + run
            if nxt < len(text) and text[nxt] == quote:
                out.append("\\" * (run // 2))
                if run % 2:  # escaped quote
                    out.append(quote)
                    j = nxt + 1
                    continue
                j = nxt  # the quote closes the string
                continue
            assert nxt < len(text), "backslashes before the end, no closing quote"
            out.append("\\" * run)  # not before a quote: literal
            j = nxt
            continue
        if text[j] == quote:
            return _omegaconf(text[i + 1: j], "".join(out)), j + 1
        out.append(text[j])
        j += 1
    raise AssertionError(f"unclosed quote in {text!r}")


def _omegaconf(raw: str, s: str) -> str:
    """OmegaConf's reading of a string: odd backslash runs before ``${`` make it literal (and are halved)."""
    if "${" not in s:
        return s

    def unescape(m: re.Match[str]) -> str:
        run = len(m.group(1))
        assert run % 2 == 1, f"live interpolation in {raw!r}"
        return "\\" * (run // 2) + "${"

    return re.sub(r"(\\*)\$\{", unescape, s)


def cli_reads_back(key: str, token: str) -> Any:
    words = shlex.split(token)
    assert len(words) == 1, f"{token!r} is {len(words)} shell words"
    k, sep, text = words[0].partition("=")
    assert sep and k == key, words[0]
    return hydra_read(text)


# ------------------------------------------------------------------------------------------ properties


@PROPERTY
@given(st.lists(values, min_size=1, max_size=4))
def test_yaml_reads_back_with_safe_load(vals: list[Any]) -> None:
    overrides = [Override(f"sec{i}.key", v) for i, v in enumerate(vals)]
    data = yaml.safe_load(overrides_yaml(overrides))
    assert list(data) == [f"sec{i}" for i in range(len(vals))]
    for i, v in enumerate(vals):
        assert same(v, data[f"sec{i}"]["key"]), (v, overrides_yaml(overrides))


@PROPERTY
@given(values)
def test_cli_token_is_one_shell_word_that_reads_back(value: Any) -> None:
    token = cli_token(Override("checkpoint.save", value))
    assert same(value, cli_reads_back("checkpoint.save", token)), token


@PROPERTY
@given(values.filter(lambda v: not any(isinstance(x, float) and not math.isfinite(x)
                                       for x in (v if isinstance(v, list) else [v]))))
def test_python_line_literal_evals_back(value: Any) -> None:
    line = python_line(Override("train.tag", value))
    lhs, sep, rhs = line.partition(" = ")
    assert sep and lhs == "cfg.train.tag"
    assert same(value, ast.literal_eval(rhs)), line


@pytest.mark.parametrize("value", ["x y", "it's", "${a.b}", "true", "", "a\\b", ["b c", 1, None], 1e-05, -3])
def test_cli_line_splits_into_one_word_per_override(value: Any) -> None:
    overrides = [Override("a.x", value), Override("b.y", True), Override("c.z", value)]
    words = shlex.split(cli_line(overrides))
    assert len(words) == 3 and words[1] == "b.y=true"
    assert same(value, cli_reads_back("c.z", shlex.quote(words[2])))


@pytest.mark.parametrize("value", [{"a b": 1, "x:y": "q r", "k": [1, None]}, {}, {"n": {"m": "true"}}])
def test_dict_values_read_back(value: dict[str, Any]) -> None:
    assert cli_reads_back("a.b", cli_token(Override("a.b", value))) == value
    assert yaml.safe_load(overrides_yaml([Override("a.b", value)])) == {"a": {"b": value}}
    assert ast.literal_eval(python_line(Override("a.b", value)).partition(" = ")[2]) == value


def test_plain_values_stay_bare_and_typed_lookalikes_are_quoted() -> None:
    assert cli_token(Override("checkpoint.ckpt_format", "fsdp_dtensor")) == "checkpoint.ckpt_format=fsdp_dtensor"
    assert cli_token(Override("ddp.use_megatron_fsdp", True)) == "ddp.use_megatron_fsdp=true"
    assert cli_token(Override("optimizer.lr", 3e-05)) == "optimizer.lr=3e-05"
    assert hydra_value("true") == '"true"' and hydra_value("1e3") == '"1e3"' and hydra_value("") == '""'
    assert hydra_value("expandable_segments:True") == "expandable_segments:True"
    assert cli_token(Override("checkpoint.save", "/ckpt dir")) == "'checkpoint.save=\"/ckpt dir\"'"


def test_a_deletion_is_a_quoted_tilde_word() -> None:
    (delete,) = normalize_overrides(["~checkpoint.save"])
    assert shlex.split(cli_token(delete)) == ["~checkpoint.save"]
    assert cli_token(delete).startswith("'")  # a bare ~word would be tilde-expanded by the shell
    assert python_line(delete) == "cfg.checkpoint.save = None"


@pytest.mark.parametrize("value", ["8", "expandable_segments:True", "a b", "it's", "$(id)", "x\ny", ""])
def test_env_and_mlm_values_are_one_shell_word(value: str) -> None:
    assert shlex.split(env_line("NCCL_DEBUG", value)) == ["export", f"NCCL_DEBUG={value}"]
    assert shlex.split(mlm_flag(Override("checkpoint.save", value))) == ["--save", value]
    assert env_line("NCCL_DEBUG", None) == "unset NCCL_DEBUG"


def test_list_flag_is_one_word_per_item() -> None:
    flag = mlm_flag(Override("model.tensor_model_parallel_size", [1, "a b"]))
    assert shlex.split(flag) == ["--tensor-model-parallel-size", "1", "a b"]


def test_nothing_in_a_value_or_key_can_become_code() -> None:
    hostile = "x\nimport os; os.system('id')"
    fix = [Override("env.NCCL_DEBUG", hostile), Override("launch.world_size", hostile),
           Override("a.b; import os", 1), Override("c.d", hostile)]
    out = render_fix(fix)
    for line in out["python"].splitlines():
        assert line.startswith(("#", "cfg.")), line
    python = [ln for ln in out["python"].splitlines() if not ln.startswith("#")]
    assert python == ["cfg.c.d = " + repr(hostile)]
    assert ast.literal_eval(python[0].partition(" = ")[2]) == hostile
    assert env_line("BAD NAME", "1").startswith("#") and "\n" not in env_line("X\nY", "1")
    assert yaml.safe_load(out["yaml"])["c"] == {"d": hostile}


def test_non_finite_floats() -> None:
    assert python_line(Override("a.b", float("inf"))) == "cfg.a.b = float('inf')"
    assert math.isnan(cli_reads_back("a.b", cli_token(Override("a.b", float("nan")))))
    assert yaml.safe_load(overrides_yaml([Override("a.b", float("-inf"))])) == {"a": {"b": float("-inf")}}


def test_every_presenter_prints_the_same_lines() -> None:
    """Replay's render section, the text report, the markdown report and the TUI tabs: one renderer."""
    from conftest import render_to_string

    from diagnose.present.markdown import render_markdown
    from diagnose.present.tui.fixrender import render_fix as tui_render

    overrides = [Override("checkpoint.save", "/ckpt dir/it's"), Override("model.name", "null"),
                 Override("train.tags", ["a b", 1])]
    finding = Finding(rule="X1", name="x", title="t", category="other", phase="unknown", severity="error",
                      role="root", confidence=0.5, first_line=1,
                      fix=Fix(summary="s", safety="safe", overrides=overrides, env=[EnvVar("NCCL_DEBUG", "INFO x")]))
    report = Report(findings=[finding], root_cause=0)
    replay = render_fix(overrides + [Override("env.NCCL_DEBUG", "INFO x")])
    text = render_to_string(report, width=400)
    markdown = render_markdown(report)
    tui = tui_render(report, finding).forms
    assert tui["cli"] == replay["env"] + "\n" + replay["cli"]
    assert tui["python"] == replay["python"] and tui["yaml"] == replay["yaml"]
    for out in (text, markdown):
        assert replay["cli"] in out and replay["env"] in out
        for line in replay["python"].splitlines()[1:] + replay["yaml"].splitlines()[1:]:
            assert line in out, line


# ------------------------------------------------------------------------------------------ the real parser


@PROPERTY
@given(values)
def test_cli_token_reads_back_through_real_hydra_and_omegaconf(value: Any) -> None:
    """As Bridge applies a CLI override: Hydra's OverridesParser, then OmegaConf, resolved (skipped without hydra)."""
    pytest.importorskip("hydra")
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    (word,) = shlex.split(cli_token(Override("a.b", value)))
    cfg = OmegaConf.create({"a": {"b": None}})
    OmegaConf.set_struct(cfg, True)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=OverridesParser.create().parse_overrides([word]), cfg=cfg)
    assert same(value, OmegaConf.to_container(cfg, resolve=True)["a"]["b"]), word
