"""Generic readings of a failure that hold on any project (issue 14, helper accgen), on synthetic logs.

- A launcher that adds its own rank option before a script's lone config file (``train.py --local_rank=0 x.yaml``)
  hides the file from a parser that reads a sole config argument: the parser's "required arguments" error is the
  launch's fault (LA230, context ``config_hidden_by_launcher``), not the config's.
- A C++ ``pure virtual method called`` is a library's defect (an object used while it was being destroyed, or a
  mismatched build): a version matter (PY230 read by IF380), and as a generic finding it does not outrank an
  earlier real error.
"""

from __future__ import annotations

from diagnose.match import load_catalogue, match_text
from diagnose.match.command_line import config_hidden_by_launcher

CATALOGUE = load_catalogue()


def _spawned(prog_args: str, host: str = "") -> str:
    return (f"{host}[2025-01-02 03:04:05,678] [INFO] [launch.py:256:main] process 1111 spawned with command: "
            f"['/env/bin/python3', '-u', {prog_args}]\n")


REQUIRED = "run_sft.py: error: the following arguments are required: --output_dir/--output-dir\n"
LONE_YAML = _spawned("'scripts/run_sft.py', '--local_rank=0', 'recipes/qwen/sft.yml'") + REQUIRED


def _start_of_last_line(text: str) -> int:
    return text.rstrip("\n").rfind("\n") + 1


def test_the_launcher_record_of_a_lone_config_after_its_rank_option_is_found():
    buf = LONE_YAML.encode()
    assert config_hidden_by_launcher(buf, _start_of_last_line(LONE_YAML), "run_sft.py")
    # another script, the record after the error, or no program name: no such record
    assert not config_hidden_by_launcher(buf, _start_of_last_line(LONE_YAML), "train.py")
    assert not config_hidden_by_launcher(buf, 0, "run_sft.py")
    assert not config_hidden_by_launcher(buf, _start_of_last_line(LONE_YAML), "")


def test_a_config_file_that_is_not_alone_or_not_after_the_rank_option_is_not_hidden():
    for args in (
        "'run_sft.py', '--local_rank=0', '--config', 'sft.yaml'",  # read through an option: the parser saw it
        "'run_sft.py', '--local_rank=0', 'sft.yaml', '--lr', '1e-5'",  # not the last word: other options follow
        "'run_sft.py', '--local_rank=0', '--deepspeed', 'ds_z3.json'",  # a DeepSpeed config, not the script's
        "'run_sft.py', 'sft.yaml'",  # no rank option added: the file was the sole argument
    ):
        text = _spawned(args) + REQUIRED
        assert not config_hidden_by_launcher(text.encode(), _start_of_last_line(text), "run_sft.py"), args


def test_the_required_arguments_error_is_the_launch_when_the_launcher_hid_the_config():
    root = match_text(LONE_YAML, CATALOGUE).root
    assert root is not None and root.rule == "LA230" and root.category == "launcher" and root.phase == "init"
    # the same error without that record stays a configuration mistake
    root = match_text(REQUIRED, CATALOGUE).root
    assert root is not None and root.rule == "CV100" and root.category == "config_validation"


def test_a_multi_node_launch_with_host_prefixes_is_read_the_same_way():
    text = (_spawned("'src/run_sft.py', '--local_rank=0', 'sft.yaml'", host="10.1.2.3: ")
            + "10.1.2.3: " + REQUIRED)
    root = match_text(text, CATALOGUE).root
    assert root is not None and root.rule == "LA230", root


TEARDOWN = """\
[rank0]: iteration      200/     200 | consumed samples: 6400 | lm loss: 2.1E+00 |
pure virtual method called
terminate called without an active exception
"""


def test_a_pure_virtual_call_is_a_library_version_matter():
    root = match_text(TEARDOWN, CATALOGUE).root
    assert root is not None and root.rule == "PY230" and root.category == "import_version"
    assert root.basis == "inferred" and root.basis_detail.startswith("IF380")


def test_a_pure_virtual_call_after_a_real_error_does_not_lead():
    earlier = """\
Traceback (most recent call last):
  File "/home/u/train.py", line 3, in <module>
ValueError: my own check failed
pure virtual method called
terminate called without an active exception
"""
    root = match_text(earlier, CATALOGUE).root
    assert root is not None and root.rule == "PY001", root


OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"


def test_a_lightning_epoch_bar_past_its_first_step_is_training_progress():
    past = "Epoch 0:   0%|          | 1/1352 [00:02<47:31,  0.47it/s, v_num=1-07]\n"
    root = match_text(past + OOM, CATALOGUE).root
    assert root is not None and root.category == "cuda_oom" and root.phase == "training"
    # the same bar before its first step completed, and a validation bar, say nothing about progress
    for line in ("Epoch 0:   0%|          | 0/1352 [00:00<?, ?it/s]\n",
                 "Validation DataLoader 0:  50%|#####     | 8/16 [00:01<00:01,  6.2it/s]\n"):
        root = match_text(line + OOM, CATALOGUE).root
        assert root is not None and root.phase != "training", line


def test_a_step_record_with_pipes_after_a_logger_prefix_is_training_progress():
    step = "INFO     root:train_ft.py:1210 [phase=base] step 4 | loss 1.2874 | mem 73.94 GiB\n"
    root = match_text(step + OOM, CATALOGUE).root
    assert root is not None and root.phase == "training"
    step0 = "INFO     root:train_ft.py:1210 step 0 | loss 11.02 | mem 70.00 GiB\n"
    root = match_text(step0 + OOM, CATALOGUE).root
    assert root is not None and root.phase != "training"


