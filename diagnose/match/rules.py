"""The rules catalogue: load, validate and order rules written as TOML data.

A catalogue is a folder of ``*.toml`` files, one per family, read in file-name order; rules keep their order inside
a file. Order matters: when several rules match the same line, the LAST one in catalogue order wins (generic rules
come first in the catalogue, specific ones after them, so a specific rule overrides a generic one on the same
line). Across lines, the root cause is chosen by tier (``match/ranking.py``): a specific rule over a generic one
(the shape of an exception, its category inferred from the traceback), over a cascade, over a catch-all that
speaks only when nothing else did (Dr. CI's catch-all speaks last too; its first rule in file order wins on a
line). ``[[infer]]`` tables teach how a generic finding's category is read from its evidence
(``match/inference.py``). The schema is documented in ``rules/README.md``.

Most rules read log lines (``input = "log"``, with patterns). ``input = "slurm_job"`` rules have no patterns: they
name the ``slurm_outcome`` of a job's Slurm record (state, exit, requeues) that ``diagnose.ingest.slurm.findings``
turns into a finding, and their examples are ``scontrol show job`` records. ``input = "loss_series"`` rules have no
patterns either: they name what the log's own loss series shows (``match/flat_loss.py``: a loss that did not move
while the steps advanced), and their examples are logs.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import regex

from diagnose.model import (
    CATEGORIES,
    PHASES,
    ROLES,
    SAFETIES,
    SEVERITIES,
    DiagnoseError,
    EnvVar,
    Fix,
    ImpliedSetting,
    Implies,
    Override,
)
from diagnose.toml_data import need, one_of, optional, parse, read_text, str_list

CODE_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
INPUTS = ("log", "slurm_job", "slurm_node", "loss_series")
# What Slurm's record of a job can say, as ingest/slurm/findings.py decides it; one slurm_job rule per outcome.
SLURM_OUTCOMES = (
    "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "CANCELLED", "FAILED", "SIGNALED", "STEP_FAILED",
    "BOOT_FAIL", "DEADLINE", "REQUEUED", "LAUNCH_FAILED",
)
# The State words a slurm_node rule may name (ingest/slurm/parse.py parse_node_state): the base states and flags
# of a node Slurm took out of service or lost, and REBOOT for any REBOOT_* flag.
NODE_STATE_WORDS = (
    "DOWN", "DRAIN", "FAIL", "FAILING", "NOT_RESPONDING", "INVAL", "INVALID_REG", "REBOOT", "REBOOT_REQUESTED",
    "REBOOT_ISSUED", "MAINTENANCE",
)
LAUNCHERS = ("torchrun",)
# Anchors are at least 3 characters (a shorter literal is on most lines and defeats the fast scan), except the
# terminal's echo of Ctrl-C, which is on a line only where someone interrupted the run.
SHORT_ANCHORS = frozenset({"^C"})
NEAR_END_MAX = 1000  # [rule.context] near_end: lines from the end of the input, at most


@dataclass(slots=True)
class Pattern:
    anchor: str  # literal that occurs in every match (fast prefilter); case-sensitive
    regex: str  # matched against the normalised line text with search semantics
    # this pattern applies only at these log levels (read off the line's prefix by the normaliser), as
    # [rule.context] levels_any does for a whole rule: one rule can read its message with the level word in the text
    # (logging's " - ERROR - ") and, by another pattern, with the level in a prefix the normaliser took off (loguru)
    levels_any: tuple[str, ...] = ()
    # where the fault this wording reports is, when it differs from the rule's ``fault_on`` (one of FAULT_ON, or ""):
    # a rule that quotes any NCCL error string (nccl-tests' ``Test NCCL failure``) reads some as its node's own
    fault_on: str = ""
    # the wording is a wrapper's report that a command failed, without the command's own reason (Python's
    # ``CalledProcessError: Command 'sbatch ...' returned non-zero exit status 1``): when a line of another of the
    # rule's patterns (the command's own error) is in the same input, that line leads the finding (findings.py)
    relays: bool = False


@dataclass(slots=True)
class Context:
    """What must surround a matching line for the rule to apply."""

    frames_any: list[str] = field(default_factory=list)  # the line's traceback has a frame containing one
    frames_none: list[str] = field(default_factory=list)  # ... and none containing these
    before_any: list[str] = field(default_factory=list)  # a line of the same input before it contains one
    before_window: int = 200  # how many lines back before_any looks
    # and a line within the same window also contains one of these: a second earlier fact both must hold (CK016: a
    # restart, and a checkpoint saved before it: only then did the restart lose saved progress)
    also_before_any: list[str] = field(default_factory=list)
    # the name of a capture listing options a parser refused: the rule applies when the log shows the command line
    # that started the program (the ``prog`` capture followed by options) and none of those options is on it
    not_on_command_line: str = ""
    # the name of a capture holding the option a parser refused a value of: the rule applies when the command line
    # that typed that option runs a version-tagged release (an image ``name:v0.8.5``: command_line.pinned_release)
    pinned_on_command_line: str = ""
    # the launcher's record of the argv it gave the ``prog`` capture's script holds its own injected rank option
    # and then one config file (.yaml/.yml) only: a script that reads a lone config file never read it (true: the
    # rule applies only then, false: only otherwise, None: either way)
    config_hidden_by_launcher: bool | None = None
    # the log level the normaliser read off the line's prefix (loguru, DeepSpeed, glog, NeMo: ERROR, E, ...) is one
    # of these: the level word is not in the normalised text the patterns see
    levels_any: list[str] = field(default_factory=list)
    # the job showed training progress (an iteration/step line with a loss, in this input) before the line: the same
    # words after hours of training mean something else than at start-up (a link that failed, not a set-up mistake)
    after_progress: bool = False
    # the name the line says was refused is (true) or is not (false) unlike every name it lists: not a typo of one
    refused_unlike_listed: bool | None = None
    # no later line of the same input contains one of these: what the line reports was overcome afterwards (a job
    # preempted, requeued and resumed from its checkpoint in the same output file)
    after_none: list[str] = field(default_factory=list)
    # a later line of the same input contains one of these: what the line reports was the last thing the run did
    # before it was stopped from outside (a caught error printed as a warning at every step, then the user's Ctrl-C)
    after_any: list[str] = field(default_factory=list)
    # no line of the same input, before or after it, contains one of these: a line that reports either of two
    # things (ProcessGroupNCCL's "Some NCCL operations have failed or timed out") reads as the one whose own
    # message the program prints first when it is that one (a timeout: "Watchdog caught collective operation
    # timeout") is absent from the whole input
    none_anywhere: list[str] = field(default_factory=list)
    # the line is among the last ``near_end`` lines of its input (0: anywhere): what it reports was still going on
    # when the output stopped (a rank retrying a host name it cannot resolve, with nothing after: the job hung there)
    near_end: int = 0
    # the rule's pattern matches a traceback's header; the finding is the line that ENDS that traceback (read forwards
    # on the header's stream), when this regex matches it and no other rule matches it (an exception whose class name
    # no rule's anchor holds: huggingface_hub's OfflineModeIsEnabled, a library's ...Failure or ...Timeout)
    traceback_ends_with: str = ""


@dataclass(frozen=True, slots=True)
class EvidenceSpec:
    """``[rule.evidence]``: which lines beside the matched one show the user why, in the finding's evidence. The
    matched line is often a summary (``Error(s) in loading state_dict``, pyxis's ``failed to import docker image``, a
    bare ``AssertionError``); the line that says which key, which registry error or which assert is near it."""

    # a regex searched in the next FOLLOWING_WINDOW lines of the same stream: up to FOLLOWING_KEPT lines it
    # matches join the evidence after the line (enroot's error printed under pyxis's, a state dict's size mismatches)
    following: str = ""
    following_window: int = 30  # lines of the same stream searched by ``following`` (at most EVIDENCE_WINDOW_MAX)
    # a regex searched in the previous ``preceding_window`` lines of the same stream: up to 2 lines it matches (the
    # nearest) join the evidence before the line (enroot's hook output above ``hooks.d/... exited with return code``)
    preceding: str = ""
    preceding_window: int = 10
    # the source line Python printed under the innermost frame of the traceback the line ends joins the evidence
    # under it (``assert len(self.ckpt_list) > 0``, the statement that raised a bare ``AssertionError``)
    raising_code: bool = False


NO_EVIDENCE_SPEC = EvidenceSpec()
EVIDENCE_WINDOW_MAX = 100  # following_window / preceding_window: lines read beside a matched line, at most


@dataclass(frozen=True, slots=True)
class Reworded:
    """What a finding says instead of its rule's title and Why when the memory model's numbers contradict the
    message's words (``[rule.numbers_say_demand]``); ``{numbers}`` in ``explanation`` is the memory model's sentence
    on those numbers."""

    title: str
    explanation: str


@dataclass(slots=True)
class Rule:
    code: str
    slug: str
    title: str
    category: str
    severity: str
    role: str
    phase: str  # a PHASE, or "auto": derived from frames and phase markers
    confidence: float
    patterns: list[Pattern]
    explanation: str
    fix: Fix
    context: Context = field(default_factory=Context)
    parser: str | None = None  # name of a structured fact parser run on the evidence (e.g. "cuda_oom")
    versions: str = ""
    links: list[str] = field(default_factory=list)
    doc: str = ""  # longer markdown: what it means, why, how to fix, fix safety
    examples_match: list[str] = field(default_factory=list)
    examples_no_match: list[str] = field(default_factory=list)
    source: str = ""  # file it came from
    order: int = 0  # global position in the catalogue
    input: str = "log"  # "log": patterns over log lines; "slurm_job": a job's Slurm record (no patterns)
    slurm_outcome: str = ""  # input "slurm_job": which outcome of the record (one of SLURM_OUTCOMES)
    # input "slurm_node": the node's State has one of these words (empty: any state that took it out of service)
    node_states_any: tuple[str, ...] = ()
    # input "slurm_node": the node's Reason matches one of these regexes (searched; empty: any Reason)
    node_reason_any: tuple[str, ...] = ()
    launcher: str = ""  # "torchrun": only that launcher prints it (then srun tasks are launchers, not ranks)
    during_training: str = ""  # the rule that replaces this one on a line once another file shows training ran
    # the failure happens when NCCL creates a communicator, which it does lazily, at a process group's first
    # collective: the phase is that call's, as the NCCL error's own traceback tells it (match/ranking.py)
    phase_at_first_collective: bool = False
    implies: Implies | None = None  # config facts the message states, and the validator check that prints it
    tier: str = "specific"  # "specific", "generic" (category inferred from evidence) or "catchall" (speaks last)
    phase_when_unknown: str = ""  # phase "auto" only: the phase when neither frames nor markers tell one
    completes: bool = False  # the line says the program finished its work: catch-alls printed before it ended nothing
    reports: str = "failure"  # what the finding reports for the ranking, beyond its category (one of REPORTS)
    fault_on: str = ""  # where the failure it reports is (one of FAULT_ON; "" not told), for match/one_host.py
    # codes of loss_series rules whose finding this (context) line explains: the finding takes this rule's category,
    # explanation and fix (accelerate's warning that the optimizer was made before FSDP wrapped the model explains
    # a loss that never moved); the line alone fails nothing
    explains: tuple[str, ...] = ()
    # the title and Why when the message's words say fragmentation but the numbers say demand (OOM190)
    numbers_say_demand: Reworded | None = None
    evidence: EvidenceSpec = NO_EVIDENCE_SPEC  # the lines beside the matched one that join its evidence

    def fault_on_of(self, pattern: int) -> str:
        """Where the failure that the rule's ``pattern`` (1-based) matched is: the pattern's word, else the rule's."""
        own = self.patterns[pattern - 1].fault_on if 0 < pattern <= len(self.patterns) else ""
        return own or self.fault_on


