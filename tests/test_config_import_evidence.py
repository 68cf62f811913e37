"""Configuration and import failures read from their own evidence, end to end (rules CV100/CV102/IM063 and the
[[infer]] tables IF110-IF126): the root cause is the script's or the loader's own words, not the launcher's exit
report that follows them."""

from __future__ import annotations

from diagnose.match import load_catalogue, match_text

CATALOGUE = load_catalogue()

ARGPARSE_UNDER_TORCHRUN = """\
usage: pretrain_gpt.py [-h] [--num-layers NUM_LAYERS] [--recompute-method {uniform,block}]
pretrain_gpt.py: error: unrecognized arguments: --activations-checkpoint-method uniform
usage: pretrain_gpt.py [-h] [--num-layers NUM_LAYERS] [--recompute-method {uniform,block}]
pretrain_gpt.py: error: unrecognized arguments: --activations-checkpoint-method uniform
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 2) local_rank: 0 (pid: 31402) of binary: /usr/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
pretrain_gpt.py FAILED
"""

LOADER = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/w/train.py", line 26, in <module>
[rank0]:     from megatron.core import parallel_state
[rank0]:   File "/env/lib/python3.12/site-packages/transformer_engine/common/__init__.py", line 271, in _load_library
[rank0]:     handles.append(ctypes.CDLL(so_path, mode=ctypes.RTLD_GLOBAL))
[rank0]:   File "/env/lib/python3.12/ctypes/__init__.py", line 379, in __init__
[rank0]:     self._handle = _dlopen(self._name, mode)
[rank0]: OSError: libcublas.so.13: cannot open shared object file: No such file or directory
E0807 18:22:44.913000 8990 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0 (pid: 9012) of binary: /env/bin/python3.12
"""

YAML = """\
Traceback (most recent call last):
  File "tools/train.py", line 42, in main
    load_config(cfg, args.config)
  File "/env/lib/python3.10/site-packages/yaml/scanner.py", line 580, in fetch_value
    self.get_mark())
yaml.scanner.ScannerError: mapping values are not allowed here
  in "<unicode string>", line 62, column 14:
"""


def test_argparse_rejection_is_the_root_cause_not_torchrun_exit():
    root = match_text(ARGPARSE_UNDER_TORCHRUN, CATALOGUE).root
    assert root is not None and root.rule == "CV100"
    assert root.category == "config_validation" and root.phase == "init"
    assert root.facts.get("unknown") == "--activations-checkpoint-method uniform"


def test_a_library_the_loader_cannot_open_is_version_or_install_skew():
    root = match_text(LOADER, CATALOGUE).root
    assert root is not None and root.category == "import_version"
    assert root.basis == "inferred" and root.basis_detail.startswith("IF111")


def test_a_config_file_that_does_not_parse_is_config_validation_at_set_up():
    root = match_text(YAML, CATALOGUE).root
    assert root is not None and root.category == "config_validation" and root.phase == "init"
    assert root.basis_detail.startswith("IF110")


def test_an_import_rule_takes_the_phase_its_frames_tell_else_init():
    lazy = """\