def _load_traceback(missing: str, frames: list[tuple[str, str]]) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, func in frames:
        lines.append(f'  File "{path}", line 10, in {func}')
    lines.append(f"FileNotFoundError: [Errno 2] No such file or directory: '{missing}'")
    return "\n".join(lines) + "\n"


SITE = "/env/lib/python3.10/site-packages"
DCP = [("/w/train.py", "main"), (f"{SITE}/torch/distributed/checkpoint/state_dict_loader.py", "load_state_dict"),
       (f"{SITE}/torch/distributed/checkpoint/filesystem.py", "read_metadata")]
TORCH_LOAD = [("/w/train.py", "main"), (f"{SITE}/deepspeed/runtime/engine.py", "load_checkpoint"),
              (f"{SITE}/torch/serialization.py", "_open_file_like")]


def test_a_missing_checkpoint_index_is_storage_and_a_missing_layout_shard_is_format():
    # the index every shard sits next to is not there: the checkpoint is not where this process reads it
    root = match_text(_load_traceback("/local/ckpt/step_50/model/.metadata", DCP), CATALOGUE).root
    assert root is not None and root.category == "checkpoint_io" and root.basis_detail.startswith("IF381")
    # a shard named after the ZeRO/TP layout is missing from a checkpoint that was found: another layout wrote it
    for name in ("/o/ckpt/global_step50/zero_pp_rank_3_mp_rank_00_optim_states.pt",
                 "/o/ckpt/iter_0000050/mp_rank_01_002/model_optim_rng.pt"):
        root = match_text(_load_traceback(name, TORCH_LOAD), CATALOGUE).root
        assert root is not None and root.category == "checkpoint_format", name
        assert root.basis_detail.startswith("IF382"), root.basis_detail
    # a file named by its rank only says nothing of a layout: a failed open stays the file system's (IF080)
    root = match_text(_load_traceback("/o/ckpt/ep0-ba50-rank0.pt", TORCH_LOAD), CATALOGUE).root
    assert root is not None and root.category == "checkpoint_io" and root.basis_detail.startswith("IF080")


def test_a_conversion_tool_reading_its_source_checkpoint_is_checkpoint_load():
    from diagnose.normalize.phases import phase_from_frames

    convert = ['File "/w/Megatron-Bridge/examples/models/checkpoint_conversion.py", line 251, in main',
               'File "/w/Megatron-Bridge/examples/models/checkpoint_conversion.py", line 170, in export_megatron_to_hf']
    assert phase_from_frames(convert) == "checkpoint_load"
    # a save frame below it says the target was being written
    saving = convert + ['File "/env/lib/python3.12/site-packages/transformers/modeling_utils.py", line 9, in save_pretrained']
    assert phase_from_frames(saving) == "checkpoint_save"
    # a dataset converter is no checkpoint conversion
    assert phase_from_frames(['File "/w/tools/convert_dataset.py", line 3, in convert_records']) != "checkpoint_load"


def test_a_kill_printed_onto_the_weight_loading_bar_died_building_the_model():
    bar_killed = "Loading checkpoint shards:  38%|###8      | 3/8 [00:02<00:03,  1.28it/s]Killed\n"
    root = match_text(bar_killed, CATALOGUE).root
    assert root is not None and root.rule == "PY231"
    assert root.category == "host_oom" and root.phase == "model_build"
    # another bar the kill landed on says nothing of the model build: the plain kill rule, its phase from elsewhere
    root = match_text("Map:  38%|###8      | 3/8 [00:02<00:03,  1.28it/s]Killed\n", CATALOGUE).root
    assert root is not None and root.rule == "PY003" and root.phase != "model_build"


def test_a_torchtune_bar_past_its_first_step_is_training_progress():
    bar = "1|2262|Loss: 0.576000:   10%|#         | 2262/20901 [113:06<17:17:42,  2.92s/it]\n"
    root = match_text(bar + OOM, CATALOGUE).root
    assert root is not None and root.phase == "training"
    root = match_text("1|0|Loss: 11.02:   0%|          | 0/20901 [00:00<?, ?it/s]\n" + OOM, CATALOGUE).root
    assert root is not None and root.phase != "training"


def test_the_launcher_record_is_remembered_with_the_answer_of_a_fresh_search():
    """Every rank prints the same parser error: one memo per input answers each line as a fresh search would,
    searching only the bytes since the line before (it was a 1 MiB search per line: minutes on 20k ranks' lines)."""
    hidden = _spawned("'scripts/run_sft.py', '--local_rank=0', 'recipes/qwen/sft.yml'")
    plain = _spawned("'scripts/run_sft.py', '--local_rank=1', '--model', 'x'")
    text = hidden + REQUIRED * 3 + plain + REQUIRED * 3
    buf = text.encode()
    memo: dict = {}
    starts = [i + 1 for i, ch in enumerate(text) if ch == "\n" and text[i + 1:].startswith("run_sft.py: error")]
    answers = [config_hidden_by_launcher(buf, s, "run_sft.py", memo) for s in starts]
    assert answers == [config_hidden_by_launcher(buf, s, "run_sft.py") for s in starts]
    assert answers == [True] * 6  # the hiding record is still in the look-back: the later argv hides nothing new
