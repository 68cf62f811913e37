"""A job that ran to the end and learned nothing: its loss did not move while its steps advanced.

How a person reads it: the log has no error, the trainer printed its loss step after step and epoch after epoch,
and the numbers do not change beyond noise (11.847, 11.852, 11.847, ... over three epochs), or every evaluation
prints the same loss to the last digit. Training that learns moves the loss; noise alone stays within a hair of the
same level. The optimizer is not updating the weights the forward pass uses (it holds other tensors than the model
does: created before FSDP flattened the parameters; frozen or detached parameters; a learning rate of 0), and the
run's exit status says nothing about it.

Three readings, any fires (thresholds from dev's clean logs, none of which fires, and its flat-loss failures):

* the train loss: at least ``MIN_TRAIN_POINTS`` distinct logged lines, the range of the values at most
  ``MAX_TRAIN_RANGE`` of their level (median), the level at least ``MIN_TRAIN_LEVEL`` (an untrained language model's;
  a healthy late window can be as flat at 2-3, a loss near 0 has no relative noise, and a reinforcement-learning
  objective legitimately sits at 0), with noise in it (``MIN_DISTINCT`` values: a loss
  printed identically at every step is a template or a cached number, and then the file's losses say nothing);
* the eval loss: at least ``MIN_EVAL_POINTS`` distinct evaluation lines printing the same value, printed to at least
  ``MIN_EVAL_DIGITS`` significant digits (a coarse print can repeat by rounding), and no train series that falls;
* the train loss of whole epochs: at least ``MIN_EVAL_POINTS`` lines that each report an epoch by its number, all
  printing the same loss to at least ``MIN_EVAL_DIGITS`` digits (an epoch's mean over the data cannot repeat so if the
  weights changed).

A fourth reading has its own rule (``COLLAPSE_RULE``): a train loss that was measured above zero and then printed
exactly 0 at every logged step to the end (2.99, 0.0, 0.0, ...). No measured loss of a model on real batches is
exactly 0; the steps go on, but what the trainer prints is no loss any more (half-precision overflow, every target
masked). It is read before the flat readings, which leave a falling series alone.

A fifth has its rule too (``DIVERGED_RULE``): a train loss that fell and then climbed back, well above the
best level it had reached, and ended there (8.0 at its best, 9.8 at the end). A person reads the curve in blocks, not
points (one lucky batch is not a level): the series is cut into ``DIVERGED_BLOCKS`` consecutive blocks, and the
median of the last block stands at least ``DIVERGED_RISE`` above the lowest block median (the best level), every step
of the last block above every step of the best block (above the noise), the best level came after a first logged
value at least ``FALLING`` higher (it had learned) and is at least ``DIVERGED_MIN_LEVEL`` (an RL objective near 0 has
no relative scale).

A sixth has its rule (``ZERO_RULE``): a train loss printed as exactly 0 at every one of at least ``MIN_ZERO_TAIL``
logged steps from the first. No loss of a model on real batches is exactly 0 from the start: the trainer reports no
measurement (a loss aggregated wrongly, every target masked, a forward pass that returned nothing). A
reinforcement-learning objective can legitimately print 0 at every step (GRPO with no KL term), so a series whose
lines also log a reward is left alone.

A seventh reads the gradient norm the step lines print (``GRAD_RULE``): a norm that grew at least ``GRAD_RISE``-fold
over the run and stayed there to the end (0.29 at the first steps, 3000-4000 over the last ones). A person reads the
norm as the size of each update before clipping: it varies with the batch, spikes for a step or two and falls back,
and in a healthy run it falls or holds its level as training settles. A norm that climbs by orders of magnitude and
does not come back means the gradients themselves have gone wrong (an unnormalised loss term, a loss scaled by the
token count twice or not at all, a learning rate that diverges the model), whatever the loss shows: read in thirds,
every step of the last third at least ``GRAD_RISE`` times the lowest norm of the first third and at least
``GRAD_MIN_LEVEL`` (large in absolute terms too: healthy runs hold levels of tens, and a tiny first norm makes
any hundredfold rise cheap). This reading is also made
when the root cause chosen is only a cascade of the job's end (Slurm cancelled it, a launcher or srun reports the
signal): a person who stops a run whose gradient norm exploded stopped it for that, and the stop says nothing more.

An eighth reads the same norm where it was printed non-finite (``NONFINITE_RULE``): ``inf`` or ``nan`` at
``NONFINITE_MIN`` logged steps or more, at least ``NONFINITE_SHARE`` of the steps from its first finite value on, one
of them among the last third. A person knows the norm of a measured gradient is a finite number: printed inf or nan,
the backward pass overflowed or produced NaN (what clipping does with it then is no update, or NaN weights). An fp16
loss scaler's skipped step prints it too, but at the first steps while the scale settles (before any finite value)
and at one step now and then after, never at a quarter of the steps to the end. Read as the norm explosion is, also
when the root cause is only the job's end.

A ninth has its rule (``JUMP_RULE``): a train loss whose first logged step is a trained model's level (below
``JUMP_MAX_FIRST``: a continued pre-training or fine-tuning run that loaded its weights) and whose next logged step
is an untrained model's (at least ``MIN_TRAIN_LEVEL`` and ``JUMP_RISE`` times the first: 1.93, then 11.4), staying at
least ``JUMP_KEEP`` times the first to the end (it never came back; it falls from there as a run from random weights
does). A person reads the first point as the loaded model measured and the second as what one update made of it:
the update destroyed the pretrained weights (a learning rate far too high with no warm-up for continued training,
an optimizer state or a precision that does not match the loaded weights). A loss spike comes back; a run that
resumed prints its level from its first step on.

The flat reading also takes a train loss printed identically at every one of at least ``MIN_TRAIN_POINTS`` logged
steps, at an untrained model's level (``MIN_TRAIN_LEVEL``), in a run someone stopped by hand (``STOPPED_RULE``):
a template or a cached number does not bring a person to stop the run; a loss that never moved does (the updated
weights are not the ones the forward pass uses).

The finding is the rule ``FLAT_RULE`` of the catalogue (``input = "loss_series"``), made only when nothing else in
the log is the root cause, so every other answer is untouched. A context rule that ``explains`` it (the line that
says why the weights did not move, such as accelerate's warning that the optimizer was created before the model was
prepared for FSDP) gives the finding its category, explanation and fix: the warning alone is only a recommendation
and fails nothing, the flat loss alone is numerics with a low confidence.
"""