Traceback (most recent call last):
  File "/w/gpt-neox/megatron/training.py", line 422, in get_model
    model = GPT2ModelPipe(
  File "/w/gpt-neox/megatron/model/transformer.py", line 351, in __init__
    from megatron.model.flash_attention import (
  File "/env/lib/python3.8/site-packages/flash_attn/flash_attn_interface.py", line 8, in <module>
    import flash_attn_2_cuda as flash_attn_cuda
ImportError: /env/lib/python3.8/site-packages/flash_attn_2_cuda.cpython-38-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi
"""
    root = match_text(lazy, CATALOGUE).root
    assert root is not None and root.category == "import_version" and root.phase == "model_build"
    bare = "ImportError: /env/lib/python3.8/site-packages/flash_attn_2_cuda.cpython-38-x86_64-linux-gnu.so: undefined symbol: x\n"
    root = match_text(bare, CATALOGUE).root
    assert root is not None and root.category == "import_version" and root.phase == "init"


def test_phase_when_unknown_needs_phase_auto():
    import pytest

    from diagnose.match.rules import parse_rule

    raw = {"code": "US001", "slug": "x", "title": "x", "category": "data", "phase": "init", "phase_when_unknown": "init",
           "explanation": "x", "patterns": [{"anchor": "x", "regex": "x"}], "fix": {"summary": "x", "safety": "manual"}}
    with pytest.raises(ValueError, match="phase_when_unknown"):
        parse_rule(raw, "t")


JSONARGPARSE = """\
usage: main.py [-h] [-c CONFIG] [--print_config[=flags]] {fit,validate,test,predict,tune} ...
main.py: error: 'Configuration check failed :: No action for destination key "trainer.process_position" to check its value.'
"""

FASTCHAT_RELAYED = """\
2024-02-20 21:46:23 | ERROR | stderr | Traceback (most recent call last):
2024-02-20 21:46:23 | ERROR | stderr |   File "/w/fastchat/serve/vllm_worker.py", line 232, in <module>
2024-02-20 21:46:23 | ERROR | stderr |     engine = AsyncLLMEngine.from_engine_args(engine_args)
2024-02-20 21:46:23 | ERROR | stderr |   File "/env/lib/python3.10/site-packages/vllm/worker/worker.py", line 231, in _check_if_gpu_supports_dtype
2024-02-20 21:46:23 | ERROR | stderr |     raise ValueError(
2024-02-20 21:46:23 | ERROR | stderr | ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla V100-PCIE-16GB GPU has compute capability 7.0.
"""

VLLM_CONFIG_MODULE = """\
Traceback (most recent call last):
  File "/env/lib/python3.10/site-packages/vllm/engine/arg_utils.py", line 286, in create_engine_configs
    model_config = ModelConfig(
  File "/env/lib/python3.10/site-packages/vllm/config.py", line 1003, in _get_and_verify_max_len
    raise ValueError(
ValueError: User-specified max_model_len (131072) is greater than the derived max_model_len (None=8192 in model's config.json).
"""

REGISTRY = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/w/finetune.py", line 344, in train
[rank0]:     config = transformers.AutoConfig.from_pretrained(
[rank0]:   File "/env/lib/python3.11/site-packages/transformers/models/auto/configuration_auto.py", line 723, in __getitem__
[rank0]:     raise KeyError(key)
[rank0]: KeyError: 'qwen2'
"""

ENGINE_WORLD = """\
Traceback (most recent call last):
  File "/code/examples/llama/run.py", line 47, in read_config
    assert world_size == tensorrt_llm.mpi_world_size(), \\
AssertionError: Engine world size (2) != Runtime world size (1)
"""


def test_any_parser_error_after_its_usage_line_is_the_root_cause():
    root = match_text(JSONARGPARSE, CATALOGUE).root
    assert root is not None and root.rule == "CV102"
    assert root.category == "config_validation" and root.phase == "init"


def test_a_parser_error_without_its_usage_line_is_not_taken_for_one():
    lone = JSONARGPARSE.splitlines()[1] + "\n"
    root = match_text(lone, CATALOGUE).root
    assert root is None or root.rule != "CV102"


def test_a_traceback_relayed_by_a_fastchat_worker_log_is_read_as_one():
    root = match_text(FASTCHAT_RELAYED, CATALOGUE).root
    assert root is not None and root.category == "config_validation" and root.phase == "init"
    assert root.basis == "inferred"


def test_raised_in_a_settings_module_is_config_validation():
    root = match_text(VLLM_CONFIG_MODULE, CATALOGUE).root
    assert root is not None and root.category == "config_validation"
    assert root.basis_detail.startswith("IF121") and "config.py" in root.basis_detail


def test_a_model_type_missing_from_the_auto_registry_is_version_skew_not_a_checkpoint():
    root = match_text(REGISTRY, CATALOGUE).root
    assert root is not None and root.category == "import_version"
    assert root.rule == "IM093"  # taught once, in rules/15_import_version.toml


def test_an_engine_built_for_two_processes_run_as_one_is_the_launch():
    root = match_text(ENGINE_WORLD, CATALOGUE).root
    assert root is not None and root.category == "launcher"
    assert root.basis_detail.startswith("IF123")

BARE_ASSERT_ON_SETTINGS = """\
Traceback (most recent call last):
  File "/home/u1/proj/train.py", line 88, in main
    assert args.global_batch_size % (args.micro_batch_size * dp) == 0
AssertionError
"""


def test_a_bare_assertion_on_the_jobs_settings_is_config_validation_but_one_on_tensors_is_not():
    root = match_text(BARE_ASSERT_ON_SETTINGS, CATALOGUE).root
    assert root is not None and root.category == "config_validation" and root.basis_detail.startswith("IF127")
    on_tensors = BARE_ASSERT_ON_SETTINGS.replace("args.global_batch_size % (args.micro_batch_size * dp) == 0", "x.shape[0] == y.shape[0]")
    other = match_text(on_tensors, CATALOGUE).root
    assert other is not None and other.category != "config_validation"

TORCHRUN_SUMMARY_ONLY = """\
E1205 10:00:09.000000 100 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 201) of binary: /usr/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-12-05_10:00:08
  host      : node1
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 201)
  error_file: /tmp/torchelastic_ab12/none_cd34/attempt_0/0/error.json
  traceback : Traceback (most recent call last):
    File "/usr/local/lib/python3.10/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper
      return f(*args, **kwargs)
    File "/usr/local/lib/python3.10/dist-packages/mylib/config.py", line 212, in _verify_parallelism
      raise ValueError(
  ValueError: bad layout 3 for 8

============================================================
"""


def test_an_exception_relayed_only_by_torchruns_summary_is_the_root_not_the_agent_exit():
    root = match_text(TORCHRUN_SUMMARY_ONLY, CATALOGUE).root
    assert root is not None and root.rule == "PY011"
    assert root.category == "config_validation" and root.basis_detail.startswith("IF121")  # the relayed frames count
