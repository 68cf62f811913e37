"""Accuracy of the diagnosis on the public corpus: top-1 category, phase, silence, clean logs, evidence.

    python3 benchmarks/accuracy.py                     # dev and test parts, tables on stdout
    python3 benchmarks/accuracy.py --part dev -v       # every miss of the dev part, one line each
    python3 benchmarks/accuracy.py --json out.json     # the figures and every case's answer, as JSON
    python3 benchmarks/accuracy.py --only a-bridge-    # just the dev cases whose id starts so, one line each
    python3 benchmarks/accuracy.py --record            # write corpus/accuracy.json (the floors CI holds)
    python3 benchmarks/accuracy.py --freeze            # once: split corpus/cases/ into dev/ and test/

The corpus (corpus/README.md) holds failure logs reconstructed from public issue threads and clean runs, each
with a ``<id>.case.json`` sidecar giving what the thread concluded. A case is scored on what a user of
``diagnose analyze`` gets: the root cause's category (top-1), its phase, whether a failed log got no root cause
at all (silent: exit 0 on a failed job), whether a clean log got one (a false alarm), and whether the line the
thread's root cause sits on is among the root cause's evidence lines.

The split is made once, before any rule is written from the corpus: whole threads go to one side (several logs
of one thread never straddle it), stratified by category, by a hash of the thread's name, so it is reproducible
and owes nothing to how the tool does. ``corpus/SPLIT.json`` records it with the SHA-256 of every test file;
tests/test_corpus.py fails when a test file changes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus"
PARTS = ("dev", "test")
TEST_SHARE = 3  # one thread in three goes to the test part
SPLIT_SALT = "diagnose-corpus-split-v1"

sys.path.insert(0, str(ROOT))


@dataclass
class Case:
    id: str
    part: str
    log: Path  # a file, or a folder of per-rank files
    sidecar: Path
    meta: dict

    @property
    def failed(self) -> bool:
        return self.meta["kind"] == "failure"

    @property
    def expected(self) -> dict:
        return self.meta["expected"]


@dataclass
class Outcome:
    id: str
    part: str
    thread: str
    failed: bool
    expected_category: str | None
    expected_phase: str | None
    category: str | None  # the root cause's, None when no root cause
    phase: str | None
    rule: str | None
    confidence: float | None
    findings: int
    evidence_hit: bool | None  # the thread's signal line is among the root cause's evidence (failures only)
    seconds: float
    error: str | None = None
    inferred_by: str | None = None  # the [[infer]] table that gave a generic finding its category (IF040...)

    @property
    def silent(self) -> bool:
        return self.failed and self.category is None

    @property
    def false_alarm(self) -> bool:
        return not self.failed and self.category is not None

    @property
    def category_right(self) -> bool:
        return self.failed and self.category == self.expected_category


@dataclass
class Figures:
    part: str
    failures: int = 0
    clean: int = 0
    category_right: int = 0
    phase_scored: int = 0
    phase_right: int = 0
    silent: int = 0
    clean_right: int = 0
    evidence_hit: int = 0
    errors: int = 0
    confusion: dict[str, dict[str, int]] = field(default_factory=dict)
    # confidence band -> [failure logs with a root cause in it, right, sum of confidences]
    reliability: dict[str, list[float]] = field(default_factory=dict)

    def pct(self, num: int, den: int) -> float:
        return round(100.0 * num / den, 1) if den else 0.0

    @property
    def top1(self) -> float:
        return self.pct(self.category_right, self.failures)

    @property
    def phase_acc(self) -> float:
        return self.pct(self.phase_right, self.phase_scored)

    @property
    def silent_rate(self) -> float:
        return self.pct(self.silent, self.failures)

    @property
    def evidence_rate(self) -> float:
        return self.pct(self.evidence_hit, self.failures)

    @property
    def top1_interval(self) -> tuple[float, float]:
        return wilson_interval(self.category_right, self.failures)

    def summary(self) -> dict:
        out = asdict(self)
        out.update(top1=self.top1, phase_accuracy=self.phase_acc, silent_rate=self.silent_rate,
                   evidence_rate=self.evidence_rate, top1_interval=list(self.top1_interval))
        return out


def wilson_interval(right: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion, in percent (one decimal): how far a part's top-1 could be
    from the rate on logs like it that were not written. 46/49 is 83.5-97.9 %: a small part cannot tell 94 % from
    95 %, and its figure is read with that interval, not as a point."""
    if n == 0:
        return (0.0, 0.0)
    p = right / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return (round(100 * max(0.0, centre - half), 1), round(100 * min(1.0, centre + half), 1))


