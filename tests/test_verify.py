"""``diagnose verify``: each check on real captured runs and on runs derived from a captured Megatron FSDP log.

The derived logs start from ``sample_logs/captured/b062_mfsdp_dtensor_save_hang.log`` (2 x H200, Bridge 0.6.2, Megatron
FSDP optim_grads_params, fsdp_dtensor saves; it hung in its first save) cut before the hang, and continue with the
lines Megatron-Bridge prints when the save finishes and training goes on (formats: megatron-bridge.md §3,
``successfully saved checkpoint from iteration {step:7d} to {save} [ t {tp}/{TP}, p {pp}/{PP} ]`` and the iteration
line). Each variant changes only what its case is about.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import jsonschema
import pytest

from diagnose.present.cli import main
from diagnose.present.commands.schema import schema_text

ROOT = Path(__file__).resolve().parent.parent
CAPTURED = ROOT / "sample_logs" / "captured"
FSDP_LOG = CAPTURED / "b062_mfsdp_dtensor_save_hang.log"
REAL_LOGS = ROOT.parent / "shared" / "real_logs"
SAVED = "  successfully saved checkpoint from iteration {it:7d} to /tmp/ckok [ t 1/1, p 1/1 ]"


def _head() -> list[str]:
    lines = FSDP_LOG.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if line.startswith("saving checkpoint at iteration"))
    return lines[:cut]


def _iteration(template: str, it: int, loss: str) -> str:
    line = re.sub(r"iteration\s+2/", f"iteration        {it}/", template)
    line = re.sub(r"consumed samples:\s+\d+", f"consumed samples:            {2 * it}", line)
    return re.sub(r"lm loss: \S+ \|", f"lm loss: {loss} |", line)


def fsdp_run(losses=("1.190012E+01", "1.181934E+01"), fmt="fsdp_dtensor", save=True) -> str:
    """A finished 4-iteration Megatron FSDP run: saves at 2 and 4 (unless ``save`` is False)."""
    head = _head()
    template = next(line for line in head if "iteration        2/" in line)
    out = list(head)
    if save:
        out += [f"saving checkpoint at iteration       2 to /tmp/ckok in {fmt} format",
                f"Storing distributed optimizer sharded state of type {fmt}", SAVED.format(it=2)]
    out += [_iteration(template, 3, losses[0]), _iteration(template, 4, losses[1])]
    if save:
        out += [f"saving checkpoint at iteration       4 to /tmp/ckok in {fmt} format", SAVED.format(it=4)]
    out += ["[after training is done] datetime: 2026-11-29 17:12:09 "]
    text = "\n".join(out) + "\n"
    if fmt != "fsdp_dtensor":
        text = text.replace("  ckpt_format: 'fsdp_dtensor'", f"  ckpt_format: '{fmt}'")
    if not save:
        text = re.sub(r"\n  save: '[^'\n]*'", "", text)
    return text


def ddp_built_although_requested() -> str:
    """The silent case: the recipe asked for Megatron FSDP through ``cfg.dist.use_megatron_fsdp`` on a release
    without that field: the config summary shows the FSDP settings around it, the wrapper is plain DDP."""
    text = fsdp_run(fmt="torch_dist")
    text = text.replace("  use_megatron_fsdp: True  (Mcore default: False)\n", "")
    text = text.replace("use_distributed_optimizer=True is required for Megatron-FSDP. Activating...\n", "")
    lines = text.splitlines()
    out = []
    for line in lines:
        if "mcore_fsdp_adapter:Setting up DistributedDataParallel" in line:
            out.append(line.replace("megatron.core.distributed.fsdp.mcore_fsdp_adapter",
                                    "megatron.core.distributed.distributed_data_parallel")
                       .replace("use_megatron_fsdp=True", "use_megatron_fsdp=False"))
        elif "megatron_fsdp" in line.lower() and "Setting up" in line or line.startswith(("[FSDP_UNIT", "\tmodule.")):
            continue
        elif "Number of FSDP Parameter Groups" in line or line.startswith("Total comm:"):
            continue
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def verify_payload(paths: list[str], strict: bool = False) -> dict:
    """What ``diagnose verify PATHS --format json`` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["verify", *paths, "--format", "json", *(["--strict"] if strict else [])])
    return json.loads(out.getvalue())


def _verify(tmp_path: Path, text: str, name: str = "run.log", strict: bool = False) -> dict:
    path = tmp_path / name
    path.write_text(text)
    payload = verify_payload([str(path)], strict)
    jsonschema.validate(payload, json.loads(schema_text("verify")))
    return payload


