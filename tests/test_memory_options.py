"""Options search: each option a set of overrides with predicted bytes, ranked cheapest first, valid by replay."""

from __future__ import annotations

import pytest

from diagnose.explain.config import ConfigView, apply_defaults
from diagnose.explain.memory import run
from diagnose.explain.memory.activations import Workload, activation_bytes
from diagnose.explain.memory.gpus import GIB, gpu_by_name
from diagnose.explain.memory.options import Scenario, evaluate, headroom, search
from diagnose.explain.memory.replay_check import prove
from diagnose.explain.memory.shape import ModelShape
from diagnose.explain.memory.state import Layout
from diagnose.model import Evidence, Finding, Override, Report

LLAMA_8B = ModelShape(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                      num_query_groups=8, vocab_size=128256, seq_length=8192, gated_linear_unit=True,
                      untie_embeddings=True, add_bias_linear=False, layernorm=False, position_embedding="rope")
H100 = gpu_by_name("h100-80gb").capacity_bytes


def _scenario(layout: Layout, work: Workload | None = Workload(1, 8192), capacity: int = H100) -> Scenario:
    return Scenario(LLAMA_8B, layout, work, capacity)


def test_ranked_fitting_first_cheapest_first_and_all_fit():
    scn = _scenario(Layout("ddp", gpus=8, grad_bytes=4))
    plans = search(scn)
    fitting = [p for p in plans if p.fits]
    assert fitting, "a Llama-8B on 8 x 80 GiB must have a fitting option"
    assert plans[: len(fitting)] == fitting
    ranks = [p.cost_rank for p in fitting]
    assert ranks == sorted(ranks)
    for p in fitting:
        assert p.peak <= H100 - headroom(H100)
        assert p.overrides or p.layout.gpus != 8


def test_non_fitting_options_shown_only_when_they_reduce_memory():
    scn = _scenario(Layout("ddp", gpus=1, grad_bytes=4))
    base = evaluate(scn, "given", [], scn.layout, scn.workload, "", 0)
    for p in search(scn):
        if not p.fits:
            assert p.peak < base.peak


def test_tp_options_divide_heads_and_query_groups():
    shape = ModelShape(num_layers=4, hidden_size=768, num_attention_heads=12, num_query_groups=4, vocab_size=1000)
    scn = Scenario(shape, Layout("ddp", gpus=8), Workload(64, 8192), 1 * GIB)
    from diagnose.explain.memory.options import candidates

    tps = {c.layout.tp for c in candidates(scn) if c.label.startswith("TP")}
    assert tps and all(12 % t == 0 and (4 % t == 0 or t % 4 == 0) for t in tps)
    assert 3 not in tps and 6 not in tps  # divide the 12 heads, but are neither divisors nor multiples of 4 groups


def test_fragmentation_puts_expandable_segments_first():
    scn = _scenario(Layout("fsdp:optim_grads_params", gpus=8, meta_init=True))
    plans = search(scn, verdict="fragmentation")
    assert plans[0].overrides[0].key == "env.PYTORCH_CUDA_ALLOC_CONF"
    assert plans[0].overrides[0].value == "expandable_segments:True"
    assert "nccl_ub" in plans[0].cost


def test_smaller_micro_batch_and_recompute_cut_activations():
    work = Workload(8, 8192)
    full = activation_bytes(LLAMA_8B, work)
    assert activation_bytes(LLAMA_8B, Workload(4, 8192)) < full
    assert activation_bytes(LLAMA_8B, Workload(8, 8192, recompute="full", recompute_num_layers=1)) < full / 5
    assert activation_bytes(LLAMA_8B, Workload(8, 8192, sequence_parallel=True), tp=4) < full / 3
    assert activation_bytes(LLAMA_8B, work, cp=2) < full * 0.55


def test_options_are_proven_by_replay_and_extended_with_the_checkpoint_format():
    view = apply_defaults(ConfigView())
    view.set("checkpoint.save", "/ckpt", "file:test")
    proof = prove(view, [Override("ddp.use_megatron_fsdp", True)])
    assert proof.valid is True
    assert any(o.key == "checkpoint.ckpt_format" and o.value == "fsdp_dtensor" for o in proof.overrides)


