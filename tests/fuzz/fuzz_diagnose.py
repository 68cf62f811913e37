"""Coverage-guided fuzz target (atheris) for everything that reads untrusted log text.

Bytes in -> decode -> normalize_line on every line -> traceback rebuild -> every fact parser on every line ->
the whole match engine (match_text) -> config extraction from the captured blocks -> the JSON/markdown/text
reports. Any exception is a crash; each crash found becomes a test in tests/test_hostile_*.py.

    pip install atheris
    python tests/fuzz/fuzz_diagnose.py -max_total_time=1800 -max_len=4096 tests/fuzz/corpus
"""

from __future__ import annotations

import io
import os
import sys

import atheris

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

with atheris.instrument_imports():
    from rich.console import Console

    from diagnose.explain.config.extract import blocks_from_lines, from_blocks
    from diagnose.match import load_catalogue, match_text
    from diagnose.normalize import decode, normalize_line
    from diagnose.normalize.facts import PARSERS
    from diagnose.normalize.tracebacks import rebuild
    from diagnose.present import json_report, markdown
    from diagnose.present import text as text_report

CATALOGUE = load_catalogue()

# Compile the catalogue once (the engine compiles per call; per input that would dominate the fuzzing rate).
from diagnose.match import compiled as _compiled  # noqa: E402

_compile = _compiled.compile_catalogue
_cache: dict = {}


def _compile_once(catalogue, captures=None):
    key = (id(catalogue), tuple(captures) if captures else None)
    if key not in _cache:
        _cache[key] = _compile(catalogue, captures)
    return _cache[key]


_compiled.compile_catalogue = _compile_once


def one_input(data: bytes) -> None:
    text = decode(data)
    lines = [normalize_line(raw, "fuzz", i + 1) for i, raw in enumerate(text.split("\n"))]
    rebuild(lines)
    for ll in lines[:64]:
        for parser in PARSERS.values():
            parser(ll, lines[:8])
    report = match_text(text, CATALOGUE, path="fuzz")
    from_blocks(blocks_from_lines(lines), report.findings)
    json_report.render_json(report)
    markdown.render_markdown(report)
    console = Console(file=io.StringIO(), width=100, color_system=None)
    text_report.render(report, console)


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