from __future__ import annotations

import copy
import re
import statistics

from diagnose.inert import inert, shorten
from diagnose.match.rules import Catalogue, Rule
from diagnose.model import Block, Evidence, Finding, Report
from diagnose.normalize import collapse_carriage_returns
from diagnose.normalize.loss_series import GRAD_KIND, LossPoint, LossSeries, finite, series_of

FLAT_RULE = "NU020"
COLLAPSE_RULE = "NU021"
ZERO_RULE = "NU024"
# an RL trainer's step line logs its reward beside the loss (TRL's 'reward', 'rewards/...'; verl's critic/rewards)
_REWARD = re.compile(r"reward", re.IGNORECASE)
DIVERGED_RULE = "NU022"
DIVERGED_BLOCKS = 6  # the series is read as this many consecutive blocks, each summed up by its median
DIVERGED_RISE = 0.15  # last block median over the best one; dev clean logs: 0.02 at most where the blocks separate
DIVERGED_MIN_LEVEL = 0.5
DIVERGED_MIN_POINTS = 2 * DIVERGED_BLOCKS  # at least two logged steps a block: one value is no level
MIN_ZERO_TAIL = 8  # logged train losses of exactly 0 at the end of the series (dev's clean logs: at most 0)
# the run was stopped by hand (the launcher rule's code): its person saw a reason, so fewer zeros at the end say it
STOPPED_RULE = "LA292"
MIN_STOPPED_ZERO_TAIL = 4
MIN_TRAIN_POINTS = 10
MAX_TRAIN_RANGE = 0.005  # (max - min) / median of the train loss; dev's clean logs: 0.038 and up
MIN_DISTINCT = 3  # a train loss printed identically at every step is no measurement (a template, a cached value)
MIN_LEVEL = 0.05
# The train reading also needs a level only a model that learned nothing prints: a language model's cross-entropy
# starts near ln(vocabulary) (10.4 for 32k tokens) and falls below ~7 within a few hundred steps of any learning.
# A healthy late pretraining window, averaged over a long log interval, can sit within 0.5 % for ten lines at 2-3;
# that clean run must never be called a failure, so a flat train loss below this level says nothing.
MIN_TRAIN_LEVEL = 5.0
MIN_EVAL_POINTS = 3
MIN_EVAL_DIGITS = 4
FALLING = 0.05  # a train series whose last value is this much (relative) below its first fell: it learned
EVIDENCE_POINTS = 3
MAX_TREND = 0.5  # |Kendall tau| of a flat series: noise sits near 0, a slow warm-up descent near -1
GRAD_RULE = "NU025"
GRAD_MIN_POINTS = 6  # two logged steps a third at least
GRAD_RISE = 100.0  # every norm of the last third over the lowest of the first third
# and every norm of the last third at least this: a tiny first norm (a warm-up, a LoRA's zero-initialised B, an RL
# batch of equal rewards) makes any hundredfold rise cheap, so the absolute level decides there. Healthy runs hold
# levels of 10-50 (dev: a 32B SFT at 14-19, a detection model at 41-45, a restart at 21-38); the explosions the rule
# was written for end in the thousands
GRAD_MIN_LEVEL = 100.0
NONFINITE_RULE = "NU026"
NONFINITE_MIN = 3  # logged steps whose gradient norm was printed inf or nan, after a finite one
NONFINITE_SHARE = 0.25  # of the logged steps from the first finite norm on
# the root causes a gradient norm explosion still leads: a cascade of the job's end that says nothing of why it ended
# (Slurm cancelled the step, srun or a launcher reports the signal its tasks got)
_END_CASCADE_CATEGORIES = ("slurm", "launcher")
JUMP_RULE = "NU028"
JUMP_MIN_POINTS = 4  # the first, the jump, and two more that stay up
# the first logged loss of a model that loaded trained weights: a language model's cross-entropy after pretraining
# sits near 1.5-3, an untrained one near ln(vocabulary), 10-12 (MIN_TRAIN_LEVEL is the level the jump must reach)
JUMP_MAX_FIRST = 4.0
JUMP_RISE = 3.0  # the second logged loss over the first
JUMP_KEEP = 2.0  # every later logged loss over the first: the run never came back to the loaded model's level