TIERS = ("specific", "generic", "catchall")
# What a rule's finding reports, as the ranking (match/ranking.py killers_first) reads it:
# - "failure": the failure its category names; a ``hardware`` finding is a device fault that kills ranks (the NCCL
#   errors and timeouts of its peers are its consequences), a ``host_oom`` finding the killer reports is a killed rank;
# - "own_death": the line is the process's own fatal signal, caught and printed inside a library (UCX's ``Caught
#   signal`` line): the launcher's report of that signal (``exitcode: -7``) is the same death, not a host-memory kill
#   that explains it (a device fault still does);
# - "link_failure": a link or network path that failed mid-run, read as hardware because of when it came: no device
#   fault on a rank, so an NCCL error printed before it still explains it;
# - "device_symptom": a CUDA call's error that names no cause (``CUDA error: unknown error``): a device fault of the
#   log (a lost GPU, an Xid) explains it and leads it wherever its line is; it still kills its rank for the NCCL
#   errors of its peers.
REPORTS = ("failure", "own_death", "link_failure", "device_symptom")
# Where the failure a finding reports is, as match/one_host.py reads it (a rule or one of its patterns says it):
# - "own_node": the node's own failure; NCCL's error names no peer (``unhandled cuda error``, ``unhandled system
#   error``, ``internal error``): a call on this node failed, and the fault is where it is raised;
# - "other_node": what another node's failure did to this one: the remote peer went away, a connection was reset or
#   closed, a collective timed out, the communicator was aborted.
# "" (the default): neither is told, and the reading leaves the finding out.
FAULT_ON = ("own_node", "other_node")


