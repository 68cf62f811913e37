"""The match engine on small texts: grouping, last-match-wins, context, exact line numbers, timeouts, captures."""

from __future__ import annotations

import pytest
from conftest import make_catalogue, make_rule
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.match import TextSource, engine, match_text, scan_and_match
from diagnose.match.compiled import compile_catalogue
from diagnose.model import CaptureSpec

OOM = make_rule("OOM1", "CUDA out of memory", r"CUDA out of memory\. Tried to allocate (?P<req>[\d.]+ [GM]iB)",
                category="cuda_oom")
GENERIC = make_rule("PY1", "Error: ", r"(?P<exc>\w+Error): (?P<msg>.*)")
import importlib.util  # noqa: E402


def _backend(name: str, module: str | None):
    """A scan backend, skipped where its optional library (the `fast` extra) is not installed."""
    missing = module is not None and importlib.util.find_spec(module) is None
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=f"{module} not installed (extra 'fast')"))


BACKENDS = [_backend("python", None), _backend("re2", "re2"), _backend("hyperscan", "hyperscan")]
INSTALLED_BACKENDS = [p.values[0] for p in BACKENDS if not any(m.args[0] for m in p.marks)]


def test_same_rule_on_many_ranks_is_one_finding():
    lines = [f"[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {r}.00 GiB" for r in (5, 0, 3, 1)]
    report = match_text("\n".join(lines), make_catalogue(OOM))
    assert len(report.findings) == 1
    f = report.findings[0]
    assert f.ranks == [0, 1, 3, 5]
    assert f.count == 4
    assert f.first_line == 1
    assert f.facts["req"] == "5.00 GiB"  # facts of the first hit
    assert [e.line for e in f.evidence] == [1, 2, 3]


def test_rule_without_named_groups_groups_all_its_lines():
    child = make_rule("LA1", "ChildFailedError", r"(?:torch\.distributed\.elastic\.multiprocessing\.errors\.)?ChildFailedError:?")
    text = "    raise ChildFailedError(\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    (f,) = match_text(text, make_catalogue(child)).findings
    assert f.count == 2 and f.first_line == 1


def test_different_named_groups_give_different_findings():
    text = "ValueError: bad shape\nKeyError: 'weight'\nValueError: bad shape\n"
    report = match_text(text, make_catalogue(GENERIC))
    assert sorted((f.facts["exc"], f.count) for f in report.findings) == [("KeyError", 1), ("ValueError", 2)]


def test_last_match_wins_on_one_line():
    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    later_specific = match_text(text, make_catalogue(GENERIC, OOM))
    assert [f.rule for f in later_specific.findings] == ["OOM1"]
    later_generic = match_text(text, make_catalogue(OOM, GENERIC))
    assert [f.rule for f in later_generic.findings] == ["PY1"]


def test_context_failure_falls_back_to_earlier_rule():
    wrap = make_rule("OOM2", "CUDA out of memory", r"CUDA out of memory", context={"frames_any": ["_ddp_wrap"]},
                     phase="dp_wrap", category="cuda_oom")
    cat = make_catalogue(OOM, wrap)
    in_wrap = (
        "Traceback (most recent call last):\n"
        '  File "/x/model_provider.py", line 10, in _ddp_wrap\n'
        "    DistributedDataParallel(config)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    elsewhere = in_wrap.replace("_ddp_wrap", "train_step")
    r1 = match_text(in_wrap, cat)
    assert [f.rule for f in r1.findings] == ["OOM2"]
    assert r1.findings[0].phase == "dp_wrap"
    assert [e.line for e in r1.findings[0].evidence] == [2, 4]  # the matched frame is evidence too
    assert [f.rule for f in match_text(elsewhere, cat).findings] == ["OOM1"]


def test_frames_are_read_from_the_same_rank_only():
    wrap = make_rule("OOM2", "CUDA out of memory", r"CUDA out of memory", context={"frames_any": ["_ddp_wrap"]})
    text = (
        "[rank0]: Traceback (most recent call last):\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/x/a.py", line 10, in _ddp_wrap\n'
        '[rank0]:   File "/x/a.py", line 99, in train_step\n'
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory.\n"
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory.\n"
    )
    report = match_text(text, make_catalogue(wrap))
    assert [(f.ranks, f.first_line) for f in report.findings] == [([1], 6)]


def test_before_any_looks_back_within_the_window():
    rule = make_rule("NC9", "Watchdog caught", "Watchdog caught", context={"before_any": ["NCCL WARN"], "before_window": 3})
    near = "NCCL WARN Cuda failure\na\nb\nWatchdog caught collective operation timeout\n"
    far = "NCCL WARN Cuda failure\na\nb\nc\nWatchdog caught collective operation timeout\n"
    assert len(match_text(near, make_catalogue(rule)).findings) == 1
    assert match_text(far, make_catalogue(rule)).findings == []


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.sampled_from(["", "a", "WA", "RN x", "WARN", "x WARN y", "WARNWARN", "bb" * 9]), max_size=40),
       window=st.integers(1, 12), step=st.integers(1, 9))
