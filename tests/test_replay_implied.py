"""Logs that fail before printing their config: replay uses only what the error message states."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.explain.config import apply_defaults
from diagnose.explain.config.implied import implied_view, stated_checks
from diagnose.explain.validate import validate
from diagnose.explain.validate.registry import CHECKS
from diagnose.match import load_catalogue, match_text
from diagnose.model import Finding
from diagnose.pipeline import AnalyzeOptions, analyze

CATALOGUE = load_catalogue()

REAL = Path(__file__).resolve().parents[2] / "shared" / "real_logs"

MESSAGES = [
    ("0.6.2", "ValueError: num_attention_heads (7) must be a multiple of tensor_model_parallel_size (2)."),
    ("0.6.2", "ValueError: num_query_groups (3) must be a multiple or divisor of tensor_model_parallel_size (2)."),
    ("0.6.2", "world size (12) is not divisible by total_model_size (model_cfg.tensor_model_parallel_size=8 * "
              "model_cfg.pipeline_model_parallel_size=1 * model_cfg.context_parallel_size=1)"),
    ("0.6.2", "AssertionError: Megatron-FSDP requires the fsdp_dtensor checkpointing format!"),
    ("0.4.2", "AssertionError: Megatron FSDP only supports fsdp_dtensor checkpoint format"),
    ("0.6.2", "AssertionError: fsdp_dtensor checkpoint format only supports Megatron FSDP"),
    ("0.6.2", "AssertionError: FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."),
    ("0.6.2", "ValueError: use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive."),
    ("0.4.2", "ValueError: Using use_megatron_fsdp and use_torch_fsdp2 at the same time is not supported."),
    ("0.4.2", "TypeError: TorchFullyShardedDataParallel.__init__() got an unexpected keyword argument 'pg_collection'"),
    ("0.6.2", "AssertionError: use_tp_pp_dp_mapping is not supported with Megatron FSDP"),
    ("0.6.2", "ValueError: Cannot use sequence parallelism without tensor parallelism"),
    ("0.6.2", "ValueError: CPU offloading can be done only for layers less than 4"),
    ("0.6.2", "AssertionError: DDP.fsdp_manual_registration requires DDP.nccl_ub!"),
    ("0.7.0", "Could not override 'dist.use_megatron_fsdp'."),  # Hydra's refusal of the moved field (MB151)
    ("mlm", "AssertionError: Using tensor model parallelism or context parallelism require setting the environment "
            "variable CUDA_DEVICE_MAX_CONNECTIONS to 1"),
]


def _finding(text: str) -> Finding:
    """The finding the matcher makes of ``text`` on line 42 of a log."""
    report = match_text("\n" * 41 + text + "\n", CATALOGUE, backend="python")
    assert report.root is not None, text
    return report.root


def test_every_rule_that_implies_settings_has_a_message_case():
    """What a message states is written once, in its rule (issue 17); each such rule is exercised here."""
    implying = {r.code for r in CATALOGUE.rules if r.implies is not None}
    assert len(implying) >= 15
    # MB104 is MB102's message raised from the model provider (its context): the same statement; MB152 is a
    # warning (Bridge skipped the moved key and the job ran without Megatron FSDP): tests/test_releases.py has it
    assert implying == {_finding(text).rule for _, text in MESSAGES} | {"MB104", "MB152"}


def test_every_implied_check_is_a_validator_check():
    names = {c.name for c in CHECKS}
    for r in CATALOGUE.rules:
        if r.implies is not None:
            assert r.implies.check in names, (r.code, r.implies.check)


def test_another_wording_of_the_rule_implies_nothing():
    # CV010's Megatron-LM assert names no numbers; MB131's Megatron-LM message states other settings
    for text in ["AssertionError: assert args.num_attention_heads % args.tensor_model_parallel_size == 0",
                 "AssertionError: FSDP manual registration is only supported with Megatron FSDP"]:
        f = _finding(text)
        assert f.implies is None and not implied_view([f]).values and stated_checks(f) == set()


@pytest.mark.parametrize("version, text", MESSAGES)
def test_implied_settings_make_the_validator_print_the_same_message(version, text):
    view = implied_view([_finding(text)])
    assert view.values and all(v.origin == "implied:log:42" for v in view.values.values())
    assert not view.config_known  # implied settings never count as the job's config
    if version == "mlm":  # a Megatron-LM-only check
        view.framework = "megatron-lm"
        view.set("model.tensor_model_parallel_size", 2, "log:1")
    else:
        view.version = version
    apply_defaults(view)
    messages = [v.message for v in validate(view, real_mcore=False)]
    body = text.split(": ", 1)[1] if text.split(":", 1)[0].endswith("Error") else text
    assert body in messages, (body, messages)


@pytest.mark.parametrize(
    "log, fix_key",
    [("b062_ckpt_format_new.log", "checkpoint.ckpt_format"),
     ("b062_cuda_max_connections.log", "env.CUDA_DEVICE_MAX_CONNECTIONS"),
     ("both_fsdp.log", "dist.use_torch_fsdp2")],
)
def test_real_validation_failure_logs_replay_against_implied_settings(log, fix_key):
    path = REAL / log
    if not path.exists():
        pytest.skip("shared real logs not present")
    report = analyze([str(path)], AnalyzeOptions(jobs=1))
    replay = report.to_dict()["replay"]
    # the validator prints the log's failure from the settings the error states: reproduced, and said so
    assert replay["reproduced"] is True and replay["implied"] is True
    assert replay["after_fix"]["passes"] is True and replay["proven"] is True
    assert fix_key in {f["key"] for f in replay["fix"]}
    assert any(v["from"].startswith("implied:log:") for v in report.to_dict()["config"]["values"].values())
    assert replay["summary"].startswith("reproduced by replay (from the settings the error states)")
