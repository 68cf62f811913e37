"""The validator checks a pipeline_model_parallel_layout the way megatron-core does (rule CV054; CV053's VPP part),
with megatron-core's own messages, so replay reproduces the failure from a log and proves dropping the layout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.explain.config import ConfigView, apply_defaults, apply_overrides
from diagnose.explain.validate import validate

ROOT = Path(__file__).resolve().parent.parent
CHECK = "pipeline_layout_invalid"

# (layout, pp, vpp, num_layers, mtp_num_layers, megatron-core's message)
CASES = [
    ("Et|t|t|t|tL", 4, None, 5, 0,
     "pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size (len(layout)=5, "
     "pipeline_model_parallel_size=4)"),
    ("Et*3|t*3|t*3|t*3L", 2, 4, 12, 0,
     "virtual_pipeline_model_parallel_size conflicts with pipeline_model_parallel_layout, "
     "(self.virtual_pipeline_model_parallel_size=4,  detected_vpp_size=2)"),
    ("tEt*2|t*3|t*3|t*3L", 4, None, 12, 0, "The first layer must be embedding, but got LayerType.decoder"),
    ("Et*3|t*3|t*3|t*2Lt", 4, None, 12, 0, "The last layer must be loss, but got LayerType.decoder"),
    ("Et*3|t*3|t*3|t*2L", 4, None, 12, 0, "Number of decoder layers 11must match num_layers 12"),
    ("Et*3|t*3|t*3|t*3L", 4, None, 12, 1, "Number of mtp layers in layout must match mtp_num_layers"),
    ("Et*3|t*2m|t*4|t*3L", 4, None, 12, 1, "decoder layers must be placed before MTP layers"),
    ("Et*6|t*6|m|||L", 2, None, 12, 1, "Currently we restrict that the MTP should be always in the last "),
]
VALID = [("Et*3|t*3|t*3|t*3L", 4, None, 12, 0), ("Et|t|t|t|t|t|t|tL", 4, 2, 8, 0), ("Et*3|t*3|t*3|t*3m|L", 5, None, 12, 1)]


def _view(layout, pp, vpp, layers, mtp, mcore: str | None = "0.16.1") -> ConfigView:
    view = ConfigView(framework="megatron-bridge", version="0.6.2")
    view.mcore_version = mcore
    settings = {"model.num_layers": layers, "model.hidden_size": 1024, "model.num_attention_heads": 16,
                "model.pipeline_model_parallel_size": pp, "model.pipeline_model_parallel_layout": layout,
                "launch.world_size": pp * 8}
    if vpp:
        settings["model.virtual_pipeline_model_parallel_size"] = vpp
    if mtp:
        settings["model.mtp_num_layers"] = mtp
    for key, value in settings.items():
        view.set(key, value, "log:1")
    return apply_defaults(view)


def _layout_violations(view: ConfigView) -> list:
    return [v for v in validate(view, real_mcore=False) if v.check == CHECK]


@pytest.mark.parametrize("layout,pp,vpp,layers,mtp,message", CASES)
def test_megatron_core_messages(layout, pp, vpp, layers, mtp, message):
    found = _layout_violations(_view(layout, pp, vpp, layers, mtp))
    assert [v.message for v in found] == [message]
    assert found[0].fixes == [[found[0].fixes[0][0]]] and found[0].fixes[0][0].value is None  # drop the layout


@pytest.mark.parametrize("layout,pp,vpp,layers,mtp", VALID)
def test_valid_layouts_pass(layout, pp, vpp, layers, mtp):
    assert _layout_violations(_view(layout, pp, vpp, layers, mtp)) == []


def test_dropping_the_layout_is_proven_only_where_the_even_split_works():
    ok = _view("Et*3|t*3|t*3|t*2L", 4, None, 12, 0)
    fixed = apply_overrides(ok, _layout_violations(ok)[0].fixes[0])
    assert validate(fixed, real_mcore=False) == []


def test_a_layout_that_does_not_parse_is_a_violation_not_an_exception():
    found = _layout_violations(_view("Et*99999999999|L", 2, None, 12, 0))
    assert len(found) == 1 and "pipeline_model_parallel_layout" in found[0].message


def test_each_message_is_matched_by_a_rule_that_replay_ties_to_the_check():
    from diagnose.match import match_text
    from diagnose.match.rules import load_catalogue

    catalogue = load_catalogue([])
    for *_, message in CASES:
        rules = {f.rule for f in match_text(f"AssertionError: {message}\n", catalogue).findings}
        assert rules & {"CV053", "CV054"}, message


@pytest.mark.megatron
@pytest.mark.parametrize("layout,pp,vpp,layers,mtp,message", CASES)
def test_real_megatron_core_raises_the_same_message(layout, pp, vpp, layers, mtp, message):
    """The mirror's wording is megatron-core's: build the real TransformerConfig with the same layout."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs = dict(num_layers=layers, hidden_size=1024, num_attention_heads=16, pipeline_model_parallel_size=pp,
                  pipeline_model_parallel_layout=layout, pipeline_dtype=__import__("torch").bfloat16)
    if vpp:
        kwargs["virtual_pipeline_model_parallel_size"] = vpp
    if mtp:
        kwargs["mtp_num_layers"] = mtp
    with pytest.raises((AssertionError, ValueError)) as e:
        TransformerConfig(**kwargs)
    assert str(e.value) == message


