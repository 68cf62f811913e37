"""Speed never changes an answer (issue 7): the two-phase scan, with each phase-1 backend, finds exactly what a slow
reference matcher finds by running every rule's regex on every normalised line of a generated multi-rank log.

The reference is written independently of the engine: no anchors, no windows, no memo, no bounded look-back; the
whole log is decoded and normalised up front, contexts are checked on the full history of the line's stream.
"""

from __future__ import annotations

import random

import pytest
import regex
from conftest import make_catalogue, make_rule

from diagnose.match import TextSource, all_captures, scan_and_match
from diagnose.match.command_line import config_hidden_by_launcher, options_not_typed, pinned_release
from diagnose.match.compiled import compile_catalogue
from diagnose.match.engine import FAULT_DUMP_LINES, scan
from diagnose.match.frames import (
    GDB_BACKTRACE_LINES,
    GDB_SIGNAL,
    PYTEST_ERROR,
    PYTEST_REPORT_LINES,
    UCX_BACKTRACE_LINES,
    UCX_SIGNAL,
    faulthandler_frames,
    gdb_backtrace_frames,
    pytest_frames,
    ucx_backtrace_frames,
)
from diagnose.match.inference import refused_unlike_listed
from diagnose.match.rules import Catalogue
from diagnose.normalize import decode, normalize_line, phases
from diagnose.normalize.tracebacks import traceback_ending_at

RANKS = 32

NOISE = [
    "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
    "NCCL INFO comm 0x55d1 rank 3 nranks 32 cudaDev 3 busId 1b000 - Init COMPLETE",
    " iteration       12/    1000 | consumed samples:          768 | elapsed time per iteration (ms): 812.3 | lm loss: 7.1E+00 |",
    "WARNING: Logging before flag parsing goes to stderr.",
    "UserWarning: TypedStorage is deprecated",
    "> building train, validation, and test datasets ...",
    "[after model, optimizer, and learning rate scheduler are built] datetime: 2026-11-29 15:24:33",
    "Setting up DistributedDataParallel with config DistributedDataParallelConfig(grad_reduce_in_fp32=True)",
    "progress 10%\rprogress 60%\rprogress 100%",
    "\x1b[32mINFO\x1b[0m all good",
]

EXTRA_RULES = [  # context rules, so the equivalence covers frames_any / frames_none / before_any / levels_any
    make_rule("ZZ905", "settings refused", r"settings refused", context={"levels_any": ["ERROR", "E"]}),
    make_rule("ZZ903", "Error: ", r"(?P<exc>\w+Error): ", context={"frames_none": ["train_step"]}, phase="auto"),
    make_rule("ZZ901", "CUDA out of memory", r"CUDA out of memory", context={"frames_any": ["_ddp_wrap"]},
              phase="auto", category="cuda_oom"),
    make_rule("ZZ902", "Watchdog caught", r"Watchdog caught collective", context={"before_any": ["NCCL WARN"],
              "before_window": 40}, role="cascade", category="nccl_timeout"),
]

OOM_TB = [
    "Traceback (most recent call last):",
    '  File "/w/train.py", line 3, in main',
    "    build()",
    '  File "/w/model_provider.py", line 40, in _ddp_wrap',
    "    DistributedDataParallel(cfg)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 135.33 GiB. GPU 0 has a total capacity of 139.81 GiB",
]
CHAINED_TB = [
    "Traceback (most recent call last):",
    '  File "/w/train.py", line 9, in train_step',
    "    step()",
    "KeyError: 'x'",
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    "Traceback (most recent call last):",
    '  File "/w/train.py", line 12, in main',
    "    recover()",
    "ValueError: recovery failed",
]


def installed_backends() -> list[str]:
    """The pure-Python scan always; RE2 and Hyperscan where the optional `fast` extra is installed (CI has it)."""
    import importlib.util

    return ["python"] + [b for b, mod in (("re2", "re2"), ("hyperscan", "hyperscan")) if importlib.util.find_spec(mod)]


def _prefix(rng: random.Random, rank: int) -> str:
    return rng.choice([f"[rank{rank}]:", f"[default{rank % 8}]:[rank{rank}]:", f"{rank}: ", ""])


