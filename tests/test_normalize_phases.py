"""Phase markers (CAPTURES) and phase_of: frames first, then the last marker before the failure."""

from __future__ import annotations

import re

import pytest
from conftest import phase_markers
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.match.lint import lint_phase_file
from diagnose.model import PHASES, CaptureSpec, DiagnoseError, LogLine
from diagnose.normalize import normalize_line
from diagnose.normalize.phase_file import load_phase_file
from diagnose.normalize.phases import CAPTURES, TRAINING_PROGRESS, parse_iteration, phase_from_frames, phase_of

SITE = "/opt/venv/lib/python3.12/site-packages"

# Frames from ../shared/real_logs/ddp_wrap_oom.log (OOM allocating DDP grad buffers inside _ddp_wrap).
DDP_WRAP_FRAMES = [
    '  File "/workspace/repro.py", line 92, in <module>',
    f'  File "{SITE}/megatron/bridge/models/model_provider.py", line 712, in _ddp_wrap',
    f'  File "{SITE}/megatron/core/distributed/distributed_data_parallel.py", line 291, in __init__',
    f'  File "{SITE}/megatron/core/distributed/distributed_data_parallel.py", line 200, in _allocate_buffers_for_parameters',
    f'  File "{SITE}/megatron/core/distributed/param_and_grad_buffer.py", line 811, in __init__',
]
# From ../shared/real_logs/b062_heads_not_divisible_by_tp.log: the code line mentions forward_step as an argument.
VALIDATE_FRAMES = [
    '  File "/workspace/train.py", line 17, in main',
    f'  File "{SITE}/megatron/bridge/training/pretrain.py", line 74, in pretrain',
    f'  File "{SITE}/megatron/bridge/training/config.py", line 1888, in runtime_config_update',
    f'  File "{SITE}/megatron/bridge/training/config.py", line 1262, in validate',
    f'  File "{SITE}/megatron/core/transformer/transformer_config.py", line 1324, in __post_init__',
]


def _frames(*funcs_and_files):
    return [f'  File "{path}", line 1, in {func}' for path, func in funcs_and_files]


def test_real_frames():
    assert phase_from_frames(DDP_WRAP_FRAMES) == "dp_wrap"
    assert phase_from_frames(VALIDATE_FRAMES) == "init"


def test_code_lines_do_not_decide_the_phase():
    frames = VALIDATE_FRAMES[:2] + ["    pretrain(config=cfg, forward_step_func=forward_step)"]
    assert phase_from_frames(frames) is None


@pytest.mark.parametrize(
    "frames, phase",
    [
        (_frames(("m/training/train.py", "train"), ("m/training/checkpointing.py", "save_checkpoint")), "checkpoint_save"),
        (_frames(("m/training/setup.py", "setup"), ("m/training/checkpointing.py", "load_checkpoint")), "checkpoint_load"),
        (
            _frames(("m/training/train.py", "train_step"), ("megatron/core/optimizer/distrib_optimizer.py", "step")),
            "optimizer_step",
        ),
        (_frames(("m/training/train.py", "train"), ("m/training/eval.py", "evaluate"), ("m/x.py", "forward")), "eval"),
        (_frames(("m/training/setup.py", "setup"), ("m/models/model_provider.py", "get_model")), "model_build"),
        (_frames(("m/core/models/gpt/gpt_model.py", "__init__"),), "model_build"),
        # torchtitan applies TP/FSDP to the built model; verl's worker builds model and optimizer under init_model
        (_frames(("torchtitan/train.py", "__init__"), ("models/llama3/infra/parallelize.py", "parallelize_llama")),
         "model_build"),
        (_frames(("verl/workers/megatron_workers.py", "init_model"),
                 ("verl/workers/megatron_workers.py", "_build_model_optimizer"), ("mbridge/core/bridge.py", "config")),
         "model_build"),
        (["DistributedDataParallel.__init__"], "dp_wrap"),
        (_frames(("m/training/initialize.py", "initialize_megatron"),), "init"),
        (_frames(("a.py", "helper"),), None),
    ],
)
def test_phase_from_frames(frames, phase):
    assert phase_from_frames(frames) == phase