@dataclass(slots=True)
class Inference:
    """How a generic finding's category is read from its evidence (an ``[[infer]]`` table; first match wins).

    Every condition given must hold; inside one condition any entry may. ``frames_any``: a frame of the line's
    traceback contains one (a library path such as ``megatron/core/dist_checkpointing/``); ``frames_none``: no frame
    contains one (the same words mean another thing on another path: a file-system error while the data pipeline
    reads is the data's, not a checkpoint's); ``text_any``: a regex
    found in the matched line; ``text_none``: a regex that must NOT be in it (a more specific table's words, e.g.
    an FSDP class named in a signature error); ``exc_types``: the exception's type name ends with one;
    ``library_frame``: the last frame is in an installed package (site-packages/dist-packages), not the user's
    script; ``raised_in``: the innermost frame (where the exception was raised) contains one; ``raised_none``: it
    contains none of these (a call made by configuration-instantiating code, a package's ``__init__.py``);
    ``raised_match``: a regex found in the innermost frame, its source line included (an assert that tests
    divisibility, ``assert a % b == 0``); ``raising_frames_any``: the location (path and function, not the source
    line under it: inference.frame_head) of a frame of the code that raised contains one: the innermost frame
    and the frames of the same package right above it (inference.raising_frames), not an outer
    entry point of another package that called it (transformers' ``from_pretrained`` counts when transformers
    raised, not when DeepSpeed's ``zero.Init``, which it called, did);
    ``phases``: the finding's phase is one of these; ``rules``: the generic rule's code is one of these.
    ``refused_unlike_listed``: the name the message says was refused is (true) or is not (false) unlike every name
    it lists as accepted or similar, i.e. not a typo of one (inference.refused_unlike_listed). ``release_named``: the
    log names (or does not name) a release of the installed package that raised, before the line.
    ``name_written_by_other_package``: the name the message refused is (or is not) written in the source line of a
    frame of another installed package than the one that raised (inference.name_written_by_other_package).
    ``names_setting``: the message, or the assert statement that raised it, names (or does not name) a setting of
    the job: an environment variable, a ``key=value`` / ``key:value`` option, a ``--flag`` (inference.names_setting).
    ``message_any``: the innermost frame's source line words an error message (an f-string, a literal formatted with
    ``.format``/``%``) and one of these regexes is found in that message: the exception came while a check worded its
    refusal (inference.message_being_worded; not a line that raises the very exception the log ends with).
    ``during_import``: the exception came (true) or did not come (false) while an installed package's module was
    being imported: the innermost ``in <module>`` frame is library code below another ``<module>`` frame
    (inference.imported_package).
    ``phase_when_unknown``: the phase the finding takes when neither its frames nor the log's markers told one (a
    configuration file that does not parse, a library that does not load: that happens at set-up).
    """

    code: str
    category: str
    why: str
    confidence: float
    frames_any: list[str] = field(default_factory=list)
    frames_none: list[str] = field(default_factory=list)
    text_any: list[str] = field(default_factory=list)
    text_none: list[str] = field(default_factory=list)
    exc_types: list[str] = field(default_factory=list)
    library_frame: bool | None = None
    raised_in: list[str] = field(default_factory=list)
    raised_none: list[str] = field(default_factory=list)
    raised_match: list[str] = field(default_factory=list)
    raising_frames_any: list[str] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    phase_when_unknown: str = ""
    refused_unlike_listed: bool | None = None
    release_named: bool | None = None
    name_written_by_other_package: bool | None = None
    names_setting: bool | None = None
    message_any: list[str] = field(default_factory=list)
    during_import: bool | None = None
    examples: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""