# Bands of the root cause's confidence, for the reliability table: is a finding said at 0.8 right about 8 times
# in 10? A band's label is its lower bound; the last band includes 1.0.
CONFIDENCE_BANDS = (0.0, 0.4, 0.6, 0.8)


def confidence_band(confidence: float) -> str:
    return f"{max(b for b in CONFIDENCE_BANDS if confidence >= b):.1f}"


# ----------------------------------------------------------------------------------------------- corpus


def load_cases(parts: tuple[str, ...], only: tuple[str, ...] = ()) -> list[Case]:
    """The cases of ``parts``; with ``only``, just those whose id starts with one of its prefixes."""
    cases: list[Case] = []
    for part in parts:
        folder = CORPUS / part
        if not folder.is_dir():
            continue
        for sidecar in sorted(folder.glob("*.case.json")):
            case_id = sidecar.name[: -len(".case.json")]
            if only and not case_id.startswith(only):
                continue
            meta = json.loads(sidecar.read_text(encoding="utf-8"))
            log = folder / f"{case_id}.log"
            if not log.exists():
                log = folder / case_id  # a folder of per-rank logs
            cases.append(Case(case_id, part, log, sidecar, meta))
    return cases


def _signal_hit(signal: str, evidence_texts: list[str]) -> bool:
    """The thread's root-cause line is among the evidence (evidence text is inert and may be cut short)."""
    want = " ".join(signal.split())
    if not want:
        return False
    for text in evidence_texts:
        have = " ".join(text.split()).rstrip("…").strip()
        if have and (want in have or have[:120] in want):
            return True
    return False


def score_case(case: Case, replay: bool) -> Outcome:
    from diagnose.model import DiagnoseError
    from diagnose.pipeline import AnalyzeOptions, analyze

    started = time.perf_counter()
    expected = case.expected
    base = dict(id=case.id, part=case.part, thread=case.meta.get("thread", ""), failed=case.failed,
                expected_category=expected.get("category"), expected_phase=expected.get("phase"))
    try:
        report = analyze([str(case.log)], AnalyzeOptions(replay=replay))
    except DiagnoseError as e:
        return Outcome(**base, category=None, phase=None, rule=None, confidence=None, findings=0,
                       evidence_hit=False if case.failed else None, seconds=time.perf_counter() - started,
                       error=str(e))
    root = report.root
    hit = None
    if case.failed:
        hit = root is not None and _signal_hit(expected.get("signal", ""), [e.text for e in root.evidence])
    return Outcome(
        **base,
        category=root.category if root else None,
        phase=root.phase if root else None,
        rule=root.rule if root else None,
        confidence=root.confidence if root else None,
        findings=len(report.findings),
        evidence_hit=hit,
        seconds=time.perf_counter() - started,
        inferred_by=root.basis_detail.split(":", 1)[0] if root and root.basis == "inferred" else None,
    )


def figures(outcomes: list[Outcome], part: str) -> Figures:
    fig = Figures(part)
    confusion: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        fig.errors += o.error is not None
        if o.failed:
            fig.failures += 1
            fig.category_right += o.category_right
            fig.silent += o.silent
            fig.evidence_hit += bool(o.evidence_hit)
            confusion[str(o.expected_category)][str(o.category)] += 1
            if o.confidence is not None:
                band = fig.reliability.setdefault(confidence_band(o.confidence), [0, 0, 0.0])
                band[0] += 1
                band[1] += o.category_right
                band[2] = round(band[2] + o.confidence, 6)
            if o.expected_phase not in (None, "unknown"):
                fig.phase_scored += 1
                fig.phase_right += o.phase == o.expected_phase
        else:
            fig.clean += 1
            fig.clean_right += not o.false_alarm
    fig.confusion = {k: dict(v) for k, v in sorted(confusion.items())}
    fig.reliability = dict(sorted(fig.reliability.items()))
    return fig


# ----------------------------------------------------------------------------------------------- output