def test_before_any_equals_a_line_by_line_look_back(lines, window, step):
    """The chunked backward search gives what checking each of the ``window`` previous lines gives."""
    data = ("\n".join(lines) + "\n").encode()
    reader = engine._LineReader(data, "t")
    starts = [0]
    for i, b in enumerate(data):
        if b == 10 and i + 1 < len(data):
            starts.append(i + 1)
    old = engine.BEFORE_STEP_BYTES, engine.BEFORE_INCREMENTAL_BYTES
    engine.BEFORE_STEP_BYTES = step
    engine.BEFORE_INCREMENTAL_BYTES = step * 3  # some calls search only the gap since the last, others walk back
    try:
        warm = engine._LineReader(data, "t")
        for i, s in enumerate(starts):
            expected = any(b"WARN" in ln.encode() or b"RN x" in ln.encode() for ln in lines[max(0, i - window):i])
            assert engine.Matcher._before_any(reader, s, ["WARN", "RN x"], window) == expected
            if i % 3 != 1:  # successive calls with line numbers (as the matcher makes them), some lines skipped
                assert engine.Matcher._before_any(warm, s, ["WARN", "RN x"], window, i + 1) == expected
    finally:
        engine.BEFORE_STEP_BYTES, engine.BEFORE_INCREMENTAL_BYTES = old


@pytest.mark.parametrize("backend", BACKENDS)
def test_line_numbers_are_exact_with_cr_crlf_and_long_lines(backend):
    lines = [
        "progress 10%\rprogress 50%\rprogress 100%",
        "x" * 100_000,
        "ok\r",
        "",
        "\x1b[31mtorch.OutOfMemoryError: CUDA out of \x1b[0mmemory. Tried to allocate 1.00 GiB\x1b[0m",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB\r",
    ]
    report = match_text("\n".join(lines), make_catalogue(OOM), backend=backend)
    (f,) = report.findings
    assert [e.line for e in f.evidence] == [5, 6]
    assert "\x1b" not in f.evidence[0].text
    assert report.inputs[0].lines == 6


@pytest.mark.parametrize("window", [7, 64, 1 << 20])
def test_windows_do_not_change_answers(window):
    text = "".join(f"line {i}\n" if i % 5 else f"CUDA out of memory. Tried to allocate {i}.0 GiB\n" for i in range(1, 200))
    compiled = compile_catalogue(make_catalogue(OOM))
    hits, _blocks, infos = engine.scan([TextSource("a.log", text.encode())], compiled, [], window_size=window)
    assert [h.line.lineno for h in hits] == list(range(5, 200, 5))
    assert infos[0].lines == 199


def test_multi_file_inputs_keep_their_own_paths_lines_and_rank_hints():
    a = TextSource("rank0.log", b"hello\nworld\nCUDA out of memory. Tried to allocate 1.0 GiB\n", rank_hint=0)
    b = TextSource("rank7.log", b"CUDA out of memory. Tried to allocate 1.0 GiB\n", rank_hint=7)
    report = scan_and_match([a, b], make_catalogue(OOM)).report
    (f,) = report.findings
    assert f.ranks == [0, 7]
    assert [(e.path, e.line) for e in f.evidence] == [("rank0.log", 3), ("rank7.log", 1)]
    assert [(i.path, i.lines) for i in report.inputs] == [("rank0.log", 3), ("rank7.log", 1)]


def test_catastrophic_user_regex_times_out_is_named_and_scan_goes_on(monkeypatch):
    monkeypatch.setattr(engine, "REGEX_TIMEOUT_S", 0.05)
    evil = make_rule("USR1", "aaaa", r"^(a|aa)+$", source="my-rules/evil.toml")
    text = "a" * 40 + "b\n" + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.0 GiB\n"
    report = match_text(text, make_catalogue(OOM, evil))
    assert [f.rule for f in report.findings] == ["OOM1"]
    assert any("USR1" in w and "switched off" in w for w in report.warnings)


