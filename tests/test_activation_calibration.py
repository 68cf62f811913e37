"""The activation model against real megatron-core measured on an H200 (benchmarks/memory_calibration/).

The records are data measured once by benchmarks/memory_calibration/measure_activations.py (forward+backward
peaks above the model state); this compares the model with them. Tolerance (docs/memory.md): every measured
activation peak within 15 %, every measured OOM predicted not to fit, every run that fitted predicted to fit.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import config_view
from predict_activations import compare, shape_of, state_bytes, workload_of

from diagnose.explain.memory.activations import Workload, activation_bytes, attention_kind
from diagnose.explain.memory.from_config import layer_implementation, workload_from_config
from diagnose.explain.memory.state import Layout

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "benchmarks" / "memory_calibration" / "h200_activations.json"
TOLERANCE = 0.15
GIB = 2**30


def _records() -> list[dict]:
    records = json.loads(TABLE.read_text())
    assert records, "the activation table is empty"
    return records


def _rows() -> list[dict]:
    rows = compare(_records())
    assert rows, "the activation table has no usable records"
    return rows


def test_every_measured_peak_within_tolerance():
    rows = [r for r in _rows() if r["outcome"] == "ok"]
    bad = [(r["name"], round(100 * r["error"], 1)) for r in rows if abs(r["error"]) > TOLERANCE]
    assert not bad, f"activation model vs H200 beyond {TOLERANCE:.0%}: {bad}"


def test_every_measured_oom_is_predicted_not_to_fit():
    ooms = [r for r in _rows() if r["outcome"] == "oom"]
    assert len(ooms) >= 8
    assert not [r["name"] for r in ooms if r["fits"]]
    # and with the state the run really held: the prediction exceeds the GPU (less the plan's headroom)
    for r in ooms:
        assert r["predicted_peak"] > r["capacity"] - max(2 * GIB, 0.04 * r["capacity"]), r["name"]


def test_runs_that_fitted_are_predicted_to_fit():
    for rec in _records():
        if rec["outcome"] != "ok":
            continue
        shape = shape_of(rec)
        peak = state_bytes(rec, shape) + activation_bytes(shape, workload_of(rec))
        capacity = rec["gpu_capacity_bytes"]
        assert peak <= capacity - max(2 * GIB, 0.04 * capacity), rec["name"]


def test_the_state_the_records_held_is_the_state_model():
    # the activation peak is measured above the model state; the OOM check adds the state model's: they agree
    for rec in _records():
        if rec["outcome"] == "ok":
            assert state_bytes(rec, shape_of(rec)) == pytest.approx(rec["state_bytes"], rel=0.02), rec["name"]


def test_table_covers_the_grid():
    records = _records()
    dense = [r for r in records if r["name"].startswith("dense/") and not r.get("config_overrides")]
    grid = {(r["attention_backend"], r["recompute"], r["batch"]["micro_batch_size"], r["batch"]["seq_length"])
            for r in dense}
    for backend in ("local", "sdpa_flash"):
        for recompute in (None, "selective", "full"):
            for mbs in (1, 2, 4):
                for seq in (2048, 4096, 8192):
                    assert (backend, recompute, mbs, seq) in grid
    assert any(r["name"].startswith("moe/") and r["outcome"] == "ok" for r in records)
    assert all(r["torch"] and r["megatron_core"] == "0.16.1" and r["gpu"] == "NVIDIA H200" for r in records)


def test_local_attention_scores_are_what_decides_fit():
    # the same run with flash attention fits in a fraction: the a*s^2 scores dominate at 4k+
    rec = next(r for r in _records() if r["name"] == "dense/local/none/mbs2/s4096")
    shape, work = shape_of(rec), workload_of(rec)
    local, flash = activation_bytes(shape, work), activation_bytes(shape, replace(work, attention="flash"))
    assert local > 2.5 * flash
    # selective recompute (core_attn) drops them; full recompute still rebuilds one layer's in backward
    selective = activation_bytes(shape, replace(work, recompute="selective"))
    full = activation_bytes(shape, replace(work, recompute="full", recompute_num_layers=1))
    assert full < selective < local / 2
    assert full > activation_bytes(shape, replace(work, recompute="full", recompute_num_layers=1, attention="flash"))


def test_the_loss_keeps_the_fp32_softmax_and_the_bf16_logits():
    rec = next(r for r in _records() if r["name"] == "dense/sdpa_flash/full/mbs4/s8192")
    shape, work = shape_of(rec), workload_of(rec)
    logits = 6 * 4 * 8192 * shape.padded_vocab(1)  # 4V fp32 + 2V bf16 per token, 32k tokens: 23.5 GiB
    assert logits <= activation_bytes(shape, work) < logits * 1.2
    assert rec["activation_peak_bytes"] == pytest.approx(activation_bytes(shape, work), rel=0.02)


@pytest.mark.parametrize("impl, backend, kind", [
    (None, None, "flash"), ("transformer_engine", "auto", "flash"), ("transformer_engine", "flash", "flash"),
    ("transformer_engine", "fused", "flash"), ("local", None, "local"), ("transformer_engine", "local", "local"),
    ("transformer_engine", "unfused", "te_unfused"), (None, "AttnBackend.unfused", "te_unfused"),
    ("local", "AttnBackend.auto", "local"),
])
def test_attention_kind_from_transformer_impl_and_attention_backend(impl, backend, kind):
    assert attention_kind(impl, backend) == kind


def test_config_keys_reach_the_workload():
    view = config_view({"model.num_layers": 2, "model.hidden_size": 512, "model.num_attention_heads": 8,
                        "model.transformer_impl": "local", "model.attention_softmax_in_fp32": False,
                        "model.bias_activation_fusion": True, "model.hidden_dropout": 0.0,
                        "model.attention_dropout": 0.0})
    got = layer_implementation(view)
    assert got["attention"] == "local" and got["torch_norm"] is True and got["softmax_fp32"] is False
    assert got["activation_fusion"] is True and got["hidden_dropout"] == 0.0 and got["attention_dropout"] == 0.0
    # unset: megatron-core's defaults (TE spec, flash, fp32 softmax, unfused SwiGLU, dropout 0.1)
    default = layer_implementation(config_view({"model.num_layers": 2}))
    assert default["attention"] == "flash" and default["torch_norm"] is False
    assert default["activation_fusion"] is False and default["hidden_dropout"] == 0.1
    unfused = layer_implementation(config_view({"model.attention_backend": "unfused"}))
    assert unfused["attention"] == "te_unfused"


def test_megatron_lm_flags_reach_the_workload(tmp_path):
    from diagnose.explain.config import load_config

    args = tmp_path / "args.txt"
    args.write_text("pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 4096 "
                    "--micro-batch-size 1 --transformer-impl local --attention-backend local --hidden-dropout 0.0 "
                    "--attention-dropout 0.0 --attention-softmax-in-fp32 --no-bias-swiglu-fusion --swiglu\n")
    view = load_config(str(args))
    got = layer_implementation(view)
    assert got["attention"] == "local" and got["softmax_fp32"] is True and got["activation_fusion"] is False
    assert got["hidden_dropout"] == 0.0
    # Megatron-LM's own defaults: the fused SwiGLU and a bf16 softmax
    args.write_text("pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --swiglu "
                    "--attention-backend flash\n")
    got = layer_implementation(load_config(str(args)))
    assert got["attention"] == "flash" and got["activation_fusion"] is True and got["softmax_fp32"] is False


def test_a_log_without_transformer_engine_means_local_attention():
    from diagnose.explain.config import load_config

    log = REPO / "sample_logs" / "captured" / "b062_first_iter_activation_oom.log"
    view = load_config(str(log))
    assert view.get("model.transformer_impl") is None  # the config summary does not say
    got = layer_implementation(view)
    assert got["attention"] == "local" and got["torch_norm"] is True and got["softmax_fp32"] is False
    from diagnose.explain.memory.from_config import shape_from_config

    shape = shape_from_config(view)
    work = workload_from_config(view, shape, Layout("distributed_optimizer", gpus=1))
    assert work.attention == "local" and work.seq_length == 8192


def test_the_oom_report_says_which_attention_it_sized():
    from diagnose.pipeline import analyze

    mem = analyze([str(REPO / "sample_logs" / "captured" / "b062_first_iter_activation_oom.log")]).memory
    assert mem is not None and mem.verdict == "activations"
    assert any("local DotProductAttention" in n and "Transformer Engine is not installed" in n for n in mem.notes)


def test_model_state_fits_but_local_attention_does_not_on_the_captured_8b_run():
    # the captured Bridge run (8B, seq 8192, micro batch 1, local spec, bf16 softmax): it ran out of memory in
    # its first forward; with flash attention the same activations would be a small fraction
    from diagnose.explain.config import load_config
    from diagnose.explain.memory.from_config import shape_from_config

    view = load_config(str(REPO / "sample_logs" / "captured" / "b062_first_iter_activation_oom.log"))
    shape = shape_from_config(view)
    work = workload_from_config(view, shape, Layout("distributed_optimizer", gpus=1))
    local = activation_bytes(shape, work)
    assert local > 140 * GIB
    assert activation_bytes(shape, replace(work, attention="flash")) < local / 3


def test_workload_defaults_are_a_transformer_engine_job():
    work = Workload()
    assert work.attention == "flash" and not work.torch_norm and work.activation_fusion and work.rope_fusion