@dataclass
class Catalogue:
    rules: list[Rule]
    errors: list[str] = field(default_factory=list)  # problems found while loading (lint reports them)
    inferences: list[Inference] = field(default_factory=list)
    # what to do next for a generic finding whose category an [[infer]] table read (06_category_fixes.toml), and the
    # generic rules whose own fix only says to read the evidence (the ones a category's fix replaces)
    category_fixes: dict[str, Fix] = field(default_factory=dict)
    category_fix_rules: set[str] = field(default_factory=set)

    def by_code(self, code: str) -> Rule | None:
        return next((r for r in self.rules if r.code == code), None)


def default_rules_dir() -> Path:
    """The catalogue shipped with the package (``rules/`` in a checkout, ``diagnose/_rules`` in a wheel)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_rules", here.parent / "rules"):
        if candidate.is_dir() and any(candidate.glob("*.toml")):
            return candidate
    raise DiagnoseError("the built-in rules catalogue is missing (reinstall diagnose)")


def rule_files(extra_dirs: Iterable[str | Path] | None, include_default: bool) -> list[tuple[Path, list[Path]]]:
    """The built-in catalogue folder (unless left out), then each of ``extra_dirs``, each with its rules files (a
    folder's ``*.toml`` in name order; a file is its own)."""
    dirs: list[Path] = [default_rules_dir()] if include_default else []
    for d in extra_dirs or []:
        p = Path(d)
        if not p.exists():
            raise DiagnoseError(f"rules folder {d}: does not exist")
        if not (p.is_dir() or p.is_file()):  # /dev/zero, a FIFO: never a rules file, and reading it would hang
            raise DiagnoseError(f"rules {d}: not a folder or a .toml file")
        dirs.append(p)
    return [(d, [d] if d.is_file() else sorted(d.glob("*.toml"))) for d in dirs]


def load_catalogue(
    extra_dirs: Sequence[str | Path] | None = None, include_default: bool = True, strict: bool = False
) -> Catalogue:
    """The built-in catalogue, then each ``extra_dirs`` folder or file, in order (the last matching rule wins).

    ``strict`` (analysis) refuses a catalogue with broken rules: a user who passed ``--rules`` expects those rules
    to run, and a report made without them would look clean. ``rules lint`` and ``rules list`` load leniently and
    show every problem.
    """
    rules: list[Rule] = []
    errors: list[str] = []
    inferences: list[Inference] = []
    category_fixes: dict[str, Fix] = {}
    category_fix_rules: set[str] = set()
    for d, files in rule_files(extra_dirs, include_default):
        if not files:
            raise DiagnoseError(f"rules folder {d}: has no *.toml files")
        in_folder: dict[str, Path] = {}  # category -> the file of this folder that gave its fix
        for f in files:
            loaded = load_rule_file(f)
            rules.extend(loaded.rules)
            errors.extend(loaded.errors)
            inferences.extend(loaded.inferences)
            category_fix_rules |= loaded.replaces_fix_of
            fixes = loaded.category_fixes
            # inside one folder, which entry won would hang on the files' order
            errors.extend(f"{f}: category_fix {c}: a second entry in this folder (also in {in_folder[c]})"
                          for c in sorted(set(fixes) & set(in_folder)))
            for category in fixes:
                in_folder.setdefault(category, f)
            category_fixes.update(fixes)  # a later folder's entry for a category replaces the built-in one
    seen: dict[str, str] = {}
    for i, r in enumerate(rules):
        r.order = i
        if r.code in seen:
            errors.append(f"{r.source}: rule {r.code}: duplicate code (also in {seen[r.code]})")
        seen.setdefault(r.code, r.source)
    if strict and errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise DiagnoseError(f"{errors[0]}{more}; see: diagnose rules lint --only-user --rules DIR")
    return Catalogue(rules, errors, inferences, category_fixes, category_fix_rules)


@dataclass(slots=True)
class RuleFile:
    """What one catalogue file holds, read in one pass, and the problems found in it."""

    rules: list[Rule]
    errors: list[str]
    inferences: list[Inference]  # its [[infer]] tables
    category_fixes: dict[str, Fix]  # its [[category_fix]] entries: category -> fix
    replaces_fix_of: set[str]  # the generic rules whose own fix only says to read the evidence


def load_rule_file(path: Path) -> RuleFile:
    """The rules, ``[[infer]]`` tables and category fixes of one catalogue file, and the problems found."""
    from diagnose import toml_cache

    text = read_text(path, "rules file")
    cached = toml_cache.get(text)  # read and checked before: no TOML parse, no regex compile
    data = cached if cached is not None else parse(text, path, "rules file")
    rules, errors = [], []
    for i, raw in enumerate(data.get("rule", [])):
        try:
            rules.append(parse_rule(raw, str(path), check_regex=cached is None))
        except ValueError as e:
            errors.append(f"{path}: rule {_code_for_error(raw, i)}: {e}")
    inferences: list[Inference] = []
    for i, raw in enumerate(data.get("infer", [])):
        try:
            inferences.append(parse_inference(raw, str(path), check_regex=cached is None))
        except ValueError as e:
            errors.append(f"{path}: infer {_code_for_error(raw, i)}: {e}")
    fixes, replaced = _category_fixes(data, path, errors)
    if cached is None and not errors:
        toml_cache.put(text, data)
    return RuleFile(rules, errors, inferences, fixes, replaced)


def _category_fixes(data: dict, path: Path, errors: list[str]) -> tuple[dict[str, Fix], set[str]]:
    """The ``[[category_fix]]`` entries of one catalogue file's data (category -> fix) and the generic rules it names
    in ``replaces_fix_of`` (their own fix only says to read the evidence); problems go to ``errors``."""
    fixes: dict[str, Fix] = {}
    replaced: set[str] = set()
    try:
        replaced = set(str_list(data, "replaces_fix_of"))
    except ValueError as e:
        errors.append(f"{path}: {e}")
    for i, raw in enumerate(data.get("category_fix", [])):
        where = f"{path}: category_fix #{i + 1}"
        try:
            if not isinstance(raw, dict):
                raise ValueError("must be a table")
            unknown = sorted(set(raw) - {"category", "summary", "steps"})
            if unknown:
                raise ValueError(f"unknown key(s): {', '.join(unknown)}")
            category = one_of(raw, "category", "", CATEGORIES)
            if category == "other":
                raise ValueError("'other' says nothing more than the generic rule: no fix for it")
            if category in fixes:
                raise ValueError(f"a second entry for {category}")
            summary = need(raw, "summary", str)
            steps = str_list(raw, "steps")
            if not summary or not steps:
                raise ValueError("needs a summary and at least one step")
            fixes[category] = Fix(summary=summary, safety="manual", steps=steps)
        except ValueError as e:
            errors.append(f"{where}: {e}")
    return fixes, replaced


def _code(raw: dict) -> str:
    """A rule's or an [[infer]] table's code: 2-8 upper-case letters and digits, starting with a letter."""
    code = need(raw, "code", str)
    if not (2 <= len(code) <= 8 and code[0].isalpha() and all(c in CODE_CHARS for c in code)):
        raise ValueError(f"code {code!r} must be 2-8 upper-case letters and digits, starting with a letter")
    return code


def _confidence(raw: dict, default: float) -> float:
    confidence = raw.get("confidence", default)
    if not isinstance(confidence, (int, float)) or not 0 <= confidence <= 1:
        raise ValueError("confidence must be a number in [0, 1]")
    return float(confidence)


def _code_for_error(raw: Any, index: int) -> str:
    """How a problem names an entry that may not even be a table: its code, else its position."""
    return raw.get("code", f"#{index + 1}") if isinstance(raw, dict) else f"#{index + 1}"


def _regex_or_empty(raw: dict, key: str, table: str = "context", check_regex: bool = True) -> str:
    """A key of ``[rule.<table>]`` holding one regex ("" when absent); one that does not compile is refused here
    (unless ``check_regex`` is off: a file cached after this very check, toml_cache)."""
    value = optional(raw, key, str, "")
    if value and check_regex:
        try:
            regex.compile(value)
        except regex.error as e:
            raise ValueError(f"{table}.{key} does not compile: {e}") from None
    return value


def _optional_bool(raw: dict, key: str) -> bool | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"'{key}' must be true or false")
    return value