def _verdicts(payload: dict) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in payload["verify"]["checks"]}


def test_successful_megatron_fsdp_run_holds(tmp_path):
    payload = _verify(tmp_path, fsdp_run())
    v = _verdicts(payload)
    assert payload["verify"]["passes"] is True, payload["verify"]["failed"]
    assert v["megatron_fsdp_active"] == v["loss_finite"] == v["checkpoint_fsdp_dtensor"] == "pass"
    assert v["sharding_strategy"] == "pass" and v["no_failure"] == "pass"
    assert v["te_apex"] == "warn"  # the capture ran without Transformer Engine and Apex
    run = payload["verify"]["run"]
    assert run == {"wrapper": "megatron_fsdp", "sharding_strategy": "optim_grads_params", "dp_size": 2,
                   "last_iteration": 4, "train_iters": 4, "checkpoint_format": "fsdp_dtensor"}
    active = next(c for c in payload["verify"]["checks"] if c["name"] == "megatron_fsdp_active")
    assert "mcore_fsdp_adapter:Setting up DistributedDataParallel" in active["evidence"][0]["text"]
    assert main(["verify", str(tmp_path / "run.log"), "--format", "json"]) == 0


def test_strict_fails_on_a_fallback(tmp_path):
    payload = _verify(tmp_path, fsdp_run(), strict=True)
    assert payload["verify"]["passes"] is False


def test_nan_loss_fails_loss_finite_only(tmp_path):
    payload = _verify(tmp_path, fsdp_run(losses=("NAN", "NAN")))
    assert payload["verify"]["failed"] == ["loss_finite"]
    check = next(c for c in payload["verify"]["checks"] if c["name"] == "loss_finite")
    assert "iteration 3" in check["detail"] and "lm loss: NAN" in check["evidence"][0]["text"]


def test_inf_loss_at_the_last_iteration_fails(tmp_path):
    payload = _verify(tmp_path, fsdp_run(losses=("1.18E+01", "INF")))
    assert payload["verify"]["failed"] == ["loss_finite"]


def test_no_checkpoint_fails_checkpoint_check(tmp_path):
    payload = _verify(tmp_path, fsdp_run(save=False))
    assert payload["verify"]["failed"] == ["checkpoint_fsdp_dtensor"]
    check = next(c for c in payload["verify"]["checks"] if c["name"] == "checkpoint_fsdp_dtensor")
    assert "no checkpoint was written" in check["detail"]


def test_torch_dist_checkpoint_under_fsdp_fails(tmp_path):
    payload = _verify(tmp_path, fsdp_run(fmt="torch_dist"))
    assert payload["verify"]["failed"] == ["checkpoint_fsdp_dtensor"]
    check = next(c for c in payload["verify"]["checks"] if c["name"] == "checkpoint_fsdp_dtensor")
    assert "torch_dist format under Megatron FSDP" in check["detail"]
    assert payload["verify"]["run"]["checkpoint_format"] == "torch_dist"


def test_fsdp_requested_but_ddp_built_is_caught_from_the_log(tmp_path):
    payload = _verify(tmp_path, ddp_built_although_requested())
    check = next(c for c in payload["verify"]["checks"] if c["name"] == "megatron_fsdp_active")
    assert check["verdict"] == "fail"
    assert "FSDP was requested in the config" in check["detail"]
    assert "wrapped by DistributedDataParallel" in check["detail"]
    texts = [e["text"] for e in check["evidence"]]
    assert any("data_parallel_sharding_strategy" in t for t in texts)  # the config line that asked for it
    assert any("distributed_data_parallel:Setting up" in t for t in texts)  # the wrapper that was built
    assert payload["verify"]["run"]["wrapper"] == "ddp"


def test_skipped_dist_key_warning_counts_as_requested(tmp_path):
    text = ddp_built_although_requested().replace(
        "INFO:megatron.training.utils.log_utils:Setting logging level to 20\n",
        "WARNING:megatron.bridge.training.utils.omegaconf_utils:Key 'use_megatron_fsdp' in overrides not found in "
        "config object DistributedInitConfig. Skipping.\nINFO:megatron.training.utils.log_utils:Setting logging "
        "level to 20\n", 1)
    payload = _verify(tmp_path, text)
    check = next(c for c in payload["verify"]["checks"] if c["name"] == "megatron_fsdp_active")
    assert check["verdict"] == "fail" and "dist.use_megatron_fsdp" in check["detail"]