def _digits(printed: str) -> int:
    """Significant digits of a printed number ("11.8421" -> 6, "0.0213" -> 3, "2.404998E+00" -> 7)."""
    mantissa = printed.lstrip("+-").split("e")[0].split("E")[0]
    return len(mantissa.replace(".", "").lstrip("0"))


def train_flat(s: LossSeries) -> bool:
    """Did this train series stay within noise of one level over many logged steps?"""
    values = s.values
    if len(values) < MIN_TRAIN_POINTS:
        return False
    level = statistics.median(values)
    if level < MIN_TRAIN_LEVEL or len(set(values)) < MIN_DISTINCT:
        return False
    if (max(values) - min(values)) / level > MAX_TRAIN_RANGE:
        return False
    return abs(_trend(values)) < MAX_TREND


def _trend(values: list[float]) -> float:
    """Kendall's tau of the values against their order: about 0 for noise around one level, near -1 for a steady
    descent however slow. A smoke test of twenty steps inside the learning-rate warm-up falls by a hair a step
    (10.962, 10.958, 10.951, ...): within the range threshold, but it is learning, and a clean run."""
    n = len(values)
    concordant = discordant = 0
    for i in range(n - 1):
        vi = values[i]
        for vj in values[i + 1:]:
            if vj > vi:
                concordant += 1
            elif vj < vi:
                discordant += 1
    pairs = n * (n - 1) // 2
    return (concordant - discordant) / pairs if pairs else 0.0


def eval_flat(s: LossSeries) -> bool:
    """Did every evaluation print the same loss, precisely enough that rounding cannot explain it?"""
    points = s.points
    if len(points) < MIN_EVAL_POINTS or points[0].value < MIN_LEVEL:
        return False
    return len({p.value for p in points}) == 1 and min(_digits(p.text) for p in points) >= MIN_EVAL_DIGITS