def print_figures(fig: Figures, outcomes: list[Outcome], verbose: bool) -> None:
    print(f"\n== {fig.part}: {fig.failures} failure logs, {fig.clean} clean logs")
    low, high = fig.top1_interval
    print(f"  top-1 category   {fig.top1:5.1f} %  ({fig.category_right}/{fig.failures}; 95 % interval {low}-{high} %)")
    print(f"  phase            {fig.phase_acc:5.1f} %  ({fig.phase_right}/{fig.phase_scored} with a known phase)")
    print(f"  silent failures  {fig.silent_rate:5.1f} %  ({fig.silent}/{fig.failures}: exit 0 on a failed job)")
    print(f"  clean logs right {fig.pct(fig.clean_right, fig.clean):5.1f} %  ({fig.clean_right}/{fig.clean})")
    print(f"  evidence on the thread's line {fig.evidence_rate:5.1f} %  ({fig.evidence_hit}/{fig.failures})")
    if fig.errors:
        print(f"  input errors     {fig.errors}")
    cats = sorted({c for row in fig.confusion.values() for c in row} | set(fig.confusion))
    if cats:
        width = max(len(c) for c in cats)
        print("  confusion (rows: expected, columns: predicted; None = silent)")
        short = {c: c[:6] for c in cats}
        print("  " + " " * width + " " + " ".join(f"{short[c]:>6}" for c in cats))
        for exp in sorted(fig.confusion):
            row = fig.confusion[exp]
            print("  " + f"{exp:<{width}} " + " ".join(f"{row.get(c, 0) or '.':>6}" for c in cats))
    if fig.reliability:
        print("  reliability (the root cause's confidence against how often its category is right)")
        uppers = [*CONFIDENCE_BANDS[1:], 1.0]
        for low, upper in zip(CONFIDENCE_BANDS, uppers):
            n, right, total = fig.reliability.get(f"{low:.1f}", [0, 0, 0.0])
            if n:
                print(f"    confidence {low:.1f}-{upper:.1f}  {int(n):5} logs  mean said {total / n:4.2f}  "
                      f"right {fig.pct(int(right), int(n)):5.1f} %")
    if verbose:
        for o in outcomes:
            if o.failed and not o.category_right:
                print(f"  MISS {o.id}: expected {o.expected_category}/{o.expected_phase}, "
                      f"got {o.category}/{o.phase} ({o.rule})")
            elif o.false_alarm:
                print(f"  FALSE ALARM {o.id}: {o.category} ({o.rule})")


def print_answers(outcomes: list[Outcome]) -> None:
    """One line per case: what the tool answered against what the case expects (``--only``)."""
    for o in outcomes:
        exp = f"{o.expected_category}/{o.expected_phase}" if o.failed else "clean"
        got = f"{o.category}/{o.phase}" if o.category is not None else "none"
        right = o.category_right if o.failed else not o.false_alarm
        verdict = "RIGHT" if right else ("MISS" if o.failed else "FALSE ALARM")
        conf = f"{o.confidence:.2f}" if o.confidence is not None else "-"
        hit = {True: "yes", False: "no", None: "-"}[o.evidence_hit]
        line = (f"  {verdict} {o.part}/{o.id}: expected {exp}, got {got}, rule {o.rule or '-'}, "
                f"confidence {conf}, evidence hit {hit}")
        if o.error:
            line += f", error: {o.error}"
        print(line)


def run(parts: tuple[str, ...], replay: bool = False,
        only: tuple[str, ...] = ()) -> tuple[dict[str, Figures], list[Outcome]]:
    outcomes = [score_case(c, replay) for c in load_cases(parts, only)]
    by_part = {p: figures([o for o in outcomes if o.part == p], p) for p in parts}
    return by_part, outcomes


# ----------------------------------------------------------------------------------------------- split


