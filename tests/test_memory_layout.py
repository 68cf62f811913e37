"""``pipeline_model_parallel_layout``: the safe parser, megatron-core's validation rules, and the per-stage memory
that follows the layout (decoder layers, MTP, embedding / loss stages, virtual stages), up to ``diagnose check``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import config_view

from diagnose.explain.memory.activations import Workload, activation_bytes, in_flight, layer_kept_bytes
from diagnose.explain.memory.from_config import pipeline_layout_problem, shape_from_config, workload_from_config
from diagnose.explain.memory.options import Scenario, evaluate, valid_splits
from diagnose.explain.memory.plan import memory_plan
from diagnose.explain.memory.pp_layout import (
    MAX_EXPANDED,
    LayoutError,
    describe,
    layout_problems,
    parse_layout,
    rank_chunks,
    rank_layer_ids,
)
from diagnose.explain.memory.shape import ModelShape, layer_params, mtp_params, stage_counts
from diagnose.explain.memory.state import Layout

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
LLAMA = ModelShape(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                   ffn_hidden_size=14336, vocab_size=128256, gated_linear_unit=True, add_bias_linear=False,
                   layernorm=False, position_embedding="rope")
# the layout string of Megatron-LM's docs/source/api-guide (custom pipeline model parallel layout): DeepSeek-V3,
# 61 decoder layers + 1 MTP layer at PP=16 VPP=2
DSV3_DOC = "Et*3|(tt|)*29,m|L"


# ------------------------------------------------------------------------------------------------ parsing

def test_upstream_docstring_example():
    # megatron-core PipelineParallelLayerLayout.parse_str_to_list: 'Example: "Ettt|(tt|)*29,m|L" will be parsed
    # to [["E","t","t","t"]]+[["t","t"]]*29+[["m"],["L"]]'
    expected = [["E", "t", "t", "t"]] + [["t", "t"]] * 29 + [["m"], ["L"]]
    assert [list(s) for s in parse_layout("Ettt|(tt|)*29,m|L")] == expected
    assert parse_layout(DSV3_DOC) == parse_layout("Ettt|(tt|)*29,m|L")


# parse_str_to_list's comments, written with letters; mapped here onto layer symbols (x y a b c d e f p q ->
# E t t m L E t m t L) so the expansions can be checked character for character
_UPSTREAM_COMMENTS = [
    ("xy(ab|cd|ef)*2,pq", "xyab|cd|efab|cd|efpq"),
    ("(ab)*3", "ababab"),
    ("ab,(cd|)*2", "abcd|cd|"),
    ("(|ab)*2,cd", "|ab|abcd"),
]


@pytest.mark.parametrize("text, expanded", _UPSTREAM_COMMENTS)
def test_upstream_expansion_comments(text, expanded):
    table = str.maketrans("xyabcdefpq", "EttmLEtmtL")
    assert parse_layout(text.translate(table)) == tuple(expanded.translate(table).split("|"))


def test_single_symbol_repetition_includes_the_stage_separator():
    assert parse_layout("Et*2|*2tL") == ("Ett", "", "tL")  # '|*2' is two separators, as upstream's (.)\*(\d+)
    assert parse_layout("t*0E|L") == ("E", "L")


def test_list_of_layer_names_as_bridge_recipes_write_it():
    # Bridge's DeepSeek-V3 recipe, (PP, VPP) = (4, 1), with mtp_num_layers=1
    last = ["mtp", "loss"]
    layout = [["embedding"] + ["decoder"] * 16, ["decoder"] * 16, ["decoder"] * 16, ["decoder"] * 13 + last]
    stages = parse_layout(layout)
    assert [s.count("t") for s in stages] == [16, 16, 16, 13]
    assert parse_layout([[" Embedding ", "DECODER"], ["loss"]]) == ("Et", "L")  # stripped, any case
    # the same list written out as text (a config dump), read without evaluating it
    assert parse_layout(str(layout)) == stages


@pytest.mark.parametrize("value, words", [
    ("t*99999999999999999999", "larger than"),
    ("t*10001", "larger than"),
    ("(" * 500 + "t" + ")*2" * 500, "nested parentheses"),
    ("(t*10000|)*10000", f"more than {MAX_EXPANDED}"),
    ("E" + "t" * 5000 + "L", "characters"),
    ("Ex|L", "unknown layer symbol 'x'"),
    ("E\x1b[2J|L", "unknown layer symbol '\\x1b'"),
    ("__import__('os').system('true')", "unknown layer symbol"),
    ("(tt)", "must be followed by '*n'"),
    ("()*3", "empty group"),
    ("t*", "whole number"),
    ("t*2*3", "cannot be repeated"),
    ("(tt", "without a matching ')'"),
    ("tt)", "without a matching '('"),
    ("E t|L", "unknown layer symbol ' '"),
    ("t*٣", "whole number"),  # a non-ASCII digit
    ([["embedding", "encoder"]], "encoder"),
    ([["embedding", 3]], "not a layer name"),
    (["Et", "L"], "not a list"),
    ("[" * 20000, "list of lists"),
    ("[['decoder'], [['decoder']]]", "list of lists"),
    ("[[decoder]]", "quoted"),
    (42, "string or a list"),
])
def test_bad_layouts_give_one_clear_line_quickly(value, words):
    start = time.perf_counter()
    with pytest.raises(LayoutError) as err:
        parse_layout(value)
    assert time.perf_counter() - start < 0.5
    message = str(err.value)
    assert words in message and "\n" not in message and "\x1b" not in message
    assert message.startswith("pipeline_model_parallel_layout")


def test_caps_are_limits_not_guesses():
    assert len(parse_layout("E|" + "(t|)*9999" + ",L")) == 10001  # under every cap: accepted
    big = "E" + "(t*10000)*10" + "L"  # 100,000 layers + E + L: just over the expansion cap
    with pytest.raises(LayoutError, match="more than"):
        parse_layout(big)


def test_agrees_with_megatron_core_where_installed():
    mod = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    upstream = mod.PipelineParallelLayerLayout
    names = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
    for text in [DSV3_DOC, "Ettt|(tt|)*29,m|L", "E|(t|)*4,L", "Et*8|t*8|t*12|t*4L", "(Et|)*1t|tL", "Et|*2tL"]:
        theirs = tuple("".join(names[x.name] for x in row) for row in upstream.parse_str_to_list(text))
        assert parse_layout(text) == theirs, text
    # validation: accept / refuse the same layouts (upstream asserts)
    cases = [(DSV3_DOC, 16, 61, 1), ("Et*3|(tt|)*29,m|L", 8, 61, 1), ("Et*3|(tt|)*29,m|L", 16, 60, 1),
             ("Et*3|(tt|)*29,m|L", 16, 61, None), ("tE|tL", 2, 2, None), ("Et|tLL", 2, 2, None),
             ("Et|mt|L|t", 2, 3, 1), ("Em|t|t|L", 2, 2, 1), ("Et|t|t|mL", 2, 3, 1), ("Et|tL", 2, 2, None)]
    for text, pp, layers, mtp in cases:
        try:
            upstream(text, pp).validate_layer_layout(layers, mtp)
            accepted = True
        except (AssertionError, IndexError):
            accepted = False
        ours = not layout_problems(parse_layout(text), pp, layers, mtp or 0)
        assert ours == accepted, (text, pp, layers, mtp)


# ------------------------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("text, pp, layers, mtp, vpp, words", [
    ("Et*3|(tt|)*29,m|L", 5, 61, 1, None, "32 stages are not divisible by pipeline_model_parallel_size=5"),
    ("Et*3|(tt|)*29,m|L", 16, 61, 1, 4, "conflicts"),
    ("tE|tL", 2, 2, 0, None, "first layer must be the embedding"),
    ("Et|tLt", 2, 3, 0, None, "last layer must be the loss"),
    ("EEt|tL", 2, 2, 0, None, "exactly once"),
    ("Et|tL", 2, 3, 0, None, "2 decoder layers (t) in the layout, but num_layers=3"),
    ("Et|tL", 2, 2, 1, None, "0 MTP layers (m) in the layout, but mtp_num_layers=1"),
    ("Et|mt|L|t", 2, 3, 1, None, "before the MTP layers"),
    ("Et|tm|t|L", 2, 3, 1, None, "last virtual stage of their rank"),
    ("Et|t|tm|mL", 2, 3, 2, None, "one virtual stage"),
    ("", 1, 1, 0, None, "no layers"),
])
def test_validation_mirrors_megatron_core(text, pp, layers, mtp, vpp, words):
    problems = layout_problems(parse_layout(text), pp, layers, mtp, vpp)
    assert any(words in p for p in problems), problems


def test_valid_layouts_have_no_problems():
    assert layout_problems(parse_layout(DSV3_DOC), 16, 61, 1) == []
    assert layout_problems(parse_layout(DSV3_DOC), 16, 61, 1, vpp=2) == []
    assert layout_problems(parse_layout("Et*4|t*4L"), 2, 8, 0, vpp=1) == []


# ------------------------------------------------------------------------------------------------ stages

def test_deepseek_v3_layout_per_rank_by_hand():
    stages = parse_layout(DSV3_DOC)
    assert len(stages) == 32  # PP=16 x VPP=2
    # stage k is virtual chunk k // 16 of rank k % 16: rank 0 = stage 0 'Ettt' + stage 16 'tt'; rank 14 = stage 14
    # 'tt' + stage 30 'm'; rank 15 = stage 15 'tt' + stage 31 'L'
    chunks = rank_chunks(stages, 16)
    assert chunks[0] == ["Ettt", "tt"] and chunks[14] == ["tt", "m"] and chunks[15] == ["tt", "L"]
    shape = replace(ModelShape(num_layers=61, hidden_size=1024, num_attention_heads=8, mtp_num_layers=1),
                    pipeline_layout=stages)
    assert shape.stage_layers(16) == [5] + [4] * 13 + [2, 2]
    assert sum(shape.stage_layers(16)) == 61
    assert shape.stage_mtp_layers(16) == [0] * 14 + [1, 0]
    assert shape.layout_vpp(16) == 2
    # layer ids follow the virtual order: stage 0 holds layers 0-2, stage k >= 1 layers 2k+1, 2k+2
    ids = rank_layer_ids(stages, 16)
    assert ids[0] == [0, 1, 2, 33, 34] and ids[1] == [3, 4, 35, 36] and ids[15] == [31, 32]
    assert sorted(i for r in ids for i in r) == list(range(61))
    assert describe(stages, 16) == "rank 0: 3+2; ranks 1-13: 2+2; ranks 14-15: 2+0"


def test_a_layout_equal_to_the_even_split_changes_nothing():
    even = replace(LLAMA, pipeline_layout=parse_layout("Et*8|t*8|t*8|t*8L"))
    assert stage_counts(even, tp=2, pp=4) == stage_counts(LLAMA, tp=2, pp=4)
    work = Workload(micro_batch_size=1, seq_length=4096, num_microbatches=16)
    for i in range(4):
        assert activation_bytes(even, work, pp=4, stage=i) == activation_bytes(LLAMA, work, pp=4, stage=i)


def test_more_layers_on_one_stage_make_it_the_peak_by_exactly_those_layers():
    even = replace(LLAMA, pipeline_layout=parse_layout("Et*8|t*8|t*8|t*8L"))
    heavy = replace(LLAMA, pipeline_layout=parse_layout("Et*8|t*8|t*12|t*4L"))
    layout = Layout(strategy="ddp", gpus=4, pp=4, grad_bytes=4)  # 18 bytes / parameter
    work = Workload(micro_batch_size=1, seq_length=4096, num_microbatches=16)
    before = evaluate(Scenario(even, layout, work, 140 * GIB), "x", [], layout, work, "", 0.0)
    after = evaluate(Scenario(heavy, layout, work, 140 * GIB), "x", [], layout, work, "", 0.0)
    assert before.stage == 0  # evenly split, the embedding stage with 4 micro batches in flight peaks
    assert after.stage == 2 and after.peak == max(after.stage_peaks)
    # stage 2 gains 4 layers: 18 bytes for each of their parameters, and their activations for the 2 micro
    # batches stage 2 of 4 holds in flight
    params = 4 * layer_params(LLAMA, moe=False)[0]
    acts = 4 * layer_kept_bytes(LLAMA, work, 4096) * in_flight(work, 4, 2)
    assert after.stage_peaks[2] - before.stage_peaks[2] == pytest.approx(18 * params + acts, abs=2)
    # the first two stages are untouched
    assert after.stage_peaks[:2] == before.stage_peaks[:2]


def test_standalone_mtp_rank_holds_the_mtp_block_and_a_word_embedding():
    shape = ModelShape(num_layers=6, hidden_size=1024, num_attention_heads=8, mtp_num_layers=1,
                       vocab_size=32000, position_embedding="rope")
    placed = replace(shape, pipeline_layout=parse_layout("Et*2|t*2|t*2m|L"))
    counts = stage_counts(placed, pp=4)
    word = shape.padded_vocab(1) * shape.hidden_size
    md, me = mtp_params(shape)
    layer = layer_params(shape, moe=False)[0]
    assert counts[2].total - counts[1].total == md + me + word
    assert counts[2].details["mtp_layers"] == 1 and counts[3].details["mtp_layers"] == 0
    assert counts[3].total == word + shape.hidden_size * 2  # output layer copy + final norm, no layers
    assert counts[1].total == 2 * layer
    # activations: the MTP layer's on rank 2; the logits (main + MTP) stay on the last rank
    work = Workload(micro_batch_size=1, seq_length=1024, num_microbatches=8)
    assert activation_bytes(placed, work, pp=4, stage=2) > activation_bytes(placed, work, pp=4, stage=1)


def test_virtual_stages_from_the_layout_set_the_in_flight_micro_batches():
    stages = parse_layout("Et*2|t*2|t*2|t*2L")  # PP=2 -> VPP=2
    shape = replace(LLAMA, num_layers=8, pipeline_layout=stages)
    work = Workload(micro_batch_size=1, seq_length=4096, num_microbatches=16)
    assert shape.layout_vpp(2) == 2
    assert activation_bytes(shape, work, pp=2, stage=1) == activation_bytes(
        replace(shape, pipeline_layout=None), replace(work, virtual_pp=2), pp=2, stage=1)


def test_split_search_keeps_pipeline_sizes_the_layout_accepts():
    shape = replace(ModelShape(num_layers=61, hidden_size=1024, num_attention_heads=8, mtp_num_layers=1),
                    pipeline_layout=parse_layout(DSV3_DOC))
    # 32 stages: PP 1, 2, 4, 8, 16 or 32 divide them. The MTP layer is stage 30: at PP=1 chunk 30 of 32 (not the
    # rank's last: refused; PP=1 with several stages is not proposed anyway); at PP=2 chunk 15 of 16 on rank 0
    # (its last chunk: allowed)
    assert [p for p in range(1, 33) if shape.pipeline_split_ok(p)] == [2, 4, 8, 16, 32]
    layout = Layout(strategy="distributed_optimizer", gpus=128, pp=16, grad_bytes=4)
    pps = {p for _, p in valid_splits(Scenario(shape, layout, Workload(), 140 * GIB))}
    assert pps <= {2, 4, 8, 16} and 16 in pps
    assert replace(shape, pipeline_layout=("EtL",), num_layers=1, mtp_num_layers=0).pipeline_split_ok(1)


# ------------------------------------------------------------------------------------------------ config / check

_view = config_view


CONFIG = {
    "model.num_layers": 32, "model.hidden_size": 4096, "model.num_attention_heads": 32,
    "model.num_query_groups": 8, "model.ffn_hidden_size": 14336, "model.vocab_size": 128256,
    "model.seq_length": 4096, "model.gated_linear_unit": True, "model.normalization": "RMSNorm",
    "model.position_embedding_type": "rope", "model.pipeline_model_parallel_size": 4,
    "model.pipeline_model_parallel_layout": "Et*4|t*8|t*16|t*4L",
    "ddp.use_distributed_optimizer": True, "train.micro_batch_size": 1, "train.global_batch_size": 128,
}


def test_config_layout_reaches_the_plan():
    view = _view(CONFIG)
    shape = shape_from_config(view)
    assert shape.stage_layers(4) == [4, 8, 16, 4]
    assert pipeline_layout_problem(view, shape) is None
    plan = memory_plan(view, 32, 140 * GIB)
    assert plan.given.worst_stage == 2
    assert any("peak is on stage 2" in n for n in plan.notes)
    assert any("ranks" in n or "rank 0: 4" in n for n in plan.notes if "layout" in n)


def test_config_list_layout_and_implied_vpp():
    rows = [["embedding"] + ["decoder"] * 4] + [["decoder"] * 4] * 6 + [["decoder"] * 4 + ["loss"]]  # 8 stages
    view = _view({**CONFIG, "model.pipeline_model_parallel_layout": rows})
    shape = shape_from_config(view)
    assert shape.layout_vpp(4) == 2 and sum(shape.stage_layers(4)) == 32
    layout = Layout(strategy="distributed_optimizer", gpus=32, pp=4, grad_bytes=4)
    assert workload_from_config(view, shape, layout).virtual_pp == 2


def test_config_layout_megatron_refuses_is_named_and_not_modelled():
    view = _view({**CONFIG, "model.pipeline_model_parallel_layout": "Et*4|t*8|t*16|t*5L"})
    shape = shape_from_config(view)
    assert shape.pipeline_layout is None and shape.stage_layers(4) == [8, 8, 8, 8]
    problem = pipeline_layout_problem(view, shape)
    assert "33 decoder layers (t) in the layout, but num_layers=32" in problem
    plan = memory_plan(view, 32, 140 * GIB)
    assert any("would refuse it" in n for n in plan.notes)


def _yaml(tmp_path: Path, values: dict) -> Path:
    sections: dict[str, list[str]] = {}
    for k, v in values.items():
        top, name = k.split(".", 1)
        sections.setdefault(top, []).append(f"  {name}: {json.dumps(v)}")
    cfg = tmp_path / "layout.yaml"
    cfg.write_text("".join(f"{top}:\n" + "\n".join(lines) + "\n" for top, lines in sections.items()))
    return cfg


def test_diagnose_check_reports_the_layouts_worst_stage(tmp_path):
    out = subprocess.run([sys.executable, "-m", "diagnose", "check", str(_yaml(tmp_path, CONFIG)), "--gpus", "32",
                          "--gpu", "h200"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr and out.returncode in (0, 1)
    text = " ".join(out.stdout.split())
    assert "peak is on stage 2 of 0..3 (a middle stage)" in text
    assert "decoder layers per pipeline rank" in text


def test_diagnose_check_with_a_hostile_layout_does_not_crash(tmp_path):
    values = {**CONFIG, "model.pipeline_model_parallel_layout": "(t*9999)*9999\x1b[31m"}
    out = subprocess.run([sys.executable, "-m", "diagnose", "check", str(_yaml(tmp_path, values)), "--gpus", "32",
                          "--gpu", "h200", "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr and out.returncode in (0, 1, 2)
    assert "\x1b[31m" not in out.stdout
