"""An exception re-raised with words added to its message (megatron-core's ``build_module``: ``raise type(e)(f"{e}
when instantiating {name}")`` at each level of a model's spec) is one failure, not one finding per traceback
(qa-report-19 L12)."""

from __future__ import annotations

from conftest import analyzed

SPEC = "/opt/megatron-lm/megatron/core/transformer/spec_utils.py"
DISPATCH = "/opt/megatron-lm/megatron/core/transformer/moe/token_dispatcher.py"
CHAIN = "\n[rank0]: During handling of the above exception, another exception occurred:\n\n"


def _traceback(message: str, outer: list[tuple[str, int, str]]) -> str:
    frames = [*outer, (SPEC, 100, "build_module"), (DISPATCH, 1289, "__init__")]
    lines = ["[rank0]: Traceback (most recent call last):"]
    lines += [f'[rank0]:   File "{path}", line {n}, in {fn}' for path, n, fn in frames]
    lines.append(f"[rank0]: AssertionError: {message}")
    return "\n".join(lines) + "\n"


def _chain(levels: list[str]) -> str:
    base = "Flex token dispatcher requires TPxEP > 1"
    parts, msg = [], base
    parts.append(_traceback(msg, []))
    for i, name in enumerate(levels):
        msg = f"{msg} when instantiating {name}"
        parts.append(_traceback(msg, [(SPEC, 104, "build_module")] * (i + 1)))
    return CHAIN.join(parts)


def test_a_chain_of_re_raises_is_one_finding_showing_first_and_last_message(tmp_path):
    report = analyzed(tmp_path, "[rank0]: building model\n" + _chain(["MoELayer", "TransformerLayer", "MambaStack"]))
    asserts = [f for f in report.findings if f.rule == "PY002"]
    assert len(asserts) == 1
    root = asserts[0]
    assert root.role == "root" and root.evidence[0].text.endswith("requires TPxEP > 1")
    assert any(e.text.endswith("when instantiating MambaStack") for e in root.evidence)


def test_two_different_assertions_stay_two_findings(tmp_path):
    text = (_traceback("Flex token dispatcher requires TPxEP > 1", []) + CHAIN
            + _traceback("num_moe_experts must be divisible by expert_model_parallel_size", []))
    report = analyzed(tmp_path, text)
    assert len([f for f in report.findings if f.rule == "PY002"]) == 2


def test_a_short_message_that_prefixes_another_is_not_taken_for_a_re_raise(tmp_path):
    text = _traceback("bad", []) + CHAIN + _traceback("bad shape for the expert weights", [])
    report = analyzed(tmp_path, text)
    assert len([f for f in report.findings if f.rule == "PY002"]) == 2
