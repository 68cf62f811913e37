"""Progress counters a human reads in any trainer's log (rules/phases/phases.toml, "(accphase)").

Synthetic logs: a counter that advanced (a step/iteration counter with its loss, a step out of the run's total, a
collective's sequence number in the thousands) puts a failure after it in training; a counter at its first value,
or a count of collectives that set-up alone can reach, does not.
"""

from __future__ import annotations

import pytest
from conftest import phase_markers

from diagnose.model import LogLine
from diagnose.normalize import normalize_line
from diagnose.normalize.phase_file import load_phase_file
from diagnose.normalize.phases import phase_of

WATCHDOG = (
    "[rank{r}]:[E209 03:14:51.207713512 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for "
    "600042 milliseconds before timing out."
)


def _phase_at_last_line(text: str, frames: list[str] | None = None) -> str:
    """The phase of a failure on the last line of ``text`` (markers before it, as the engine passes them)."""
    lines = text.splitlines()
    failure = normalize_line(lines[-1], "job.log", len(lines))
    return phase_of(line=failure, markers=phase_markers(text), frames=frames or [])


# ------------------------------------------------------------------ a collective's sequence number


@pytest.mark.parametrize("seq, phase", [(2113, "training"), (88120, "training"), (1999, "unknown"), (39, "unknown"),
                                        (1, "unknown")])
def test_the_failing_collectives_own_sequence_number_says_progress(seq, phase):
    # the watchdog line is the failure: its own count is read
    assert _phase_at_last_line("some unrelated line\n" + WATCHDOG.format(r=0, n=seq)) == phase


def test_a_sequence_number_never_overrides_a_later_phase_marker():
    save = "saving checkpoint at iteration     200 to /ckpt/run in torch_dist format"
    # a save announced after training progress, then the watchdog fires while saving: still the save
    assert _phase_at_last_line(f"{WATCHDOG.format(r=1, n=5000)}\n{save}\n{WATCHDOG.format(r=0, n=5001)}") == (
        "checkpoint_save"
    )
    # set-up markers after a high count (a communicator created later) do not make it init: weak after progress
    nccl = "gpu7:4102:4311 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>"
    assert _phase_at_last_line(f"{nccl}\n{WATCHDOG.format(r=0, n=40311)}") == "training"
    # a low count after NCCL's start-up stays init
    assert _phase_at_last_line(f"{nccl}\n{WATCHDOG.format(r=0, n=5)}") == "init"


def test_a_high_sequence_number_turns_training_frames_into_training_not_the_first_iteration():
    frames = ['  File "/w/train.py", line 9, in main', '  File "/t/torch/autograd/__init__.py", line 3, in backward']
    assert _phase_at_last_line("RuntimeError: CUDA error: uncorrectable ECC error encountered", frames) == (
        "first_iteration"
    )
    log = f"{WATCHDOG.format(r=2, n=41233)}\nRuntimeError: CUDA error: uncorrectable ECC error encountered"
    assert _phase_at_last_line(log, frames) == "training"
    # frames that name another phase still win
    save = ['  File "/w/train.py", line 9, in main', '  File "/x/torchtitan/components/checkpoint.py", line 3, in save']
    assert _phase_at_last_line(log, save) == "checkpoint_save"


# ------------------------------------------------------------------ step counters in other trainers' shapes


@pytest.mark.parametrize(
    "line",
    [
        # torchvision/ImageNet example's ProgressMeter: "Epoch: [e][ i/N]" with its loss
        "Epoch: [0][ 440/1563]\tTime  3.615 ( 4.464)\tData  0.068 ( 0.095)\tLoss 4.9532e+00 (5.2487e+00)",
        # detectron2's event writer: "iter: N" with its losses
        "[03/02 11:20:41 d2.utils.events]:  eta: 2:10:07  iter: 2059  total_loss: 0.912  loss_cls: 0.211  lr: 0.02",
        # a tqdm bar with "loss: v" in its postfix, slower and faster than a step a second
        "lora_run:   7%|▋         | 210/3000 [06:13<1:22:40,  1.78s/it, lr: 1.0e-04 loss: 3.991e-01]",
        "train:  40%|####      | 400/1000 [01:40<02:30,  4.00it/s, loss: 0.71]",
        # a step out of the run's total with its loss, fields between "|"
        "[2026-05-18 22:40:13] INFO trainer: step 630/5000 | loss 1.1802 | lr 1.94e-04 | 3.40 s/step",
        # a step out of the run's total heading a metrics block
        "2025-01-07 10:00:00.000\tnode-1:0\tolmo.train:889\tINFO\t[step=120/739328]",
    ],
)
def test_counters_that_advanced_are_training(line):
    assert _phase_at_last_line(f"{line}\nRuntimeError: boom") == "training"