# a line that reports a whole epoch by its number ("epoch 3: train_loss 0.6931", "Epoch 2/5 ..."), not a step's dict
# that carries a fractional epoch ("'epoch': 0.03")
_EPOCH_LINE = re.compile(r"(?i)\bepoch\b\W{0,3}\d+\b(?!\.\d)")


def epochs_flat(s: LossSeries) -> bool:
    """Did the train loss of every epoch print the same value to the last of at least ``MIN_EVAL_DIGITS`` digits?

    An epoch's loss is the mean over a whole pass of the data: a model whose weights change cannot repeat it to four
    digits epoch after epoch (a per-step loss printed identically may be a template; an epoch's mean is measured)."""
    pts = s.points
    return (s.kind == "train" and len(pts) >= MIN_EVAL_POINTS and len({p.text for p in pts}) == 1
            and pts[0].value >= MIN_LEVEL and _digits(pts[0].text) >= MIN_EVAL_DIGITS
            and all(_EPOCH_LINE.search(p.line.text) for p in pts))


def _fell(s: LossSeries) -> bool:
    values = s.values
    return len(values) >= 2 and values[0] > 0 and (values[0] - values[-1]) / values[0] >= FALLING


def _constant(s: LossSeries) -> bool:
    """Many logged steps, one value to the last printed digit: not a measured loss (batches differ, so does their
    loss, even when nothing learns) but a template or a cached number; the file's losses say nothing then."""
    return len(s.points) >= MIN_TRAIN_POINTS and len(set(s.values)) == 1


def stuck_and_stopped(s: LossSeries, stopped_by_hand: bool) -> bool:
    """Was this train loss printed identically at every one of many logged steps, at an untrained model's level, in a
    run someone stopped by hand? A template or a cached number brings no one to stop a run; a loss that never moved
    does."""
    return (stopped_by_hand and s.kind == "train" and _constant(s) and s.values[0] >= MIN_TRAIN_LEVEL)


def flat_series(series: list[LossSeries], stopped_by_hand: bool = False) -> list[LossSeries]:
    """The series that show a run that did not learn, train first; [] when any train series of the same file fell."""
    by_path: dict[str, list[LossSeries]] = {}
    for s in series:
        by_path.setdefault(s.path, []).append(s)
    for group in by_path.values():
        train = [s for s in group if s.kind == "train"]
        if any(_fell(s) or (_constant(s) and not epochs_flat(s) and not stuck_and_stopped(s, stopped_by_hand))
               for s in train):
            continue
        flat = ([s for s in train if train_flat(s) or epochs_flat(s) or stuck_and_stopped(s, stopped_by_hand)]
                + [s for s in group if s.kind == "eval" and eval_flat(s)])
        if flat:
            return flat
    return []


def _blocks(values: list[float]) -> list[list[float]]:
    """``DIVERGED_BLOCKS`` consecutive blocks of the series: equal ones, the first taking the rest, so the last block
    is the series' latest steps only."""
    size = len(values) // DIVERGED_BLOCKS
    first = len(values) - size * (DIVERGED_BLOCKS - 1)
    bounds = [0] + [first + i * size for i in range(DIVERGED_BLOCKS)]
    return [values[a:b] for a, b in zip(bounds, bounds[1:])]


def _levels(values: list[float]) -> tuple[list[list[float]], list[float], int]:
    """The blocks, their medians and the index of the best (lowest) block before the last one."""
    blocks = _blocks(values)
    medians = [statistics.median(b) for b in blocks]
    return blocks, medians, min(range(len(blocks) - 1), key=medians.__getitem__)


def diverged(s: LossSeries) -> bool:
    """Did this train loss fall, then climb back well above its best level and end there?"""
    values = s.values
    if s.kind != "train" or len(values) < DIVERGED_MIN_POINTS or len(set(values)) < MIN_DISTINCT:
        return False
    blocks, medians, best = _levels(values)
    level = medians[best]
    # above the noise too: every step of the last block is above every step of the best block
    return (level >= DIVERGED_MIN_LEVEL and values[0] >= level * (1 + FALLING)
            and medians[-1] >= level * (1 + DIVERGED_RISE) and min(blocks[-1]) > max(blocks[best]))


