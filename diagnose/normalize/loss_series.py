"""The loss series a log prints as training goes: the training loss of each logged step, the loss of each evaluation.

Trainers print their loss in many shapes (Megatron's ``lm loss: 2.40E+00 |``, torchtitan's ``loss:  2.31``, the
Hugging Face Trainer's ``{'loss': 1.87, ...}`` and ``{'eval_loss': 1.2, ...}``, Lightning's ``loss=0.5``, a custom
loop's ``train loss 11.8473`` or ``| eval loss 11.8421 |``). Only the loss itself is read, by its usual names
(``loss``, ``lm loss``, ``train loss``, ``train_loss``, ``train/loss``; ``eval loss``, ``eval_loss``, ``val_loss``,
``validation loss``, Megatron's validation ``lm loss value``): a component (``pg_loss``, ``aux_loss``, ``z_loss``,
``actor/loss``) or a setting (``loss_scale``, ``loss scale: 1.0``) is not the training objective and may rightly stay
constant.

``CAPTURES`` asks the scanner for the loss lines: the earliest ``SERIES_LINES`` of them, and the last one (the end of
a long run, where a loss that fell late shows it fell), deferred: read after the scan, only when asked (a Megatron
log says ``loss`` on every iteration line, and the series matters only when nothing else is the root cause).
``series_of`` turns the captured lines into one series per input file and kind (train, eval), each point a distinct
line: a line repeated by every rank is one point.

The gradient norm the same step lines print is read too, as its own kind (``grad_norm``): Megatron's ``grad norm:
0.741 |``, the Hugging Face Trainer's ``'grad_norm': 1.25``, verl's ``actor/grad_norm:0.412``, ``grad_norm=0.30``.
Each name as printed (``actor/grad_norm``, ``critic/grad_norm``) is a series of its own: an actor's and a critic's
norms are two models'. A norm printed non-finite (``grad_norm inf``, ``'grad_norm': nan``, ``grad norm: inf |``: the
backward pass overflowed, or an fp16 loss scaler's skipped step) is no point of the series' values; it is kept
beside them, in ``LossSeries.nonfinite``, for the reading of a norm that keeps coming back non-finite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from diagnose.model import Block, CaptureSpec, LogLine

SERIES_LINES = 256  # the earliest loss lines kept (across ranks: repeated lines are one point)
CAPTURE_PREFIX = "loss_series."

_NUMBER = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
# how Python, torch and C++ print a non-finite float ("inf", "-inf", "nan", numpy's "NaN", "Infinity" in JSON)
_NONFINITE = r"[-+]?(?:nan|inf(?:inity)?)"
# the loss's own names; longest first so that "lm loss value" is not read as "lm loss"
_EVAL_NAMES = r"lm loss value|validation loss|valid(?:ation)?_loss|eval(?:uation)?[ _/]loss|val[ _/]loss"
_TRAIN_NAMES = r"train(?:ing)?[ _/]loss|lm loss|loss"
# the name starts the line or follows a separator (not a letter, "_" or "/": pg_loss, actor/loss are components),
# ends at a word boundary (loss_scale is a setting), then an optional quote and ":" or "=", then the number
_LOSS = re.compile(
    rf"""(?:^|(?<=[\s'"{{(\[,;|]))(?P<name>{_EVAL_NAMES}|{_TRAIN_NAMES})['"]?(?![\w/])\s*[:=]?\s*(?P<value>{_NUMBER})"""
    rf"""(?![\w.])""",
    re.IGNORECASE,
)
_EVAL = re.compile(rf"^(?:{_EVAL_NAMES})$", re.IGNORECASE)
# a run's summary, not a step: the Hugging Face Trainer's end-of-training metrics (the dict with ``train_runtime``,
# and its ``log_metrics`` table row ``  train_loss = 0.8917``) give the MEAN loss over the whole run, which lies above
# the last steps' loss of any run that learned
_RUN_SUMMARY = re.compile(r"'train_runtime'|^\s*train_loss\s+=\s")
# Megatron's validation line names the loss "lm loss value" after "validation loss at iteration N |": the train-loss
# name inside it is the eval's
_VALIDATION_LINE = re.compile(r"validation loss at", re.IGNORECASE)

# the gradient norm's names: a prefix naming the model it belongs to (actor/, train/) is kept as part of the name
_GRAD_NAMES = r"grad(?:ient)?[ _]norm"
_GRAD = re.compile(
    rf"""(?:^|(?<=[\s'"{{(\[,;|]))(?P<name>(?:[A-Za-z]\w*/)*(?:{_GRAD_NAMES}))['"]?(?![\w/])\s*[:=]?\s*"""
    rf"""(?P<value>{_NUMBER}|{_NONFINITE})(?![\w.])""",
    re.IGNORECASE,
)
GRAD_KIND = "grad_norm"

_REGEX = rf"""(?i)(?:^|[\s'"{{(\[,;|])(?:{_EVAL_NAMES}|{_TRAIN_NAMES})['"]?\s*[:=]?\s*{_NUMBER}"""

_GRAD_REGEX = rf"""(?i)(?:^|[\s'"{{(\[,;|/])(?:{_GRAD_NAMES})['"]?\s*[:=]?\s*(?:{_NUMBER}|{_NONFINITE})"""

CAPTURES: list[CaptureSpec] = [
    spec
    for anchor in ("loss", "Loss", "LOSS")
    for spec in (
        CaptureSpec(f"{CAPTURE_PREFIX}{anchor}.all", anchor, regex=_REGEX, keep="all", max_blocks=SERIES_LINES,
                    deferred=True),
        CaptureSpec(f"{CAPTURE_PREFIX}{anchor}.last", anchor, regex=_REGEX, keep="last", deferred=True),
    )
] + [
    spec
    # "grad norm", "Grad norm", "grad_norm", "gradient norm", "Gradient_norm": the anchor leaves out the first letter
    for anchor in ("rad norm", "rad_norm", "radient norm", "radient_norm")
    for spec in (
        CaptureSpec(f"{CAPTURE_PREFIX}{anchor}.all", anchor, regex=_GRAD_REGEX, keep="all", max_blocks=SERIES_LINES,
                    deferred=True),
        CaptureSpec(f"{CAPTURE_PREFIX}{anchor}.last", anchor, regex=_GRAD_REGEX, keep="last", deferred=True),
    )
]


@dataclass(frozen=True, slots=True)
class LossPoint:
    value: float
    text: str  # the value as printed (its digits say how precisely it was printed)
    line: LogLine


@dataclass(slots=True)
class LossSeries:
    path: str
    kind: str  # "train", "eval" or GRAD_KIND
    points: list[LossPoint] = field(default_factory=list)
    name: str = ""  # a gradient norm's name as printed, lower-cased ("actor/grad_norm"); "" for a loss
    nonfinite: list[LossPoint] = field(default_factory=list)  # a gradient norm's lines that printed inf or nan

    @property
    def values(self) -> list[float]:
        return [p.value for p in self.points]


def _finite(printed: str) -> float | None:
    """The number as printed, None when it is no number or not finite (nan, inf: no level to read)."""
    try:
        value = float(printed)
    except ValueError:
        return None
    return value if finite(value) else None


def finite(value: float) -> bool:
    return value == value and value not in (float("inf"), float("-inf"))


def losses_of(text: str) -> list[tuple[str, float, str]]:
    """``(kind, value, value as printed)`` of each loss on a line, kind "train" or "eval"."""
    if _RUN_SUMMARY.search(text):
        return []
    out = []
    validation = _VALIDATION_LINE.search(text) is not None
    for m in _LOSS.finditer(text):
        name = m.group("name")
        if (value := _finite(m.group("value"))) is None:
            continue
        kind = "eval" if validation or _EVAL.match(name) else "train"
        out.append((kind, value, m.group("value")))
    return out


def all_grad_norms_of(text: str) -> list[tuple[str, float, str]]:
    """``(name, value, value as printed)`` of each gradient norm on a line, finite or not, the name lower-cased."""
    out = []
    for m in _GRAD.finditer(text):
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        out.append((m.group("name").lower(), value, m.group("value")))
    return out


def grad_norms_of(text: str) -> list[tuple[str, float, str]]:
    """``(name, value, value as printed)`` of each finite gradient norm on a line, the name lower-cased."""
    return [g for g in all_grad_norms_of(text) if finite(g[1])]


def series_of(blocks: dict[str, list[Block]]) -> list[LossSeries]:
    """One series per (input file, kind), in line order, and one per (input file, gradient norm name); each distinct
    line is one point (a line that every rank printed the same is counted once)."""
    lines: dict[tuple[str, int], LogLine] = {}
    for name, got in blocks.items():
        if not name.startswith(CAPTURE_PREFIX):
            continue
        for block in got:
            for line in block.lines[:1]:
                lines.setdefault((line.path, line.lineno), line)
    series: dict[tuple[str, str], LossSeries] = {}
    grads: dict[tuple[str, str], LossSeries] = {}
    seen: set[tuple[str, str]] = set()
    for (path, _lineno), line in sorted(lines.items()):
        if (path, line.text) in seen:
            continue
        seen.add((path, line.text))
        for kind, value, printed in losses_of(line.text):
            s = series.setdefault((path, kind), LossSeries(path, kind))
            s.points.append(LossPoint(value, printed, line))
        for name, value, printed in all_grad_norms_of(line.text):
            g = grads.setdefault((path, name), LossSeries(path, GRAD_KIND, name=name))
            (g.points if finite(value) else g.nonfinite).append(LossPoint(value, printed, line))
    return list(series.values()) + list(grads.values())