def test_rule_with_broken_regex_is_refused_by_the_schema():
    with pytest.raises(ValueError, match="pattern 1: regex does not compile"):
        make_rule("BAD1", "CUDA out", r"CUDA out (")


def test_rule_with_broken_regex_is_skipped_with_a_warning():
    """The engine's own guard, for a Rule built in code past the schema (the schema refuses it, above)."""
    import dataclasses

    good = make_rule("BAD1", "CUDA out", r"CUDA out")
    bad = dataclasses.replace(good, patterns=[dataclasses.replace(good.patterns[0], regex=r"CUDA out (")])
    report = match_text("CUDA out of memory. Tried to allocate 1.0 GiB\n", make_catalogue(OOM, bad))
    assert [f.rule for f in report.findings] == ["OOM1"]
    assert any("BAD1" in w for w in report.warnings)


def test_captures_keep_policy_and_lines_after_of_same_stream():
    specs = [
        CaptureSpec("cfg", "CONFIG BEGIN", lines_after=5, until="CONFIG END", keep="first"),
        CaptureSpec("iter", "iteration", regex=r"iteration\s+\d+", keep="first_last"),
    ]
    text = (
        "[rank0]: CONFIG BEGIN\n[rank1]: noise\n[rank0]: a: 1\n[rank0]: CONFIG END\n[rank0]: after\n"
        "[rank0]: iteration 1\n[rank0]: iteration 2\n[rank0]: iteration 3\n[rank1]: CONFIG BEGIN\n"
    )
    result = scan_and_match([TextSource("x.log", text.encode())], make_catalogue(OOM), captures=specs)
    (cfg,) = result.blocks["cfg"]
    assert cfg.start_line == 1
    assert [ln.text for ln in cfg.lines] == ["CONFIG BEGIN", "a: 1", "CONFIG END"]
    assert [b.start_line for b in result.blocks["iter"]] == [6, 8]


def test_empty_input_and_no_match():
    assert match_text("", make_catalogue(OOM)).findings == []
    report = match_text("all good\n", make_catalogue(OOM))
    assert report.findings == [] and report.root_cause is None


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=3000))
def test_any_bytes_give_a_report_never_an_exception(data):
    # builtin catalogue, every backend: arbitrary bytes (NUL, invalid UTF-8, lone \r, escapes) never break a scan
    catalogue = _builtin()
    reports = [scan_and_match([TextSource("b.log", data)], catalogue, backend=b).report.to_dict()
               for b in INSTALLED_BACKENDS]
    assert all(r == reports[0] for r in reports)
    assert reports[0]["inputs"][0]["lines"] == data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1)


_BUILTIN = []


def _builtin():
    from diagnose.match.rules import load_catalogue

    if not _BUILTIN:
        _BUILTIN.append(load_catalogue())
    return _BUILTIN[0]


def test_a_line_longer_than_a_window_is_matched_once():
    line = "x" * (3 << 20) + " torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB"
    report = match_text("first\n" + line + "\nlast\n", make_catalogue(OOM))
    (f,) = report.findings
    assert f.first_line == 2 and f.count == 1
    assert len(f.evidence[0].text) <= 500  # evidence of a huge line is cut