def _b042_view() -> ConfigView:
    """Values of ../shared/real_logs/b042_first_iter_oom.log's configuration summary (Bridge 0.4.2, core 0.17.1)."""
    view = ConfigView(framework="megatron-bridge", version="0.4.2", mcore_version="0.17.1")
    for key, value in {
        "model.num_layers": 8, "model.hidden_size": 4096, "model.ffn_hidden_size": 14336,
        "model.num_attention_heads": 32, "model.num_query_groups": 32, "model.kv_channels": 128,
        "model.vocab_size": 32000, "model.seq_length": 8192, "model.bf16": True, "train.micro_batch_size": 256,
        "train.global_batch_size": 256, "ddp.use_megatron_fsdp": True, "ddp.grad_reduce_in_fp32": True,
        "ddp.data_parallel_sharding_strategy": "optim_grads_params", "ddp.use_distributed_optimizer": True,
        "launch.world_size": 1,
    }.items():
        view.set(key, value, "log:1")
    return apply_defaults(view)


def test_first_iteration_oom_of_b042_is_activations_and_smaller_micro_batches_fit():
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 56.00 GiB. GPU 0 has a total capacity of "
           "139.80 GiB of which 26.65 GiB is free. Including non-PyTorch memory, this process has 113.14 GiB memory "
           "in use. Of the allocated memory 112.00 GiB is allocated by PyTorch, and 1.97 MiB is reserved by PyTorch "
           "but unallocated.")
    finding = Finding(rule="OOM", name="oom", title="t", category="cuda_oom", phase="first_iteration",
                      severity="error", role="root", confidence=0.9, evidence=[Evidence("b042.log", 308, oom)])
    mem = run(Report(findings=[finding], root_cause=0), _b042_view(), None)
    assert mem.verdict == "activations"
    assert mem.params_source == "config"
    fitting = [o for o in mem.options if o.fits]
    assert fitting and all(o.valid is not False for o in fitting)
    mbs = [dict((x.key, x.value) for x in o.overrides).get("train.micro_batch_size") for o in fitting]
    assert any(m is not None and m < 256 for m in mbs)
    for o in fitting:
        assert o.activation_bytes < mem.current.activation_bytes


def test_unknown_shape_still_gives_strategy_and_gpu_options_from_the_log_count():
    scn = Scenario(None, Layout("ddp", gpus=1), None, gpu_by_name("h200").capacity_bytes, log_params=20 * 10**9)
    plans = search(scn)
    assert plans and all(p.layout.tp == 1 and p.layout.pp == 1 for p in plans)
    assert any(p.fits and p.layout.gpus > 1 for p in plans)


@pytest.mark.parametrize("strategy", ["ddp", "distributed_optimizer", "fsdp:optim_grads_params"])
def test_more_gpus_never_increase_per_gpu_state(strategy):
    small = evaluate(_scenario(Layout(strategy, gpus=8)), "", [], Layout(strategy, gpus=8), None, "", 0)
    big = evaluate(_scenario(Layout(strategy, gpus=64)), "", [], Layout(strategy, gpus=64), None, "", 0)
    assert big.state.total <= small.state.total


def _oom_finding(text: str, phase: str, frames: list[str] = ()) -> Report:
    evidence = [Evidence("x.log", i + 1, t) for i, t in enumerate([*frames, text])]
    return Report(findings=[Finding(rule="OOM", name="oom", title="t", category="cuda_oom", phase=phase,
                                    severity="error", role="root", confidence=0.9, evidence=evidence)], root_cause=0)


FRAG = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 3 has a total capacity of "
        "79.10 GiB of which 301.06 MiB is free. Including non-PyTorch memory, this process has 78.79 GiB memory in "
        "use. Of the allocated memory 56.34 GiB is allocated by PyTorch, and 21.73 GiB is reserved by PyTorch but "
        "unallocated.")


def test_fragmentation_without_any_config_still_recommends_expandable_segments():
    mem = run(_oom_finding(FRAG, "training"), None, None)
    assert mem.verdict == "fragmentation"
    assert "expandable_segments:True" in mem.explanation
    assert mem.options[0].overrides == [Override("env.PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")]


