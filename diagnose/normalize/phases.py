"""Megatron-LM / Megatron-Bridge phase markers, and the phase of a failure derived from them and its frames.

``CAPTURES`` asks the scanner to collect the progress lines these programs print (see
../shared/knowledge/megatron-bridge.md 3.3-3.6 and megatron-core.md 4), in the order they appear in a run::

    > initializing torch distributed ...                                  init
    [after megatron is initialized] datetime: ...                         (model build is next)
     > number of parameters on (tensor, pipeline) model parallel rank ... (the model exists; DP wrap is next)
    Setting up DistributedDataParallel with config ...                    DP wrap (DDP and Megatron FSDP)
     loading distributed checkpoint from ... / successfully loaded ...    checkpoint load
    [after model, optimizer, and learning rate scheduler are built] ...   (first iteration is next)
    Starting training loop at iteration N                                 first iteration
     [ts] iteration   10/  500 | ...                                      training
    saving checkpoint at iteration ... / successfully saved checkpoint    checkpoint save
    [after training is done]                                              shutdown

``phase_of`` answers with a value of ``diagnose.model.PHASES``. Traceback frames win over markers (an OOM with
``_ddp_wrap`` in its stack is a DP-wrap OOM whatever was printed last); without telling frames, the last marker
seen before the failure line in the same file decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from diagnose.model import Block, CaptureSpec, LogLine

# a training progress bar past its first step ("Steps:   1%|  | 371/20000 [..."). Bars without a description (HF
# Trainer's) are not read: their only literal ("%|", "it/s") is on every progress bar of a log (vLLM's, loading,
# tokenising), and a capture whose anchor is frequent but whose regex rarely holds is verified line by line.
_TRAIN_BAR = r"Steps:\s*\d+%\|[^|]*\|\s*[1-9]\d*/\d+ \["

CAPTURES: list[CaptureSpec] = [
    CaptureSpec("init_distributed", anchor="> initializing torch distributed"),
    CaptureSpec("megatron_initialized", anchor="[after megatron is initialized]"),
    CaptureSpec(
        "param_count",
        anchor="> number of parameters on (",
        regex=r"> number of parameters on \([\w, ]+\) model parallel rank \([\d, ]+\): \d+",
        keep="first_last",
    ),
    CaptureSpec("ddp_setup", anchor="Setting up DistributedDataParallel with config", keep="first_last"),
    CaptureSpec("fsdp_setup", anchor="Setting up Megatron-FSDP MixedPrecisionPolicy", keep="first_last"),
    CaptureSpec("ddp_buckets", anchor="Number of buckets for gradient all-reduce", keep="first_last"),
    CaptureSpec(
        "model_optimizer_built", anchor="[after model, optimizer, and learning rate scheduler are built]"
    ),
    CaptureSpec("dataloaders_built", anchor="[after dataloaders are built]"),
    CaptureSpec("training_start", anchor="Starting training loop at iteration", keep="first_last"),
    CaptureSpec("before_training_step", anchor="[before the start of training step]", keep="first_last"),
    CaptureSpec(
        "iteration",
        anchor="iteration ",
        regex=r"(?:^|\s)iteration\s+\d+/\s*\d+ \|",
        keep="first_last",
    ),
    CaptureSpec(
        "memory_report",
        anchor=" iterations) memory (",
        regex=r"\(after \d+ iterations\) memory \((?:MB|GB)\)",
        keep="first_last",
    ),
    CaptureSpec(
        "checkpoint_save_start",
        anchor="saving checkpoint at iteration",
        regex=r"saving checkpoint at iteration\s+\d+",
        keep="first_last",
    ),
    CaptureSpec("checkpoint_saved", anchor="successfully saved checkpoint", keep="first_last"),
    CaptureSpec(
        "checkpoint_load_start",
        anchor="checkpoint from ",
        regex=r"\bloading (?:distributed )?checkpoint from ",
        keep="first_last",
    ),
    CaptureSpec("checkpoint_loaded", anchor="successfully loaded checkpoint from", keep="first_last"),
    CaptureSpec("eval_start", anchor="Evaluating iter", regex=r"Evaluating iter\s*\d+", keep="first_last"),
    CaptureSpec(
        "eval_done",
        anchor="validation loss at ",
        regex=r"validation loss at (?:iteration \d+|the end of training)",
        keep="first_last",
    ),
    # Other frameworks' per-step progress lines (the job got past its first step, as Megatron's iteration line says):
    # NeMo Automodel ("| step 600 | epoch 0 | loss ..."), torchtitan ("step: 10  loss: 7.1"), verl ("step:3 - ..."),
    # and an accelerate-style "Steps:" progress bar that has completed at least one step.
    CaptureSpec("step_progress", anchor="| step ", regex=r"\| step \d+ \| epoch \d+ \|", keep="first_last"),
    # one spec for both "step:" forms: an anchor shared by two specs would be verified twice on every such line
    CaptureSpec("step_progress_titan", anchor="step:", regex=r"\bstep:(?:\s*\d+\s+loss:|\d+ - )", keep="first_last"),
    CaptureSpec("step_progress_bar", anchor="Steps:", regex=_TRAIN_BAR, keep="first_last"),
    # Keras-style loops: "Epoch 3/40" opens the third epoch (two are done), and a step bar with its loss
    # (" 412/1250 [=====>....] - loss: 0.41") shows steps completing.
    # RETURNN's step line ("ep 12 train, step 3810, ce 1.913, ...") and hivemind's collaborative progress
    # ("albert accumulated 1536 samples for epoch #117 from 2 peers")
    CaptureSpec("returnn_step", anchor=" train, step ", regex=r"^ep \d+ train, step \d+,", keep="first_last"),
    CaptureSpec("hivemind_epoch", anchor="samples for epoch #", regex=r"accumulated \d+ samples for epoch #\d+",
                keep="first_last"),
    CaptureSpec("epoch_header", anchor="Epoch ", regex=r"^\s*Epoch (?:[2-9]|[1-9]\d+)/\d+\s*$", keep="first_last"),
    CaptureSpec("keras_step_bar", anchor="] - loss: ", regex=r"\d+/\d+ \[[=>.]+\] - loss: ", keep="first_last"),
    # DeepSpeed announces a save before writing it (HF Trainer's announcement: framework_save_start below)
    CaptureSpec("checkpoint_save_start_ds", anchor="is about to be saved", regex=r"Checkpoint \S+ is about to be saved",
                keep="first_last"),
    CaptureSpec("training_done", anchor="[after training is done]", keep="last"),
    CaptureSpec("exiting", anchor="exiting program ", keep="last"),
    # Other trainers' progress lines (HF Trainer / accelerate, DeepSpeed, Lightning, torchtune) and NCCL's own start-up.
    CaptureSpec("nccl_start", anchor="NCCL INFO Bootstrap", keep="first_last"),
    # (simple anchors and regexes: each capture regex is also compiled for Hyperscan, bounded repeats are costly)
    CaptureSpec("hf_loss_log", anchor="{'loss': ", keep="first_last"),
    CaptureSpec("deepspeed_step_log", anchor=", skipped=", regex=r"step=\d+, skipped=\d+, lr=", keep="first_last"),
    # a tqdm bar's postfix with a loss; anchored on the rate, not on "loss" (on every Megatron iteration line, where
    # the regex never holds: scanning each window for it doubled the cost of a Megatron log)
    CaptureSpec("tqdm_loss", anchor="it/s, ", regex=r"it/s, [^\]]*loss\w*=", keep="first_last"),
    CaptureSpec("tqdm_loss_slow", anchor="s/it, ", regex=r"s/it, [^\]]*loss\w*=", keep="first_last"),
    # a step/epoch counter with a loss value: "Step 10 ... loss", mmcv's "Epoch [1][74/371] lr: .. loss: 0.44",
    # "[epoch 18], [iter 610 / 745], [train main loss 0.21]",
    # "5000 iteration, ... train/total_loss: 1.27", "[Epoch 0] train/sup_loss: 4.2"
    CaptureSpec(
        "step_loss",
        anchor="oss",
        regex=r"^(?:[Ee]poch\s*\d+\W+)?(?:[Ss]tep|[Ii]ter(?:ation)?)\s*[:=]?\s*\d+\b.*\b[Ll]oss\b|"
        r"\b[Ee]poch \[\d+\]\[\d+/\d+\].*loss\w*: \d|\b\d+ iteration, .*loss\w*: \d|"
        r"\[Epoch \d+\] \S*loss\w*: \d|\b[Ee]poch\W+\d+\W.*\b[Ii]ter(?:ation)?\W+\d+.*\bloss\b",
        keep="first_last",
    ),
    CaptureSpec(
        "framework_save_start",
        anchor="aving",
        regex=r"Saving model checkpoint to |\bSaving (?:last )?model checkpoint(?: to |: )|"
        r"Saving checkpoint\. This may take some time|"
        r"Model checkpoint of size [\d.]+ \w+ saved to |\bis about to be saved!|saving model to ",
        keep="first_last",
    ),
    CaptureSpec(
        "framework_load_start",
        anchor="heckpoint",
        regex=r"Restoring states from the checkpoint path at |Loading model from .*checkpoint|"
        r"Continuing training from checkpoint",
        keep="first_last",
    ),
    CaptureSpec("framework_loaded", anchor="Restored all states from the checkpoint", keep="first_last"),
]

MARKER_NAMES = tuple(spec.name for spec in CAPTURES)

# What a failure right after each marker is in the middle of.
_PHASE_AFTER_MARKER = {
    "init_distributed": "init",
    "megatron_initialized": "model_build",
    "param_count": "dp_wrap",  # printed by get_model once the model exists, right before the DP wrapper
    "ddp_setup": "dp_wrap",
    "fsdp_setup": "dp_wrap",
    "ddp_buckets": "dp_wrap",
    "checkpoint_load_start": "checkpoint_load",
    "checkpoint_loaded": "first_iteration",
    "model_optimizer_built": "first_iteration",
    "dataloaders_built": "first_iteration",
    "training_start": "first_iteration",
    "before_training_step": "first_iteration",
    "iteration": "training",
    "memory_report": "training",
    "checkpoint_save_start": "checkpoint_save",
    "checkpoint_saved": "training",
    "eval_start": "eval",
    "eval_done": "training",
    "checkpoint_save_start_ds": "checkpoint_save",
    "step_progress": "training",
    "step_progress_titan": "training",
    "step_progress_bar": "training",
    "epoch_header": "training",
    "returnn_step": "training",
    "hivemind_epoch": "training",
    "keras_step_bar": "training",
    "training_done": "shutdown",
    "exiting": "shutdown",
    "nccl_start": "init",
    "hf_loss_log": "training",
    "deepspeed_step_log": "training",
    "tqdm_loss": "training",
    "tqdm_loss_slow": "training",
    "step_loss": "training",
    "framework_save_start": "checkpoint_save",
    "framework_load_start": "checkpoint_load",
    "framework_loaded": "first_iteration",
}
_TRAINING_PROGRESS = (
    "iteration", "memory_report", "checkpoint_saved", "eval_done", "hf_loss_log", "deepspeed_step_log", "tqdm_loss",
    "tqdm_loss_slow",
    "step_loss", "step_progress", "step_progress_titan", "step_progress_bar", "epoch_header", "keras_step_bar",
    "returnn_step", "hivemind_epoch",
)
# NCCL prints its start-up for every new communicator, also for groups created lazily in the middle of training:
# after training progress it says nothing about the phase.
_WEAK_AFTER_PROGRESS = {"nccl_start"}
TRAINING_PROGRESS = _TRAINING_PROGRESS  # markers that show the job got past its first iteration

# Frame patterns, most specific phase first: the first phase with a matching frame wins. Each frame is reduced to
# ``path/file.py:function`` (from a ``File "...", line N, in function`` line; code lines are ignored, they mention
# names like ``forward_step`` as arguments) or kept as given when it is already a name (``DDP.__init__``).
_FRAME_PHASES: list[tuple[str, re.Pattern[str]]] = [
    (
        "checkpoint_save",
        re.compile(
            r":_?(?:save_checkpoint\w*|save_sharded_\w*|save_optimizer_and_scheduler|save_pretrained|save_model)$|"
            r"dist_checkpointing/serialization\.py:save$|torch/serialization\.py:_?save$|safetensors/torch\.py:save_file$",
            re.M,
        ),
    ),
    (
        "checkpoint_load",
        re.compile(
            r":(?:load_checkpoint\w*|_load_checkpoint\w*|_load_base_checkpoint|load_sharded_\w*|"
            r"_load_from_checkpoint|_load_optimizer_and_scheduler|restore_training_state|load_fsdp_\w+)$|"
            r"dist_checkpointing/serialization\.py:load$",
            re.M,
        ),
    ),
    (
        "optimizer_step",
        re.compile(
            r"optim\w*(?:/\S*)?\.py:(?:step|_step|step_with_ready_grads|prepare_grads|clip_grad\w*|"
            r"get_grad_norm\w*|_copy_main_params_to_model_params|_copy_model_grads_to_main_grads)$|:optimizer_step$|"
            r"Optimizer\w*\.step$",
            re.M,
        ),
    ),
    (
        "dp_wrap",
        re.compile(
            r":(?:_ddp_wrap|_allocate_buffers_for_parameters|_init_fsdp_param_and_grad_buffer|fully_shard|"
            r"wrap_with_ddp)$|"
            r"(?:distributed_data_parallel|fully_sharded_data_parallel|param_and_grad_buffer|mcore_fsdp_adapter|"
            r"megatron_fsdp)\.py:__init__$|"
            r"(?:DistributedDataParallel|FullyShardedDataParallel|ParamAndGradBuffer)\.__init__$|"
            r"torch/nn/parallel/distributed\.py:__init__$|:_verify_param_shape_across_processes$",
            re.M,
        ),
    ),
    ("eval", re.compile(r":(?:evaluate|evaluate_and_print_results|evaluate_\w+)$", re.M)),
    # Bridge/Megatron setup warms up fused kernels with activation-sized tensors before training starts.
    ("init", re.compile(r":(?:set_jit_fusion_options|_warmup_jit_function)$", re.M)),
    # Trainer construction and its argument checks (Lightning's accelerator/device parsing, DeepSpeed's config) run at
    # set-up, whatever function of the user's script called them (often one named train).
    (
        "init",
        re.compile(
            r"(?:accelerator_connector|device_parser)\.py:\w+$|deepspeed/runtime/config\.py:\w+$|"
            r"deepspeed/__init__\.py:initialize$",
            re.M,
        ),
    ),
    # Datasets are built during setup, before the first iteration.
    (
        "init",
        re.compile(
            r"(?:indexed_dataset|gpt_dataset|blended_megatron_dataset_builder|megatron_dataset)\.py:\w+$|"
            r":build_train_valid_test_data\w*$",
            re.M,
        ),
    ),
    # torchrun's elastic agent rendezvous (c10d/etcd store, handler registry): before any worker runs.
    ("init", re.compile(r"torch/distributed/elastic/rendezvous/\w+\.py:\w+$", re.M)),
    # DeepSpeed inference builds (injects, shards) the model it is given; vLLM's model loader constructs its model.
    (
        "model_build",
        re.compile(
            r"deepspeed/(?:inference/engine|module_inject/\w+)\.py:\w+$|deepspeed/__init__\.py:init_inference$|"
            r"vllm/model_executor/model_loader/\w+\.py:(?:load_model|initialize_model)$",
            re.M,
        ),
    ),
    (
        "model_build",
        re.compile(
            r":(?:get_model|model_provider\w*|provide_distributed_model|provide|build_model|_build_layers|from_pretrained|"
            r"restore_from|from_config|"
            r"build_model_and_optimizer|apply_model_infrastructure|_build_model_optimizer|parallelize_\w+)$|"
            r"(?:gpt_model|transformer_block|transformer_layer|mamba_model|language_model|attention|mlp|"
            r"embedding\w*)\.py:__init__$",
            re.M,
        ),
    ),
    (
        "training",
        re.compile(
            r":(?:train_step|forward_backward_\w+|forward_step\w*|backward_step|forward|backward|"
            r"_engine_run_backward|run_backward)$",
            re.M,
        ),
    ),
    (
        "init",
        re.compile(
            r":(?:validate|runtime_config_update|initialize_megatron|_initialize_distributed|init_process_group|"
            r"finalize|__post_init__|initialize_model_parallel|validate_args|parse_args|_create_c10d_store|"
            r"rendezvous|next_rendezvous|init_workers|init_model)$|"
            r"single_controller/ray/base\.py:__init__$",  # verl: a Ray worker group's workers being created
            re.M,
        ),
    ),
    (
        # a worker setting up its device and communicators, or an inference engine sizing its cache before serving
        # (vLLM's init_device / profile_run): the job had not started its work yet
        "init",
        re.compile(
            r":(?:set_device|_setup_devices|init_device|init_worker_distributed_environment|"
            r"determine_num_available_blocks|profile_run)$",
            re.M,
        ),
    ),
]
_FRAME_HEAD = re.compile(r'\s*File "(?P<file>[^"]*)", line \d+, in (?P<func>[\w.<>]+)')


def _frame_key(frame: Any) -> str:
    text = frame if isinstance(frame, str) else getattr(frame, "text", str(frame))
    m = _FRAME_HEAD.match(text)
    if m is not None:
        return f"{m.group('file')}:{m.group('func')}"
    text = text.strip()
    return text if ":" in text else f":{text}"


def phase_from_frames(frames: Iterable[Any]) -> str | None:
    """The phase named by traceback frames (``File "..."`` lines, Frame objects or function names), or None."""
    keys = [_frame_key(f) for f in frames or ()]
    if not keys:
        return None
    joined = "\n".join(keys)
    for phase, pattern in _FRAME_PHASES:
        if pattern.search(joined):
            return phase
    if any(key.endswith(":<module>") for key in keys[1:]):
        return "init"  # failed while importing a module: before anything ran
    return None


def _marker_events(markers: Any, path: str | None, line_no: int | None) -> list[tuple[int, str]]:
    """(line, marker name) of markers before the failure line in the same file, oldest first."""
    events: list[tuple[int, str]] = []

    def add(name: str, where_path: str, where_line: int) -> None:
        if name not in _PHASE_AFTER_MARKER:
            return
        if path is not None and where_path != path:
            return
        if line_no is not None and where_line >= line_no:
            return
        events.append((where_line, name))

    if isinstance(markers, Mapping):
        for name, blocks in markers.items():
            for block in blocks or ():
                if isinstance(block, Block):
                    add(name, block.path, block.start_line)
                elif isinstance(block, LogLine):
                    add(name, block.path, block.lineno)
    elif markers:
        for item in markers:
            try:
                name, where = item
            except (TypeError, ValueError):
                continue
            if isinstance(where, LogLine):
                add(name, where.path, where.lineno)
            elif isinstance(where, Block):
                add(name, where.path, where.start_line)
    events.sort()
    return events


def phase_of(
    line_no: int | None = None,
    path: str | None = None,
    markers: Any = None,
    frames: Iterable[str] | None = None,
    *,
    line: LogLine | None = None,
) -> str:
    """Phase of a failure at ``line_no`` of ``path`` (or at ``line``). Never raises; "unknown" when unsure.

    ``markers``: ``{capture name: [Block, ...]}`` (what the scanner collected for ``CAPTURES``) or a list of
    ``(capture name, LogLine)`` in scan order. ``frames``: the failure's traceback frames, outermost first.
    """
    try:
        if line is not None:
            line_no = line.lineno if line_no is None else line_no
            path = line.path if path is None else path
        events = _marker_events(markers, path, line_no)
        seen_progress = any(name in _TRAINING_PROGRESS for _, name in events)
        from_frames = phase_from_frames(frames or ())
        if from_frames == "training":
            return "training" if seen_progress else "first_iteration"
        if from_frames is not None:
            return from_frames
        if not events:
            return "unknown"
        last = events[-1][1]
        if last in _WEAK_AFTER_PROGRESS and seen_progress:
            return "training"
        return _PHASE_AFTER_MARKER[last]
    except Exception:  # noqa: BLE001 - a phase is a hint; never break the report
        return "unknown"


# ---------------------------------------------------------------------------------------------- facts

_ITERATION = re.compile(r"iteration\s+(?P<it>\d+)/\s*(?P<total>\d+) \|")
_NUMERIC_KEYS = {
    "consumed samples": "consumed_samples",
    "elapsed time per iteration (ms)": "elapsed_ms",
    "throughput per GPU (TFLOP/s/GPU)": "tflops_per_gpu",
    "learning rate": "learning_rate",
    "global batch size": "global_batch_size",
    "lm loss": "lm_loss",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
}


def parse_iteration(text: str) -> dict[str, Any] | None:
    """Facts of a Megatron iteration line (numbers as int/float; ``nan``/``inf`` kept as floats)."""
    m = _ITERATION.search(text)
    if m is None:
        return None
    out: dict[str, Any] = {"iteration": int(m.group("it")), "train_iters": int(m.group("total"))}
    for field_text in text[m.end() :].split(" |"):
        name, sep, value = field_text.rpartition(":")
        key = _NUMERIC_KEYS.get(name.strip()) if sep else None
        if key is None:
            continue
        value = value.strip()
        try:
            out[key] = int(value) if value.lstrip("-+").isdigit() else float(value)
        except ValueError:
            continue
    return out
