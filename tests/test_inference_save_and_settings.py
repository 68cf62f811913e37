"""Three readings of round 9 (accsave9), through the whole matcher on synthetic logs:

- an OS error (errno and path) raised by the file call a checkpoint SAVE made itself is the storage's (IF417), while
  the same error on LOAD is left to the load tables;
- a check that names a setting of the job, in its message or in the assert statement the traceback prints, is the
  configuration's (IF418, ``inference.names_setting``);
- a timed-out wait in the c10d store for rank 0's NCCL id is a collective timeout (LA257), a reset one stays LA015.
"""

from __future__ import annotations

import time

import pytest

from diagnose.match import load_catalogue, match_text
from diagnose.match.inference import names_setting

CATALOGUE = load_catalogue()

_SAVE_TRACEBACK = """\
{'loss': 1.21, 'grad_norm': 2.5, 'learning_rate': 1e-05, 'epoch': 0.2}
Traceback (most recent call last):
  File "/work/proj/train.py", line 40, in main
    trainer.train()
  File "/env/lib/python3.11/site-packages/transformers/trainer.py", line 2345, in _inner_training_loop
    self._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch)
  File "/env/lib/python3.11/site-packages/transformers/trainer.py", line 2909, in _save_checkpoint
    self.state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))
  File "/env/lib/python3.11/site-packages/transformers/trainer_callback.py", line 144, in save_to_json
    with open(json_path, "w", encoding="utf-8") as f:
{error}
"""


@pytest.mark.parametrize("error", [
    "FileNotFoundError: [Errno 2] No such file or directory: 'out/run-3/checkpoint-40/trainer_state.json'",
    "OSError: [Errno 36] File name too long: 'out/run-3/checkpoint-40/trainer_state.json'",
])
def test_an_os_error_of_the_saves_own_file_call_is_the_storage(error):
    root = match_text(_SAVE_TRACEBACK.replace("{error}", error), CATALOGUE).root
    assert root is not None and root.category == "checkpoint_io" and root.phase == "checkpoint_save"
    assert root.basis_detail.startswith("IF417")


def test_a_message_of_the_save_code_itself_is_not_read_as_the_file_system():
    text = _SAVE_TRACEBACK.replace("{error}", "FileNotFoundError: checkpoint-40 was not written by this trainer")
    root = match_text(text, CATALOGUE).root
    assert root is not None and not root.basis_detail.startswith("IF417")


def test_the_same_os_error_while_loading_is_left_to_the_load_tables():
    text = """\
Traceback (most recent call last):
  File "/env/lib/python3.11/site-packages/transformers/modeling_utils.py", line 3000, in from_pretrained
    with open(resolved_archive_file, "rb") as f:
FileNotFoundError: [Errno 2] No such file or directory: '/ckpt/run/step_100/model.safetensors'
"""
    root = match_text(text, CATALOGUE).root
    assert root is not None and not root.basis_detail.startswith("IF417")


_ASSERT = """\
Traceback (most recent call last):
  File "/env/lib/python3.10/site-packages/vllm/worker/worker.py", line 180, in load_model
    allocator = CuMemAllocator.get_instance()
  File "/env/lib/python3.10/site-packages/vllm/device_allocator/cumem.py", line 139, in __init__
    {code}
AssertionError: Expandable segments are not compatible with memory pool.
"""


def test_an_assert_statement_that_tests_a_setting_is_the_configuration():
    text = _ASSERT.format(code='assert "expandable_segments:True" not in conf, \\')
    root = match_text(text, CATALOGUE).root
    assert root is not None and root.category == "config_validation" and root.basis_detail.startswith("IF418")


def test_an_assert_statement_that_tests_no_setting_says_nothing_of_configuration():
    # the statement names no setting, so IF418 (a refused setting) does not read it; a message that says two features
    # are incompatible is still the library refusing a combination (IF921), whatever the statement tests
    text = _ASSERT.format(code="assert self.pool is None")
    root = match_text(text, CATALOGUE).root
    assert root is not None and not root.basis_detail.startswith("IF418")
    assert root.basis_detail.startswith("IF921")
    plain = text.replace("Expandable segments are not compatible with memory pool.", "Memory pool was already created.")
    root = match_text(plain, CATALOGUE).root
    assert root is not None and root.category != "config_validation"


@pytest.mark.parametrize(("text", "code", "named"), [
    ("AssertionError: not compatible", 'assert "expandable_segments:True" not in conf', True),
    ("AssertionError: not compatible", 'assert os.environ.get("VLLM_USE_V1") != "1"', True),
    ("AssertionError: not compatible", 'x = "expandable_segments:True"', False),  # not the assert that raised
    ("AssertionError: not compatible", "assert self.pool is None", False),
    ("ValueError: set the environment variable TOKENIZERS_PARALLELISM", "", True),
    ("ValueError: offload_param=True needs stage 3", "", True),
    ("ValueError: --seq-length 4096 exceeds --max-position-embeddings 2048", "", True),
    ("AssertionError: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is not allowed here", "", True),
    # a YAML entry as the config file writes it, one space after the colon (axolotl's own advice)
    ("ValueError: eval dataset split is too small for sample_packing. You should set `eval_sample_packing: False`. ",
     "", True),
    ("ValueError: set 'use_cache = false' to train", "", True),
    # advice to set a named option to a value (axolotl's load_tokenizer: an adapter with new special tokens)
    ("ValueError: Please set lora_modules_to_save to [`embed_tokens`, `lm_head`] when using an adapter and changing "
     "the special tokens.", "", True),
    ("ValueError: set `gradient_checkpointing` to False with this model", "", True),
    ("ValueError: Please set the device to cuda", "", False),  # a phrase, no option's name
    ("ValueError: cannot set offset to -1", "", False),  # a single word: no option's name
    ("ValueError: got 'step: x'", "", False),  # no value a setting takes
    ("ValueError: expected `a:  1`", "", False),  # two spaces: no config file's spelling
    ("AssertionError: a == b failed", "", False),
    ("ValueError: shapes 3 != 4", "", False),
    ("AssertionError: 256 != 8 * 1 * 8", "", False),
])
def test_names_setting(text, code, named):
    frames = [f'File "/env/lib/python3.10/site-packages/pkg/mod.py", line 9, in f {code}'.rstrip()]
    assert names_setting(text, frames) is named


@pytest.mark.parametrize("text", ["ValueError: set " + "a_" * 60_000, "ValueError: " + "a_b" * 40_000,
                                  "ValueError: " + "A_B" * 40_000])
def test_names_setting_reads_a_100_kb_message_in_one_pass(text):
    # a name's parts backtracked at every failure to end it (3 to 8 s a line of "a_a_a_..."); the bound is generous
    # for a shared machine, the possessive reading takes about 0.2 s
    start = time.perf_counter()
    assert names_setting(text, []) is False
    assert time.perf_counter() - start < 2.0


_STORE = """\
Traceback (most recent call last):
  File "/env/lib/python3.10/site-packages/transformers/training_args.py", line 2035, in main_process_first
    dist.barrier()
  File "/env/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 3696, in barrier
    work = default_pg.barrier(opts=opts)
RuntimeError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store \
by key '0', but store->get('0') got error: {error}
"""


@pytest.mark.parametrize(("error", "rule", "category"), [
    ("Socket Timeout", "LA257", "nccl_timeout"),
    ("Connection reset by peer", "LA015", "launcher"),
])
def test_a_timed_out_wait_for_the_nccl_id_is_a_collective_timeout(error, rule, category):
    root = match_text(_STORE.format(error=error), CATALOGUE).root
    assert root is not None and (root.rule, root.category) == (rule, category)
