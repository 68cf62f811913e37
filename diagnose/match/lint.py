"""Lint a rules catalogue: schema, duplicate codes, regexes, anchors, and every rule's examples run for real.

What is checked, per rule (``rules/README.md`` documents the schema):

* the loader's schema errors (missing keys, bad category/phase/safety...) and duplicate codes or slugs;
* each regex compiles (``regex`` module) and, when google-re2 is installed, in linear time with RE2: an error for
  the built-in catalogue, a warning for a user's catalogue (the engine still runs it, with a timeout);
* each pattern's anchor occurs in every match of its regex on the example lines (the fast scan looks for the anchor
  first: an anchor missing from a match would hide the line);
* a named ``parser`` exists in ``diagnose.normalize.facts.PARSERS``;
* at least one ``match`` and one ``no_match`` example, every pattern exercised by some match example;
* every example runs through the real pipeline (``diagnose.match.match_text``): a ``match`` example must produce a
  finding of the rule, a ``no_match`` example must not; a ``slurm_job`` rule's examples are ``scontrol show job``
  records, run through ``diagnose.ingest.slurm.findings``;
* the phase markers file (``rules/phases/phases.toml``): it loads, its regexes are RE2-compatible, each marker's
  ``match`` lines are captured with the anchor inside the regex's match and its ``no_match`` lines are not, each
  frame example gives (or, ``no_match``, does not give) its entry's phase;
* codes: never one listed in ``rules/RETIRED`` (codes are never reused); codes beginning with ``U`` are reserved for
  users' rules (an error in the built-in catalogue, and a user rule outside that range is warned that a later
  release may take its code); one ``slurm_job`` rule per outcome; ``during_training`` names a log rule.

Problems are data (:class:`LintProblem`); the ``rules lint`` command prints them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import regex

from diagnose.inert import shorten
from diagnose.match.rules import Catalogue, Rule, default_rules_dir, load_rule_file, rule_files
from diagnose.model import DiagnoseError
from diagnose.normalize.facts import PARSERS
from diagnose.normalize.phase_file import load_phase_file

REGEX_TIMEOUT_S = 1.0  # a user's catastrophic regex must not hang the linter
USER_CODE_PREFIX = "U"  # codes reserved for users' own rules: the built-in catalogue never uses them
RETIRED_FILE = "RETIRED"  # in the built-in rules folder: codes used once, never to be reused

# Python's own regex parser, to read the literals every match must contain (3.11+: re._parser)
if sys.version_info >= (3, 11):
    from re import _constants as _sre_constants
    from re import _parser as _sre_parse
else:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_constants
    import sre_parse as _sre_parse
SLUG = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


@dataclass(frozen=True, slots=True)
class LintProblem:
    severity: str  # "error" | "warning"
    source: str  # the rules file
    code: str | None  # the rule, or None for a problem with the whole file
    message: str

    def __str__(self) -> str:
        where = f"{self.source}: rule {self.code}" if self.code else self.source
        return f"{self.severity}: {where}: {self.message}"


@dataclass
class LintResult:
    catalogue: Catalogue
    problems: list[LintProblem]

    @property
    def errors(self) -> list[LintProblem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[LintProblem]:
        return [p for p in self.problems if p.severity == "warning"]


def load_for_lint(
    extra_dirs: Iterable[str | Path] = (), include_default: bool = True
) -> tuple[Catalogue, list[LintProblem]]:
    """Load like ``load_catalogue`` but keep going past a broken file, reporting it as a problem.

    A folder that does not exist (or a FIFO, a device) is a usage error (``DiagnoseError``), not a lint problem.
    """
    rules: list[Rule] = []
    problems: list[LintProblem] = []
    for d, files in rule_files(extra_dirs, include_default):
        if not files:
            problems.append(LintProblem("error", str(d), None, "has no *.toml files"))
        for f in files:
            try:
                loaded = load_rule_file(f)
            except DiagnoseError as e:
                problems.append(LintProblem("error", str(f), None, str(e).removeprefix(f"rules file {f}: ")))
                continue
            rules.extend(loaded.rules)
            problems.extend(_loader_problem(msg, str(f)) for msg in loaded.errors)
    for i, r in enumerate(rules):
        r.order = i
    return Catalogue(rules, []), problems


def _loader_problem(message: str, source: str) -> LintProblem:
    # The loader's messages read "<path>: rule <code>: <what>".
    head = f"{source}: rule "
    if message.startswith(head):
        code, _, what = message[len(head):].partition(": ")
        return LintProblem("error", source, code, what)
    return LintProblem("error", source, None, message)


def lint(
    catalogue: Catalogue,
    load_problems: list[LintProblem] | None = None,
    only_sources: set[str] | None = None,
    strict_sources: set[str] | None = None,
    run_examples: bool = True,
) -> LintResult:
    """Check ``catalogue``; ``only_sources`` limits the report to rules from those files (None: all).

    ``strict_sources``: files held to the built-in standard (a non-RE2 regex is an error there, a warning elsewhere);
    None means every file is strict.
    """
    problems = list(load_problems or [])
    problems += _duplicates(catalogue)
    problems += _code_ranges(catalogue, retired_codes())
    problems += _rule_references(catalogue)
    for rule in catalogue.rules:
        if only_sources is not None and rule.source not in only_sources:
            continue
        strict = strict_sources is None or rule.source in strict_sources
        problems += _lint_rule(rule, strict)
    if run_examples:
        problems += _run_examples(catalogue, only_sources)
    problems += lint_phase_file()
    if only_sources is not None:
        problems = [p for p in problems if p.source in only_sources]
    return LintResult(catalogue, problems)


def _duplicates(catalogue: Catalogue) -> list[LintProblem]:
    out: list[LintProblem] = []
    codes: dict[str, str] = {}
    slugs: dict[str, str] = {}
    for r in catalogue.rules:
        if r.code in codes:
            out.append(LintProblem("error", r.source, r.code, f"duplicate code (also in {codes[r.code]})"))
        codes.setdefault(r.code, r.source)
        if r.slug in slugs:
            out.append(LintProblem("error", r.source, r.code, f"duplicate slug {r.slug!r} (also in {slugs[r.slug]})"))
        slugs.setdefault(r.slug, r.source)
    return out


def retired_codes() -> dict[str, str]:
    """Code -> why it was retired, from the built-in ``rules/RETIRED`` (``CODE  reason`` lines, ``#`` comments)."""
    path = default_rules_dir() / RETIRED_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            code, _, why = line.partition(" ")
            out[code] = why.strip()
    return out


def is_builtin(rule: Rule) -> bool:
    return Path(rule.source).resolve().parent == default_rules_dir().resolve()


def _code_ranges(catalogue: Catalogue, retired: dict[str, str]) -> list[LintProblem]:
    out: list[LintProblem] = []
    for r in catalogue.rules:
        if r.code in retired:
            out.append(LintProblem("error", r.source, r.code, f"code is retired ({retired[r.code]}): use a new one"))
        if is_builtin(r):
            if r.code.startswith(USER_CODE_PREFIX):
                out.append(LintProblem("error", r.source, r.code, "codes beginning with U are reserved for users"))
        elif not r.code.startswith(USER_CODE_PREFIX):
            out.append(LintProblem(
                "warning", r.source, r.code,
                "user rules should use codes beginning with U (U001, USR100...): a later release may take this one",
            ))
    return out


# Prefixes that every line of a common launcher's log carries (torchrun's --tee / -r prefixes, srun --label, mpirun
# --tag-output, Ray's worker prefix, pdsh, logging timestamps). An anchor found inside one of them prefilters
# nothing: every line of such a log becomes a candidate for the regex (an anchor of "]:" made a 200 MiB torchrun log
# 4x slower to scan).
LINE_PREFIXES = ("[rank0]: ", "[default0]:", "0: ", "[1,0]<stdout>:", "(RayWorkerWrapper pid=1234) ", "node01: ",
                 "2026-01-01 00:00:00,123 - INFO - ", "[2026-01-01 00:00:00] ", "2026-01-01T00:00:00.123456Z ")


def anchor_on_every_line(anchor: str) -> str:
    """The launcher prefix an anchor occurs in (it would prefilter nothing on such a log), or ""."""
    return next((prefix for prefix in LINE_PREFIXES if anchor in prefix), "")


def lint_phase_file(path: Path | None = None) -> list[LintProblem]:
    """The phase markers and frame patterns (the built-in file unless ``path``): loaded, RE2, examples."""
    from diagnose.normalize.lines import normalize_line
    from diagnose.normalize.phases import phase_from_frames

    try:
        phase_file = load_phase_file(path, check=True)  # every regex compiled, cached or not
    except DiagnoseError as e:
        return [LintProblem("error", str(path or "rules/phases/phases.toml"), None, str(e))]
    out: list[LintProblem] = []

    def err(what: str, message: str) -> None:
        out.append(LintProblem("error", str(phase_file.path), None, f"{what}: {message}"))

    for marker in phase_file.markers:
        spec, what = marker.spec, f"marker {marker.spec.name}"
        regex = spec.regex or re.escape(spec.anchor)
        if prefix := anchor_on_every_line(spec.anchor):
            err(what, f"anchor {spec.anchor!r} is in the prefix {prefix!r} that every line of some logs carries")
        complaint = _compile_re2(regex)
        if complaint is not None:
            err(what, f"regex is not RE2-compatible (linear time): {complaint}")
        if not marker.examples.match:
            err(what, "no 'match' example")
        for line in marker.examples.match:
            found = re.search(regex, normalize_line(line).text)
            if found is None or spec.anchor not in found.group(0):
                err(what, f"match example {shorten(line, 80)!r} is not captured with the anchor in the regex's match")
        for line in marker.examples.no_match:
            text = normalize_line(line).text
            if spec.anchor in text and re.search(regex, text):
                err(what, f"no_match example {shorten(line, 80)!r} is captured")
    for i, frame in enumerate(phase_file.frames, 1):
        what = f"frame {i} ({frame.phase})"
        complaint = _compile_re2(frame.pattern.pattern)
        if complaint is not None:
            err(what, f"regex is not RE2-compatible (linear time): {complaint}")
        if not frame.examples.match:
            err(what, "no 'match' example")
        for key in frame.examples.match:
            if (got := phase_from_frames([key], phase_file)) != frame.phase:
                err(what, f"match example {key!r} gives {got}")
        for key in frame.examples.no_match:
            if phase_from_frames([key], phase_file) == frame.phase:
                err(what, f"no_match example {key!r} gives {frame.phase}")
    return out


def _rule_references(catalogue: Catalogue) -> list[LintProblem]:
    """Attributes that name another rule or a Slurm outcome point at something that exists, once."""
    out: list[LintProblem] = []
    by_code = {r.code: r for r in catalogue.rules}
    outcomes: dict[str, str] = {}
    for r in catalogue.rules:
        if r.during_training:
            target = by_code.get(r.during_training)
            if target is None or target.input != "log":
                what = f"during_training {r.during_training!r} is not a log rule"
                out.append(LintProblem("error", r.source, r.code, what))
        for code in r.explains:
            target = by_code.get(code)
            if target is None or target.input != "loss_series":
                out.append(LintProblem("error", r.source, r.code, f"explains {code!r}: not a loss_series rule"))
        if r.input in ("slurm_node", "loss_series") and not is_builtin(r):
            out.append(LintProblem("error", r.source, r.code, f"{r.input} rules are built in; users' never run"))
            continue
        if r.input == "slurm_job":
            if not is_builtin(r):
                out.append(LintProblem("error", r.source, r.code, "slurm_job rules are built in; users' never run"))
            elif r.slurm_outcome in outcomes:
                out.append(LintProblem(
                    "error", r.source, r.code, f"slurm_outcome {r.slurm_outcome} is also {outcomes[r.slurm_outcome]}'s"
                ))
            outcomes.setdefault(r.slurm_outcome, r.code)
    return out


def _compile_re2(pattern: str) -> str | None:
    """None when RE2 accepts the pattern (or RE2 is not installed), else its complaint."""
    try:
        import re2
    except ImportError:
        return None
    try:
        re2.compile(pattern)
    except Exception as e:  # noqa: BLE001 - re2 raises its own error type
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


def mandatory_literals(pattern: str) -> list[str] | None:
    """The literal runs that every match of ``pattern`` contains, in order; None when Python cannot parse it.

    Walks the parsed pattern: plain characters extend the current run, groups are entered (unless case-insensitive),
    a repetition of at least one is entered once, and anything else (a class, an alternation, an optional part)
    ends the run. An anchor found inside one of these runs is proven to occur in every match.
    """
    try:
        tree = _sre_parse.parse(pattern)
    except Exception:  # noqa: BLE001 - RE2/`regex` syntax Python lacks: no proof either way
        return None
    C = _sre_constants
    runs: list[str] = []
    current: list[str] = []

    def flush() -> None:
        if current:
            runs.append("".join(current))
            current.clear()

    def walk(seq, ignore_case: bool) -> None:
        for op, av in seq:
            if op is C.LITERAL and not ignore_case:
                current.append(chr(av))
            elif op is C.SUBPATTERN:
                _group, add_flags, _del_flags, sub = av
                walk(sub, ignore_case or bool(add_flags & C.SRE_FLAG_IGNORECASE))
            elif op in (C.MAX_REPEAT, C.MIN_REPEAT) and av[0] >= 1:
                walk(av[2], ignore_case)
                flush()
            elif op is C.AT:
                continue
            else:
                flush()

    walk(tree, bool(tree.state.flags & C.SRE_FLAG_IGNORECASE))
    flush()
    return runs


def _lint_rule(rule: Rule, strict: bool) -> list[LintProblem]:
    out: list[LintProblem] = []

    def err(msg: str, severity: str = "error") -> None:
        out.append(LintProblem(severity, rule.source, rule.code, msg))

    if not SLUG.match(rule.slug):
        err(f"slug {rule.slug!r} must be lower-case words joined by '-'")
    if not rule.title.strip():
        err("empty title")
    if not rule.explanation.strip():
        err("empty explanation")
    if rule.fix.empty:
        err("no fix (give at least a summary)")
    for link in rule.links:
        if not link.startswith("https://"):
            err(f"link {link!r} is not an https:// URL")
    if rule.parser and rule.parser not in PARSERS:
        err(f"parser {rule.parser!r} is not one of {', '.join(sorted(PARSERS))}")
    if rule.implies is not None:
        _lint_implies(rule, err)
    if not rule.examples_match:
        err("no 'match' example")
    if not rule.examples_no_match:
        err("no 'no_match' example")

    compiled: list[regex.Pattern | None] = []
    for i, p in enumerate(rule.patterns, 1):
        try:
            compiled.append(regex.compile(p.regex))
        except regex.error as e:
            compiled.append(None)
            err(f"pattern {i}: regex does not compile: {e}")
            continue
        if prefix := anchor_on_every_line(p.anchor):
            err(f"pattern {i}: anchor {p.anchor!r} is in the prefix {prefix!r} that every line of some logs carries")
        runs = mandatory_literals(p.regex)
        if runs is not None and not any(p.anchor in run for run in runs):
            err(
                f"pattern {i}: anchor {p.anchor!r} is not provably in every match "
                f"(literals every match has: {', '.join(repr(r) for r in runs[:4]) or 'none'})",
                "error" if strict else "warning",
            )
        complaint = _compile_re2(p.regex)
        if complaint is not None:
            if strict:
                err(f"pattern {i}: regex is not RE2-compatible (linear time): {complaint}")
            else:
                err(f"pattern {i}: regex is not RE2-compatible, it will run with a timeout: {complaint}", "warning")

    from diagnose.normalize.lines import normalize_line

    used = [False] * len(rule.patterns)
    for example in rule.examples_match:
        for raw in example.splitlines():
            text = normalize_line(raw).text
            for i, (p, rx) in enumerate(zip(rule.patterns, compiled)):
                if rx is None:
                    continue
                try:
                    matches = list(rx.finditer(text, timeout=REGEX_TIMEOUT_S))
                except TimeoutError:
                    err(f"pattern {i + 1}: regex takes over {REGEX_TIMEOUT_S:g}s on an example line (catastrophic?)")
                    continue
                for m in matches:
                    used[i] = True
                    if p.anchor not in m.group(0):
                        err(f"pattern {i + 1}: anchor {p.anchor!r} is not in its match {shorten(m.group(0), 80)!r}")
    for i, was_used in enumerate(used):
        if compiled[i] is not None and rule.examples_match and not was_used:
            err(f"pattern {i + 1}: no 'match' example exercises it", "warning")
    return out


def _lint_implies(rule: Rule, err) -> None:
    """[rule.implies]: a check name, setting keys that are config paths, facts that are named groups of the
    patterns it is for (else the setting could never be read)."""
    implies = rule.implies
    assert implies is not None
    if not implies.check:
        err("implies: no 'check' (the validator check that prints this message)")
    numbers = implies.patterns or list(range(1, len(rule.patterns) + 1))
    groups: set[str] = set()
    for n in numbers:
        try:
            groups |= set(regex.compile(rule.patterns[n - 1].regex).groupindex)
        except (regex.error, IndexError):
            continue
    for setting in implies.settings:
        if "." not in setting.key:
            err(f"implies: key {setting.key!r} is not a config path (section.name or env.NAME)")
        if setting.fact and setting.fact not in groups:
            err(f"implies: fact {setting.fact!r} of {setting.key} is not a named group of pattern(s) {numbers}")


def _run_examples(catalogue: Catalogue, only_sources: set[str] | None) -> list[LintProblem]:
    """Every example run for real, as a user's log (or Slurm record) would go."""
    out: list[LintProblem] = []
    for rule in catalogue.rules:
        if only_sources is not None and rule.source not in only_sources:
            continue
        for n, example in enumerate(rule.examples_match, 1):
            codes = _codes(rule, example, catalogue)
            if rule.code not in codes:
                got = ", ".join(codes) or "nothing"
                out.append(LintProblem("error", rule.source, rule.code, f"match example {n} is not found (got {got})"))
        for n, example in enumerate(rule.examples_no_match, 1):
            if rule.code in _codes(rule, example, catalogue):
                out.append(LintProblem("error", rule.source, rule.code, f"no_match example {n} is found"))
    return out


def _codes(rule: Rule, example: str, catalogue: Catalogue) -> list[str]:
    """The codes an example produces: a slurm_job rule's examples are ``scontrol show job`` records, run through the
    Slurm findings, a slurm_node rule's are ``scontrol show node`` records, run through the node findings; a log
    rule's go through ``match_text`` with the whole catalogue."""
    if rule.input == "slurm_job":
        from diagnose.ingest.slurm.findings import findings_of_scontrol

        return [f.rule for f in findings_of_scontrol(example)]
    if rule.input == "slurm_node":
        from diagnose.match.slurm_nodes import findings_of_scontrol_node

        return [f.rule for f in findings_of_scontrol_node(example)]
    from diagnose.match import match_text

    # The pure-Python phase-1 backend gives the same answers as hyperscan/re2 (the engine's own tests hold it to
    # that) without compiling a multi-pattern database per example.
    return [f.rule for f in match_text(example, catalogue, backend="python").findings]
