"""run() and the plan never raise on odd config values: the memory section is best effort, never a traceback."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_memory_verdict import REAL_OOM

from diagnose.explain.config import ConfigView
from diagnose.explain.memory import run
from diagnose.model import Evidence, Finding, Report

KEYS = ["model.num_layers", "model.hidden_size", "model.num_attention_heads", "model.num_query_groups",
        "model.ffn_hidden_size", "model.vocab_size", "model.tensor_model_parallel_size",
        "model.pipeline_model_parallel_size", "model.context_parallel_size", "model.num_moe_experts",
        "model.expert_model_parallel_size", "train.micro_batch_size", "train.global_batch_size",
        "ddp.use_megatron_fsdp", "ddp.data_parallel_sharding_strategy", "ddp.grad_reduce_in_fp32",
        "launch.world_size", "launch.num_parameters", "model.seq_length", "model.recompute_granularity"]
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-4, 70000), st.text(max_size=8),
                   st.sampled_from(["optim_grads_params", "full", "selective", "1e3", "32"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=12), st.sampled_from(
    ["dp_wrap", "first_iteration", "optimizer_step", "checkpoint_save", "init", "unknown"]))
def test_run_never_raises(values, phase):
    view = ConfigView()
    for k, v in values.items():
        view.set(k, v, "log:1")
    finding = Finding(rule="OOM", name="oom", title="t", category="cuda_oom", phase=phase, severity="error",
                      role="root", confidence=0.9, evidence=[Evidence("x.log", 1, REAL_OOM)])
    out = run(Report(findings=[finding], root_cause=0), view, None)
    assert out is not None
    assert out.verdict in ("capacity", "fragmentation", "transient_peak", "activations", "unknown")
    for o in out.options:
        assert o.gpus >= 1 and o.model_state_bytes >= 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(1, 96), hidden_mult=st.integers(1, 64), heads=st.sampled_from([1, 2, 4, 8, 12, 16, 64]),
       groups=st.sampled_from([None, 1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4, 8, 3]), pp=st.sampled_from([1, 2, 4]),
       world=st.sampled_from([1, 2, 8, 64, 6]), mbs=st.integers(0, 64), seq=st.sampled_from([128, 4096, 32768]),
       experts=st.sampled_from([None, 8, 64]), ep=st.sampled_from([1, 8]),
       fsdp=st.booleans(), strategy=st.sampled_from(["no_shard", "optim", "optim_grads", "optim_grads_params", "x"]))
def test_run_on_plausible_shapes(layers, hidden_mult, heads, groups, tp, pp, world, mbs, seq, experts, ep, fsdp,
                                 strategy):
    view = ConfigView()
    for k, v in {"model.num_layers": layers, "model.hidden_size": 64 * hidden_mult * heads,
                 "model.num_attention_heads": heads, "model.num_query_groups": groups,
                 "model.tensor_model_parallel_size": tp, "model.pipeline_model_parallel_size": pp,
                 "launch.world_size": world, "train.micro_batch_size": mbs, "model.seq_length": seq,
                 "model.num_moe_experts": experts, "model.expert_model_parallel_size": ep,
                 "ddp.use_megatron_fsdp": fsdp, "ddp.data_parallel_sharding_strategy": strategy}.items():
        if v is not None:
            view.set(k, v, "log:1")
    finding = Finding(rule="OOM", name="oom", title="t", category="cuda_oom", phase="first_iteration",
                      severity="error", role="root", confidence=0.9, evidence=[Evidence("x.log", 1, REAL_OOM)])
    out = run(Report(findings=[finding], root_cause=0), view, None)
    assert out.current is not None and out.current.model_state_bytes > 0
    fitting = [o for o in out.options if o.fits]
    assert all(o.peak_bytes <= out.gpu_capacity_bytes for o in fitting)