RUN = """\
> initializing torch distributed ...
[after megatron is initialized] datetime: 2026-11-29 15:00:00
 > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 36327530496
Setting up DistributedDataParallel with config DistributedDataParallelConfig(grad_reduce_in_fp32=True)
 loading distributed checkpoint from /ckpt at iteration 100
  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 100
[after model, optimizer, and learning rate scheduler are built] datetime: 2026-11-29 15:01:00
Starting training loop at iteration 100
 [2026-11-29 15:02:00] iteration      110/    1000 | consumed samples:        11264 | lm loss: 2.404998E+00 |
saving checkpoint at iteration     120 to /ckpt in torch_dist format
  successfully saved checkpoint from iteration     120 to /ckpt [ t 1/1, p 1/1 ]
 [2026-11-29 15:03:00] iteration      130/    1000 | consumed samples:        13312 | lm loss: 2.104998E+00 |
saving checkpoint at iteration     140 to /ckpt in torch_dist format
[after training is done] datetime: 2026-11-29 15:09:00
"""


@pytest.mark.parametrize(
    "after_line, phase",
    [(0, "unknown"), (1, "init"), (2, "model_build"), (3, "dp_wrap"), (4, "dp_wrap"), (5, "checkpoint_load"),
     (6, "first_iteration"), (8, "first_iteration"), (9, "training"), (10, "checkpoint_save"), (11, "training"),
     (13, "checkpoint_save"), (14, "shutdown")],
)
def test_marker_sequence(after_line, phase):
    markers = phase_markers(RUN)
    # A failure on the line right after ``after_line`` (1-based), with no telling frames.
    assert phase_of(after_line + 1, "job.log", markers, []) == phase


def test_markers_of_other_files_are_ignored_and_order_does_not_matter():
    markers = list(reversed(phase_markers(RUN)))
    assert phase_of(12, "job.log", markers, []) == "training"
    assert phase_of(12, "rank1.log", markers, []) == "unknown"  # line numbers of another file mean nothing here
    assert phase_of(line=LogLine("job.log", 11, "x", "x"), markers=markers) == "checkpoint_save"


def test_frames_win_over_markers_and_training_frames_split_on_progress():
    markers = phase_markers(RUN)
    forward = _frames(("m/training/train.py", "train_step"), ("m/model.py", "forward"))
    assert phase_of(8, "job.log", markers, forward) == "first_iteration"  # no iteration line yet
    assert phase_of(12, "job.log", markers, forward) == "training"
    assert phase_of(12, "job.log", markers, DDP_WRAP_FRAMES) == "dp_wrap"


def test_every_capture_is_valid_and_every_phase_is_known():
    names = [spec.name for spec in CAPTURES]
    assert len(names) == len(set(names))
    for spec in CAPTURES:
        assert isinstance(spec, CaptureSpec) and spec.keep in ("first", "last", "first_last", "all")
        if spec.regex:
            re.compile(spec.regex)
    for k in range(len(RUN.splitlines()) + 2):
        assert phase_of(k, "job.log", phase_markers(RUN), []) in PHASES