@pytest.mark.parametrize(
    "line",
    [
        "[03/02 11:20:41 d2.utils.events]:  eta: 2:10:07  iter: 1  total_loss: 0.912",  # first value
        "SOLVER: max_iter: 90000 base_lr: 0.02 loss_type: smooth_l1",  # a config dump
        "[2026-05-18 22:20:13] INFO trainer: step 0/5000 | loss 11.02",  # first value
        "2025-01-07 10:00:00.000\tnode-1:0\tolmo.train:889\tINFO\t[step=1/739328]",  # first value
        "Epoch: [0][ 440/1563]\tTime  3.615 ( 4.464)\tData  0.068 ( 0.095)",  # no loss: a data or eval meter
        "Loading checkpoint shards: 100%|##########| 2/2 [00:09<00:00,  4.61s/it]",
    ],
)
def test_counters_at_their_first_value_or_without_a_loss_are_not_progress(line):
    assert _phase_at_last_line(f"{line}\nRuntimeError: boom") != "training"


def test_background_markers_show_progress_and_are_checked_when_loaded(tmp_path):
    background = [m for m in load_phase_file().markers if m.background]
    assert background and all(m.progress for m in background)
    bad = tmp_path / "phases.toml"
    bad.write_text('[[marker]]\nname = "x"\nanchor = "x"\nphase = "training"\nbackground = true\n'
                   'examples.match = ["x"]\n', encoding="utf-8")
    from diagnose.model import DiagnoseError

    with pytest.raises(DiagnoseError, match="background marker shows progress"):
        load_phase_file(bad)


# ------------------------------------------------------------------ what the frames say


def _stack(*path_funcs: tuple[str, str]) -> list[str]:
    return [f'  File "{path}", line 1, in {func}' for path, func in path_funcs]


SITE = "/env/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    "frames, phase",
    [
        # an HF Trainer (a subclass from any library) being constructed: its Accelerator's plugin checks are set-up
        (_stack(("/w/run.py", "main"), ("/w/my_trainer.py", "__init__"), (f"{SITE}/transformers/trainer.py", "__init__"),
                (f"{SITE}/transformers/trainer.py", "create_accelerator_and_postprocess"),
                (f"{SITE}/accelerate/accelerator.py", "__init__"), (f"{SITE}/accelerate/state.py", "__init__"),
                (f"{SITE}/accelerate/utils/dataclasses.py", "set_mixed_precision")), "init"),
        # ... but a Trainer moving its model to the device is still building the model
        (_stack(("/w/run.py", "<module>"), (f"{SITE}/transformers/trainer.py", "__init__"),
                (f"{SITE}/transformers/trainer.py", "_move_model_to_device"),
                (f"{SITE}/torch/nn/modules/module.py", "to"), (f"{SITE}/torch/nn/modules/module.py", "_apply")),
         "model_build"),
        # ... and accelerate's prepare wraps it for data parallelism
        (_stack(("/w/run.py", "main"), (f"{SITE}/accelerate/accelerator.py", "prepare"),
                (f"{SITE}/accelerate/accelerator.py", "prepare_model"),
                (f"{SITE}/accelerate/utils/dataclasses.py", "set_auto_wrap_policy")), "dp_wrap"),
        # composer's FSDP preparation, even when what fails there is an import
        (_stack(("/w/train.py", "main"), (f"{SITE}/composer/trainer/trainer.py", "__init__"),
                (f"{SITE}/composer/trainer/dist_strategy.py", "prepare_fsdp_module"),
                (f"{SITE}/composer/trainer/mosaic_fsdp.py", "<module>")), "dp_wrap"),
        # NeMo's strategy setting up model parallelism (its first barrier)
        (_stack(("/w/pretrain.py", "<module>"), (f"{SITE}/lightning/pytorch/trainer/trainer.py", "_run"),
                ("/opt/NeMo/nemo/lightning/megatron_parallel.py", "init_model_parallel"),
                (f"{SITE}/torch/distributed/distributed_c10d.py", "barrier")), "init"),
        # vLLM's warm-up runs at engine start-up, before it serves
        (_stack(("/w/offline.py", "<module>"), (f"{SITE}/vllm/v1/worker/gpu_model_runner.py", "_dummy_sampler_run"),
                (f"{SITE}/vllm/v1/sample/ops/topk_topp_sampler.py", "forward_native")), "init"),
    ],
)
def test_frames_name_the_phase(frames, phase):
    assert phase_of(line=LogLine("job.log", 50, "RuntimeError: boom", "RuntimeError: boom"), frames=frames) == phase


@pytest.mark.parametrize("step_frame", [
    ("/x/transformers/trainer.py", "training_step"),
    ("/x/composer/trainer/trainer.py", "_train_batch"),
    ("/x/detectron2/engine/train_loop.py", "run_step"),
])
def test_other_trainers_step_frames_say_a_step_was_running(step_frame):
    frames = _stack(("/w/train.py", "main"), step_frame, ("/x/lib/ops.py", "kernel"))
    failure = LogLine("job.log", 50, "RuntimeError: boom", "RuntimeError: boom")
    assert phase_of(line=failure, frames=frames) == "first_iteration"  # no progress seen yet
    progress = phase_markers("step 630/5000 | loss 1.1802 | lr 1.94e-04")
    assert phase_of(line=failure, frames=frames, markers=progress) == "training"
    # the driver around the whole run is not a step
    assert phase_of(line=failure, frames=_stack(("/w/train.py", "train"), ("/x/lib/ops.py", "kernel"))) == "unknown"
