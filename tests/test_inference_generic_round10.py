"""Readings of round 10 (accgen10), through the whole matcher on synthetic logs:

- transformers 4.36-4.38's staging checkpoint folder raced between ranks (IM136): an errno error under the Trainer
  frame that touches ``staging_output_dir`` is that release's bug; the same error elsewhere in the save stays the
  storage's (IF417);
- a signature-mismatch TypeError raised in the data pipeline's own module is the data set-up (IF610), while one
  raised inside HF datasets' own code stays version skew (IF112);
- torch.stack of an empty list inside an evaluation loop is a rank without evaluation batches (IF611);
- a logits/targets shape mismatch inside a loss function is the batch's (IF612);
- torch's ``'weight' must be 2-D`` and a kernel's dtype check are FSDP's wrapping only where the log shows FSDP
  (MB230) or its mixed-precision policy (MB231).
"""

from __future__ import annotations

import pytest

from diagnose.match import load_catalogue, match_text

CATALOGUE = load_catalogue()

_TRAINER = """\
[INFO|trainer.py:3067] 2024-02-26 11:10:40,118 >> Saving model checkpoint to /ckpt/run/tmp-checkpoint-500
Traceback (most recent call last):
  File "/work/proj/train.py", line 40, in main
    trainer.train()
  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line 1929, in _inner_training_loop
    self._maybe_log_save_evaluate(tr_loss, model, trial, epoch, ignore_keys_for_eval)
  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line 2395, in _save_checkpoint
    {code}
{error}
"""


@pytest.mark.parametrize("code, error", [
    ("os.rename(staging_output_dir, output_dir)",
     "FileNotFoundError: [Errno 2] No such file or directory: '/ckpt/run/tmp-checkpoint-500' -> '/ckpt/run/checkpoint-500'"),
    ("os.rename(staging_output_dir, output_dir)",
     "OSError: [Errno 39] Directory not empty: '/ckpt/run/tmp-checkpoint-500' -> '/ckpt/run/checkpoint-500'"),
    ("shutil.rmtree(staging_output_dir)", "FileNotFoundError: [Errno 2] No such file or directory: 'model.safetensors'"),
])
def test_the_staging_folder_race_is_the_transformers_release(code, error):
    root = match_text(_TRAINER.format(code=code, error=error), CATALOGUE).root
    assert root is not None and root.rule == "IM136"
    assert root.category == "import_version" and root.phase == "checkpoint_save"


def test_an_os_error_of_the_save_outside_the_staging_code_stays_the_storage():
    text = _TRAINER.format(code="fd = os.open(output_dir, os.O_RDONLY)",
                           error="FileNotFoundError: [Errno 2] No such file or directory: 'out/checkpoint-500'")
    root = match_text(text, CATALOGUE).root
    assert root is not None and root.rule != "IM136" and root.category == "checkpoint_io"


_CALL = """\
Traceback (most recent call last):
  File "/work/proj/train.py", line 12, in main
    ds = build(cfg)
  File "{path}", line 88, in {func}
    {code}
{error}
"""


def test_a_call_that_does_not_fit_inside_the_data_pipeline_is_the_data_set_up():
    text = _CALL.format(path="/opt/proj/src/proj/data/datasets/sft.py", func="__init__",
                        code="super().__init__(path, tokenizer, **kwargs)",
                        error="TypeError: SFTDataset.__init__() got an unexpected keyword argument 'chat_template'")
    root = match_text(text, CATALOGUE).root
    assert root is not None and root.category == "data" and root.basis_detail.startswith("IF610")


def test_a_call_that_does_not_fit_inside_hf_datasets_stays_two_releases():
    text = _CALL.format(path="/env/lib/python3.10/site-packages/datasets/load.py", func="load_dataset",
                        code="download_config = DownloadConfig(**download_kwargs)",
                        error="TypeError: DownloadConfig.__init__() got an unexpected keyword argument 'use_auth_token'")
    root = match_text(text, CATALOGUE).root
    assert root is not None and root.category == "import_version" and not root.basis_detail.startswith("IF610")


@pytest.mark.parametrize("func, expected", [("validate", "data"), ("forward", None)])
def test_an_empty_stack_is_a_rank_without_evaluation_batches_only_in_an_evaluation_loop(func, expected):
    text = _CALL.format(path="/env/lib/python3.12/site-packages/litgpt/pretrain.py", func=func,
                        code="val_loss = torch.stack(losses).mean()",
                        error="RuntimeError: stack expects a non-empty TensorList")
    root = match_text(text, CATALOGUE).root
    assert root is not None
    assert root.basis_detail.startswith("IF611") == (expected is not None)
    if expected:
        assert root.category == expected


def test_logits_and_targets_of_another_shape_in_the_loss_are_the_batch():
    text = _CALL.format(path="/opt/megatron-lm/megatron/core/tensor_parallel/cross_entropy.py",
                        func="calculate_predicted_logits",
                        code="predicted_logits_1d = logits_2d[arange_1d, masked_target_1d]",
                        error="IndexError: shape mismatch: indexing tensors could not be broadcast together with "
                              "shapes [486], [162]")
    root = match_text(text, CATALOGUE).root
    assert root is not None and root.category == "data" and root.basis_detail.startswith("IF612")


_EMBEDDING = """\
{banner}
Traceback (most recent call last):
  File "/work/proj/train.py", line 151, in train
    out = model(inp)
  File "/env/lib/python3.10/site-packages/torch/nn/functional.py", line 2264, in embedding
    return torch.embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)
[rank0]: RuntimeError: 'weight' must be 2-D
"""


def test_a_flat_embedding_weight_is_fsdp_wrapping_where_the_log_shows_fsdp():
    root = match_text(_EMBEDDING.format(banner="Starting PyTorch 2D (FSDP + TP) example on rank 0."), CATALOGUE).root
    assert root is not None and root.rule == "MB230" and root.category == "fsdp_config"


def test_a_flat_embedding_weight_under_zero3_is_not_read_as_fsdp():
    banner = "[INFO:swift] Using DeepSpeed: {'zero_optimization': {'stage': 3}}"
    root = match_text(_EMBEDDING.format(banner=banner), CATALOGUE).root
    assert root is not None and root.rule != "MB230" and root.category != "fsdp_config"


_DTYPE = """\
{banner}
Traceback (most recent call last):
  File "/opt/proj/moe/experts.py", line 712, in forward
    out = ops.gmm(x, self.w1, tokens_per_expert)
RuntimeError: Expected b.scalar_type() == torch::kBFloat16 to be true, but got false.
"""


def test_a_dtype_check_under_fsdps_mixed_precision_policy_is_fsdp_wrapping():
    banner = "Loading model with FSDP2, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)"
    root = match_text(_DTYPE.format(banner=banner), CATALOGUE).root
    assert root is not None and root.rule == "MB231" and root.category == "fsdp_config"


def test_a_dtype_check_without_a_mixed_precision_policy_is_left_alone():
    root = match_text(_DTYPE.format(banner="Loading model"), CATALOGUE).root
    assert root is not None and root.rule != "MB231"