def test_iteration_facts():
    f = parse_iteration(
        " [2025-12-28 00:20:24] iteration        1/     100 | consumed samples:         1024 | elapsed time per "
        "iteration (ms): 27003.9 | learning rate: 9.900000E-05 | global batch size:  1024 | lm loss: 2.404998E+00 |"
        " loss scale: 1.0 | grad norm: 3.048 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    assert (f["iteration"], f["train_iters"], f["consumed_samples"], f["global_batch_size"]) == (1, 100, 1024, 1024)
    assert f["lm_loss"] == pytest.approx(2.404998) and f["nan_iterations"] == 0
    assert parse_iteration("no iteration here") is None


@settings(max_examples=200, deadline=None)
@given(
    st.integers(-3, 50),
    st.lists(st.tuples(st.sampled_from([s.name for s in CAPTURES] + ["bogus"]), st.integers(-5, 60)), max_size=20),
    st.lists(st.text(max_size=60), max_size=8),
)
def test_phase_of_never_raises(line_no, marks, frames):
    markers = [(name, LogLine("p", n, "", "")) for name, n in marks]
    assert phase_of(line_no, "p", markers, frames) in PHASES
    assert phase_of(line_no, "p", "garbage", frames) in PHASES


@pytest.mark.parametrize(
    "frames, phase",
    [
        # Megatron-LM argument checks (sample_logs/mlm_tp_max_connections.log).
        (_frames(("/w/pretrain_gpt.py", "<module>"), ("/w/megatron/training/arguments.py", "validate_args")), "init"),
        # An import that fails inside a package (sample_logs/te_undefined_symbol.log).
        (_frames(("/w/pretrain_gpt.py", "<module>"), ("/site/transformer_engine/pytorch/__init__.py", "<module>")), "init"),
        # Dataset files missing (sample_logs/dataset_idx_missing.log).
        (_frames(("/w/train.py", "main"), ("/opt/megatron/core/datasets/indexed_dataset.py", "__init__")), "init"),
        # JIT warm-up in setup (../shared/real_logs/b042_first_iter_oom.log) beats the forward frames below it.
        (
            _frames(("m/training/initialize.py", "_warmup_jit_function"), ("torch/_functorch/aot_autograd.py", "forward")),
            "init",
        ),
        (_frames(("/w/train.py", "<module>"),), None),  # the entry script alone says nothing
    ],
)
def test_setup_time_frames_are_init(frames, phase):
    assert phase_from_frames(frames) == phase


# Other trainers print no Megatron markers; their own progress lines (HF Trainer, torchtune, Lightning, DeepSpeed,
# plain scripts) and NCCL's start-up say the phase the same way.
OTHER_RUN = """\
gpu7:4102:4102 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>
Restoring states from the checkpoint path at /ckpt/last.ckpt
Restored all states from the checkpoint file at /ckpt/last.ckpt
{'loss': 2.3012, 'grad_norm': 1.25, 'learning_rate': 1e-05, 'epoch': 0.5}
Saving model checkpoint to out/checkpoint-500
epoch 1 step 600 loss 1.8817 lr 1.0e-05
gpu7:4102:4311 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>
INFO:torchtune.utils._logging:Saving checkpoint. This may take some time. Retrieving full model state dict...
"""


@pytest.mark.parametrize(
    "after_line, phase",
    [(1, "init"), (2, "checkpoint_load"), (3, "first_iteration"), (4, "training"), (5, "checkpoint_save"),
     (6, "training"), (7, "training"), (8, "checkpoint_save")],
)
def test_other_trainers_markers(after_line, phase):
    # line 7: NCCL's start-up for a communicator created after training began does not send the phase back to init
    assert phase_of(after_line + 1, "job.log", phase_markers(OTHER_RUN), []) == phase


@pytest.mark.parametrize(
    "frames, phase",
    [
        (_frames(("transformers/trainer.py", "_save_checkpoint"), ("torch/serialization.py", "save")), "checkpoint_save"),
        (_frames(("ronin/train.py", "train"), ("/x/torch/serialization.py", "save"),
                 ("/x/torch/serialization.py", "_open_zipfile_writer")), "checkpoint_save"),
        (_frames(("transformers/trainer.py", "train"), ("transformers/trainer.py", "_load_from_checkpoint")),
         "checkpoint_load"),
        (_frames(("a.py", "main"), ("/x/torch/serialization.py", "load")), None),
        (_frames(("accelerate/accelerator.py", "prepare_model"), ("/x/torch/nn/parallel/distributed.py", "__init__"),
                 ("/x/torch/distributed/utils.py", "_verify_param_shape_across_processes")), "dp_wrap"),
    ],
)
def test_other_trainers_save_and_load_frames(frames, phase):
    assert phase_from_frames(frames) == phase


@pytest.mark.parametrize(
    "frames, phase",
    [
        # verl creates its Ray worker groups (and their config checks run) before any step
        # (corpus/dev/c-verl-ttrl-ppo-mini-batch-normalised-to-zero.log).
        (
            _frames(("/w/verl/trainer/main_ppo.py", "run"), ("/w/verl/trainer/ppo/ray_trainer.py", "init_workers"),
                    ("/w/verl/single_controller/ray/base.py", "__call__")),
            "init",
        ),
        (_frames(("/w/verl/trainer/ppo/ray_trainer.py", "init_model"),), "init"),
        # the worker's own construction, as the Ray actor's creation task prints it
        (_frames(("/w/verl/single_controller/ray/base.py", "__init__"), ("/w/verl/workers/fsdp_workers.py", "__init__")), "init"),
        # NeMo Automodel builds the model and loads its base weights inside build_model_and_optimizer
        # (corpus/dev/c-automodel-tp2-remote-code-default-plan-shard-order-assert.log).
        (
            _frames(("/o/nemo_automodel/recipes/llm/train_ft.py", "setup"),
                    ("/o/nemo_automodel/recipes/llm/train_ft.py", "build_model_and_optimizer"),
                    ("/o/nemo_automodel/components/checkpoint/checkpointing.py", "load_base_model")),
            "model_build",
        ),
        # a checkpoint load frame below it still names the load
        (
            _frames(("/o/nemo_automodel/recipes/llm/train_ft.py", "build_model_and_optimizer"),
                    ("/o/megatron/training/checkpointing.py", "load_checkpoint")),
            "checkpoint_load",
        ),
    ],
)
def test_worker_and_model_setup_frames(frames, phase):
    assert phase_from_frames(frames) == phase


# Other frameworks' progress: a failure after their first completed step is in training, after a save was
# announced in the save (corpus/dev: a-automodel-*, b-cuda-uncorrectable-ecc-*, c-ckptio-safetensors-*).
OTHER_RUNS = [
    ("2026-02-26 06:14:44 | INFO | root | step 600 | epoch 0 | loss 0.7320 | grad_norm 16.9640 | lr 9.60e-06", "training"),
    ("[rank0]:[titan] 2026-04-02 06:13:01,117 - root - INFO - step: 10  loss:  7.1234  memory: 57.42GiB", "training"),
    ("(TaskRunner pid=3120) step:3 - global_seqlen/mean:180291 - actor/pg_loss:0.0098", "training"),
    ("Steps:   1%|          | 371/20000 [02:33<122:17,  2.71it/s, loss=0.138, lr=1e-5]", "training"),
    # (accphase5) a bar without a description past its first step: HF Trainer's (or a script's) step bar
    ("  0%|▏         | 1/2500 [00:03<2:04:00, 3.22s/it]", "training"),
    ("Actor Train epoch [1/1]: 100%|██████████| 8/8 [02:11<00:00, 16.44s/it, pg=0.0118, cfrac=0.00152]", "training"),
    ("[2022-11-19 09:48:55,610 INFO] Step 500/ 20000; acc:  11.42; ppl: 2871.30; xent: 7.96; lr: 0.00062;", "training"),
    ("INFO:train:Training finished; saving final checkpoint to outputs/run_1/checkpoints/final.ckpt", "checkpoint_save"),
    ("INFO:train:Training finished; writing final checkpoint outputs/run_1/checkpoints/final.ckpt", "checkpoint_save"),
    ("`Trainer.fit` stopped: `max_epochs=60` reached.", "shutdown"),
    ("[INFO|trainer.py:1721] 2024-02-08 14:04:59,418 >> ***** Running training *****", "first_iteration"),
    ("[INFO|trainer.py:3158] 2024-02-08 15:10:02,001 >> ***** Running Evaluation *****", "eval"),
    ("{'eval_loss': 1.4437, 'eval_runtime': 61.2208, 'eval_samples_per_second': 16.335, 'epoch': 0.05}", "training"),
    ("[INFO|trainer.py:3503] 2024-08-12 03:18:09,324 >> Saving model checkpoint to saves/q/checkpoint-100", "checkpoint_save"),
    ("[2025-06-02 20:41:24,859] [INFO] [logging.py:128:log_dist] [Rank 0] [Torch] Checkpoint global_step1 is about to be saved!", "checkpoint_save"),
]
NOT_PROGRESS = [
    "Processed prompts:  40%|████      | 205/512 [00:03<00:10, 35.2it/s, est. speed input: 1200 toks/s]",
    "Steps:   0%|          | 0/20000 [00:00<?, ?it/s]",
    "Loading checkpoint shards: 100%|██████████| 2/2 [00:09<00:00,  4.61s/it]",
    "  0%|          | 0/4875 [00:00<?, ?it/s]",
    "Running tokenizer on dataset: 100%|██████████| 20000/20000 [00:09<00:00, 2140.64 examples/s]",
]


@pytest.mark.parametrize("line, phase", OTHER_RUNS)
def test_other_frameworks_progress_and_save_lines(line, phase):
    assert phase_of(2, "job.log", phase_markers(line), []) == phase
    # training frames after a completed step are training, not the first iteration
    frames = ['File "/w/train.py", line 9, in train', 'File "/t/torch/autograd/__init__.py", line 3, in backward']
    if phase == "training":
        assert phase_of(2, "job.log", phase_markers(line), frames) == "training"


# bars that name a phase without being training progress: the marker they give, if any
PHASE_BARS = {
    "Loading checkpoint shards:": "hf_loading_shards",  # transformers' from_pretrained: model_build
    "Running tokenizer on dataset:": "hf_datasets_map",  # datasets' map: data prepared, the Trainer's set-up next (init)
    "  0%|          | 0/": "bare_bar_start",  # a bar without a description opening: HF Trainer's step bar (first_iteration)
}


@pytest.mark.parametrize("line", NOT_PROGRESS)
def test_loading_and_tokenising_bars_are_not_progress(line):
    names = [name for name, _ in phase_markers(line)]
    assert not any(name in TRAINING_PROGRESS for name in names)
    assert names == [marker for prefix, marker in PHASE_BARS.items() if line.startswith(prefix)]


def test_a_failure_after_the_datasets_map_bar_is_in_the_trainer_set_up_not_the_model_build():
    shards = "Loading checkpoint shards: 100%|██████████| 2/2 [00:04<00:00,  2.11s/it]"
    mapped = "Map: 100%|██████████| 100000/100000 [00:09<00:00, 10841.25 examples/s]"
    assert phase_of(3, "job.log", phase_markers(f"{shards}\n{mapped}"), []) == "init"
    assert phase_of(3, "job.log", phase_markers(f"{mapped}\n{shards}"), []) == "model_build"


def test_a_process_killed_right_after_the_checkpoint_shard_bar_died_building_the_model():
    bar = "Loading checkpoint shards:  56%|█████     | 21/37 [02:37<02:15, 1.84s/it]"
    assert phase_of(2, "job.log", phase_markers(bar), []) == "model_build"
    # weak: once training progress was seen (a reference model loaded later), the bar says nothing
    step = " [2026-01-02 10:04:00] iteration       10/   10000 | consumed samples:        10240 | lm loss: 2.404998E+00 |"
    markers = phase_markers(f"{step}\n{bar}")
    assert "iteration" in [name for name, _ in markers] and markers[-1][0] == "hf_loading_shards"
    assert phase_of(3, "job.log", markers, []) == "training"


def test_torch_save_and_private_save_checkpoint_frames_are_checkpoint_save():
    hf = _frames(("/s/transformers/trainer.py", "_maybe_log_save_evaluate"), ("/s/transformers/trainer.py", "_save_checkpoint"))
    assert phase_from_frames(hf) == "checkpoint_save"
    assert phase_from_frames(_frames(("/w/train.py", "main"), ("/s/torch/serialization.py", "save"))) == "checkpoint_save"


# torchrun's elastic rendezvous and DeepSpeed inference's model injection name their phase by their frames
# (pytorch#107021-style RendezvousConnectionError; DeepSpeed#3634-style init_inference head-count assert).
@pytest.mark.parametrize(
    "frames, phase",
    [
        (
            _frames(
                ("/opt/conda/lib/python3.10/site-packages/torch/distributed/launcher/api.py", "launch_agent"),
                ("/opt/conda/lib/python3.10/site-packages/torch/distributed/elastic/rendezvous/registry.py",
                 "get_rendezvous_handler"),
                ("/opt/conda/lib/python3.10/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py",
                 "_create_tcp_store"),
            ),
            "init",
        ),
        (
            _frames(
                ("/workspace/infer_tp.py", "<module>"),
                ("/usr/local/lib/python3.10/dist-packages/deepspeed/__init__.py", "init_inference"),
                ("/usr/local/lib/python3.10/dist-packages/deepspeed/inference/engine.py", "__init__"),
                ("/usr/local/lib/python3.10/dist-packages/deepspeed/module_inject/replace_module.py", "update_mp_params"),
            ),
            "model_build",
        ),
        # DeepSpeed's training engine is not model building
        (_frames(("/x/deepspeed/runtime/engine.py", "step"),), None),
    ],
)
def test_launcher_and_inference_setup_frames(frames, phase):
    assert phase_from_frames(frames) == phase


@pytest.mark.parametrize(
    "line", ["Epoch 3/40", " 412/1250 [========>.....................] - loss: 0.4127 - acc: 0.8511"]
)
def test_keras_style_epoch_and_step_progress_is_training(line):
    assert phase_of(2, "job.log", phase_markers(line), []) == "training"


@pytest.mark.parametrize("line", ["Epoch 1/40", "Epoch 3/40: resuming", "   Epoch 12/40 done in 3s"])
def test_first_epoch_header_and_other_epoch_lines_are_not_progress(line):
    assert phase_markers(line) == []


@pytest.mark.parametrize(
    "line",
    [
        "Epoch [1][74/371]  loss: 1.1705  lr: 0.00990  data_time: 0.205  time: 0.493",  # mmcv-style loop
        "[2021-10-25 21:05:40,812 INFO] 5000 iteration, USE_EMA: True, train/sup_loss: 1.0377, train/total_loss: 1.2661",
        "[2021-10-25 21:02:11,204 INFO] [Epoch 0] train/sup_loss: 4.2011, train/unsup_loss: 0.0000",
        "2022-09-06 14:13:07,107 - mmrotate - INFO - Epoch [1][50/3200]\tlr: 3.3e-04, eta: 9:58:12, loss_cls: 1.17, loss: 1.87",
        "10-08 03:12:41.558 [epoch 18], [iter 610 / 745], [train main loss 0.217640], [lr 0.008411]",
        "ep 12 train, step 3810, ce 1.913, fer 0.402, num_seqs 21, max_size:time 1830, 0.522 sec/step",  # RETURNN
        "Aug 29 16:41:03.137 [INFO] albert accumulated 768 samples for epoch #117 from 2 peers. ETA 7.42 sec",  # hivemind
    ],
)
def test_other_loops_step_and_loss_lines_are_training(line):
    assert phase_of(2, "job.log", phase_markers(line), []) == "training"


@pytest.mark.parametrize(
    "line",
    [
        "Epoch [1][74/371] starting",  # a counter without a loss value
        "epoch 18 will use iter schedule 3",
        "loss scale: 65536.0, reducing to 32768.0",
        "Using 5000 iteration budget; the loss: not computed yet",
    ],
)
def test_counters_or_losses_alone_are_not_progress(line):
    assert [name for name, _ in phase_markers(line) if name == "step_loss"] == []


def test_device_setup_and_inference_engine_profiling_frames_are_init():
    vllm = [
        '  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/worker_base.py", line 140, in execute_method',
        '  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/worker.py", line 154, in determine_num_available_blocks',
        '  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/model_runner.py", line 839, in profile_run',
    ]
    assert phase_from_frames(vllm) == "init"
    accelerate = ['  File "/env/lib/python3.9/site-packages/accelerate/state.py", line 301, in __init__',
                  '  File "/env/lib/python3.9/site-packages/torch/cuda/__init__.py", line 478, in set_device']
    assert phase_from_frames(accelerate) == "init"
    # a step that fails in the forward pass stays training even if the worker set its device earlier in the stack
    assert phase_from_frames(['  File "/w/train.py", line 9, in set_device', '  File "/w/train.py", line 30, in train_step']) == "training"


def test_a_driver_function_named_train_is_not_the_training_step():
    # a user's or framework's train() wraps the whole run (set-up included): only step/forward/backward frames say
    # the failure happened while training
    from diagnose.normalize.phases import phase_from_frames

    setup = ['File "/w/train_network.py", line 238, in train', 'File "/w/library/train_util.py", line 3441, in get_optimizer']
    assert phase_from_frames(setup) != "training"
    step = ['File "/w/train.py", line 90, in train', 'File "/w/megatron/training/training.py", line 700, in train_step']
    assert phase_from_frames(step) == "training"


# ------------------------------------------------------------------ rules/phases/phases.toml: examples and loader

PHASE_FILE = load_phase_file()


@pytest.mark.parametrize("marker", PHASE_FILE.markers, ids=lambda m: m.spec.name)
def test_marker_examples(marker):
    assert marker.examples.match, "every marker carries a line it must match"
    for line in marker.examples.match:
        found = re.search(marker.spec.regex or re.escape(marker.spec.anchor), normalize_line(line).text)
        assert found is not None and marker.spec.anchor in found.group(0), line
        assert marker.spec.name in [name for name, _ in phase_markers(line)]
        assert phase_of(2, "job.log", [(marker.spec.name, LogLine("job.log", 1, line, line))], []) == marker.phase
    for line in marker.examples.no_match:
        assert marker.spec.name not in [name for name, _ in phase_markers(line)], line


@pytest.mark.parametrize("frame", PHASE_FILE.frames, ids=lambda f: f"{f.phase}-{f.pattern.pattern[:24]}")
def test_frame_examples(frame):
    assert frame.examples.match
    for key in frame.examples.match:
        assert phase_from_frames([key]) == frame.phase, key
    for key in frame.examples.no_match:
        assert phase_from_frames([key]) != frame.phase, key


def test_the_built_in_phase_file_lints_clean_and_a_broken_example_is_reported(tmp_path):
    assert lint_phase_file() == []
    broken = tmp_path / "phases.toml"
    broken.write_text(
        '[[marker]]\nname = "x"\nanchor = "Starting"\nregex = "Starting (?=run)"\nphase = "init"\n'
        'examples.match = ["Starting run"]\nexamples.no_match = ["Starting run now"]\n'
        '[[frame]]\nphase = "eval"\nregex = ":evaluate$"\nexamples.match = ["m.py:evaluate_model"]\n',
        encoding="utf-8",
    )
    messages = [p.message for p in lint_phase_file(broken)]
    assert any(m.startswith("marker x: regex is not RE2-compatible") for m in messages)
    assert "marker x: no_match example 'Starting run now' is captured" in messages
    assert any(m.startswith("frame 1 (eval): match example 'm.py:evaluate_model' gives") for m in messages)


@pytest.mark.parametrize(
    "text, error",
    [
        ("[[marker]]\nname = 'x'\nanchor = 'a'\nphase = 'lunch'\n", "marker 1 (x): phase 'lunch' is not one of"),
        ("[[marker]]\nname = 'x'\nanchor = 'a'\nphase = 'init'\nprogess = true\n", "unknown key(s) progess"),
        ("[[marker]]\nname = 'x'\nanchor = 'a'\nphase = 'init'\nregex = '('\n", "marker 1 (x): missing ),"),
        ("[[marker]]\nname = 'x'\nanchor = 'a'\nphase = 'init'\nkeep = 'most'\n", "keep 'most' is not one of"),
        ("[[frame]]\nphase = 'init'\nregex = []\n", "frame 1: 'regex' must be a string or a list of strings"),
        ("[[marker]]\nname = 'x'\nanchor = 'a'\nphase = 'init'\n" * 2, "marker x is defined twice"),
        ("[[marker]\n", "invalid TOML"),
    ],
)
def test_a_malformed_phase_file_is_one_clear_error(tmp_path, text, error):
    path = tmp_path / "phases.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DiagnoseError) as raised:
        load_phase_file(path)
    message = str(raised.value)
    assert message.startswith(f"phase markers file {path}: ") and error in message and "\n" not in message


def test_frame_regex_lists_are_one_alternation():
    # a list of alternatives is the same regex as the alternatives joined by "|" (what the file used to spell out)
    save = next(frame for frame in PHASE_FILE.frames if frame.phase == "checkpoint_save")
    assert save.pattern.flags & re.M
    assert save.pattern.pattern.startswith(r":_?(?:save_checkpoint\w*|") and "|dist_checkpointing/" in save.pattern.pattern


def test_a_windows_tracebacks_frames_name_the_same_phase():
    # a traceback printed on Windows has backslashes in its paths: the frame patterns (written with '/') still read it
    windows = [r'File "C:\env\lib\site-packages\torch\distributed\checkpoint\filesystem.py", line 3, in read_data']
    posix = ['File "/env/lib/site-packages/torch/distributed/checkpoint/filesystem.py", line 3, in read_data']
    assert phase_from_frames(posix) == "checkpoint_load"
    assert phase_from_frames(windows) == "checkpoint_load"


def test_lightning_strategy_set_up_is_the_dp_wrap():
    """(accphase5) Lightning's strategy wraps the model and sets up its optimizers before the fit loop."""
    frames = [
        'File "/w/train.py", line 81, in main',
        'File "/v/lightning/pytorch/trainer/trainer.py", line 1083, in _run',
        'File "/v/lightning/pytorch/strategies/fully_sharded_native.py", line 281, in setup',
        'File "/v/lightning/pytorch/strategies/fully_sharded_native.py", line 299, in setup_optimizers',
    ]
    assert phase_of(9, "job.log", [], frames) == "dp_wrap"



HF_TRAIN = """  0%|          | 0/39063 [00:00<?, ?it/s]
{'loss': 6.8312, 'grad_norm': 3.0625, 'learning_rate': 7.68e-06, 'epoch': 0.0}
  0%|          | 50/39063 [04:31<58:51:12,  5.43s/it]
"""
EVAL_BAR = """  0%|          | 0/313 [00:00<?, ?it/s]
  3%|▎         | 9/313 [00:08<04:40,  1.08it/s]
"""


def _phase_after(text: str) -> str:
    return phase_of(text.count("\n") + 1, "job.log", phase_markers(text), [])


def test_a_bar_opened_after_hf_trainer_loss_lines_is_its_evaluation():
    """(accphase5) HF Trainer's one step bar, its loss lines, then a new bar: the evaluation inside the loop."""
    assert _phase_after(HF_TRAIN + EVAL_BAR) == "eval"
    assert _phase_after(HF_TRAIN + EVAL_BAR.splitlines()[0] + "\n") == "eval"


def test_the_training_bar_resuming_after_evaluation_is_training():
    resumed = "  0%|          | 51/39063 [05:40<58:51:12,  5.43s/it]\n"
    assert _phase_after(HF_TRAIN + EVAL_BAR + resumed) == "training"
    assert _phase_after(HF_TRAIN + EVAL_BAR + "{'loss': 5.44, 'learning_rate': 1.5e-05, 'epoch': 0.01}\n") == "training"


def test_a_scripts_epoch_bars_without_hf_loss_lines_are_training():
    epochs = "  0%|          | 0/1000 [00:00<?, ?it/s]\n 50%|█████     | 500/1000 [01:00<01:00,  8.3it/s]\n"
    assert _phase_after(epochs + epochs) == "training"
    assert _phase_after("  0%|          | 0/2439 [00:00<?, ?it/s]\n") == "first_iteration"


def test_a_dataset_build_that_caches_with_torch_save_is_set_up_not_a_checkpoint_save():
    # (tuner r33) DeepSpeed-Chat's create_prompt_dataset torch.saves the split it built: the dataset-building frame
    # comes before the save frames in the phase file, so the failure is set-up; a plain torch.save is still a save
    cache = [
        'File "/w/DeepSpeed-Chat/training/utils/data/data_utils.py", line 328, in create_prompt_dataset',
        'File "/env/lib/python3.8/site-packages/torch/serialization.py", line 422, in save',
        'File "/env/lib/python3.8/site-packages/torch/serialization.py", line 309, in _open_zipfile_writer',
    ]
    assert phase_from_frames(cache) == "init"
    assert phase_from_frames([cache[0].replace("create_prompt_dataset", "train")] + cache[1:]) == "checkpoint_save"
    resume = ['File "/env/lib/python3.10/site-packages/nemo/utils/exp_manager.py", line 642, in check_resume']
    assert phase_from_frames(resume) == "checkpoint_load"


def test_a_marker_anchored_on_a_launchers_line_prefix_is_a_lint_error(tmp_path):
    """An anchor inside torchrun's `[rank0]: ` prefix prefilters nothing on such a log: every line is a candidate."""
    broad = tmp_path / "phases.toml"
    broad.write_text('[[marker]]\nname = "x"\nanchor = "]:"\nregex = \'^\\[batch=\\d+\\]:$\'\nphase = "training"\n'
                     'examples.match = ["[batch=3]:"]\n', encoding="utf-8")
    messages = [p.message for p in lint_phase_file(broad)]
    assert "marker x: anchor ']:' is in the prefix '[rank0]: ' that every line of some logs carries" in messages
