"""QA round 9 (docs/qa-report-9.md): a hostile new user of the whole product, from zero.

Each test failed on the tree before its fix. Output tests run the real command line (``python -m diagnose``) as a
subprocess on small logs shaped as the corpus logs read; catalogue tests read ``load_catalogue()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cli_run import ROOT, run, write

# Megatron-LM 0.9+ world line: an encoder's sizes follow the job's own
MLM_WORLD = ("using world size: 8, data-parallel size: 2, context-parallel size: 1, hierarchical context-parallel "
             "sizes: None, tensor-model-parallel size: 2, encoder-tensor-model-parallel size: 0, "
             "pipeline-model-parallel size: 2, encoder-pipeline-model-parallel size: 0\n")
MLM_FAILURE = """\
------------------------ arguments ------------------------
  num_layers ...................................... 24
  hidden_size ..................................... 4096
  num_attention_heads ............................. 32
  sequence_parallel ............................... True
  recompute_granularity ........................... full
  recompute_method ................................ uniform
  recompute_num_layers ............................ 5
-------------------- end of arguments ---------------------
[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 236, in forward_step
[rank0]:   File "/workspace/Megatron-LM/megatron/core/transformer/transformer_block.py", line 473, in _checkpointed_forward
[rank0]:   File "/workspace/Megatron-LM/megatron/core/transformer/transformer_block.py", line 372, in _get_layer
[rank0]:     return self.layers[layer_number]
[rank0]:   File "/usr/local/lib/python3.12/dist-packages/torch/nn/modules/container.py", line 316, in _get_abs_string_index
[rank0]:     raise IndexError(f"index {idx} is out of range")
[rank0]: IndexError: index 12 is out of range
"""


def test_megatron_lm_world_line_reads_the_jobs_tp_not_the_encoders(tmp_path: Path) -> None:
    """cd-megatron-recompute-...: the world line's ``encoder-tensor-model-parallel size: 0`` was read as the job's TP,
    so the replay 'found' TP 0 and told a TP 2 job to run on TP 1 without sequence parallelism."""
    log = write(tmp_path, "mlm.log", MLM_WORLD + MLM_FAILURE)
    report = json.loads(run("analyze", "--format", "json", str(log)).stdout)
    values = report["config"]["values"]
    assert values["model.tensor_model_parallel_size"]["value"] == 2
    assert values["model.pipeline_model_parallel_size"]["value"] == 2
    replay = report.get("replay") or {}
    assert not any("model.tensor_model_parallel_size" in v["keys"] for v in replay.get("violations", []))
    assert "--tensor-model-parallel-size 1" not in run("analyze", str(log)).stdout


NCCL_DOCKER = """\
3f9a1c2be71d:88:88 [0] NCCL INFO Bootstrap : Using [0]eth0:172.17.0.2<0>
3f9a1c2be71d:88:88 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]
3f9a1c2be71d:88:88 [0] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>
3f9a1c2be71d:88:127 [0] NCCL INFO Call to connect returned Connection refused, retrying
{connect_warn}3f9a1c2be71d:88:127 [0] NCCL INFO bootstrap.cc:95 -> 2
Traceback (most recent call last):
  File "train.py", line 63, in main
    dist.broadcast(ps, 0)
  File "/opt/conda/lib/python3.6/site-packages/torch/distributed/distributed_c10d.py", line 842, in broadcast
    work = _default_pg.broadcast([tensor], opts)
RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:518, unhandled system error, NCCL version 2.4.8
"""
CONNECT_WARN = "3f9a1c2be71d:88:127 [0] include/socket.h:403 NCCL WARN Connect to 172.17.0.2<41729> failed : " \
               "Connection refused\n"


def _fix_steps(report: dict) -> list[str]:
    return report["findings"][report["root_cause"]]["fix"]["steps"]


def test_the_nccl_warn_a_fix_points_at_is_not_ncclS_infiniband_probe(tmp_path: Path) -> None:
    """cc-arcface-torch-two-node-...: 'its first NCCL WARN (line 5) names what NCCL tried and failed' pointed at
    'Failed to open libibverbs.so[.1]', NCCL's probe on a host without InfiniBand (it then uses sockets), not at the
    refused connect that was the failure."""
    log = write(tmp_path, "nccl.log", NCCL_DOCKER.format(connect_warn=CONNECT_WARN))
    report = json.loads(run("analyze", "--format", "json", str(log)).stdout)
    steps = " ".join(_fix_steps(report))
    connect = 1 + NCCL_DOCKER.format(connect_warn=CONNECT_WARN).splitlines().index(CONNECT_WARN.strip())
    assert f"(line {connect})" in steps
    assert "(line 2)" not in steps


def test_a_log_whose_only_nccl_warn_is_the_probe_is_not_told_it_names_the_failure(tmp_path: Path) -> None:
    log = write(tmp_path, "nccl.log", NCCL_DOCKER.format(connect_warn=""))
    report = json.loads(run("analyze", "--format", "json", str(log)).stdout)
    steps = _fix_steps(report)
    assert not any("names what NCCL tried and failed" in s and "(line 2)" in s for s in steps)
    assert not any(e["name"] == "NCCL_DEBUG" for e in report["findings"][report["root_cause"]]["fix"]["env"])


ONE_RANK_OOM = """\
Traceback (most recent call last):
  File "/home/u/train.py", line 88, in <module>
    loss.backward()
  File "/opt/conda/lib/python3.10/site-packages/torch/_tensor.py", line 487, in backward
torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 500.00 MiB (GPU 0; 47.54 GiB total capacity; 45.12 GiB already allocated; 315.06 MiB free; 45.20 GiB reserved in total by PyTorch)
"""


def test_a_conditional_oom_step_does_not_read_as_a_fact_about_this_log(tmp_path: Path) -> None:
    """cc-colossalai-coati-ppo-... (one rank, one GPU): the Fix said 'Every rank's message names the same GPU (GPU 0
    on rank 2): the ranks share one device', a claim about a log whose only message came from one rank."""
    log = write(tmp_path, "oom.log", ONE_RANK_OOM)
    report = json.loads(run("analyze", "--format", "json", str(log)).stdout)
    fix = report["findings"][report["root_cause"]]["fix"]
    said = [s for s in fix["steps"] + fix.get("other_stacks", []) if "same GPU" in s]
    assert said, "the shared-device step is still offered"
    assert all(s.startswith(("If ", "When ")) for s in said), said
    text = run("analyze", str(log)).stdout
    assert "Every rank's message names the same GPU" not in text


def test_rules_list_piped_prints_one_line_per_rule_with_its_whole_title() -> None:
    """`diagnose rules list | grep watchdog` missed rules: piped, the table was laid out at 80 columns and a title
    was folded onto the next line ('NCCL watchdog tears the' / '... process down'), 1353 lines for 436 rules."""
    from diagnose.match.rules import load_catalogue

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update(PYTHONPATH=str(ROOT), DIAGNOSE_NO_CONFIG="1")
    out = subprocess.run([sys.executable, "-m", "diagnose", "rules", "list"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120).stdout.splitlines()
    rules = load_catalogue().rules
    rows = {line.split()[0]: line for line in out[1:-1]}
    assert len(out) == len(rules) + 2  # the header, a line per rule, the count
    for r in rules:
        assert rows[r.code].rstrip().endswith(r.title), r.code


def test_quiet_keeps_the_warning_that_logs_of_different_jobs_were_read_as_one(tmp_path: Path) -> None:
    """`analyze -q sample_logs/captured` (31 jobs' logs in one folder): the default report ends with the warning
    'they look like logs of different jobs, diagnosed here as one', -q printed one root cause and dropped it."""
    folder = tmp_path / "logs"
    folder.mkdir()
    for name, err in (("a.log", "ValueError: shard 7 is truncated"), ("b.log", "KeyError: 'lm_head.weight'")):
        write(folder, name, f'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n{err}\n')
    default = " ".join(run("analyze", str(folder)).stdout.split())  # a long tmp path moves the wrapping
    assert "different jobs" in default  # the report knows
    quiet = " ".join(run("analyze", "-q", str(folder)).stdout.split())
    assert "different jobs" in quiet


SIZE_MISMATCH = """\
Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/transformers/modeling_utils.py", line 4728, in _load_pretrained_model
    raise RuntimeError(f"Error(s) in loading state_dict for {model.__class__.__name__}:\\n\\t{error_msg}")
RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM:
\tsize mismatch for model.embed_tokens.weight: copying a param with shape torch.Size([65536, 1024]) from checkpoint, the shape in current model is torch.Size([65535, 1024]).
\tsize mismatch for lm_head.weight: copying a param with shape torch.Size([65536, 1024]) from checkpoint, the shape in current model is torch.Size([65535, 1024]).
"""


def test_a_state_dict_size_mismatch_is_not_answered_as_missing_keys(tmp_path: Path) -> None:
    """cc-colossalai-hybrid-tp4-vocab-...: 'Error(s) in loading state_dict' followed only by 'size mismatch for'
    lines was headed 'Checkpoint keys do not match the model', fixed by 'Resume with the model/wrapper that wrote the
    checkpoint', with a Why about fsdp_dtensor checkpoints: nothing said that a tensor's size differed."""
    log = write(tmp_path, "ckpt.log", SIZE_MISMATCH)
    report = json.loads(run("analyze", "--format", "json", str(log)).stdout)
    root = report["findings"][report["root_cause"]]
    said = " ".join([root["title"], root["fix"]["summary"], *root["fix"]["steps"]]).lower()
    assert "size" in root["title"].lower() or "size" in root["fix"]["summary"].lower()
    assert "size mismatch" in said


STORE_TIMEOUT = """\
Traceback (most recent call last):
  File "/root/envs/t/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 3696, in barrier
    work = default_pg.barrier(opts=opts)
RuntimeError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout
"""
SIGILL = """\
[node01:03114] *** Process received signal ***
[node01:03114] Signal: Illegal instruction (4)
[node01:03114] Signal code: Illegal operand (2)
[node01:03114] [ 1] /usr/local/lib/python3.5/dist-packages/horovod/torch/mpi_lib_v2.cpython-35m-x86_64-linux-gnu.so(_ZN7horovod6common13InitializeMPIEv+0x46)[0x7f2ad81c54e6]
[node01:03114] *** End of error message ***
"""


def _root_fix(tmp_path: Path, text: str) -> tuple[str, list[str]]:
    report = json.loads(run("analyze", "--format", "json", str(write(tmp_path, "job.log", text))).stdout)
    root = report["findings"][report["root_cause"]]
    return root["rule"], [root["fix"]["summary"], *root["fix"]["steps"]]


def test_a_store_timeout_fix_names_the_timeout_settings_and_how_to_shorten_rank0s_work(tmp_path: Path) -> None:
    """cc-llamafactory-codellama34b-...: the thread raised --ddp_timeout or tokenized with more workers; the Fix
    said only 'finish that work before the collective or raise the process group's timeout', naming no setting."""
    _, said = _root_fix(tmp_path, STORE_TIMEOUT)
    assert any("ddp_timeout" in s and "init_process_group(timeout=" in s for s in said), said
    assert any("num_proc" in s or "preprocessing_num_workers" in s for s in said), said


def test_an_illegal_instruction_fix_covers_a_prebuilt_wheel_not_only_a_jit_cache(tmp_path: Path) -> None:
    """cc-horovod-mpirun-illegal-instruction-...: a prebuilt Horovod wheel using AVX on a CPU without it; the Fix
    spoke only of a shared JIT build cache (TORCH_EXTENSIONS_DIR) and nodes of one CPU type."""
    rule, said = _root_fix(tmp_path, SIGILL)
    assert rule == "IM160"
    assert any("/proc/cpuinfo" in s and "wheel" in s for s in said), said


TIME_LIMIT = "slurmstepd: error: *** STEP 6629104.0 ON node031 CANCELLED AT 2026-07-08T23:27:31 DUE TO TIME LIMIT ***\n"


def test_a_time_limit_fix_says_how_to_be_warned_before_the_limit(tmp_path: Path) -> None:
    """cd-megatron-bridge-long-run-slices-...: the thread's fix was a signal before the time limit (Slurm --signal
    and the trainer's exit-signal handler) so that each slice saves; the Fix named no way to be warned."""
    rule, said = _root_fix(tmp_path, TIME_LIMIT)
    assert rule == "SL003"
    assert any("--signal=" in s and "exit-signal-handler" in s for s in said), said


FP8_K = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/usr/local/lib/python3.10/dist-packages/transformer_engine/pytorch/module/linear.py", line 92, in forward
[rank0]:     assert_dim_for_fp8_exec(inputmat)
[rank0]:   File "/usr/local/lib/python3.10/dist-packages/transformer_engine/pytorch/utils.py", line 216, in assert_dim_for_fp8_exec
[rank0]:     assert check_dim_for_fp8_exec(tensor), (
[rank0]: AssertionError: Tensor dimensions are not compatible for FP8 execution: (2048 % 8 != 0, 767 % 16 != 0)
"""


def test_an_fp8_shape_fix_covers_the_last_dimension_not_only_the_sequence(tmp_path: Path) -> None:
    """cb-te-fp8-autocast-linear-in-features-767-...: a te.Linear with in_features 767 (767 % 16) was told only to
    'Pad sequences to a multiple of 16 x TP x CP'; the thread padded in_features to 768."""
    rule, said = _root_fix(tmp_path, FP8_K)
    assert rule == "CV251"
    assert any("in_features" in s for s in said), said


def test_check_does_not_tell_a_recipe_that_names_its_provider_to_name_its_provider(tmp_path: Path) -> None:
    """`diagnose check recipe.yaml` on a recipe whose model is `_target_: ...Llama3ModelProvider8B`: the warning said
    'set them (or the model's provider _target_) for a true count', to a config that had just done so."""
    recipe = write(tmp_path, "recipe.yaml", "model:\n  _target_: megatron.bridge.models.llama.llama_provider."
                   "Llama3ModelProvider8B\n  tensor_model_parallel_size: 2\ntrain:\n  micro_batch_size: 2\n")
    out = run("check", str(recipe), "--gpus", "8").stdout
    assert "WARNING: the parameter count assumes" in out  # the provider gives no vocabulary: still said
    assert "_target_" not in out