def test_hyperscan_database_cache_survives_a_torn_file(tmp_path, monkeypatch):
    """Compiled Hyperscan databases (the literal pass, each anchor's locator) are cached on disk; a damaged copy is
    recompiled, never trusted."""
    pytest.importorskip("hyperscan")
    from diagnose.match import anchors
    from diagnose.match.anchors import Phase1

    monkeypatch.setenv("DIAGNOSE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DIAGNOSE_NO_CACHE", raising=False)
    monkeypatch.setattr(anchors, "LOCATOR_MIN_BYTES", 0)
    args = ([b"CUDA out of memory", b"Error: "], [[r"CUDA out of memory"], [r"(?P<exc>\w+Error): "]], [b"iteration "])
    window = b"x\n[rank1]: CUDA out of memory. Tried\nValueError: boom\n iteration 3\nok\n"
    expected = Phase1(*args, backend="hyperscan").scan(window)
    assert expected == ([2, 37], [0])
    cached = sorted(tmp_path.glob("hs-*.db"))
    assert len(cached) == 3  # the literal pass; each anchor's locator, the variant an ASCII window needs
    Phase1(*args, backend="hyperscan").scan(window.replace(b"boom", "b\u00f6\u00f6m".encode()))
    assert len(list(tmp_path.glob("hs-*.db"))) == 5  # a window with non-ASCII bytes: the other variant, compiled now
    assert Phase1(*args, backend="hyperscan").scan(window) == expected  # loaded from the cache
    for db in cached:
        db.write_bytes(db.read_bytes()[:100])
    assert Phase1(*args, backend="hyperscan").scan(window) == expected  # torn: compiled again
    for db in cached:
        db.write_bytes(b"\0" * 32 + b"junk")
    assert Phase1(*args, backend="hyperscan").scan(window) == expected
    monkeypatch.setattr(anchors, "CACHE_KEEP", 2)
    for extra in (b"a1", b"a2", b"a3"):  # other catalogues: the oldest databases are removed, the newest kept
        Phase1([*args[0], extra], [*args[1], [extra.decode()]], args[2], backend="hyperscan")
    assert len(list(tmp_path.glob("hs-*.db"))) == 2


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300).map(lambda b: b.replace(b"a", b"\n")), a=st.integers(0, 310), b=st.integers(0, 320))
def test_numpy_newline_count_equals_bytes_count(data, a, b):
    count = engine.numpy_counter()
    if count is None:
        pytest.skip("numpy not installed")
    assert count(data, a, b) == data.count(b"\n", a, b)


_ITER = ("[2026-11-29 10:20:00] iteration {i:8d}/  100000 | consumed samples: {c:12d} | elapsed time per iteration "
         "(ms): 8012.4 | learning rate: 1.5E-04 | global batch size:  4096 | lm loss: 2.87E+00 | loss scale: 1.0 |")
_FRAMES_OOM = [
    "Traceback (most recent call last):",
    '  File "/opt/Megatron-LM/megatron/core/transformer/moe/experts.py", line 250, in forward',
    "    intermediate_parallel = self.activation_func(fc1_output)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 11.38 GiB. GPU 1 has a total capacity of 79.11 GiB "
    "of which 2.31 GiB is free. Including non-PyTorch memory, this process has 76.79 GiB memory in use. Of the "
    "allocated memory 70.02 GiB is allocated by PyTorch, and 5.10 GiB is reserved by PyTorch but unallocated.",
]


@pytest.mark.parametrize("trained", [True, False])
def test_per_rank_files_date_a_failure_by_the_rank_that_logs_iterations(tmp_path, trained):
    """QA2 #2: Megatron logs iterations on one rank; the OOM on rank 3 after 300 iterations is not "first_iteration"."""
    from diagnose.pipeline import AnalyzeOptions, analyze

    iterations = [_ITER.format(i=i, c=i * 4096) for i in range(1, 301)] if trained else ["> building model ..."]
    (tmp_path / "rank_0.log").write_text("\n".join(iterations) + "\n")
    (tmp_path / "rank_3.log").write_text("\n".join(_FRAMES_OOM) + "\n")
    report = analyze([str(tmp_path)], AnalyzeOptions(replay=False))
    assert report.root_cause is not None
    root = report.findings[report.root_cause]
    assert root.ranks == [3]
    assert root.phase == ("training" if trained else "first_iteration")


def test_per_rank_hang_on_a_one_element_collective_is_during_training_when_a_file_trained(tmp_path):
    """QA2 #8: the ranks that log no iterations got NC002, the early collective's timeout read as set-up (a
    one-element all-reduce at SeqNum 80231) while rank 63's file shows 299 iterations: one finding, during training."""
    from diagnose.pipeline import AnalyzeOptions, analyze

    watchdog = ("[E1129 10:35:00.1 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Watchdog caught "
                "collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                "Timeout(ms)=600000) ran for 600031 milliseconds before timing out.")
    for seq, expected in ((80231, "NC007"), (12, "NC002")):
        folder = tmp_path / str(seq)
        folder.mkdir()
        for r in range(8):
            lines = [_ITER.format(i=i, c=i * 4096) for i in range(1, 300)] if r == 7 and seq > 100 else ["> start"]
            (folder / f"rank_{r}.log").write_text("\n".join(lines + [watchdog.format(r=r, seq=seq)]) + "\n")
        report = analyze([str(folder)], AnalyzeOptions(replay=False))
        codes = {f.rule for f in report.findings if f.category == "nccl_timeout"}
        assert codes == {expected}, (seq, codes)
