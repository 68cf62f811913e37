"""``[rule.evidence]``, continued: a wider ``following_window`` and ``preceding`` (the lines above the matched one).

torchrun's ``failed (exitcode: -9)`` names no signal: the summary it prints under its own traceback does
(``traceback : Signal 9 (SIGKILL) received by PID``). Ray's count of workers killed for memory is followed by the
driver's exception and the node's memory report. torch's ``NCCL error ... unhandled cuda error`` is followed by NCCL's
``Last error:`` (``Cuda failure 217 'peer access is not supported...'``). An enroot hook's exit status and spank's
``task_init() failed`` come after the line that says why, above them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import analyzed_root as _root  # the root cause analyze reports for a log of this text

from diagnose.match.rules import parse_rule
from tests.test_rule_evidence import _rule  # a minimal user rule around an [rule.evidence] table


def _lines(finding) -> list[str]:
    return [e.text.strip() for e in finding.evidence]


_LAUNCHER_TRACEBACK = "".join(
    f'  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/frame{i}.py", line {100 + i}, in f{i}\n'
    f"    return f{i + 1}(*args, **kwargs)\n"
    for i in range(12)
)

TORCHRUN_SIGKILL = f"""\
[rank0]: step 120 loss 2.31
E1004 21:27:33.604000 140213 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 0 (pid: 140228) of binary: /opt/conda/bin/python
Traceback (most recent call last):
  File "/opt/conda/bin/torchrun", line 8, in <module>
    sys.exit(main())
{_LAUNCHER_TRACEBACK}torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2023-10-04_21:27:31
  host      : node-03
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 140228)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 140228
============================================================
"""


def test_torchrun_s_sigkill_shows_the_signal_its_summary_names_past_its_own_traceback(tmp_path: Path) -> None:
    root = _root(tmp_path, TORCHRUN_SIGKILL)
    assert root.rule == "LA291"
    lines = _lines(root)
    assert lines[0].endswith("failed (exitcode: -9) local_rank: 0 (pid: 140228) of binary: /opt/conda/bin/python")
    assert "traceback : Signal 9 (SIGKILL) received by PID 140228" in lines, lines
    assert len(lines) <= 3


RAY_OOM = """\
(raylet) [2025-03-01 14:02:17,551 E 1980 1980] (raylet) node_manager.cc:3069: 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 1f3, IP: 10.44.0.9) over the last time period.
(raylet)
(raylet) Refer to the documentation on how to address the out of memory issue: https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-prevention.html.
Traceback (most recent call last):
  File "/workspace/verl/verl/trainer/main_ppo.py", line 25, in main
    run_ppo(config)
  File "/workspace/verl/verl/trainer/main_ppo.py", line 33, in run_ppo
    ray.get(main_task.remote(config, compute_score))
  File "/usr/local/lib/python3.10/dist-packages/ray/_private/worker.py", line 919, in get_objects
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(OutOfMemoryError): ray::main_task() (pid=2207, ip=10.44.0.9)
  File "/workspace/verl/verl/trainer/main_ppo.py", line 128, in main_task
    trainer.fit()
  File "/workspace/verl/verl/single_controller/ray/base.py", line 42, in func
    output = ray.get(output)
ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.
Memory on the node (IP: 10.44.0.9, ID: 1f3) where the task (actor ID: 9c1e, name=WorkerDict.__init__, pid=2290) was running was 481.20GB / 503.50GB (0.955722), which exceeds the memory usage threshold of 0.95.
"""


def test_ray_s_oom_count_shows_the_driver_s_exception_and_the_memory_report(tmp_path: Path) -> None:
    root = _root(tmp_path, RAY_OOM)
    assert root.rule == "OOM024"
    lines = _lines(root)
    assert "killed due to memory pressure (OOM)" in lines[0]
    assert "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory." in lines
    assert any(t.startswith("Memory on the node (IP: 10.44.0.9") for t in lines), lines


def test_nccl_s_last_error_under_torch_s_unhandled_cuda_error_is_shown(tmp_path: Path) -> None:
    text = """\
