"""Start-up (perf46): what a run without a finding does not import or compile, and that deferring it changed nothing.

A clean log's ``analyze`` no longer imports the memory model, the fitter or yaml, no longer compiles the capture
regexes whose literal is not in the log, the phase file's frame patterns or inference's patterns, and reads the phase
file from the JSON cache (``diagnose/toml_cache``) once it was checked. ``rules lint`` still compiles every pattern.
No timings here: what is asserted is which work is skipped, and that the answers are the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import regex

from diagnose.match import all_captures, load_catalogue
from diagnose.match.anchors import loosen
from diagnose.match.compiled import FILTER_AFTER, compile_catalogue
from diagnose.model import CaptureSpec
from diagnose.normalize import phase_file as pf

ROOT = Path(__file__).resolve().parents[1]

# imported by a run with a finding that needs them, never by one without a finding
HEAVY = ("yaml", "diagnose.explain.memory.analysis", "diagnose.explain.memory.options", "diagnose.explain.fit",
         "diagnose.explain.config.safe_yaml", "diagnose.explain.memory.from_config", "textual", "numpy", "torch")

_PROBE = r"""
import json, sys
from diagnose.present.cli import main
code = main(["analyze", sys.argv[1]])
from diagnose.match import inference
from diagnose.normalize import phase_file
print(json.dumps({
    "code": code,
    "modules": sorted(m for m in sys.modules if m.split(".")[0] in {"yaml", "textual", "numpy", "torch", "diagnose"}),
    "inference_compiled": [n for n, v in vars(inference).items()
                           if type(v).__name__ == "LazyPattern" and v._compiled is not None],
    "frames_compiled": phase_file._frame_pattern.cache_info().currsize,
}), file=sys.stderr)
"""


def _probe(log: Path, cache: Path) -> dict:
    env = {**os.environ, "DIAGNOSE_NO_FORK": "1", "DIAGNOSE_SKIP_SLURM": "1", "DIAGNOSE_CACHE_DIR": str(cache),
           "PYTHONPATH": str(ROOT)}
    env.pop("DIAGNOSE_NO_CACHE", None)
    done = subprocess.run([sys.executable, "-c", _PROBE, str(log)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stderr.strip().splitlines()[-1])


def test_a_clean_log_imports_no_heavy_module_and_compiles_no_deferred_pattern(tmp_path):
    log = tmp_path / "one.log"
    log.write_text("iteration 10/100 | lm loss: 2.3 | elapsed time per iteration (ms): 123.4\n", encoding="utf-8")
    first = _probe(log, tmp_path / "cache")  # fills the cache (rules files and the phase file)
    again = _probe(log, tmp_path / "cache")  # reads them from it
    for seen in (first, again):
        assert seen["code"] == 0
        loaded = set(seen["modules"])
        assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
        assert seen["inference_compiled"] == []
    # the first run checked the phase file by compiling its frame patterns; a cached run compiles none
    assert first["frames_compiled"] > 0 and again["frames_compiled"] == 0


def test_an_oom_log_still_imports_the_memory_model_and_reads_the_same(tmp_path):
    log = ROOT / "sample_logs" / "b042_first_iter_oom.log"
    seen = _probe(log, tmp_path / "cache")
    assert "diagnose.explain.memory.analysis" in seen["modules"]


def test_every_built_in_capture_regex_compiles():
    """Capture regexes are compiled when their literal is first found: a broken one would be found by a log, not at
    start-up, so every built-in one (and its loosened forms) is compiled here."""
    for spec in all_captures():
        assert spec.anchor, spec.name
        if spec.regex:
            regex.compile(spec.regex)
            loose = loosen(spec.regex)
            if loose is not None:
                regex.compile(loose)


def test_a_capture_whose_regex_does_not_compile_accepts_nothing_and_says_so():
    compiled = compile_catalogue(load_catalogue(), [CaptureSpec("broken", anchor="boom", regex="boom (")])
    (cc,) = compiled.captures
    assert cc.broken == "" and cc._built is False  # nothing compiled yet
    assert not cc.accepts("boom (x")
    assert cc.broken and "missing )" in cc.broken
    assert cc.may_accept_raw("boom (x")  # no loosened filter: the line is not refused before accepts() sees it


def test_captures_read_the_same_lines_compiled_lazily():
    compiled = compile_catalogue(load_catalogue(), all_captures())
    for cc in compiled.captures:
        spec = cc.spec
        line = spec.anchor + " 12"
        want = spec.anchor in line and (not spec.regex or regex.search(spec.regex, line) is not None)
        assert cc.accepts(line) == want, spec.name


def test_a_captures_loosened_filters_come_after_some_lines_and_change_no_answer():
    """The loosened filters only reject early: before they are compiled every line goes on to ``accepts``, and the
    answer for a line is the same before and after."""
    compiled = compile_catalogue(load_catalogue(), all_captures())
    rejected_once_built = 0
    for cc in compiled.captures:
        if not cc.spec.regex or loosen(cc.spec.regex) is None:
            continue
        line = f"{cc.spec.anchor} zz"
        answers, early = [], []
        for _ in range(FILTER_AFTER + 3):
            early.append(cc.may_accept_raw(line))
            answers.append(early[-1] and cc.accepts(line))
        assert len(set(answers)) == 1, cc.spec.name
        assert all(early[:FILTER_AFTER]), cc.spec.name  # no filter yet: nothing rejected early
        assert cc.window_rx is not None or cc.loose is not None, cc.spec.name  # built by now
        rejected_once_built += not early[-1]
    assert rejected_once_built > 10  # the filters do reject lines once built


def test_the_phase_file_read_from_the_cache_is_the_file_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DIAGNOSE_NO_CACHE", raising=False)
    path = tmp_path / "phases.toml"
    path.write_text(pf.phase_file_path().read_text(encoding="utf-8"), encoding="utf-8")
    pf.load_phase_file.cache_clear()
    checked = pf.load_phase_file(path)
    assert list((tmp_path / "cache").glob("rules-*.json")), "a checked file is cached"
    pf.load_phase_file.cache_clear()
    cached = pf.load_phase_file(path)
    assert cached == checked
    assert [f.pattern.pattern for f in cached.frames] == [f.pattern.pattern for f in checked.frames]
    pf.load_phase_file.cache_clear()


def test_a_broken_phase_file_is_never_cached_and_check_compiles_a_cached_one(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[[marker]]\nname = 'x'\nanchor = 'a'\nphase = 'init'\nregex = '('\n", encoding="utf-8")
    for _ in range(2):
        pf.load_phase_file.cache_clear()
        with pytest.raises(pf.DiagnoseError, match="missing \\)"):
            pf.load_phase_file(bad)
    assert not list((tmp_path / "cache").glob("rules-*.json"))
    good = tmp_path / "good.toml"
    good.write_text("[[frame]]\nphase = 'init'\nregex = ':setup$'\n", encoding="utf-8")
    pf.load_phase_file.cache_clear()
    pf.load_phase_file(good)
    pf._frame_pattern.cache_clear()
    pf.load_phase_file(good, check=True)  # lint's load: every regex compiled though the text is cached
    assert pf._frame_pattern.cache_info().currsize == 1
    pf.load_phase_file.cache_clear()


def test_lint_still_reports_a_user_rule_whose_regex_does_not_compile(tmp_path, capsys):
    from diagnose.present.cli import main

    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "x.toml").write_text(
        '[[rule]]\ncode = "ZZ001"\nslug = "zz-bad"\ntitle = "bad"\ncategory = "cuda_oom"\nexplanation = "x"\n'
        'patterns = [{ anchor = "bang", regex = "bang" }]\n[rule.evidence]\nfollowing = "(unclosed"\n'
        '[rule.fix]\nsummary = "x"\n[rule.examples]\nmatch = ["bang"]\n', encoding="utf-8")
    code = main(["rules", "lint", "--only-user", "--rules", str(rules)])
    out = capsys.readouterr()
    assert code != 0
    assert "ZZ001: evidence.following does not compile" in out.out + out.err