@pytest.mark.parametrize("name, dp", [("b062_tiny_train_success", 1), ("b062_two_node_success", 2)])
def test_captured_successful_ddp_runs(name, dp):
    payload = verify_payload([str(CAPTURED / f"{name}.log")])
    v = _verdicts(payload)
    # plain DDP runs with checkpoint.save=null: trained fine, but not Megatron FSDP and no checkpoint
    assert v["no_failure"] == "pass" and v["loss_finite"] == "pass"
    assert v["megatron_fsdp_active"] == "fail" and v["checkpoint_fsdp_dtensor"] == "fail"
    assert v["sharding_strategy"] == "skip" and v["te_apex"] == "warn"
    assert payload["verify"]["run"]["wrapper"] == "ddp" and payload["verify"]["run"]["dp_size"] == dp
    assert payload["verify"]["passes"] is False


def test_captured_failed_fsdp_run_names_what_failed():
    payload = verify_payload([str(FSDP_LOG)])
    assert payload["root_cause"]["rule"] == "CK014"
    assert payload["verify"]["failed"] == ["no_failure", "loss_finite", "checkpoint_fsdp_dtensor"]
    assert _verdicts(payload)["megatron_fsdp_active"] == "pass"


@pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="../shared/real_logs absent")
def test_real_failure_logs_never_pass():
    for log in sorted(REAL_LOGS.glob("*.log")):
        payload = verify_payload([str(log)])
        assert payload["verify"]["passes"] is False, log.name
        assert _verdicts(payload)["no_failure"] == "fail", log.name


def test_analyze_adds_the_verify_section_only_without_failure(tmp_path, capsys):
    path = tmp_path / "ok.log"
    path.write_text(fsdp_run())
    assert main(["analyze", str(path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    jsonschema.validate(report, json.loads(schema_text("report")))
    assert report["verify"]["passes"] is True
    assert main(["analyze", str(FSDP_LOG), "--format", "json"]) == 1
    assert "verify" not in json.loads(capsys.readouterr().out)
    assert main(["analyze", str(path), "--color", "never"]) == 0
    text = capsys.readouterr().out
    assert "VERIFY (Megatron FSDP run)" in text and "[PASS]" in text


def test_markdown_report_has_the_verify_section(tmp_path, capsys):
    path = tmp_path / "ok.log"
    path.write_text(fsdp_run())
    assert main(["analyze", str(path), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "### Verify (Megatron FSDP run)" in out and "**all checks hold**" in out


def test_verify_text_makes_log_text_inert(tmp_path, capsys):
    text = fsdp_run(losses=("NAN", "NAN")).replace("lm loss: NAN |", "lm loss: NAN | \x1b]0;pwned\x07 [bold]x[/bold] |")
    path = tmp_path / "evil.log"
    path.write_text(text)
    assert main(["verify", str(path), "--color", "always"]) == 1
    out = capsys.readouterr().out
    assert "\x1b]0;" not in out and "\x07" not in out


def test_verify_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert main(["verify", str(tmp_path / "missing.log")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.log" in err


def test_schema_command_prints_the_verify_schema(capsys):
    assert main(["schema", "verify"]) == 0
    assert json.loads(capsys.readouterr().out)["$id"] == "urn:diagnose:schema:verify-1"


def test_fallback_settings_warn_under_fsdp(tmp_path):
    text = fsdp_run().replace("keep_fp8_transpose_cache=False", "keep_fp8_transpose_cache=True").replace(
        "average_in_collective=False", "average_in_collective=True")
    payload = _verify(tmp_path, text)
    v = _verdicts(payload)
    assert v["keep_fp8_transpose_cache"] == "warn" and v["average_in_collective"] == "warn"
    assert payload["verify"]["passes"] is True  # fallbacks cost speed or memory; the run still holds
    assert _verify(tmp_path, text, strict=True)["verify"]["passes"] is False


def test_fsdp_with_tensor_parallel_on_hopper_warns_about_cuda_device_max_connections(tmp_path):
    text = fsdp_run().replace("[model] Non-default values (vs Mcore TransformerConfig):\n",
                              "[model] Non-default values (vs Mcore TransformerConfig):\n"
                              "  tensor_model_parallel_size: 2  (Mcore default: 1)\n", 1)
    payload = _verify(tmp_path, text)
    check = next(c for c in payload["verify"]["checks"] if c["name"] == "cuda_device_max_connections")
    assert check["verdict"] == "warn" and "TP=2" in check["detail"]
    blackwell = "NVIDIA B200 detected\n" + text
    assert _verdicts(_verify(tmp_path, blackwell, name="b200.log"))["cuda_device_max_connections"] == "pass"