def parse_inference(raw: Any, source: str, check_regex: bool = True) -> Inference:
    if not isinstance(raw, dict):
        raise ValueError("an [[infer]] entry must be a table")
    code = _code(raw)
    category = need(raw, "category", str)
    if category not in CATEGORIES or category == "other":
        raise ValueError(f"category {category!r} must be one of {', '.join(CATEGORIES)} but 'other'")
    confidence = _confidence(raw, 0.5)
    library = _optional_bool(raw, "library_frame")
    text_any, text_none = str_list(raw, "text_any"), str_list(raw, "text_none")
    message_any = str_list(raw, "message_any")
    raised_match = str_list(raw, "raised_match")
    for key, patterns in (("text_any", text_any), ("text_none", text_none), ("message_any", message_any),
                          ("raised_match", raised_match)):
        for t in patterns:
            try:
                if check_regex:
                    regex.compile(t)
            except regex.error as e:
                raise ValueError(f"{key} {t!r}: regex does not compile: {e}") from None
    phases = str_list(raw, "phases")
    bad = [p for p in phases if p not in PHASES]
    if bad:
        raise ValueError(f"phases {bad} are not among {', '.join(PHASES)}")
    fallback = raw.get("phase_when_unknown", "")
    if not isinstance(fallback, str) or (fallback and (fallback not in PHASES or fallback == "unknown")):
        raise ValueError(f"phase_when_unknown {fallback!r} must be one of {', '.join(PHASES)} but 'unknown'")
    unlike = _optional_bool(raw, "refused_unlike_listed")
    frames_any, exc_types = str_list(raw, "frames_any"), str_list(raw, "exc_types")
    raised_in, raising_frames_any = str_list(raw, "raised_in"), str_list(raw, "raising_frames_any")
    if not (frames_any or text_any or exc_types or raised_in or raised_match or raising_frames_any
            or library is not None):
        raise ValueError("no condition: give frames_any, raised_in, raised_match, raising_frames_any, text_any, "
                         "exc_types or library_frame")
    examples = raw.get("examples", [])
    if not isinstance(examples, list) or not all(isinstance(x, dict) for x in examples):
        raise ValueError("'examples' must be a list of tables")
    return Inference(
        code=code,
        category=category,
        why=need(raw, "why", str).strip(),
        confidence=confidence,
        frames_any=frames_any,
        frames_none=str_list(raw, "frames_none"),
        text_any=text_any,
        text_none=text_none,
        exc_types=exc_types,
        library_frame=library,
        raised_in=raised_in,
        raised_none=str_list(raw, "raised_none"),
        raised_match=raised_match,
        raising_frames_any=raising_frames_any,
        phases=phases,
        rules=str_list(raw, "rules"),
        phase_when_unknown=fallback,
        refused_unlike_listed=unlike,
        release_named=_optional_bool(raw, "release_named"),
        during_import=_optional_bool(raw, "during_import"),
        name_written_by_other_package=_optional_bool(raw, "name_written_by_other_package"),
        names_setting=_optional_bool(raw, "names_setting"),
        message_any=message_any,
        examples=list(examples),
        source=source,
    )