Traceback (most recent call last):
  File "/app/train.py", line 10, in <module>
    dist.barrier()
torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
ncclUnhandledCudaError: Call to CUDA function failed.
Last error:
Cuda failure 217 'peer access is not supported between these two devices'
"""
    root = _root(tmp_path, text)
    assert root.rule == "PY006"
    lines = _lines(root)
    assert lines[0].startswith("torch.distributed.DistBackendError: NCCL error in:")
    assert "Cuda failure 217 'peer access is not supported between these two devices'" in lines, lines


def test_nccl_s_system_error_shows_which_system_call_failed(tmp_path: Path) -> None:
    text = """\
[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
[rank0]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.
[rank0]: Last error:
[rank0]: socketStartConnect: Connect to 172.21.40.12<51423> failed : Software caused connection abort
[rank1]: socketStartConnect: Connect to 172.21.40.99<51423> failed : No route to host
"""
    root = _root(tmp_path, text)
    assert root.rule == "NC015"
    lines = _lines(root)
    assert any(t.endswith("socketStartConnect: Connect to 172.21.40.12<51423> failed : Software caused connection abort")
               for t in lines), lines
    assert not any("172.21.40.99" in t for t in lines), lines  # another rank's line is not this one's reason


def test_an_enroot_hook_s_exit_status_shows_the_hook_s_error_above_it(tmp_path: Path) -> None:
    text = """\
srun: job 77 queued and waiting for resources
slurmstepd: error: pyxis: container start failed with error code: 1
slurmstepd: error: pyxis: printing enroot log file:
slurmstepd: error: pyxis:     nvidia-container-cli: ldcache error: process /usr/sbin/ldconfig.real failed with error code: 1
slurmstepd: error: pyxis:     [ERROR] /etc/enroot/hooks.d/98-nvidia.sh exited with return code 1
"""
    root = _root(tmp_path, text)
    assert root.rule == "SL016"
    lines = _lines(root)
    i = next(k for k, t in enumerate(lines) if "98-nvidia.sh exited with return code 1" in t)
    assert i >= 1 and "ldcache error" in lines[i - 1], lines  # above the line, as in the log


def test_spank_s_failure_shows_pyxis_s_reason_above_it(tmp_path: Path) -> None:
    text = """\
slurmstepd-gpu-b04: error: pyxis: mounting /opt/slurm
slurmstepd-gpu-b04: error: pyxis:     enroot-mount: failed to mount: /opt/slurm at /home/u/.local/share/enroot/pyxis_1.0/opt/slurm: Not a directory
slurmstepd-gpu-b04: error: pyxis: couldn't start container
slurmstepd-gpu-b04: error: spank: required plugin spank_pyxis.so: task_init() failed with rc=-1
"""
    root = _root(tmp_path, text)
    assert root.rule == "SL018"
    lines = _lines(root)
    assert "failed to mount" in lines[0] and "task_init() failed" in lines[1], lines


def test_a_refused_deepspeed_key_shows_the_config_section_pydantic_names_above_it(tmp_path: Path) -> None:
    text = """\
[rank0]: pydantic_core._pydantic_core.ValidationError: 2 validation errors for DeepSpeedBF16Config
[rank0]: loss_scale
[rank0]:   Extra inputs are not permitted [type=extra_forbidden, input_value=0, input_type=int]
"""
    root = _root(tmp_path, text)
    assert root.rule == "IM094"
    lines = _lines(root)
    assert lines[0].endswith("ValidationError: 2 validation errors for DeepSpeedBF16Config"), lines


@pytest.mark.parametrize("evidence, message", [
    ({"preceding": "(unclosed"}, "evidence.preceding does not compile"),
    ({"following": "x", "following_window": 0}, "evidence.following_window must be an integer from 1 to 100"),
    ({"following": "x", "following_window": 101}, "evidence.following_window must be an integer from 1 to 100"),
    ({"preceding": "x", "preceding_window": True}, "evidence.preceding_window must be an integer from 1 to 100"),
    ({"preceding_window": 5}, "evidence.preceding_window without evidence.preceding"),
    ({"following_window": 5}, "evidence.following_window without evidence.following"),
])
def test_a_bad_window_or_preceding_regex_is_refused_with_its_reason(evidence: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rule(_rule(evidence), "user.toml")


def test_the_windows_are_read_from_the_table() -> None:
    rule = parse_rule(_rule({"following": "a", "following_window": 60, "preceding": "b", "preceding_window": 3}),
                      "user.toml")
    assert (rule.evidence.following_window, rule.evidence.preceding, rule.evidence.preceding_window) == (60, "b", 3)


def test_preceding_reads_only_its_window_of_the_line_s_own_stream(tmp_path: Path) -> None:
    """The hook's error five lines up is outside its window of four; another task's error right above is not this
    line's reason; pyxis's prefix (``slurmstepd: error: pyxis:``) alone does not make an [INFO] line an error."""
    text = """\
slurmstepd: error: pyxis:     nvidia-container-cli: container error: far away
slurmstepd: error: pyxis:     [INFO] a
slurmstepd: error: pyxis:     [INFO] b
slurmstepd: error: pyxis:     [INFO] c
slurmstepd: error: pyxis:     [INFO] d
1: sed: couldn't close stdout: No space left on device
slurmstepd: error: pyxis:     [ERROR] /etc/enroot/hooks.d/10-shadow.sh exited with return code 4
"""
    root = _root(tmp_path, text)
    assert root.rule == "SL016"
    lines = _lines(root)
    assert not any("far away" in t or "No space left" in t or "[INFO]" in t for t in lines), lines


@pytest.mark.parametrize("text, shown", [
    ("""\
Traceback (most recent call last):
  File "/app/train.py", line 9, in <module>
    cfg = TrainerConfig(**raw)
pydantic.error_wrappers.ValidationError: 1 validation error for TrainerConfig
output_dir
  field required (type=value_error.missing)
""", "field required (type=value_error.missing)"),
    ("""\
Traceback (most recent call last):
  File "/app/train.py", line 9, in <module>
    cfg = AxolotlConfig(**raw)
pydantic_core._pydantic_core.ValidationError: 1 validation error for AxolotlConfig
pretraining_dataset
  Input should be a valid list [type=list_type, input_value={'path': 'c4'}, input_type=dict]
""", "Input should be a valid list [type=list_type, input_value={'path': 'c4'}, input_type=dict]"),
    ("""\
Traceback (most recent call last):
  File "/app/train.py", line 9, in <module>
    trainer.save_model()
RuntimeError:
            Some tensors share memory, this will lead to duplicate memory on disk: [{'lm_head.weight', 'embed.weight'}].
""", "Some tensors share memory, this will lead to duplicate memory on disk: [{'lm_head.weight', 'embed.weight'}]."),
    ("""\
Traceback (most recent call last):
  File "/app/train.py", line 9, in <module>
    trainer.train()
ValueError: Please correct the following DeepSpeed config values that mismatch TrainingArguments values:
- ds bf16.enabled=True vs hf bf16|bf16_full_eval=False
""", "- ds bf16.enabled=True vs hf bf16|bf16_full_eval=False"),
])
def test_a_generic_exception_shows_the_message_it_prints_under_its_line(tmp_path: Path, text: str, shown: str) -> None:
    root = _root(tmp_path, text)
    assert root.rule == "PY001"
    assert shown in _lines(root), _lines(root)


def test_a_later_traceback_s_code_is_not_taken_for_the_message(tmp_path: Path) -> None:
    text = """\
Traceback (most recent call last):
  File "/app/train.py", line 9, in <module>
    trainer.save_model()
RuntimeError: save failed
Traceback (most recent call last):
  File "/app/other.py", line 3, in <module>
    check(x)  # (type=value_error.extra)
"""
    root = _root(tmp_path, text)
    assert root.rule == "PY001"
    assert not any("check(x)" in t for t in _lines(root)), _lines(root)
