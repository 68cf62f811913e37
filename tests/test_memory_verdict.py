"""OOM numbers (from the engine's facts, or the message itself) and the verdict."""

from __future__ import annotations

import pytest

from diagnose.explain.memory.gpus import GIB, gpu_by_name, parse_gpu_memory
from diagnose.explain.memory.verdict import OomNumbers, decide, fragmented, from_facts, from_text
from diagnose.model import DiagnoseError
from diagnose.units import parse_size

# the OOM line of ../shared/real_logs/ddp_wrap_oom.log (torch 2.11, H200), without its "[rank0]: " prefix
REAL_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 135.33 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 3.80 GiB is free. Including non-PyTorch memory, this process has 136.00 GiB memory in use. "
    "Of the allocated memory 135.33 GiB is allocated by PyTorch, and 1.47 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF="
    "expandable_segments:True to avoid fragmentation."
)
OLD_OOM = (
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity; 77.23 GiB "
    "already allocated; 3.06 MiB free; 78.01 GiB reserved in total by PyTorch) If reserved memory is >> allocated"
)


def test_numbers_from_the_new_message():
    n = from_text(REAL_OOM)
    assert n.requested == pytest.approx(135.33 * GIB, rel=1e-4)
    assert n.capacity == pytest.approx(139.80 * GIB, rel=1e-4)
    assert n.free == pytest.approx(3.80 * GIB, rel=1e-3)
    assert n.in_use == pytest.approx(136.00 * GIB, rel=1e-4)
    assert n.reserved_unallocated == pytest.approx(1.47 * 2**20, rel=1e-2)


def test_numbers_from_the_old_message():
    n = from_text(OLD_OOM)
    assert n.capacity == pytest.approx(79.15 * GIB, rel=1e-4)
    assert n.reserved_unallocated == pytest.approx((78.01 - 77.23) * GIB, rel=1e-3)


def test_text_is_read_by_the_one_oom_parser():
    """verdict has no OOM regex of its own (issue 17): every wording normalize's parser knows is read, the pre-1.4
    "cached" one and ROCm's HIP included, with the same numbers as the parser's facts."""
    from diagnose.normalize.facts.oom import parse_cuda_oom

    cached = OLD_OOM.replace("reserved in total by PyTorch)", "cached)")
    n = from_text(cached)
    assert n.known and n.reserved_unallocated == pytest.approx((78.01 - 77.23) * GIB, rel=1e-3)
    hip = from_text(REAL_OOM.replace("CUDA out of memory", "HIP out of memory"))
    facts = parse_cuda_oom(REAL_OOM)
    assert facts is not None
    assert (hip.requested, hip.capacity, hip.free) == (facts["requested_bytes"], facts["total_bytes"], facts["free_bytes"])
    assert not from_text("Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB").known


def test_engine_facts_are_read_by_their_names():
    from diagnose.normalize.facts.oom import parse_cuda_oom

    facts = parse_cuda_oom(REAL_OOM)
    assert facts is not None
    n = from_facts(facts)
    assert n == from_text(REAL_OOM)


def test_missing_facts_are_filled_from_the_evidence_text():
    n = from_facts({"requested_bytes": 10}, [REAL_OOM])
    assert n.requested == 10 and n.capacity == pytest.approx(139.80 * GIB, rel=1e-4)


def test_fragmentation_when_cached_free_blocks_would_have_held_the_request():
    n = OomNumbers(requested=4 * GIB, capacity=80 * GIB, free=1 * GIB, in_use=79 * GIB, allocated=70 * GIB,
                   reserved_unallocated=8 * GIB)
    assert fragmented(n)
    assert decide(n, "training", 40 * GIB, None, 20 * GIB, None) == "fragmentation"
    assert not fragmented(from_text(REAL_OOM))


def test_capacity_when_state_cannot_fit():
    n = from_text(REAL_OOM)
    assert decide(n, "dp_wrap", 609 * GIB, 270 * GIB, None, None) == "capacity"


def test_activations_when_state_fits_and_activations_do_not():
    n = OomNumbers(requested=56 * GIB, capacity=int(139.8 * GIB), free=26 * GIB, in_use=113 * GIB,
                   allocated=112 * GIB, reserved_unallocated=2 << 20)
    assert decide(n, "first_iteration", 30 * GIB, None, 2900 * GIB, None) == "activations"