def jumped_after_first(s: LossSeries) -> bool:
    """Was this train loss a trained model's at its first logged step, an untrained model's at the next, and never
    back near the first to the end?"""
    values = s.values
    if s.kind != "train" or len(values) < JUMP_MIN_POINTS:
        return False
    first, second = values[0], values[1]
    return (MIN_LEVEL <= first < JUMP_MAX_FIRST and second >= max(MIN_TRAIN_LEVEL, JUMP_RISE * first)
            and min(values[1:]) >= JUMP_KEEP * first)


def _zero_tail(values: list[float]) -> int:
    """The index where the run of exact zeros that ends the series starts (``len(values)`` when it ends otherwise)."""
    start = len(values)
    while start and values[start - 1] == 0.0:
        start -= 1
    return start


def collapsed_to_zero(s: LossSeries, stopped_by_hand: bool = False) -> bool:
    """Was this train loss measured above zero, then printed as exactly 0 at every logged step to the end?

    A run someone stopped by hand (``STOPPED_RULE``) was stopped for a reason: there a shorter tail of zeros
    (``MIN_STOPPED_ZERO_TAIL``) after a first value measured above zero is the reason, even when the loss fell to
    zero through small values (1.33, 0.44, 0.01, 0.0008, 0.0, 0.0, ...: the trainer's print rounds what is left).
    """
    if s.kind != "train":
        return False
    values = s.values
    start = _zero_tail(values)
    if start < 1:
        return False
    if stopped_by_hand and len(values) - start >= MIN_STOPPED_ZERO_TAIL and values[0] >= MIN_LEVEL:
        return True
    return len(values) - start >= MIN_ZERO_TAIL and all(v >= MIN_LEVEL for v in values[:start])


def zero_throughout(s: LossSeries) -> bool:
    """Was this train loss printed as exactly 0 at every logged step, from the first, in a trainer logging no reward?"""
    return (s.kind == "train" and len(s.points) >= MIN_ZERO_TAIL and all(v == 0.0 for v in s.values)
            and not any(_REWARD.search(p.line.text) for p in s.points))


