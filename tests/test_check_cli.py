"""``diagnose check CONFIG --gpus N``: JSON schema diagnose/check@1, exit codes, validation caught before launch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from diagnose.explain.memory.meta_count import available as meta_available
from diagnose.present.cli import main

LLAMA_8B = {
    "model": {
        "_target_": "megatron.bridge.models.llama.Llama3ModelProvider8B",
        "num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32,
        "num_query_groups": 8, "vocab_size": 128256, "seq_length": 8192, "gated_linear_unit": True,
        "share_embeddings_and_output_weights": False, "add_bias_linear": False, "normalization": "RMSNorm",
        "position_embedding_type": "rope", "bf16": True,
    },
    "train": {"micro_batch_size": 1, "global_batch_size": 128},
    "ddp": {"grad_reduce_in_fp32": True, "use_distributed_optimizer": True},
    "optimizer": {"use_distributed_optimizer": True},
    "checkpoint": {"save": "/ckpt"},
}
PLAN_KEYS = {"overrides", "strategy", "dp", "tp", "pp", "cp", "bytes_per_param", "model_state_bytes",
             "activation_bytes", "peak_bytes", "fits", "cost"}
STRATEGIES = {"ddp", "distributed_optimizer", "fsdp:no_shard", "fsdp:optim", "fsdp:optim_grads",
              "fsdp:optim_grads_params"}


@pytest.fixture(autouse=True)
def _analytic_counts(monkeypatch):
    monkeypatch.setenv("DIAGNOSE_EXACT_PARAMS", "0")  # the meta-device build is tested on its own below


def _write(tmp_path: Path, cfg: dict, name: str = "run_config.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _check(capsys, *argv) -> tuple[int, dict | str]:
    code = main(["check", *argv])
    out = capsys.readouterr()
    if "--format" in argv:
        return code, json.loads(out.out) if out.out.strip() else out.err
    return code, out.out + out.err


def test_json_schema_and_first_plan_is_the_config_as_given(tmp_path, capsys):
    code, out = _check(capsys, _write(tmp_path, LLAMA_8B), "--gpus", "8", "--gpu", "h100-80gb", "--format", "json")
    assert out["schema"] == "diagnose/check@1"
    assert set(out) == {"schema", "replay", "memory"}
    mem = out["memory"]
    assert mem["gpu_capacity_bytes"] == pytest.approx(79.11 * 2**30, rel=1e-3)
    assert mem["params"] == 8_030_261_248
    plans = mem["plans"]
    assert plans[0]["overrides"] == [] and plans[0]["strategy"] == "distributed_optimizer"
    assert (plans[0]["dp"], plans[0]["tp"], plans[0]["pp"], plans[0]["cp"]) == (8, 1, 1, 1)
    for p in plans:
        assert PLAN_KEYS <= set(p)
        assert p["strategy"] in STRATEGIES
        assert isinstance(p["activation_bytes"], int) and p["peak_bytes"] >= p["model_state_bytes"]
        assert p["dp"] * p["tp"] * p["pp"] * p["cp"] == 8, "alternatives keep the GPU count"
        assert p["fits"] == (p["peak_bytes"] <= mem["gpu_capacity_bytes"] - max(2 * 2**30,
                                                                                 mem["gpu_capacity_bytes"] * 0.04))
    # exit code follows the config as given
    assert code == (0 if plans[0]["fits"] and not out["replay"]["violations"] else 1)


def test_alternatives_cheapest_working_change_first(tmp_path, capsys):
    _, out = _check(capsys, _write(tmp_path, LLAMA_8B), "--gpus", "8", "--gpu", "h100-80gb", "--format", "json")
    alternatives = out["memory"]["plans"][1:]
    fitting = [p for p in alternatives if p["fits"]]
    assert fitting and alternatives[: len(fitting)] == fitting
    assert all(p["valid"] is not False for p in fitting)
    # Megatron FSDP with saving needs fsdp_dtensor: the replay adds it
    fsdp = next(p for p in fitting if p["strategy"].startswith("fsdp:"))
    assert {"key": "checkpoint.ckpt_format", "value": "fsdp_dtensor"} in fsdp["overrides"]


def test_fits_exit_0(tmp_path, capsys):
    code, out = _check(capsys, _write(tmp_path, LLAMA_8B), "--gpus", "8", "--gpu", "h200",
                       "--set", "model.recompute_granularity=full", "--set", "model.recompute_method=uniform",
                       "--set", "model.recompute_num_layers=1", "--format", "json")
    assert out["memory"]["plans"][0]["fits"] and not out["replay"]["violations"]
    assert code == 0


def test_does_not_fit_exit_1(tmp_path, capsys):
    code, out = _check(capsys, _write(tmp_path, LLAMA_8B), "--gpus", "1", "--gpu-memory", "40GiB", "--format", "json")
    assert out["memory"]["gpu_capacity_bytes"] == 40 * 2**30
    assert not out["memory"]["plans"][0]["fits"]
    assert code == 1


def test_validation_failure_is_caught_before_launch_with_a_proven_fix(tmp_path, capsys):
    cfg = {"model": {"num_layers": 4, "hidden_size": 448, "num_attention_heads": 7, "vocab_size": 1000,
                     "seq_length": 512, "tensor_model_parallel_size": 2},
           "train": {"micro_batch_size": 1, "global_batch_size": 8}}
    code, out = _check(capsys, _write(tmp_path, cfg), "--gpus", "2", "--gpu", "h200", "--format", "json")
    assert code == 1
    messages = [v["message"] for v in out["replay"]["violations"]]
    assert any("must be a multiple of tensor_model_parallel_size" in m for m in messages)
    assert out["replay"]["after_fix"]["passes"] is True


def test_megatron_fsdp_without_fsdp_dtensor_is_caught(tmp_path, capsys):
    code, out = _check(capsys, _write(tmp_path, LLAMA_8B), "--gpus", "8", "--gpu", "h200",
                       "--set", "ddp.use_megatron_fsdp=true", "--format", "json")
    assert code == 1
    assert any("fsdp_dtensor" in v["message"] for v in out["replay"]["violations"])
    assert {"key": "checkpoint.ckpt_format", "value": "fsdp_dtensor"} in out["replay"]["fix"]


def test_set_changes_the_plan(tmp_path, capsys):
    _, out = _check(capsys, _write(tmp_path, LLAMA_8B), "--gpus", "8", "--gpu", "h200",
                    "--set", "model.tensor_model_parallel_size=2", "--format", "json")
    given = out["memory"]["plans"][0]
    assert (given["tp"], given["dp"]) == (2, 4)


def test_text_output_shows_the_plan(tmp_path, capsys):
    code, text = _check(capsys, _write(tmp_path, LLAMA_8B), "--gpus", "8", "--gpu", "h100-80gb")
    assert "Validation: passes" in text and "given" in text and "fsdp:optim_grads_params" in text
    assert code in (0, 1)


@pytest.mark.parametrize("argv, needle", [
    (["/nonexistent/run_config.yaml", "--gpus", "8"], "/nonexistent/run_config.yaml"),
    (["{cfg}", "--gpus", "0"], "--gpus"),
    (["{cfg}", "--gpus", "8", "--gpu", "h9000"], "unknown GPU"),
    (["{cfg}", "--gpus", "8", "--gpu-memory", "lots"], "lots"),
    (["{cfg}", "--gpus", "8", "--set", "not-an-override"], "override"),
    (["{empty}", "--gpus", "8"], "model shape"),
])
def test_bad_input_exit_2_one_line(tmp_path, capsys, argv, needle):
    cfg = _write(tmp_path, LLAMA_8B)
    empty = _write(tmp_path, {"train": {"micro_batch_size": 1}}, "empty.yaml")
    argv = [a.replace("{cfg}", cfg).replace("{empty}", empty) for a in argv]
    code = main(["check", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.megatron
def test_exact_count_from_the_meta_device(tmp_path, capsys, monkeypatch):
    if not meta_available():
        pytest.skip("torch and megatron-core are not installed")
    monkeypatch.setenv("DIAGNOSE_EXACT_PARAMS", "1")
    _, out = _check(capsys, _write(tmp_path, LLAMA_8B), "--gpus", "8", "--gpu", "h200", "--format", "json")
    assert out["memory"]["params_source"] == "meta"
    assert out["memory"]["params"] == 8_030_261_248


def test_megatron_lm_argument_list(tmp_path, capsys):
    args = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 --swiglu "
            "--untie-embeddings-and-output-weights --disable-bias-linear --normalization RMSNorm "
            "--position-embedding-type rope --bf16 --micro-batch-size 1 --global-batch-size 128 "
            "--use-distributed-optimizer --vocab-size 128256\n")
    path = tmp_path / "args.txt"
    path.write_text(args)
    _, out = _check(capsys, str(path), "--gpus", "8", "--gpu", "h200", "--format", "json")
    given = out["memory"]["plans"][0]
    assert out["memory"]["params"] == 8_030_261_248
    # Megatron-LM's --bf16 reduces grads in fp32: distributed optimizer 6 + 12/8 bytes per parameter (+ nothing else)
    assert given["strategy"] == "distributed_optimizer"
    assert given["bytes_per_param"] == pytest.approx(7.5, rel=1e-3)


def test_nothing_fits_points_to_a_gpu_count_that_does(tmp_path, capsys):
    code, out = _check(capsys, _write(tmp_path, LLAMA_8B), "--gpus", "1", "--gpu-memory", "32GiB", "--format", "json")
    assert code == 1
    assert not any(p["fits"] for p in out["memory"]["plans"])  # activations alone (~45 GiB) exceed 32 GiB
    note = next(n for n in out["memory"]["notes"] if n.startswith("nothing fits on 1 GPUs"))
    assert "GPUs" in note


def test_fsdp_plan_bytes_per_param_excludes_transient_buffers(tmp_path, capsys):
    # QA report #10: the optim_grads_params plan at DP=64 is 18/64 bytes per parameter, buffers reported apart
    _, out = _check(capsys, _write(tmp_path, LLAMA_8B), "--gpus", "64", "--gpu", "h200", "--format", "json")
    plan = next(p for p in out["memory"]["plans"] if p["strategy"] == "fsdp:optim_grads_params" and p["dp"] == 64
                and p["tp"] == 1)
    assert plan["transient_bytes"] > 0 and plan["components"]["buffers"] == plan["transient_bytes"]
    assert plan["bytes_per_param"] == pytest.approx(18 / 64, abs=0.002)
    assert plan["model_state_bytes"] == sum(v for k, v in plan["components"].items() if k != "buffers")
    assert plan["peak_bytes"] >= plan["model_state_bytes"] + plan["transient_bytes"]


LLAMA_70B = {
    "model": {
        "num_layers": 80, "hidden_size": 8192, "ffn_hidden_size": 28672, "num_attention_heads": 64,
        "num_query_groups": 8, "vocab_size": 128256, "gated_linear_unit": True,
        "share_embeddings_and_output_weights": False, "seq_length": 8192, "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1, "context_parallel_size": 1, "sequence_parallel": False, "bf16": True,
        "recompute_granularity": None,
        # what Bridge's Llama 3 provider sets (megatron-core's defaults are 0.1 dropout and an unfused SwiGLU)
        "bias_activation_fusion": True, "hidden_dropout": 0.0, "attention_dropout": 0.0,
    },
    "ddp": {"use_megatron_fsdp": False, "use_distributed_optimizer": True, "grad_reduce_in_fp32": True},
    "optimizer": {"optimizer": "adam", "bf16": True, "use_distributed_optimizer": True, "lr": 0.0003},
    "train": {"micro_batch_size": 1, "global_batch_size": 256, "train_iters": 1000},
    "checkpoint": {"save": "/ckpt/llama70b", "ckpt_format": "torch_dist"},
}


def test_plan_search_combines_tp_and_pp_splits(tmp_path, capsys):
    # QA report #8: Llama-3-70B on 64 x H100-80GB: TP 8 x PP 2 and TP 4 x PP 4 fit without full recompute
    code, out = _check(capsys, _write(tmp_path, LLAMA_70B), "--gpus", "64", "--gpu", "h100-80gb", "--format", "json")
    plans = out["memory"]["plans"]
    assert not plans[0]["fits"] and len(plans) <= 14

    def recompute(p):
        return any(o["key"] == "model.recompute_granularity" for o in p["overrides"])

    fitting = [p for p in plans[1:] if p["fits"]]
    splits = {(p["tp"], p["pp"]) for p in fitting if not recompute(p)}
    assert (8, 2) in splits and (4, 4) in splits
    assert not recompute(fitting[0])  # a layout change without recomputation is the cheapest working change
    for p in plans:
        assert 64 % (p["tp"] * p["pp"] * p["cp"]) == 0 and p["dp"] * p["tp"] * p["pp"] * p["cp"] == 64
        assert 64 % p["tp"] == 0 and (8 % p["tp"] == 0 or p["tp"] % 8 == 0) and 80 % p["pp"] == 0
        if p is not plans[0]:
            assert p["valid"] is not False
    tp8pp2 = next(p for p in fitting if (p["tp"], p["pp"]) == (8, 2) and not recompute(p))
    keys = {o["key"]: o["value"] for o in tp8pp2["overrides"]}
    assert keys["model.tensor_model_parallel_size"] == 8 and keys["model.pipeline_model_parallel_size"] == 2
    assert keys["model.sequence_parallel"] is True
    assert "train.global_batch_size" not in keys  # 256 divides by micro batch x DP 4


M36B = {
    "model": {"num_layers": 40, "hidden_size": 8192, "ffn_hidden_size": 28672, "num_attention_heads": 64,
              "num_query_groups": 8, "vocab_size": 128256, "gated_linear_unit": True,
              "share_embeddings_and_output_weights": False, "normalization": "RMSNorm", "add_bias_linear": False,
              "seq_length": 4096, "bf16": True},
    "ddp": {"grad_reduce_in_fp32": True, "overlap_grad_reduce": True, "use_distributed_optimizer": True},
    "optimizer": {"use_distributed_optimizer": True, "bf16": True},
    "train": {"micro_batch_size": 1, "global_batch_size": 8},
}


@pytest.mark.parametrize("gpus, tp", [(6, 4), (12, 8)])
def test_invalid_config_is_never_a_working_plan(tmp_path, capsys, gpus, tp):
    # QA report #9: world size not divisible by TP: the given row is invalid, every alternative is a valid split,
    # and changes to train.global_batch_size (a hyper-parameter) are said, never silent
    cfg = _write(tmp_path, M36B)
    code, out = _check(capsys, cfg, "--gpus", str(gpus), "--gpu", "h200", "--set",
                       f"model.tensor_model_parallel_size={tp}", "--format", "json")
    assert code == 1 and out["replay"]["violations"]
    plans = out["memory"]["plans"]
    assert plans[0]["valid"] is False
    for p in plans[1:]:
        assert p["dp"] * p["tp"] * p["pp"] * p["cp"] == gpus and p["valid"] is not False
        gbs = [o["value"] for o in p["overrides"] if o["key"] == "train.global_batch_size"]
        if gbs or 8 % p["dp"]:
            assert "changes train.global_batch_size" in p["cost"]
    assert any(n.startswith("the config as given fails validation") for n in out["memory"]["notes"])
    fix_gbs = [o["value"] for o in out["replay"].get("fix") or [] if o["key"] == "train.global_batch_size"]
    if fix_gbs:
        assert out["replay"]["changes_global_batch_size"] == {"from": 8, "to": fix_gbs[0]}
    code, text = _check(capsys, cfg, "--gpus", str(gpus), "--gpu", "h200", "--set",
                        f"model.tensor_model_parallel_size={tp}")
    assert "Cheapest working change" not in text and "INVALID" in text
    if fix_gbs:
        assert "changes train.global_batch_size 8 ->" in " ".join(text.split())


def test_a_plan_whose_dp_does_not_divide_the_global_batch_says_so(tmp_path, capsys):
    # QA report #9: on 64 GPUs with global batch 8, a TP 4 plan (DP 16) must change the global batch: say so
    _, out = _check(capsys, _write(tmp_path, M36B), "--gpus", "64", "--gpu", "h200", "--format", "json")
    for p in out["memory"]["plans"][1:]:
        if 8 % (p["dp"] * 1) or any(o["key"] == "train.global_batch_size" for o in p["overrides"]):
            assert "changes train.global_batch_size" in p["cost"], p["label"]


def test_a_shape_value_that_is_not_an_integer_is_named(tmp_path, capsys):
    # QA report #3 (4th command): model.num_layers=abc is there, just not an integer: say that, exit 2
    code, text = _check(capsys, _write(tmp_path, M36B), "--gpus", "8", "--set", "model.num_layers=abc")
    assert code == 2
    # issue 19 item 4: refused as the --set is read, in OmegaConf's words
    assert "model.num_layers: value 'abc'" in text and "Integer" in text and "has no model shape" not in text


def test_text_override_lines_are_one_line_and_the_header_is_whole(tmp_path, capsys, monkeypatch):
    # QA report #16: overrides hard-wrapped mid-command (copy-paste hazard); the 'fits' header truncated to 'fi…'
    monkeypatch.setenv("COLUMNS", "80")
    _, text = _check(capsys, _write(tmp_path, M36B), "--gpus", "64", "--gpu", "h200")
    header = next(line for line in text.splitlines() if "strategy" in line and "peak" in line)
    assert header.rstrip().endswith("fits") and "…" not in header
    import re

    lines = [line for line in text.splitlines() if re.match(r"^ ?\d+  [a-z_.]+=", line)]
    assert lines and all(line.rstrip().split()[-1].count("=") == 1 for line in lines)  # ends on a whole key=value
    assert any("model.init_model_with_meta_device=true" in line and "ddp.use_megatron_fsdp=true" in line
               for line in lines)