def test_transient_peak_at_the_first_optimizer_step_or_checkpoint():
    n = OomNumbers(requested=10 * GIB, capacity=80 * GIB, free=2 * GIB, allocated=70 * GIB, reserved_unallocated=0)
    assert decide(n, "optimizer_step", 60 * GIB, 85 * GIB, None, None) == "transient_peak"
    assert decide(n, "checkpoint_save", 60 * GIB, None, None, None) == "transient_peak"


def test_unknown_without_numbers():
    assert decide(OomNumbers(), "training", None, None, None, None) == "unknown"


@pytest.mark.parametrize("text, expected", [("80GiB", 80 * GIB), ("80G", 80 * GIB), ("141GB", 141 * 10**9),
                                            ("139.80 GiB", int(round(139.8 * GIB))), ("1024", 1024)])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "eighty", "80 parsecs", "-5GiB"])
def test_bad_sizes_are_one_line_errors(bad):
    assert parse_size(bad) is None
    with pytest.raises(DiagnoseError, match="^--gpu-memory: not a memory size: "):
        parse_gpu_memory(bad)


def test_gpu_table():
    assert gpu_by_name("H200").capacity_bytes == pytest.approx(139.80 * GIB, rel=1e-4)
    assert gpu_by_name("h100").name == "h100-80gb"
    with pytest.raises(DiagnoseError):
        gpu_by_name("h9000")


def test_a_little_slack_on_a_full_gpu_is_not_fragmentation():
    # b062_adam_step_oom: 96 MiB request, 0.35 GiB cached-unallocated of 139.8 GiB, Adam state does not fit
    n = OomNumbers(requested=96 << 20, capacity=int(139.8 * GIB), free=10 << 20, in_use=int(139.7 * GIB),
                   allocated=int(137.02 * GIB), reserved_unallocated=int(0.35 * GIB))
    assert not fragmented(n)
    assert decide(n, "optimizer_step", 164 * GIB, None, None, None) == "capacity"


def test_state_that_cannot_fit_wins_over_fragmentation():
    n = OomNumbers(requested=GIB, capacity=80 * GIB, free=GIB, allocated=60 * GIB, reserved_unallocated=10 * GIB)
    assert fragmented(n)
    assert decide(n, "dp_wrap", 200 * GIB, None, None, None) == "capacity"


# EasyEdit #563 (torch 2.1 'capacty' typo): one tensor bigger than the whole GPU (QA report #7)
TOO_BIG_OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 355.43 GiB. GPU 0 has a total capacty of "
    "79.32 GiB of which 18.06 GiB is free. Including non-PyTorch memory, this process has 61.25 GiB memory in use. "
    "Of the allocated memory 52.51 GiB is allocated by PyTorch, and 8.25 GiB is reserved by PyTorch but unallocated."
)


@pytest.mark.parametrize("phase", ["unknown", "first_iteration", "training", "dp_wrap", "optimizer_step"])
def test_a_request_larger_than_the_gpu_is_capacity(phase):
    n = from_text(TOO_BIG_OOM)
    assert n.requested > n.capacity
    assert decide(n, phase, None, None, None, None) == "capacity"
    assert decide(n, phase, 10 * GIB, 20 * GIB, 5 * GIB, None) == "capacity"


def test_a_request_larger_than_the_gpu_is_explained_through_the_pipeline():
    import os
    import tempfile

    from diagnose.pipeline import AnalyzeOptions, analyze
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "too_big.log")
        with open(path, "w") as fh:
            fh.write(TOO_BIG_OOM + "\n")
        mem = analyze([path], AnalyzeOptions()).memory
    assert mem.verdict == "capacity"
    assert "larger than the whole GPU" in mem.explanation
    assert "expandable_segments" in mem.explanation  # says it will not help
    assert mem.options == []  # no allocator option offered: it cannot help


def test_numbers_only_capacity_at_the_optimizer_step_says_why():
    from pathlib import Path

    from diagnose.pipeline import AnalyzeOptions, analyze

    log = Path(__file__).resolve().parents[1] / "sample_logs" / "optimizer_step_oom.log"
    mem = analyze([str(log)], AnalyzeOptions()).memory
    assert mem.verdict == "capacity" and mem.phase == "optimizer_step"
    assert "Adam" in mem.explanation and "first optimizer step" in mem.explanation