def generate_log(catalogue: Catalogue, seed: int, noise_lines: int = 3000) -> str:
    """A seeded multi-rank log: noise on every rank, every rule's examples, interleaved tracebacks, CRLF, ANSI."""
    rng = random.Random(seed)
    blocks: list[list[str]] = []
    for rule in catalogue.rules:
        blocks.extend(ex.splitlines() or [""] for ex in rule.examples_match + rule.examples_no_match)
    blocks += [OOM_TB, CHAINED_TB, ["NCCL WARN Cuda failure 'out of memory'"], ["Watchdog caught collective operation timeout"],
               ["NCCL WARN Cuda failure", "Watchdog caught collective operation timeout"],
               ["2025-03-01 10:00:01.456 | ERROR    | train:main:41 - settings refused"],
               ["2025-03-01 10:00:01.456 | INFO     | train:main:41 - settings refused"]] * 3
    out: list[str] = []
    noise_left = noise_lines
    rng.shuffle(blocks)
    for block in blocks:
        for _ in range(rng.randint(0, noise_left // max(1, len(blocks)) * 2)):
            r = rng.randrange(RANKS)
            out.append(_prefix(rng, r) + rng.choice(NOISE))
            noise_left -= 1
        rank_a, rank_b = rng.sample(range(RANKS), 2)
        pa, pb = f"[rank{rank_a}]: ", f"[rank{rank_b}]: "
        if rng.random() < 0.3:  # two ranks printing the same block, line by line interleaved
            for line in block:
                out.append(pa + line)
                out.append(pb + line)
        else:
            prefix = _prefix(rng, rank_a)
            out.extend(prefix + line for line in block)
    for i in range(len(out)):
        roll = rng.random()
        if roll < 0.03:
            out[i] += "\r"
        elif roll < 0.08:  # colour, sometimes in the middle of a word (an anchor split by an escape)
            cut = rng.randrange(len(out[i]) + 1)
            out[i] = "\x1b[31m" + out[i][:cut] + "\x1b[1m" + out[i][cut:] + "\x1b[0m"
    return "\n".join(out) + "\n"


def reference_hits(text: str, catalogue: Catalogue, path: str) -> list[tuple[str, int, str]]:
    """(rule code, line number, phase) for every line, by brute force."""
    raw = text.encode()
    raw_lines = raw.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    lines = [normalize_line(decode(b), path, i + 1) for i, b in enumerate(raw_lines)]
    rules = [(r, [regex.compile(p.regex) for p in r.patterns]) for r in catalogue.rules]
    specs = [s for s in all_captures() if s.name in {c.name for c in phases.CAPTURES}]
    spec_rx = {s.name: regex.compile(s.regex) if s.regex else None for s in specs}
    markers: list[tuple[str, object]] = []
    by_stream: dict[tuple, list[int]] = {}
    hits = []
    for i, ll in enumerate(lines):
        by_stream.setdefault(ll.stream, []).append(i)
        text_i = ll.text
        header_rule = None  # a traceback_ends_with rule matched this line: its hit is the traceback's end line
        other_match = False
        quoted_end = _quoted_source_end(lines, i)  # a traceback's quoted source line: the exception line below
        for rule, rxs in reversed(rules):
            number, found = next(((j, m) for j, m in enumerate(rx.search(text_i) for rx in rxs) if m), (-1, None))
            if found is None:
                continue
            if quoted_end is not None and any(rx.search(quoted_end) for rx in rxs):
                continue  # the exception line says it: the quoted code is not the rule's line
            if rule.context.traceback_ends_with:
                header_rule = header_rule or rule
                continue
            other_match = True
            ctx = rule.context
            levels = rule.patterns[number].levels_any or ctx.levels_any
            if levels and (ll.level or "").upper() not in levels:
                continue
            frames: list[str] | None = None
            if (ctx.frames_any or ctx.frames_none or ctx.after_progress or rule.phase == "auto"
                    or rule.phase_at_first_collective):
                same = [lines[j] for j in by_stream[ll.stream]]
                tb = traceback_ending_at(same, len(same) - 1)
                frames = []
                if text_i.startswith("Fatal Python error: "):
                    # faulthandler's dump follows the line: the same stream's lines among the next ones
                    after = [lines[j] for j in range(i + 1, min(len(lines), i + 1 + FAULT_DUMP_LINES))
                             if lines[j].stream == ll.stream]
                    frames = [f.text for f in faulthandler_frames(after)]
                if not frames and UCX_SIGNAL.match(text_i):
                    # UCX's native backtrace follows its Caught signal line
                    after = [lines[j] for j in range(i + 1, min(len(lines), i + 1 + UCX_BACKTRACE_LINES))
                             if lines[j].stream == ll.stream]
                    frames = [f.text for f in ucx_backtrace_frames(after)]
                if not frames and GDB_SIGNAL.match(text_i):
                    # gdb's stop location and `bt` stack follow its received signal line
                    after = [lines[j] for j in range(i + 1, min(len(lines), i + 1 + GDB_BACKTRACE_LINES))
                             if lines[j].stream == ll.stream]
                    frames = [f.text for f in gdb_backtrace_frames(after)]
                if not frames and PYTEST_ERROR.match(text_i):
                    # pytest's failure report: the call locations above the E line, the raise site below it
                    before = [lines[j] for j in range(i - 1, max(-1, i - 1 - PYTEST_REPORT_LINES), -1)
                              if lines[j].stream == ll.stream]
                    after = [lines[j] for j in range(i + 1, min(len(lines), i + 1 + PYTEST_REPORT_LINES))
                             if lines[j].stream == ll.stream]
                    frames = [f.text for f in pytest_frames(before, after)]
                if not frames and tb is not None:
                    for t in tb.chain + [tb]:
                        frames += [f.text for f in t.frames] + list(t.cpp_frames)
            if ctx.frames_none and any(n in f for f in frames for n in ctx.frames_none):
                continue
            if ctx.frames_any and not any(a in f for f in frames for a in ctx.frames_any):
                continue
            if ctx.before_any:
                window = raw_lines[max(0, i - ctx.before_window) : i]
                if not any(n.encode() in b for b in window for n in ctx.before_any):
                    continue
            if ctx.also_before_any:
                window = raw_lines[max(0, i - ctx.before_window) : i]
                if not any(n.encode() in b for b in window for n in ctx.also_before_any):
                    continue
            if ctx.after_none and any(n.encode() in b for b in raw_lines[i + 1 :] for n in ctx.after_none):
                continue
            if ctx.after_any and not any(n.encode() in b for b in raw_lines[i + 1 :] for n in ctx.after_any):
                continue
            if ctx.none_anywhere and any(n.encode() in b for b in raw_lines for n in ctx.none_anywhere):
                continue
            if ctx.near_end and len(raw_lines) - 1 - i - (raw_lines[-1] == b"") > ctx.near_end:
                continue
            if ctx.after_progress and phases.phase_of(line=ll, frames=frames, markers=markers) != "training":
                continue
            if ctx.refused_unlike_listed is not None and refused_unlike_listed(text_i) != ctx.refused_unlike_listed:
                continue
            if ctx.pinned_on_command_line:
                groups = {k: v or "" for k, v in found.groupdict().items()}
                start = sum(len(b) + 1 for b in raw_lines[:i])
                if not pinned_release(raw, start, groups.get(ctx.pinned_on_command_line, ""), {}):
                    continue
            if ctx.config_hidden_by_launcher is not None:
                start = sum(len(b) + 1 for b in raw_lines[:i])
                if config_hidden_by_launcher(raw, start, found.groupdict().get("prog") or "") != ctx.config_hidden_by_launcher:
                    continue
            if ctx.not_on_command_line:
                groups = {k: v or "" for k, v in found.groupdict().items()}
                start = sum(len(b) + 1 for b in raw_lines[:i])
                if not options_not_typed(raw, start, groups.get("prog", ""), groups.get(ctx.not_on_command_line, ""),
                                         {}):
                    continue
            phase = rule.phase if rule.phase != "auto" else phases.phase_of(line=ll, frames=frames, markers=markers)
            if rule.phase != "auto" and rule.phase_at_first_collective:
                # the collective's own traceback, when the line carries one, names the call that issued it
                read, by_frames = phases.phase_reading(line=ll, frames=frames, markers=markers)
                if by_frames and read in phases.AFTER_SETUP:
                    phase = read
            if phase in (None, "unknown") and rule.phase_when_unknown:
                phase = rule.phase_when_unknown
            hits.append((rule.code, ll.lineno, phase))
            break
        if header_rule is not None and not other_match:
            end = _reference_end(lines, i, header_rule, rules)
            if end is not None:
                same = [lines[j] for j in range(end + 1) if lines[j].stream == ll.stream]
                tb = traceback_ending_at(same, len(same) - 1)
                frames = [f.text for t in (tb.chain + [tb] if tb else []) for f in t.frames]
                phase = phases.phase_of(line=lines[end], frames=frames, markers=markers) or "unknown"
                hits.append((header_rule.code, lines[end].lineno, phase))
        for s in specs:
            # a capture's anchor is searched in the raw bytes, then checked on the normalised text
            if s.anchor.encode() in raw_lines[i] and s.anchor in text_i and (
                spec_rx[s.name] is None or spec_rx[s.name].search(text_i)
            ):
                markers.append((s.name, ll))  # noqa: PERF401 (one line's captures, in catalogue order)
    return hits


def _stream_after(lines, i: int):
    """``(index, text)`` of the non-blank lines of ``lines[i]``'s stream after it (4000 lines at most), ending at a
    run of more than 2 blank lines: the walk both traceback readings below make."""
    blanks = 0
    for j in range(i + 1, min(len(lines), i + 4001)):
        text = lines[j].text
        if lines[j].stream != lines[i].stream:
            continue
        if not text.strip():
            blanks += 1
            if blanks > 2:
                return
            continue
        yield j, text


def _quoted_source_end(lines, i: int) -> str | None:
    """When ``lines[i]`` is indented under a frame line of its stream (among the 8 lines above it): the text of the
    first line of its stream below that starts at the margin (past indented lines, carets, repeat notes, at most 2
    blanks), unless it is another traceback header; else None."""
    ll = lines[i]
    if ll.text[:1] not in (" ", "\t"):
        return None
    above = [lines[j] for j in range(i - 1, max(-1, i - 9), -1) if lines[j].stream == ll.stream]
    if not above or not above[0].text.lstrip().startswith('File "'):
        return None
    for _j, text in _stream_after(lines, i):
        if text[0] in " \t" or text.startswith(("[Previous line repeated", "^", "~")):
            continue
        return None if text.startswith(("Traceback (most recent call last)", "Exception Group Traceback")) else text
    return None


def _reference_end(lines, i: int, rule, rules) -> int | None:
    """The index of the line ending the traceback whose header is ``lines[i]``, when ``rule``'s traceback_ends_with
    matches it and no rule's regex does: the first line of the header's stream after at least one frame that is not
    indented, a caret or a repeat note; a blank run (over 2), another header or no frame first: none."""
    frames = 0
    for j, text in _stream_after(lines, i):
        if text[0] in " \t":
            frames += text.lstrip().startswith('File "')
            continue
        if text.startswith(("[Previous line repeated", "^", "~")):
            continue
        if frames == 0 or text.startswith(("Traceback (most recent call last)", "Exception Group Traceback")):
            return None
        if any(rx.search(text) for _r, rxs in rules for rx in rxs):
            return None
        return j if regex.search(rule.context.traceback_ends_with, text) else None
    return None


@pytest.fixture(scope="module")
def catalogue(builtin_catalogue):
    return make_catalogue(*builtin_catalogue.rules, *EXTRA_RULES)


@pytest.mark.parametrize("seed", [1, 2])
def test_fast_scan_equals_reference_matcher(catalogue, seed):
    text = generate_log(catalogue, seed)
    expected = reference_hits(text, catalogue, "gen.log")
    codes = {code for code, _l, _p in expected}
    assert len(codes) > 10 and {"ZZ901", "ZZ902", "ZZ903", "ZZ905"} <= codes  # the log really exercises the catalogue
    compiled = compile_catalogue(catalogue, all_captures())
    for backend in installed_backends():
        for window in (1 << 20, 4096):
            hits, _b, _i = scan([TextSource("gen.log", text.encode())], compiled, [], backend=backend,
                                window_size=window)
            got = [(h.rule.rule.code, h.line.lineno, h.phase) for h in hits]
            assert got == expected, f"backend {backend}, window {window}"


@pytest.mark.parametrize("seed", [1, 5])
def test_hyperscan_locators_of_large_inputs_equal_reference_matcher(catalogue, seed, monkeypatch):
    """Large inputs: the literal pass, then Hyperscan locators for the anchors present (plain, and with
    non-ASCII/NUL bytes: the "anchor and special byte" variant), Hyperscan's text presence in phase 2 and numpy's
    newline counting, all forced on a small generated log."""
    pytest.importorskip("hyperscan")
    from diagnose.match import anchors, engine

    monkeypatch.setattr(anchors, "LOCATOR_MIN_BYTES", 0)
    monkeypatch.setattr(engine, "TEXT_PRESENCE_MIN_BYTES", 0)
    monkeypatch.setattr(engine, "NUMPY_MIN_BYTES", 0)  # numpy newline counting too, where installed
    anchors._CACHE.clear()
    # \w matches "é" in the text but not in the raw bytes: only the "anchor and special byte" patterns find it
    catalogue = make_catalogue(*catalogue.rules, make_rule("ZZ904", "mixed byte", r"mixed byte \w+ end"))
    rng = random.Random(seed)
    lines = generate_log(catalogue, seed).split("\n")
    if seed == 5:  # some windows not pure ASCII: the database variant with "anchor and special byte" patterns
        for i in range(0, len(lines), 97):
            lines[i] = lines[i] + rng.choice([" caf\u00e9", " \x00", " \u2013 "])
        lines[len(lines) // 2] = "[rank3]: mixed byte \u00e9t\u00e9 end"
    text = "\n".join(lines)
    expected = reference_hits(text, catalogue, "gen.log")
    compiled = compile_catalogue(catalogue, all_captures())
    for window in (1 << 20, 4096):
        hits, _b, _i = scan([TextSource("gen.log", text.encode())], compiled, [], backend="hyperscan",
                            window_size=window)
        assert [(h.rule.rule.code, h.line.lineno, h.phase) for h in hits] == expected, f"window {window}"
    assert seed != 5 or "ZZ904" in {code for code, _l, _p in expected}


def test_backends_give_identical_reports(catalogue):
    text = generate_log(catalogue, 3).encode()
    dicts = [
        scan_and_match([TextSource("gen.log", text)], catalogue, backend=b).report.to_dict()
        for b in installed_backends()
    ]
    assert dicts[0]["findings"] and all(d == dicts[0] for d in dicts)


def test_parallel_phase1_gives_the_serial_answer(catalogue, tmp_path, monkeypatch):
    """--jobs 2: forked workers scan newline-aligned chunks of the mapped file; the report must not change."""
    import mmap

    from diagnose.match import engine, parallel

    monkeypatch.setattr(engine, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 8192)
    path = tmp_path / "gen.log"
    path.write_bytes(generate_log(catalogue, 4).encode())
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        src = TextSource("gen.log", mm)
        serial = scan_and_match([src], catalogue, jobs=1).report.to_dict()
        forked = scan_and_match([src], catalogue, jobs=2).report.to_dict()
    assert serial["findings"] and serial == forked


@pytest.mark.parametrize("seed", [1, 3])
def test_stray_lines_between_chained_tracebacks_keep_the_fast_scan_exact(catalogue, seed):
    """Every 13th line gets stray text (a progress suffix, a NUL, non-ASCII): some land between "During handling of
    the above exception" and the next header, where the rebuild keeps the chain; the fast look-back must keep it too
    (it used to stop at the stray line and lose the chained frames: another rule, another phase)."""
    rng = random.Random(seed)
    lines = generate_log(catalogue, seed).split("\n")
    for i in range(0, len(lines), 13):
        lines[i] = lines[i] + rng.choice([" caf\u00e9", " \x00", " \u2013 ", " progress 10%", "x"])
    text = "\n".join(lines)
    expected = reference_hits(text, catalogue, "gen.log")
    compiled = compile_catalogue(catalogue, all_captures())
    for backend in installed_backends():
        hits, _b, _i = scan([TextSource("gen.log", text.encode())], compiled, [], backend=backend)
        assert [(h.rule.rule.code, h.line.lineno, h.phase) for h in hits] == expected, backend


@pytest.mark.parametrize("seed", [2, 6])
def test_pure_python_scanner_with_a_tiny_shape_memory_equals_reference_matcher(catalogue, seed, monkeypatch):
    """The pure-Python scanner remembers line shapes; forgetting them (a full memory) or not remembering long lines
    must never change an answer."""
    from diagnose.match import anchors

    monkeypatch.setattr(anchors._PythonPresence, "MAX_SHAPES", 8)
    monkeypatch.setattr(anchors._PythonPresence, "MAX_SHAPE_BYTES", 40)
    anchors._CACHE.clear()
    text = generate_log(catalogue, seed)
    expected = reference_hits(text, catalogue, "gen.log")
    compiled = compile_catalogue(catalogue, all_captures())
    for window in (4096, 1 << 16):
        hits, _b, _i = scan([TextSource("gen.log", text.encode())], compiled, [], backend="python", window_size=window)
        assert [(h.rule.rule.code, h.line.lineno, h.phase) for h in hits] == expected, window
    anchors._CACHE.clear()


@pytest.mark.parametrize("seed", [1, 5])
def test_hyperscan_locators_equal_reference_matcher(catalogue, seed, monkeypatch):
    """Windows of 1 MiB and more locate the lines of present anchors with per-anchor Hyperscan locators (smaller
    ones by find loops and the anchors' regexes): force the locators on the small generated log."""
    pytest.importorskip("hyperscan")
    from diagnose.match import anchors

    monkeypatch.setattr(anchors, "LOCATOR_MIN_BYTES", 0)
    anchors._CACHE.clear()
    lines = generate_log(catalogue, seed).split("\n")
    if seed == 5:
        for i in range(0, len(lines), 89):
            lines[i] = lines[i] + " caf\u00e9"
    text = "\n".join(lines)
    expected = reference_hits(text, catalogue, "gen.log")
    compiled = compile_catalogue(catalogue, all_captures())
    for window in (1 << 20, 4096):
        hits, _b, _i = scan([TextSource("gen.log", text.encode())], compiled, [], backend="hyperscan",
                            window_size=window)
        assert [(h.rule.rule.code, h.line.lineno, h.phase) for h in hits] == expected, window
    anchors._CACHE.clear()


def test_a_colour_escape_inside_a_frame_line_keeps_the_frames(catalogue):
    """The byte pre-check for a stream's earlier traceback looks for `File "`; an escape inside it ('Fil\\x1b[1me "')
    is removed by normalising, so the pre-check must not conclude "no traceback here" (it did: the frame was lost
    and the phase came from the markers instead of `torch/serialization.py in save`)."""
    text = "\n".join([
        "[rank3]: iteration 5 | loss 2.1",
        '\x1b[31m[rank3]:   Fil\x1b[1me "/env/lib/python3.10/site-packages/torch/serialization.py", line 652, in save\x1b[0m',
        "[rank3]:     with _open_zipfile_writer(f) as opened_zipfile:",
        "[rank3]: OSError: [Errno 28] No space left on device",
    ]) + "\n"
    expected = reference_hits(text, catalogue, "gen.log")
    assert any(phase == "checkpoint_save" for _c, _l, phase in expected)
    compiled = compile_catalogue(catalogue, all_captures())
    for backend in installed_backends():
        hits, _b, _i = scan([TextSource("gen.log", text.encode())], compiled, [], backend=backend)
        assert [(h.rule.rule.code, h.line.lineno, h.phase) for h in hits] == expected, backend