def _thirds(values: list[float]) -> tuple[list[float], list[float]]:
    """The first and the last third of the series (the same size, at least one value each)."""
    size = max(1, len(values) // 3)
    return values[:size], values[-size:]


def grad_exploded(s: LossSeries) -> bool:
    """Did this gradient norm grow ``GRAD_RISE``-fold from its early level and stay there to the end?"""
    if s.kind != GRAD_KIND or len(s.points) < GRAD_MIN_POINTS:
        return False
    head, tail = _thirds(s.values)
    early = [v for v in head if v > 0]  # a norm printed 0 is a skipped step, not a level
    if not early:
        return False
    low = min(early)
    return min(tail) >= max(GRAD_RISE * low, GRAD_MIN_LEVEL)


def _in_order(s: LossSeries) -> list[LossPoint]:
    """A gradient norm's points, finite or not, in line order."""
    return sorted(s.points + s.nonfinite, key=lambda p: p.line.lineno)


def _from_first_finite(s: LossSeries) -> list[LossPoint]:
    """The series from its first finite value on (an fp16 loss scaler's first steps, which overflow while it finds
    its scale, are left out); [] when no value is finite."""
    pts = _in_order(s)
    first = next((i for i, p in enumerate(pts) if finite(p.value)), None)
    return [] if first is None else pts[first:]


def grad_nonfinite(s: LossSeries) -> bool:
    """Was this gradient norm printed inf or nan at ``NONFINITE_MIN`` logged steps or more after a finite one, at least
    ``NONFINITE_SHARE`` of them, one among the last third (the run did not leave it behind)?"""
    if s.kind != GRAD_KIND or len(s.nonfinite) < NONFINITE_MIN:
        return False
    pts = _from_first_finite(s)
    bad = [i for i, p in enumerate(pts) if not finite(p.value)]
    if len(bad) < NONFINITE_MIN or len(bad) < NONFINITE_SHARE * len(pts):
        return False
    return bad[-1] >= len(pts) - max(1, len(pts) // 3)


def _summary(s: LossSeries, code: str) -> str:
    """What the series shows, in words, as the reading ``code`` found it."""
    values = s.values
    if code == NONFINITE_RULE:
        pts = _from_first_finite(s)
        bad = [p for p in pts if not finite(p.value)]
        printed = sorted({p.text.lower() for p in bad})
        return (f"{s.name} was printed {' or '.join(printed)} at {len(bad)} of the {len(pts)} logged steps from its "
                f"first finite value ({pts[0].text}) on; its finite values ran from {min(values):g} to "
                f"{max(values):g}")
    if code == GRAD_RULE:
        head, tail = _thirds(values)
        low = min(v for v in head if v > 0)
        return (f"{s.name} was {low:g} at its lowest over the first {len(head)} of {len(values)} logged steps and "
                f"between {min(tail):g} and {max(tail):g} over the last {len(tail)} ({min(tail) / low:.0f} times "
                f"higher at least); its highest was {max(values):g}")
    if code == JUMP_RULE:
        return (f"the train loss was {s.points[0].text} at its first logged step and {s.points[1].text} at the next "
                f"({values[1] / values[0]:.1f} times higher), and stayed between {min(values[1:]):g} and "
                f"{max(values[1:]):g} over the {len(values) - 1} logged steps after it (the last: {values[-1]:g})")
    if code == DIVERGED_RULE:
        blocks, medians, best = _levels(values)
        return (f"the train loss fell from {values[0]:g} to a best level of about {medians[best]:g}, then climbed "
                f"back to about {medians[-1]:g} over the last {len(blocks[-1])} of {len(values)} "
                f"logged steps (medians of blocks of steps); the last value is {values[-1]:g}")
    if code == COLLAPSE_RULE:
        zeros = len(values) - _zero_tail(values)
        return (f"the train loss was {values[0]:g} at its first logged step, then exactly 0 at each of the last "
                f"{zeros} of {len(values)} logged steps")
    if code == ZERO_RULE:
        return f"the train loss was exactly 0 at each of its {len(values)} logged steps, from the first"
    if s.kind == "eval":
        return f"{len(values)} evaluations all printed eval loss {s.points[0].text}"
    if len(set(values)) == 1:
        return (f"the train loss was printed as {s.points[0].text} at every one of its {len(values)} logged steps, "
                f"and the run was stopped by hand")
    return (f"{len(values)} logged train losses stayed between {min(values):g} and {max(values):g} "
            f"(range {100 * (max(values) - min(values)) / statistics.median(values):.2f} % of the level)")


def _evidence(s: LossSeries, code: str) -> list[Evidence]:
    """The first, middle and last points; for a collapse, the last measured one, the first 0 and the last; for a
    divergence, the first, the lowest before the last block and the last."""
    pts = s.points
    if code == NONFINITE_RULE:
        ordered = _from_first_finite(s)
        first_bad = next(i for i, p in enumerate(ordered) if not finite(p.value))
        chosen = [ordered[max(0, first_bad - 1)], ordered[first_bad]] + (
            [ordered[-1]] if first_bad != len(ordered) - 1 else [])
    elif code == GRAD_RULE:
        head, _tail = _thirds(s.values)
        low = min((v, i) for i, v in enumerate(head) if v > 0)[1]
        peak = s.values.index(max(s.values))
        chosen = [pts[low], pts[peak]] + ([pts[-1]] if peak != len(pts) - 1 else [])
    elif code == JUMP_RULE:
        chosen = [pts[0], pts[1], pts[-1]]
    elif code == DIVERGED_RULE:
        head = s.values[:len(pts) - len(_blocks(s.values)[-1])]
        low = head.index(min(head))
        chosen = [pts[0], pts[low], pts[-1]]
    elif code == COLLAPSE_RULE:
        first_zero = _zero_tail(s.values)
        chosen = [pts[first_zero - 1], pts[first_zero], pts[-1]]
    else:
        chosen = [pts[0], pts[len(pts) // 2], pts[-1]][:EVIDENCE_POINTS] if len(pts) >= 3 else pts
    return [Evidence(p.line.path, p.line.lineno, shorten(inert(collapse_carriage_returns(p.line.raw)), 500))
            for p in chosen]


def _explainer(findings: list[Finding], catalogue: Catalogue, code: str) -> tuple[Finding, Rule] | None:
    """The first context finding whose rule says it explains the loss series finding ``code``."""
    for f in findings:
        rule = catalogue.by_code(f.rule)
        if rule is not None and code in rule.explains:
            return f, rule
    return None


def ended_from_outside(root: Finding | None, catalogue: Catalogue) -> bool:
    """The root cause is only a cascade of the job's end (Slurm cancelled it, srun or a launcher reports a signal):
    the series may still say why the run was stopped. The rule's role is read (the ranking made the finding's
    "root")."""
    rule = catalogue.by_code(root.rule) if root is not None else None
    return rule is not None and rule.role == "cascade" and rule.category in _END_CASCADE_CATEGORIES


def flat_loss(report: Report, blocks: dict[str, list[Block]], catalogue: Catalogue) -> None:
    """Make the collapsed- or flat-loss finding the report's root cause when nothing else is one (the gradient norm
    explosion also when the root cause is only the job's end, ``ended_from_outside``)."""
    if report.root_cause is None:
        codes: tuple[str, ...] = (COLLAPSE_RULE, ZERO_RULE, GRAD_RULE, NONFINITE_RULE, JUMP_RULE, DIVERGED_RULE,
                                  FLAT_RULE)
    elif ended_from_outside(report.root, catalogue):
        codes = (GRAD_RULE, NONFINITE_RULE)
    else:
        return
    series = series_of(blocks)
    stopped = any(f.rule == STOPPED_RULE for f in report.findings)
    # the collapse first, then a loss of 0 throughout, then an exploding gradient norm, then a divergence (a falling
    # series is not flat), each reading only where the catalogue has its rule: a catalogue without NU021, NU024,
    # NU025 or NU022 still gets NU020's reading
    for code in codes:
        rule = catalogue.by_code(code)
        if rule is None or rule.input != "loss_series":
            continue
        if code == GRAD_RULE:
            flat = [s for s in series if grad_exploded(s)]
        elif code == NONFINITE_RULE:
            flat = [s for s in series if grad_nonfinite(s)]
        elif code == COLLAPSE_RULE:
            flat = [s for s in series if collapsed_to_zero(s, stopped)]
        elif code == ZERO_RULE:
            flat = [s for s in series if zero_throughout(s)]
        elif code == JUMP_RULE:
            flat = [s for s in series if jumped_after_first(s)]
        elif code == DIVERGED_RULE:
            flat = [s for s in series if diverged(s)]
        else:
            flat = flat_series(series, stopped)
        if flat:
            break
    else:
        return
    lead = flat[0]
    points = _from_first_finite(lead) if code == NONFINITE_RULE else lead.points
    finding = Finding(
        rule=rule.code, name=rule.slug, title=rule.title, category=rule.category, phase="training",
        severity="error", role="root", confidence=rule.confidence, count=len(points),
        first_line=points[0].line.lineno, evidence=_evidence(lead, code), explanation=rule.explanation,
        fix=copy.deepcopy(rule.fix),
        facts={"series": lead.name or lead.kind, "points": len(points), "loss_min": min(lead.values),
               "loss_max": max(lead.values)},
    )
    if code == NONFINITE_RULE:
        finding.facts["nonfinite"] = sum(1 for p in points if not finite(p.value))
    finding.explanation = f"{finding.explanation}\n\nHere: " + "; ".join(_summary(s, code) for s in flat) + "."
    explained = _explainer(report.findings, catalogue, code)
    if explained is not None:
        why, why_rule = explained
        finding.category = why_rule.category
        finding.confidence = why_rule.confidence
        finding.title = f"{rule.title}: {why_rule.title}"
        finding.explanation = f"{why_rule.explanation}\n\n{finding.explanation}"
        finding.fix = copy.deepcopy(why_rule.fix)
        finding.basis = "inferred"
        finding.basis_detail = f"{why_rule.code}: {why_rule.title} ({why.evidence[0].text if why.evidence else ''})"
        finding.evidence = list(why.evidence[:1]) + finding.evidence
        finding.facts["explained_by"] = why_rule.code
    report.lead_with(finding)