# QA report (new #2): an OOM while saving a checkpoint after 500 trained iterations, no config but the parameter count
CKPT_SAVE_OOM = ' > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 8030261248\n [2025-01-02 03:04:05] iteration      500/  500000 | consumed samples:       256000 | elapsed time per iteration (ms): 1234.6 | learning rate: 1.500000E-04 | global batch size:   512 | lm loss: 3.123456E+00 | loss scale: 1.0 | grad norm: 1.210 | number of skipped iterations:   0 | number of nan iterations:   0 |\n[2025-01-02 03:04:06.000000] saving checkpoint at iteration     500 to /ckpt in fsdp_dtensor format\n[rank0]: Traceback (most recent call last):\n[rank0]:   File "/opt/Megatron-Bridge/src/megatron/bridge/training/train.py", line 400, in train\n[rank0]:     save_checkpoint_and_time(\n[rank0]:   File "/opt/Megatron-Bridge/src/megatron/bridge/training/checkpointing.py", line 1174, in save_checkpoint\n[rank0]:     state_dict = generate_state_dict(\n[rank0]:   File "/opt/megatron/core/optimizer/distrib_optimizer.py", line 1100, in sharded_state_dict\n[rank0]:     tensor = torch.empty_like(main_param)\n[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.74 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 77.98 GiB memory in use. Of the allocated memory 75.50 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n'


def test_checkpoint_save_oom_after_training_is_a_transient_peak_not_capacity(tmp_path):
    from diagnose.pipeline import AnalyzeOptions, analyze

    path = tmp_path / "ckpt_save_oom.log"
    path.write_text(CKPT_SAVE_OOM)
    mem = analyze([str(path)], AnalyzeOptions()).memory
    assert mem.phase == "checkpoint_save"
    assert mem.verdict == "transient_peak"
    assert mem.current.strategy == "distributed_optimizer"  # from the distrib_optimizer.py frame
    assert mem.current.dp_known is False
    assert "cannot fit whatever the batch" not in mem.explanation
    assert "on 1 GPU" not in mem.explanation and "had trained" in mem.explanation
    assert any("data-parallel size is unknown" in n for n in mem.notes)
    assert not any(o.fits and o.gpus > 1 for o in mem.options)  # no GPU counts sized from a guessed DP


_TRAIN_OOM = [
    "Traceback (most recent call last):",
    '  File "/opt/Megatron-LM/megatron/core/transformer/transformer_layer.py", line 250, in forward',
    "    hidden_states = self.mlp(hidden_states)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 1 has a total capacity of 79.11 GiB "
    "of which 2.31 GiB is free. Including non-PyTorch memory, this process has 76.79 GiB memory in use. Of the "
    "allocated memory 70.02 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated.",
]
_CFG = ("model:\n  num_layers: 32\n  hidden_size: 4096\n  ffn_hidden_size: 14336\n  num_attention_heads: 32\n"
        "  num_query_groups: 8\n  vocab_size: 128256\n  seq_length: 8192\n  gated_linear_unit: true\n"
        "  tensor_model_parallel_size: 2\n  pipeline_model_parallel_size: 2\ntrain:\n  micro_batch_size: 1\n"
        "  global_batch_size: 512\nddp:\n  use_distributed_optimizer: true\n  grad_reduce_in_fp32: true\n"
        "optimizer:\n  use_distributed_optimizer: true\n  bf16: true\n")


@pytest.mark.parametrize("files", [64, 1])
def test_dp_size_from_the_ranks_of_per_rank_files_or_said_to_be_unknown(tmp_path, files):
    """QA2 #6: 64 per-rank files with TP 2 x PP 2 in the config were modelled on 4 GPUs (DP 1, the distributed
    optimizer unsharded) while current.dp_known said true; one file gives no world size: dp_known false, a note."""
    from diagnose.pipeline import AnalyzeOptions, analyze

    (tmp_path / "cfg.yaml").write_text(_CFG)
    logs = tmp_path / "logs"
    logs.mkdir()
    for r in range(files):
        lines = _TRAIN_OOM if r == files - 1 else ["> building model ..."]
        (logs / f"rank_{r}.log").write_text("\n".join(lines) + "\n")
    mem = analyze([str(logs)], AnalyzeOptions(config_path=str(tmp_path / "cfg.yaml"))).memory
    current = mem.current
    if files == 64:
        assert (current.gpus, current.dp, current.dp_known) == (64, 16, True)
        assert any("world size 64 from the highest rank" in n for n in mem.notes)
    else:
        assert (current.dp, current.dp_known) == (1, False)
        assert any("data-parallel size is unknown" in n for n in mem.notes)