def test_parameter_count_inferred_from_ddp_grad_buffer_request():
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 30.10 GiB. GPU 0 has a total capacity of "
           "79.10 GiB of which 12.02 GiB is free. Including non-PyTorch memory, this process has 67.07 GiB memory in "
           "use. Of the allocated memory 66.20 GiB is allocated by PyTorch, and 12.00 MiB is reserved by PyTorch but "
           "unallocated.")
    frames = ['  File "/opt/megatron/core/distributed/distributed_data_parallel.py", line 200, in '
              '_allocate_buffers_for_parameters']
    mem = run(_oom_finding(oom, "dp_wrap", frames), None, None)
    assert mem.params == pytest.approx(30.10 * GIB / 4, rel=1e-3)
    assert "inferred from the request" in mem.notes[0]
    assert mem.verdict == "capacity"
    assert any(o.fits for o in mem.options)
    # without the frames that identify the buffer, no count is invented
    assert run(_oom_finding(oom, "dp_wrap"), None, None).params is None


def test_split_combinations_respect_divisibility_and_stay_bounded():
    from diagnose.explain.memory.options import split_combinations, valid_splits

    shape = ModelShape(num_layers=30, hidden_size=6144, ffn_hidden_size=16384, num_attention_heads=48,
                       num_query_groups=8, vocab_size=128256, seq_length=4096, gated_linear_unit=True)
    scn = Scenario(shape, Layout("distributed_optimizer", gpus=48, grad_bytes=4), Workload(1, 4096), H100,
                   global_batch_size=96)
    splits = valid_splits(scn)
    assert (8, 2) in splits and (4, 3) in splits and (2, 5) not in splits  # 48 % 10 != 0
    assert all(48 % t == 0 and (8 % t == 0 or t % 8 == 0) and 30 % p == 0 and 48 % (t * p) == 0 for t, p in splits)
    assert (3, 1) not in splits and (6, 1) not in splits  # 3 and 6 divide the heads but not the 8 query groups
    combos = split_combinations(scn)
    assert len({(c.layout.tp, c.layout.pp) for c in combos}) == len(combos) <= len(splits)
    for c in combos:
        plan = evaluate(scn, c.label, [], c.layout, c.workload, c.cost, c.cost_rank)
        assert plan is not None  # the cheapest fitting combination of its split, or its smallest when none fits
        if 96 % c.layout.dp:
            assert "changes train.global_batch_size" in c.cost


def test_split_combinations_keep_the_expert_mesh_whole():
    from diagnose.explain.memory.options import valid_splits

    shape = ModelShape(num_layers=16, hidden_size=2048, num_attention_heads=16, num_query_groups=4, vocab_size=32000,
                       num_moe_experts=8)
    scn = Scenario(shape, Layout("distributed_optimizer", gpus=16, ep=8), Workload(1, 4096), H100)
    splits = valid_splits(scn)
    assert splits and all((16 // p) % (t * 8) == 0 for t, p in splits)
    assert (4, 1) not in splits and (1, 4) not in splits and (2, 1) in splits


def test_distributed_optimizer_inferred_from_the_step_frames():
    # QA report #4: the optimizer-step OOM inside distrib_optimizer.py runs the distributed optimizer already; the
    # memory model must not model DDP nor offer "distributed optimizer" as a change
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 3 has a total capacity of "
           "79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in "
           "use. Of the allocated memory 77.20 GiB is allocated by PyTorch, and 20.00 MiB is reserved by PyTorch but "
           "unallocated.")
    frames = ['  File "/workspace/Megatron-LM/megatron/core/optimizer/distrib_optimizer.py", line 1503, in step']
    report = _oom_finding(oom, "optimizer_step", frames)
    report.findings[0].facts["num_parameters"] = 5 * 10**9
    mem = run(report, None, None)
    assert mem.current.strategy == "distributed_optimizer"
    assert any("distrib_optimizer.py" in n for n in mem.notes)
    assert not any(o.strategy == "distributed_optimizer" and o.gpus == mem.current.gpus
                   and not o.overrides[0].key.startswith("optimizer.optimizer_cpu") for o in mem.options)