def _files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    for f in _files_of(path):
        h.update(f.relative_to(path.parent).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def freeze() -> None:
    """Split corpus/cases/ into dev/ and test/ by thread, stratified by category; write corpus/SPLIT.json."""
    source = CORPUS / "cases"
    if (CORPUS / "SPLIT.json").exists():
        raise SystemExit("corpus/SPLIT.json exists: the split is frozen; add new cases to dev/ by hand")
    metas = {s.name[: -len(".case.json")]: json.loads(s.read_text()) for s in sorted(source.glob("*.case.json"))}
    threads: dict[str, list[str]] = defaultdict(list)
    for case_id, meta in metas.items():
        key = (meta.get("thread") or case_id) if meta["kind"] == "failure" else f"clean:{case_id}"
        threads[key].append(case_id)
    # stratum of a thread: its most common expected category (clean runs are their own stratum)
    strata: dict[str, list[str]] = defaultdict(list)
    for thread, ids in threads.items():
        cats = Counter(str(metas[i]["expected"].get("category")) for i in ids)
        strata[cats.most_common(1)[0][0]].append(thread)
    test_threads: set[str] = set()
    for _cat, members in sorted(strata.items()):
        ordered = sorted(members, key=lambda t: hashlib.sha256(f"{SPLIT_SALT}:{t}".encode()).hexdigest())
        test_threads.update(t for i, t in enumerate(ordered) if i % TEST_SHARE == TEST_SHARE - 1)
    assignment: dict[str, str] = {}
    for thread, ids in threads.items():
        for case_id in ids:
            assignment[case_id] = "test" if thread in test_threads else "dev"
    for part in PARTS:
        (CORPUS / part).mkdir(exist_ok=True)
    test_hashes = {}
    for case_id, part in sorted(assignment.items()):
        for item in (source / f"{case_id}.log", source / case_id, source / f"{case_id}.case.json"):
            if item.exists():
                target = CORPUS / part / item.name
                shutil.move(str(item), str(target))
                if part == "test":
                    test_hashes[item.name] = sha256_of(target)
    split = {
        "note": "Frozen before any rule was written from the corpus. Never tune on test/; see corpus/README.md.",
        "salt": SPLIT_SALT,
        "test_share": f"1/{TEST_SHARE} of threads per category stratum",
        "dev": sorted(i for i, p in assignment.items() if p == "dev"),
        "test": sorted(i for i, p in assignment.items() if p == "test"),
        "test_sha256": test_hashes,
    }
    (CORPUS / "SPLIT.json").write_text(json.dumps(split, indent=1, sort_keys=True) + "\n")
    print(f"dev {len(split['dev'])} cases, test {len(split['test'])} cases "
          f"({len(test_threads)} of {len(threads)} threads)")


# ----------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=[*PARTS, "all"], default=None,
                    help="the parts to score (default: all; with --only, dev)")
    ap.add_argument("--only", metavar="PREFIX", action="append", default=[],
                    help="score just the cases whose id starts with PREFIX (repeatable), of the parts asked "
                         "(dev unless --part says otherwise); prints each case's answer; never with --record")
    ap.add_argument("--replay", action="store_true", help="run config replay and the memory model too (slower)")
    ap.add_argument("--json", metavar="FILE", help="write figures and every case's answer as JSON")
    ap.add_argument("--record", action="store_true", help="write corpus/accuracy.json, the figures CI holds")
    ap.add_argument("--freeze", action="store_true", help="split corpus/cases/ into dev/ and test/ (once)")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every miss")
    args = ap.parse_args(argv)
    if args.freeze:
        freeze()
        return 0
    only = tuple(args.only)
    if only and args.record:
        ap.error("--only scores part of the corpus; a partial run is never recorded: drop --record")
    if only and any(not prefix.strip() for prefix in only):
        ap.error("--only needs a non-empty case id prefix")
    part = args.part or ("dev" if only else "all")
    parts = PARTS if part == "all" else (part,)
    by_part, outcomes = run(parts, replay=args.replay, only=only)
    if only and not outcomes:
        print(f"accuracy.py: no case of {'/'.join(parts)} has an id starting with "
              f"{' or '.join(repr(p) for p in only)}", file=sys.stderr)
        return 2
    for part in parts:
        print_figures(by_part[part], [o for o in outcomes if o.part == part], args.verbose)
    if only:
        print("\n== answers")
        print_answers(outcomes)
    total = sum(o.seconds for o in outcomes)
    print(f"\n{len(outcomes)} cases in {total:.1f} s")
    data = {
        "figures": {p: by_part[p].summary() for p in parts},
        "cases": {o.id: {**asdict(o), "seconds": round(o.seconds, 3)} for o in outcomes},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    if args.record:
        record = {
            "figures": data["figures"],
            "answers": {o.id: {"category": o.category, "phase": o.phase, "rule": o.rule} for o in outcomes},
        }
        (CORPUS / "accuracy.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