# the keys a [[rule]] table may have (rules/README.md): any other is a misspelling whose setting would otherwise be
# dropped in silence (``confidnce = 0.9`` left the rule at the default confidence)
RULE_KEYS = frozenset({
    "code", "slug", "title", "category", "severity", "role", "phase", "phase_when_unknown", "confidence", "tier",
    "input", "slurm_outcome", "node_states_any", "node_reason_any", "patterns", "context", "parser", "launcher",
    "during_training", "phase_at_first_collective", "implies", "completes", "reports", "fault_on", "explains",
    "numbers_say_demand", "evidence", "explanation", "doc", "versions", "links", "fix", "examples",
})
EXAMPLE_KEYS = frozenset({"match", "no_match"})
_FIX_FIELDS = frozenset(f.name for f in fields(Fix))  # the keys a [rule.fix] table may have
_CONTEXT_FIELDS = frozenset(f.name for f in fields(Context))  # ... and a [rule.context] table


def _unknown_keys(raw: dict, known: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in known)
    if not unknown:
        return
    said = []
    for key in unknown:
        near = difflib.get_close_matches(key, sorted(known), n=1)
        said.append(f"{key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    raise ValueError(f"unknown {where} key(s): {', '.join(said)}")


def parse_rule(raw: Any, source: str, check_regex: bool = True) -> Rule:
    if not isinstance(raw, dict):
        raise ValueError("a rule must be a table")
    code = _code(raw)
    _unknown_keys(raw, RULE_KEYS, "rule")
    category = need(raw, "category", str)
    if category not in CATEGORIES:
        raise ValueError(f"category {category!r} is not one of {', '.join(CATEGORIES)}")
    severity = one_of(raw, "severity", "error", SEVERITIES)
    role = one_of(raw, "role", "root", ROLES)
    phase = raw.get("phase", "auto")
    if phase != "auto" and phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not 'auto' or one of {', '.join(PHASES)}")
    phase_fallback = raw.get("phase_when_unknown", "")
    if phase_fallback and (phase != "auto" or phase_fallback not in PHASES or phase_fallback == "unknown"):
        raise ValueError("phase_when_unknown needs phase = \"auto\" and one of " + ", ".join(PHASES) + " but 'unknown'")
    confidence = _confidence(raw, 0.8)

    kind = one_of(raw, "input", "log", INPUTS)
    outcome = raw.get("slurm_outcome", "")
    if kind == "slurm_job":
        if outcome not in SLURM_OUTCOMES:
            raise ValueError(f"slurm_outcome {outcome!r} is not one of {', '.join(SLURM_OUTCOMES)}")
        if raw.get("patterns"):
            raise ValueError("a slurm_job rule reads Slurm's record, not log lines: no patterns")
    elif kind == "loss_series" and raw.get("patterns"):
        raise ValueError("a loss_series rule reads the log's loss series, not a line: no patterns")
    elif outcome:
        raise ValueError("slurm_outcome is only for input = \"slurm_job\"")
    node_states, node_reasons = _node_conditions(raw, kind, check_regex)
    launcher = raw.get("launcher", "")
    if launcher and launcher not in LAUNCHERS:
        raise ValueError(f"launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")
    during_training = raw.get("during_training", "")
    if not isinstance(during_training, str):
        raise ValueError("'during_training' must be a rule code")
    at_first_collective = _optional_bool(raw, "phase_at_first_collective") or False
    if at_first_collective and phase == "auto":
        raise ValueError("'phase_at_first_collective' needs a phase of its own (the one when no traceback tells)")
    completes = raw.get("completes", False)
    if not isinstance(completes, bool) or (completes and (severity != "info" or role != "context")):
        raise ValueError("'completes' must be true or false, and true only with severity \"info\" and role \"context\"")
    reports = one_of(raw, "reports", "failure", REPORTS)
    fault_on = _fault_on(raw, "fault_on")
    explains = str_list(raw, "explains")
    if explains and (role != "context" or kind != "log"):
        raise ValueError("'explains' is only for a log rule with role \"context\"")

    patterns: list[Pattern] = []
    for p in raw.get("patterns", []) if kind != "log" else need(raw, "patterns", list):
        if not isinstance(p, dict) or not isinstance(p.get("anchor"), str) or not isinstance(p.get("regex"), str):
            raise ValueError("each pattern needs string 'anchor' and 'regex'")
        if len(p["anchor"]) < 3 and p["anchor"] not in SHORT_ANCHORS:
            raise ValueError(f"anchor {p['anchor']!r} is shorter than 3 characters")
        try:
            if check_regex:  # off only for a file cached after this very check passed (toml_cache)
                regex.compile(p["regex"])  # compiled again (from regex's cache) by the engine
        except regex.error as e:
            raise ValueError(f"pattern {len(patterns) + 1}: regex does not compile: {e}") from None
        levels = p.get("levels_any", [])
        if not isinstance(levels, list) or not all(isinstance(v, str) and v for v in levels):
            raise ValueError(f"pattern {len(patterns) + 1}: levels_any must be a list of level names")
        where = _fault_on(p, f"pattern {len(patterns) + 1}: fault_on")
        relays = p.get("relays", False)
        if not isinstance(relays, bool):
            raise ValueError(f"pattern {len(patterns) + 1}: relays must be true or false")
        patterns.append(Pattern(p["anchor"], p["regex"], tuple(v.upper() for v in levels), where, relays))
    if not patterns and kind == "log":
        raise ValueError("no patterns")
    if patterns and all(p.relays for p in patterns):
        raise ValueError("every pattern relays: a relaying pattern needs another pattern for the command's own error")

    fix_raw = raw.get("fix", {})
    if not isinstance(fix_raw, dict):
        raise ValueError("'fix' must be a table")
    unknown = sorted(set(fix_raw) - _FIX_FIELDS)
    if unknown:  # a misspelt field (other_stack) would otherwise be dropped in silence and its words never shown
        raise ValueError(f"unknown fix field(s): {', '.join(unknown)}")
    safety = one_of(fix_raw, "safety", "manual", SAFETIES, "fix.safety")
    overrides = []
    for o in fix_raw.get("overrides", []):
        if not isinstance(o, dict) or not isinstance(o.get("key"), str) or "value" not in o:
            raise ValueError("each fix.overrides entry needs 'key' and 'value'")
        overrides.append(Override(o["key"], o["value"]))
    env = []
    for var in fix_raw.get("env", []):
        if not isinstance(var, dict) or not isinstance(var.get("name"), str) or not isinstance(var.get("value"), str):
            raise ValueError("each fix.env entry needs string 'name' and 'value'")
        env.append(EnvVar(var["name"], var["value"]))
    fix = Fix(
        summary=str(fix_raw.get("summary", "")),
        safety=safety,
        overrides=overrides,
        env=env,
        steps=str_list(fix_raw, "steps"),
        other_stacks=str_list(fix_raw, "other_stacks"),
    )

    ctx_raw = raw.get("context", {})
    if not isinstance(ctx_raw, dict):
        raise ValueError("'context' must be a table")
    unknown = sorted(set(ctx_raw) - _CONTEXT_FIELDS)
    if unknown:  # a misspelt condition would otherwise be dropped in silence and the rule fire without it
        raise ValueError(f"unknown context condition(s): {', '.join(unknown)}")
    near_end = ctx_raw.get("near_end", 0)
    if not isinstance(near_end, int) or isinstance(near_end, bool) or not 0 <= near_end <= NEAR_END_MAX:
        raise ValueError(f"context.near_end must be an integer in [0, {NEAR_END_MAX}]")
    window = ctx_raw.get("before_window", 200)
    if not isinstance(window, int) or not 1 <= window <= 5000:
        raise ValueError("context.before_window must be an integer in [1, 5000]")
    context = Context(
        frames_any=str_list(ctx_raw, "frames_any"),
        frames_none=str_list(ctx_raw, "frames_none"),
        before_any=str_list(ctx_raw, "before_any"),
        before_window=window,
        also_before_any=str_list(ctx_raw, "also_before_any"),
        not_on_command_line=optional(ctx_raw, "not_on_command_line", str, ""),
        pinned_on_command_line=optional(ctx_raw, "pinned_on_command_line", str, ""),
        config_hidden_by_launcher=_optional_bool(ctx_raw, "config_hidden_by_launcher"),
        levels_any=[level.upper() for level in str_list(ctx_raw, "levels_any")],
        after_progress=optional(ctx_raw, "after_progress", bool, False),
        refused_unlike_listed=_optional_bool(ctx_raw, "refused_unlike_listed"),
        after_none=str_list(ctx_raw, "after_none"),
        after_any=str_list(ctx_raw, "after_any"),
        none_anywhere=str_list(ctx_raw, "none_anywhere"),
        near_end=near_end,
        traceback_ends_with=_regex_or_empty(ctx_raw, "traceback_ends_with", check_regex=check_regex),
    )

    implies = _implies(raw.get("implies"), len(patterns))
    numbers_say_demand = _reworded(raw.get("numbers_say_demand"))
    evidence = _evidence_spec(raw.get("evidence"), check_regex)

    ex = raw.get("examples", {})
    if not isinstance(ex, dict):
        raise ValueError("'examples' must be a table")
    _unknown_keys(ex, EXAMPLE_KEYS, "examples")
    parser = raw.get("parser")
    if parser is not None and not isinstance(parser, str):
        raise ValueError("'parser' must be a string")
    tier = one_of(raw, "tier", "generic" if category == "other" else "specific", TIERS)

    return Rule(
        code=code,
        slug=need(raw, "slug", str),
        title=need(raw, "title", str),
        category=category,
        severity=severity,
        role=role,
        phase=phase,
        phase_when_unknown=phase_fallback,
        confidence=confidence,
        patterns=patterns,
        explanation=need(raw, "explanation", str).strip(),
        fix=fix,
        context=context,
        parser=parser,
        versions=str(raw.get("versions", "")),
        links=str_list(raw, "links"),
        doc=str(raw.get("doc", "")).strip(),
        examples_match=str_list(ex, "match"),
        examples_no_match=str_list(ex, "no_match"),
        source=source,
        tier=tier,
        input=kind,
        slurm_outcome=outcome,
        node_states_any=node_states,
        node_reason_any=node_reasons,
        launcher=launcher,
        during_training=during_training,
        phase_at_first_collective=at_first_collective,
        implies=implies,
        completes=completes,
        reports=reports,
        fault_on=fault_on,
        explains=tuple(explains),
        numbers_say_demand=numbers_say_demand,
        evidence=evidence,
    )


def _evidence_spec(raw: Any, check_regex: bool = True) -> EvidenceSpec:
    """``[rule.evidence]``: ``following`` and ``preceding`` (regexes), their windows (1..EVIDENCE_WINDOW_MAX lines)
    and ``raising_code`` (true/false)."""
    if raw is None:
        return NO_EVIDENCE_SPEC
    if not isinstance(raw, dict):
        raise ValueError("'evidence' must be a table")
    keys = {"following", "following_window", "preceding", "preceding_window", "raising_code"}
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise ValueError(f"evidence: unknown key(s): {', '.join(unknown)}")
    regexes = {name: _regex_or_empty(raw, name, "evidence", check_regex) for name in ("following", "preceding")}
    windows = {}
    for name, default in (("following_window", NO_EVIDENCE_SPEC.following_window),
                          ("preceding_window", NO_EVIDENCE_SPEC.preceding_window)):
        value = optional(raw, name, int, default)
        if isinstance(value, bool) or not 1 <= value <= EVIDENCE_WINDOW_MAX:
            raise ValueError(f"evidence.{name} must be an integer from 1 to {EVIDENCE_WINDOW_MAX}")
        if name in raw and not regexes[name.removesuffix("_window")]:
            raise ValueError(f"evidence.{name} without evidence.{name.removesuffix('_window')}")
        windows[name] = value
    return EvidenceSpec(following=regexes["following"], following_window=windows["following_window"],
                        preceding=regexes["preceding"], preceding_window=windows["preceding_window"],
                        raising_code=optional(raw, "raising_code", bool, False))


def _reworded(raw: Any) -> Reworded | None:
    """``[rule.numbers_say_demand]``: a title and an explanation (read for a rule whose fix is the allocator setting
    alone, the fix the memory model's numbers can contradict: ``explain._allocator_as_a_step``)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("'numbers_say_demand' must be a table")
    unknown = sorted(set(raw) - {"title", "explanation"})
    if unknown:
        raise ValueError(f"numbers_say_demand: unknown key(s): {', '.join(unknown)}")
    title, explanation = need(raw, "title", str).strip(), need(raw, "explanation", str).strip()
    if not title or not explanation:
        raise ValueError("numbers_say_demand needs a title and an explanation")
    return Reworded(title, explanation)


def _fault_on(raw: dict, name: str) -> str:
    value = raw.get("fault_on", "")
    if value != "" and value not in FAULT_ON:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(FAULT_ON)}")
    return value


def _node_conditions(raw: dict, kind: str, check_regex: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A slurm_node rule's ``node_states_any`` (State words) and ``node_reason_any`` (regexes over the Reason)."""
    states = str_list(raw, "node_states_any")
    reasons = str_list(raw, "node_reason_any")
    if kind != "slurm_node":
        if states or reasons:
            raise ValueError("node_states_any and node_reason_any are only for input = \"slurm_node\"")
        return (), ()
    if raw.get("patterns"):
        raise ValueError("a slurm_node rule reads a node's Slurm record, not log lines: no patterns")
    bad = [s for s in states if s not in NODE_STATE_WORDS]
    if bad:
        raise ValueError(f"node_states_any {bad} not among {', '.join(NODE_STATE_WORDS)}")
    for n, r in enumerate(reasons, 1):
        try:
            if check_regex:
                regex.compile(r)
        except regex.error as e:
            raise ValueError(f"node_reason_any {n}: regex does not compile: {e}") from None
    return tuple(states), tuple(reasons)


def _implies(raw: Any, n_patterns: int) -> Implies | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("'implies' must be a table")
    check = raw.get("check", "")
    if not isinstance(check, str):
        raise ValueError("implies.check must be a validator check name")
    settings = []
    for s in raw.get("settings", []):
        if not isinstance(s, dict) or not isinstance(s.get("key"), str) or ("value" in s) == ("fact" in s):
            raise ValueError("each implies.settings entry needs 'key' and one of 'value' or 'fact'")
        if not isinstance(s.get("fact", ""), str) or not isinstance(s.get("after", ""), str):
            raise ValueError("implies.settings 'fact' and 'after' must be strings")
        settings.append(ImpliedSetting(s["key"], s.get("value"), s.get("fact", ""), s.get("after", "")))
    patterns = raw.get("patterns", [])
    if not isinstance(patterns, list) or not all(isinstance(i, int) and 1 <= i <= n_patterns for i in patterns):
        raise ValueError(f"implies.patterns must list pattern numbers 1-{n_patterns}")
    if not settings and not check:
        raise ValueError("implies needs a check or settings")
    return Implies(check, settings, list(patterns))
