"""Version skew read from where and how a generic exception was raised (diagnose/match/inference.py, frames.py):
a wrapper carrying a signature-mismatch TypeError's message, torch.load's weights-only refusal, and the frames of a
notebook's (IPython) traceback. Each is checked both ways: the same shape without the evidence stays what it was."""

from __future__ import annotations

from conftest import lines_after

from diagnose.match import load_catalogue, match_text
from diagnose.match.frames import ipython_frames
from diagnose.match.inference import carried_type

CATALOGUE = load_catalogue()


def _root(lines: list[str]):
    root = match_text("\n".join(lines) + "\n", CATALOGUE).root
    assert root is not None
    return root


ASYNC_SAVE = [
    "saving checkpoint at iteration     500 to /ckpt/run in torch_dist format",
    "Traceback (most recent call last):",
    '  File "/w/Megatron-LM/pretrain_gpt.py", line 323, in <module>',
    "    pretrain(",
    '  File "/w/Megatron-LM/megatron/training/checkpointing.py", line 434, in save_checkpoint',
    "    async_save_request = dist_checkpointing.save(state_dict, checkpoint_name, save_strategy,",
    '  File "/w/Megatron-LM/megatron/core/dist_checkpointing/strategies/filesystem_async.py", line 337, in retrieve_write_results',
    "    raise RuntimeError(f'Worker failure: {write_results_or_exc}') from write_results_or_exc",
]


def test_a_wrapper_carrying_a_signature_mismatch_is_version_skew():
    root = _root([*ASYNC_SAVE, "RuntimeError: Worker failure: _write_item() missing 1 required positional argument: 'fmt'"])
    assert root.category == "import_version", root.basis_detail
    assert "carrying a TypeError's message" in root.basis_detail
    assert root.phase == "checkpoint_save"


def test_the_same_wrapper_carrying_another_failure_keeps_its_subsystem():
    root = _root([*ASYNC_SAVE, "RuntimeError: Worker failure: tensor of shape [4] does not match [8]"])
    assert root.category == "checkpoint_format", root.basis_detail


def test_carried_type_reads_only_the_interpreters_own_wordings():
    assert carried_type("RuntimeError: Worker failure: f() got an unexpected keyword argument 'x'", "RuntimeError")
    assert carried_type("ValueError: step() takes 2 positional arguments but 3 were given", "ValueError")
    assert carried_type("TypeError: f() got an unexpected keyword argument 'x'", "TypeError") == ""
    assert carried_type("RuntimeError: missing 1 required argument in the config", "RuntimeError") == ""
    assert carried_type("RuntimeError: unexpected keyword argument in template", "RuntimeError") == ""


RESUME = [
    "resume_from_checkpoint: /out/checkpoint-1400",
    "Traceback (most recent call last):",
    '  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line 3124, in _load_rng_state',
    "    checkpoint_rng_state = torch.load(rng_file)",
    '  File "/env/lib/python3.10/site-packages/torch/serialization.py", line 1470, in load',
    "    raise pickle.UnpicklingError(_get_wo_message(str(e))) from None",
]


def test_a_weights_only_refusal_is_version_skew_at_load():
    root = _root([*RESUME, "_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do so "
                           "you have two options, do those steps only if you trust the source of the checkpoint. "])
    assert root.category == "import_version", root.basis_detail
    assert root.basis_detail.startswith("IF336")


def test_another_unpickling_error_is_not_read_as_version_skew():
    root = _root([*RESUME, "_pickle.UnpicklingError: invalid load key, '<'."])
    assert root.category != "import_version" or not (root.basis_detail or "").startswith("IF336")


NOTEBOOK = [
    "---------------------------------------------------------------------------",
    "TypeError                                 Traceback (most recent call last)",
    "/tmp/ipykernel_31/2214309554.py in <cell line: 0>()",
    "----> 1 trainer_stats = trainer.train()",
    "",
    "/usr/local/lib/python3.11/dist-packages/transformers/trainer.py in train(self, resume_from_checkpoint, trial)",
    "   2244         else:",
    "-> 2245             return inner_training_loop(",
    "   2246                 args=args,",
    "",
    "/usr/local/lib/python3.11/dist-packages/unsloth/models/llama.py in _fast_inner_training_loop(self, batch_size)",
    "",
]
NOTEBOOK_8 = [
    "---------------------------------------------------------------------------",
    "TypeError                                 Traceback (most recent call last)",
    "Cell In[3], line 1",
    "----> 1 trainer.train()",
    "File /usr/lib/python3.11/site-packages/transformers/trainer.py:2245, in Trainer.train(self, resume_from_checkpoint)",
    "-> 2245 return inner_training_loop(",
    "",
]
SKEW = "TypeError: _get_batch_samples() takes 3 positional arguments but 4 were given"


def test_ipython_calls_are_read_as_frames_innermost_last():
    frames = ipython_frames(lines_after([*NOTEBOOK, SKEW]))
    assert [f.text.strip() for f in frames] == [
        'File "/tmp/ipykernel_31/2214309554.py", line 1, in <cell line: 0>',
        'File "/usr/local/lib/python3.11/dist-packages/transformers/trainer.py", line 2245, in train',
        'File "/usr/local/lib/python3.11/dist-packages/unsloth/models/llama.py", line 0, in _fast_inner_training_loop',
    ]
    assert [f.text.strip() for f in ipython_frames(lines_after([*NOTEBOOK_8, SKEW]))] == [
        'File "/usr/lib/python3.11/site-packages/transformers/trainer.py", line 2245, in Trainer.train',
    ]
    assert ipython_frames(lines_after(["some output", "more output", SKEW])) == []


def test_a_notebook_signature_mismatch_raised_in_a_library_is_version_skew():
    root = _root([*NOTEBOOK, SKEW])
    assert root.category == "import_version", root.basis_detail
    assert root.basis_detail.startswith("IF112")


def test_a_notebook_signature_mismatch_in_the_users_own_cell_is_not_read_as_a_library_call():
    own_cell = NOTEBOOK[:4] + [""]
    root = _root([*own_cell, "TypeError: build() takes 3 positional arguments but 4 were given"])
    assert not (root.basis_detail or "").startswith("IF112")


STREAMING = [
    "Traceback (most recent call last):",
    '  File "/home/u/proj/train.py", line 40, in main',
    "    ds = load_dataset(path, streaming=True)",
    '  File "/env/lib/python3.10/site-packages/datasets/load.py", line 2136, in load_dataset',
    "    return builder_instance.as_streaming_dataset(split=split)",
    '  File "/env/lib/python3.10/site-packages/datasets/builder.py", line 1213, in as_streaming_dataset',
    "    raise NotImplementedError(",
]


def test_a_library_lacking_something_yet_is_its_release_not_the_data():
    root = _root([*STREAMING, "NotImplementedError: Loading a dataset cached in a LocalFileSystem is not supported yet."])
    assert root.category == "import_version", root.basis_detail
    assert root.basis_detail.startswith("IF337")


def test_a_combination_of_settings_not_supported_yet_is_not_read_as_the_release():
    root = _root([*STREAMING, "NotImplementedError: streaming=True is not supported yet for this builder"])
    assert not (root.basis_detail or "").startswith("IF337"), root.basis_detail
    root = _root([*STREAMING, "NotImplementedError: Loading a dataset is not supported yet when num_proc > 1"])
    assert not (root.basis_detail or "").startswith("IF337"), root.basis_detail