def test_analyze_reproduces_a_layout_failure_from_the_log(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(
        "[default0]:------- Task Configuration -------\n"
        "[default0]:_target_: megatron.bridge.training.config.ConfigContainer\n"
        "[default0]:model:\n"
        "[default0]:  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider\n"
        "[default0]:  hidden_size: 1024\n"
        "[default0]:  num_attention_heads: 16\n"
        "[default0]:  num_layers: 12\n"
        "[default0]:  pipeline_model_parallel_layout: Et*3|t*3|t*3|t*2L\n"
        "[default0]:  pipeline_model_parallel_size: 4\n"
        "[default0]:----------------------------------\n"
        "[default0]:Traceback (most recent call last):\n"
        '[default0]:  File "/opt/megatron/core/transformer/pipeline_parallel_layer_layout.py", line 106, in '
        "validate_layer_layout\n"
        "[default0]:AssertionError: Number of decoder layers 11must match num_layers 12\n")
    out = subprocess.run([sys.executable, "-m", "diagnose", "analyze", "--format", "json", str(log)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                                            "DIAGNOSE_EXACT_PARAMS": "0"})
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["findings"][report["root_cause"]]["rule"] == "CV054"
    replay = report["replay"]
    assert replay["reproduced"] is True, replay
    assert replay["proven"] is True
    assert [f["key"] for f in replay["fix"]] == ["model.pipeline_model_parallel_layout"]


def test_mtp_split_layouts_are_not_refused_for_a_newer_or_unknown_megatron_core():
    """After 0.16 megatron-core accepts one loss per MTP layer and MTP layers over consecutive ranks (QA2 #16):
    those conditions are claimed only when the job's megatron-core is known to be 0.16 or older."""
    split = ("Et*3|t*3|t*3|t*3mL|mL|L", 3, None, 12, 2)  # a loss per MTP layer and the main one; MTP on two stages
    assert [v.message for v in _layout_violations(_view(*split, mcore="0.16.1"))] == [
        "Loss must be specified exactly once"]
    assert _layout_violations(_view(*split, mcore=None)) == []
    assert _layout_violations(_view(*split, mcore="0.17.0")) == []
    # what no release accepts is still refused whatever the version
    assert [v.message for v in _layout_violations(_view("Et*3|t*3|t*3|t*2L", 4, None, 12, 0, mcore=None))] == [
        "Number of decoder layers 11must match num_layers 12"]
