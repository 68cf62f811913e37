"""Parsers of log text never raise on any input; YAML input fails only with a one-line DiagnoseError."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.configview import ConfigView
from diagnose.explain.config import parse_set
from diagnose.explain.config.cmdline import parse_command
from diagnose.explain.config.extract import blocks_from_lines, from_blocks, lines_of
from diagnose.explain.config.loglines import parse_ddp_repr, parse_env_line, parse_num_parameters, parse_world_size
from diagnose.explain.config.safe_yaml import safe_load
from diagnose.explain.config.values import parse_scalar
from diagnose.model import DiagnoseError, LogLine

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300)
CONFIGISH = st.lists(
    st.sampled_from([
        "------- Task Configuration -------", "----------------------------------", "model:", "  num_layers: 4",
        "Configuration Summary (Non-Default Values vs Megatron Core)", "=" * 70, "[ddp]:", "  nccl_ub: True",
        "------------------------ arguments ------------------------", "  save ........ /x", "torchrun --nnodes=2",
        "python pretrain_gpt.py --tensor-model-parallel-size", "export CUDA_DEVICE_MAX_CONNECTIONS=1", "a: [b",
        "Setting up DistributedDataParallel with config DistributedDataParallelConfig(a=(", "\\", "&a", "*a",
    ]) | TEXT,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_single_line_parsers_never_raise(text):
    parse_scalar(text)
    view = ConfigView()
    line = LogLine("f", 1, text, text)
    for parse in (parse_env_line, parse_world_size, parse_num_parameters, parse_ddp_repr):
        parse(line, view)
    parse_command(text, "log:1", view)


@settings(max_examples=150, deadline=None)
@given(CONFIGISH)
def test_block_extraction_never_raises_unexpectedly(lines):
    try:
        from_blocks(blocks_from_lines(lines_of("\n".join(lines), "f")))
    except DiagnoseError as e:
        assert "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_yaml_fails_only_with_a_one_line_diagnose_error(text):
    try:
        safe_load(text)
    except DiagnoseError as e:
        assert "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_set_parsing_fails_only_with_diagnose_error(text):
    try:
        o = parse_set(text)
    except DiagnoseError as e:
        assert "\n" not in str(e)
    else:
        assert "." in o.key


def test_uppercase_set_key_is_an_environment_variable():
    o = parse_set("CUDA_DEVICE_MAX_CONNECTIONS=32")
    assert (o.key, o.value) == ("env.CUDA_DEVICE_MAX_CONNECTIONS", "32")
