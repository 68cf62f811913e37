"""The phase of a failure: from its traceback frames, else from the last phase marker printed before it.

The knowledge (the progress lines Megatron-LM, Megatron-Bridge and other trainers print, the phase after each, the
frames that name a phase) is data in ``rules/phases/phases.toml``, read by ``phase_file``. ``CAPTURES`` asks the
scanner to collect the markers' lines. ``phase_of`` answers with a value of ``diagnose.model.PHASES``. Traceback
frames win over markers (an OOM with ``_ddp_wrap`` in its stack is a DP-wrap OOM whatever was printed last);
without telling frames, the last marker seen before the failure line in the same file decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from diagnose.model import CaptureSpec, LogLine
from diagnose.normalize.phase_file import PhaseFile, load_phase_file

_PHASE_FILE = load_phase_file()
CAPTURES: list[CaptureSpec] = [marker.spec for marker in _PHASE_FILE.markers]
# phases a communicator's first collective can be issued in, past the set-up (init) an NCCL set-up rule names
AFTER_SETUP = frozenset({"model_build", "dp_wrap", "checkpoint_load", "first_iteration", "training",
                         "optimizer_step", "checkpoint_save", "eval"})
# What a failure right after each marker is in the middle of.
_PHASE_AFTER_MARKER = {marker.spec.name: marker.phase for marker in _PHASE_FILE.markers}
# markers that show the job got past its first iteration
TRAINING_PROGRESS = frozenset(marker.spec.name for marker in _PHASE_FILE.markers if marker.progress)
# markers that say nothing about the phase after training progress
_WEAK_AFTER_PROGRESS = frozenset(marker.spec.name for marker in _PHASE_FILE.markers if marker.weak)
# progress counters that do not say what the job was doing when printed (a collective's sequence number): they
# show progress, are never the last marker, and the failure line's own counter counts too
BACKGROUND_PROGRESS = frozenset(marker.spec.name for marker in _PHASE_FILE.markers if marker.background)
_BACKGROUND_ON_LINE = tuple(
    (marker.spec.anchor, re.compile(marker.spec.regex or re.escape(marker.spec.anchor)))
    for marker in _PHASE_FILE.markers if marker.background
)
_FRAME_HEAD = re.compile(r'\s*File "(?P<file>[^"]*)", line \d+, in (?P<func>[\w.<>]+)')


def _frame_key(frame: str) -> str:
    """``path/file.py:function`` for a ``File "...", line N, in function`` line; other text stripped, with a ``:``
    put before it when it has none (``DDP.__init__`` becomes ``:DDP.__init__``)."""
    m = _FRAME_HEAD.match(frame)
    if m is not None:
        return f"{m.group('file').replace(chr(92), '/')}:{m.group('func')}"  # a Windows path reads as a POSIX one
    text = frame.strip()
    return text if ":" in text else f":{text}"


def phase_from_frames(frames: Iterable[str], phase_file: PhaseFile = _PHASE_FILE) -> str | None:
    """The phase named by traceback frames (``File "..."`` lines or function names), or None.

    ``phase_file``: whose frame patterns decide (the built-in file; lint passes the file it checks)."""
    keys = [_frame_key(f) for f in frames or ()]
    if not keys:
        return None
    joined = "\n".join(keys)
    for frame in phase_file.frames:
        if frame.pattern.search(joined):
            return frame.phase
    if any(key.endswith(":<module>") for key in keys[1:]):
        return "init"  # failed while importing a module: before anything ran
    return None


# HF Trainer prints one bar without a description for all its training steps, and its loss lines ({'loss': ...}) as
# it goes; a bar without a description that starts after them is the evaluation bar it opens inside the loop, until
# a step bar of another total (the training bar again) or a later loss line follows it.
_HF_LOSS, _BAR_START, _BAR_STEP = "hf_loss_log", "bare_bar_start", "bare_step_bar"
_BAR_TOTAL = re.compile(r"\|\s*\d+/(\d+) \[")


def _hf_eval_bar(events: list[tuple[int, str]], lines: dict[str, LogLine]) -> bool:
    """The last markers are HF Trainer's evaluation bar: a bar start after its loss lines, and no step bar of
    another total after that start."""
    order = {name: lineno for lineno, name in events}
    start, loss = order.get(_BAR_START), order.get(_HF_LOSS)
    if start is None or loss is None or start < loss or max(order.values()) not in (start, order.get(_BAR_STEP)):
        return False
    step = order.get(_BAR_STEP)
    if step is None or step < start:
        return True
    first, then = (_BAR_TOTAL.search(lines[name].text) for name in (_BAR_START, _BAR_STEP))
    return first is not None and then is not None and first.group(1) == then.group(1)


def _counts_progress(text: str) -> bool:
    """The failure line itself carries a background progress counter (a watchdog's ``SeqNum=48213``)."""
    return any(anchor in text and pattern.search(text) for anchor, pattern in _BACKGROUND_ON_LINE)


def progress_before(line: LogLine, markers: Iterable[tuple[str, LogLine]] | None) -> bool:
    """The file of ``line`` shows the job got past its first iteration before ``line``: a progress marker of its
    own before it (an iteration, a loss, a step bar), or a background counter on the line itself (a watchdog's
    ``SeqNum=187203``: thousands of collectives completed before this one).

    What a rule that says "before training started" from the failure line's shape alone (a one-element collective)
    must yield to."""
    try:
        if _counts_progress(line.text):
            return True
        return any(
            name in TRAINING_PROGRESS and name not in BACKGROUND_PROGRESS
            and where.path == line.path and where.lineno < line.lineno
            for name, where in markers or ()
        )
    except Exception:  # noqa: BLE001 - a phase is a hint; never break the report
        return False


def phase_of(
    line_no: int | None = None,
    path: str | None = None,
    markers: Iterable[tuple[str, LogLine]] | None = None,
    frames: Iterable[str] | None = None,
    *,
    line: LogLine | None = None,
) -> str:
    """Phase of a failure at ``line_no`` of ``path`` (or at ``line``). Never raises; "unknown" when unsure.
    ``phase_reading`` says besides whether the traceback's frames told it."""
    return phase_reading(line_no, path, markers, frames, line=line)[0]


def phase_reading(
    line_no: int | None = None,
    path: str | None = None,
    markers: Iterable[tuple[str, LogLine]] | None = None,
    frames: Iterable[str] | None = None,
    *,
    line: LogLine | None = None,
) -> tuple[str, bool]:
    """``phase_of``'s phase, and whether a frame of the traceback named it (not the markers before the line).

    ``markers``: ``(capture name, LogLine)`` of the ``CAPTURES`` the scanner met, in any order (those of other
    files and at or after the failure line are left out). ``frames``: the failure's traceback frames, outermost
    first. Background progress markers (``background = true``) count as progress, on the failure line too, but
    never name the phase: alone they say "training".
    """
    try:
        if line is not None:
            line_no = line.lineno if line_no is None else line_no
            path = line.path if path is None else path
        kept = [
            (name, where) for name, where in markers or ()
            if name in _PHASE_AFTER_MARKER and path in (None, where.path)
            and (line_no is None or where.lineno < line_no)
        ]
        events = sorted((where.lineno, name) for name, where in kept)
        seen_progress = any(name in TRAINING_PROGRESS for _, name in events) or (
            line is not None and _counts_progress(line.text)
        )
        events = [event for event in events if event[1] not in BACKGROUND_PROGRESS]
        from_frames = phase_from_frames(frames or ())
        if from_frames == "training":
            return ("training" if seen_progress else "first_iteration"), True
        if from_frames is not None:
            return from_frames, True
        if not events:
            return ("training" if seen_progress else "unknown"), False
        last = events[-1][1]
        if last in (_BAR_START, _BAR_STEP) and _hf_eval_bar(events, dict(kept)):
            return "eval", False
        if last in _WEAK_AFTER_PROGRESS and seen_progress:
            return "training", False
        return _PHASE_AFTER_MARKER[last], False
    except Exception:  # noqa: BLE001 - a phase is a hint; never break the report
        return "unknown", False


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
