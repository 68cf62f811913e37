"""The built-in catalogue's content: size, coverage of every category, the rules the users asked for, order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import regex

from diagnose.match.rules import load_catalogue
from diagnose.model import CATEGORIES

CATALOGUE = load_catalogue()
RULES = CATALOGUE.rules
PREFIX_FILE = {
    "PY": "00_generic", "CA": "00_generic", "LA": "10_launcher", "IM": "15_import_version",
    "CV": "20_config_validation", "MB": "30_megatron_fsdp", "OOM": "40_oom", "NC": "50_nccl", "CK": "60_checkpoint",
    "SL": "70_slurm", "SJ": "75_slurm_job", "SN": "76_slurm_node",
    "HW": "80_hardware", "NU": "85_numerics", "DA": "90_data", "EC": "99_echoes",
}
# Top-level ConfigContainer fields of Megatron-Bridge (megatron-bridge.md §1.5) a fix may override.
CONFIG_SECTIONS = {
    "model", "ddp", "dist", "optimizer", "checkpoint", "train", "dataset", "scheduler", "validation", "logger",
    "tokenizer", "rng", "rerun_state_machine", "comm_overlap", "profiling", "peft", "ft", "straggler",
}
TOP_LEVEL_KEYS = {"mixed_precision"}


def test_loads_without_errors():
    assert CATALOGUE.errors == []


def test_size():
    assert len(RULES) >= 60


def test_every_category_has_a_rule():
    present = {r.category for r in RULES}
    assert set(CATEGORIES) <= present, set(CATEGORIES) - present


def test_codes_follow_their_file():
    for r in RULES:
        prefix = re.match(r"[A-Z]+", r.code).group(0)
        assert Path(r.source).stem == PREFIX_FILE[prefix], f"{r.code} is in {Path(r.source).name}"


def test_fix_override_keys_are_bridge_config_paths():
    for r in RULES:
        for o in r.fix.overrides:
            section = o.key.split(".")[0]
            assert o.key in TOP_LEVEL_KEYS or (section in CONFIG_SECTIONS and "." in o.key), f"{r.code}: {o.key}"


def test_fix_values_are_real_values():
    """TOML has no null: a "null"/"None" string would be applied literally by the replay."""
    for r in RULES:
        for o in r.fix.overrides:
            # ("none" in lower case is a real value: model.cuda_graph_impl="none")
            assert not (isinstance(o.value, str) and o.value.strip() in {"null", "Null", "NULL", "None", "~", ""}), r.code


def test_one_slurm_job_rule_per_outcome():
    from diagnose.match.rules import SLURM_OUTCOMES

    outcomes = [r.slurm_outcome for r in RULES if r.input == "slurm_job"]
    assert sorted(outcomes) == sorted(SLURM_OUTCOMES)
    assert all(r.code.startswith("SJ") and not r.patterns for r in RULES if r.input == "slurm_job")


def test_no_builtin_code_is_retired_or_in_the_user_range():
    from diagnose.match.lint import retired_codes

    retired = retired_codes()
    assert "ZZ001" in retired  # the file is read
    assert not [r.code for r in RULES if r.code in retired or r.code.startswith("U")]


def test_generic_rules_come_first():
    """Last match wins, so the catch-alls must be ordered before every specific rule."""
    generic = [r.order for r in RULES if r.code.startswith(("PY", "CA"))]
    specific = [r.order for r in RULES if not r.code.startswith(("PY", "CA"))]
    assert max(generic) < min(specific)


def _regex_matches(text: str) -> list[str]:
    """Codes whose regex matches ``text`` (one line), in catalogue order, context ignored."""
    return [r.code for r in RULES for p in r.patterns if p.anchor in text and regex.search(p.regex, text)]


@pytest.mark.parametrize(
    "line, code",
    [
        ("TypeError: TorchFullyShardedDataParallel.__init__() got an unexpected keyword argument 'pg_collection'", "MB101"),
        ("AssertionError: Megatron FSDP only supports fsdp_dtensor checkpoint format", "MB110"),
        ("AssertionError: Megatron-FSDP requires the fsdp_dtensor checkpointing format!", "MB111"),
        ("AssertionError: Megatron-FSDP requires the `fsdp_dtensor` checkpointing format.", "MB111"),
        ("ValueError: Using use_megatron_fsdp and use_torch_fsdp2 at the same time is not supported.", "MB102"),
        ("ValueError: use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive.", "MB103"),
        ("AssertionError: fsdp_dtensor checkpoint format only supports Megatron FSDP", "MB112"),
        ("AssertionError: FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.", "MB120"),
        ("AssertionError: Using tensor model parallelism or context parallelism require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1", "CV018"),
        ("ValueError: Currently there is no support for Pipeline parallelism with CPU offloading", "CV020"),
        ("ValueError: CPU offloading does not work when activation recomputation is enabled", "CV021"),
        ("AssertionError: use_tp_pp_dp_mapping is not supported with Megatron FSDP", "MB130"),
        ("include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'", "OOM010"),
        ("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60", "NC010"),
        ("slurmstepd: error: *** JOB 2 ON vm CANCELLED AT 2026-11-29T15:37:15 DUE TO TIME LIMIT ***", "SL003"),
        ("slurmstepd: error: *** JOB 2 ON vm CANCELLED AT 2026-11-29T15:37:15 DUE TO PREEMPTION ***", "SL004"),
        ("slurmstepd: error: *** JOB 2 ON vm CANCELLED AT 2026-11-29T15:37:15 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***", "SL005"),
        ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=7.0. Some of your processes may have been killed by the cgroup out-of-memory handler.", "SL007"),
        ("slurmstepd: error: Detected 2 oom_kill events in StepId=7.batch. Some of the step tasks have been OOM Killed.", "SL007"),
        ("srun: error: node01: task 3: Exited with exit code 1", "SL010"),
        ("srun: error: node01: tasks 0-7: Killed", "SL011"),
        ("RuntimeError: The server socket has failed to listen on any local network address. useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use", "LA010"),
        ("RuntimeError: CUDA error: invalid device ordinal", "LA011"),
        ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "LA001"),
        ("Sending process 21035 closing signal SIGTERM", "LA003"),
        ("Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources.", "LA004"),
        ("ModuleNotFoundError: No module named 'transformer_engine'", "IM010"),
        ("ImportError: /x/transformer_engine_torch.cpython-310-x86_64-linux-gnu.so: undefined symbol: _ZN3c10abc", "IM011"),
        ("ModuleNotFoundError: No module named 'apex'", "IM020"),
        ("ModuleNotFoundError: No module named 'flash_attn'", "IM030"),
        ("ValueError: num_attention_heads (7) must be a multiple of tensor_model_parallel_size (2).", "CV010"),
        ("ValueError: num_query_groups (6) must be a multiple or divisor of tensor_model_parallel_size (4).", "CV011"),
        ("ValueError: number of middle layers: 30 must be divisible by middle pipeline_model_parallel_size 4", "CV012"),
        ("RuntimeError: world_size (12) is not divisible by 8", "CV013"),
        ("AssertionError: global batch size (100) is not divisible by micro batch size (2) times data parallel size (8)", "CV014"),
        ("AssertionError: Sequence length must be divisible by 2 * context parallel size if context parallel is used.", "CV015"),
        ("ValueError: Cannot use sequence parallelism without tensor parallelism", "CV016"),
        ("ValueError: When using pipeline parallelism, pipeline_dtype must be specified", "CV017"),
        ("RuntimeError: Rank 0, node n1, device 0, iteration 9: Unexpected result nan (message='found NaN in local forward loss calculation')", "NU002"),
        ("AssertionError: One or both of the .idx and .bin files cannot be found at the path prefix /data/x", "DA001"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "HW001"),
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.", "HW004"),
        ("ValueError: Checkpoint format 'fsdp_dtensor' from config differs from inferred format 'torch_dist' for /c.", "CK001"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which 1.00 MiB is free. Of the allocated memory 60.00 GiB is allocated by PyTorch, and 18.00 GiB is reserved by PyTorch but unallocated.", "OOM190"),
    ],
)
def test_required_message_is_recognised(line, code):
    """The line alone (no traceback around it) gives exactly this rule: the last matching rule wins."""
    from diagnose.match import match_text

    assert code in _regex_matches(line)
    found = [f.rule for f in match_text(line, CATALOGUE, backend="python").findings]
    assert found == [code], f"{line!r} gave {found} (regexes matching: {_regex_matches(line)})"


@pytest.mark.parametrize(
    "frame, phase, code",
    [
        ('File "/m/bridge/models/model_provider.py", line 590, in get_model', "model_build", "OOM101"),
        ('File "/m/core/distributed/distributed_data_parallel.py", line 200, in _allocate_buffers_for_parameters', "dp_wrap", "OOM102"),
        ('File "/m/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py", line 420, in _init_fsdp_param_and_grad_buffer', "dp_wrap", "OOM102"),
        ('File "/m/core/pipeline_parallel/schedules.py", line 500, in forward_backward_no_pipelining', "first_iteration", "OOM103"),
        ('File "/usr/lib/python3/dist-packages/torch/optim/adam.py", line 160, in _init_group', "optimizer_step", "OOM105"),
        ('File "/m/bridge/training/checkpointing.py", line 1200, in save_checkpoint', "checkpoint_save", "OOM107"),
        ('File "/m/bridge/training/checkpointing.py", line 3200, in load_checkpoint', "checkpoint_load", "OOM108"),
    ],
)
def test_cuda_oom_is_told_apart_by_where_it_happened(frame, phase, code):
    """The innermost frame decides, even though every Megatron-Bridge traceback starts in
    ``pretrain(config=cfg, forward_step_func=forward_step)`` (a first-iteration word in the wrap's traceback)."""
    from diagnose.match import match_text

    text = "\n".join(["Traceback (most recent call last):", '  File "/w/pretrain_gpt.py", line 40, in <module>',
                      "    pretrain(config=cfg, forward_step_func=forward_step)", "  " + frame, "    x = torch.empty(n)",
                      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.00 GiB is free."])
    root = match_text(text, CATALOGUE, backend="python").root
    assert (root.rule, root.phase, root.category) == (code, phase, "cuda_oom")


def test_every_rule_is_documented():
    """`rules show` has something to say for every rule: doc, versions, a fix summary, a title."""
    for r in RULES:
        assert r.doc and r.versions and r.fix.summary and r.title, r.code
