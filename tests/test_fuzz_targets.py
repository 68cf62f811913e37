"""A few seconds of each fuzz target in tests/fuzz (the 30-minute runs are scripts/fuzz.sh): the seeds and a short
seeded mutation run pass, the seeds reach the paths they are meant to, and each target's check can fail."""

from __future__ import annotations

import gzip
import json
import os

import pytest
from fuzz import fuzz_cli, fuzz_ingest, fuzz_tui_pilot, fuzz_tui_text, harness

from diagnose.present.tui.app import DiagnoseApp


def test_choices_read_what_encode_wrote():
    c = harness.Choices(harness.encode(3, "a[b]\udcff", b"rest"))
    assert c.byte() == 3 and c.text() == "a[b]\udcff" and c.rest() == b"rest"
    assert c.byte() == 0 and c.text() == "" and c.pick(["x", "y"]) == "x"  # an input too short never raises


def test_a_long_run_saves_each_distinct_crash_once_and_keeps_going(tmp_path):
    def check(data: bytes) -> None:
        if b"!" in data:
            raise ValueError("boom")

    stats = harness.Stats("t", "mutation")
    one = harness.guarded(check, stats, str(tmp_path))
    for data in (b"ok", b"a!", b"b!", b"fine"):
        one(data)
    stats.save(str(tmp_path), force=True)
    saved = json.loads((tmp_path / "stats.json").read_text())
    (signature,) = saved["crashes"]  # one distinct crash (a!, b! raise at the same line), saved once
    assert harness.signature(_raised(AssertionError("internal error TypeError; argv=1"))) != harness.signature(
        _raised(AssertionError("internal error KeyError; argv=1")))
    assert saved["iterations"] == 4 and signature.startswith("ValueError@test_fuzz_targets.py:")
    crash = tmp_path / saved["crashes"][signature]
    assert crash.read_bytes() == b"a!" and "boom" in (tmp_path / (crash.name + ".txt")).read_text()


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:  # noqa: BLE001 - the exception with its traceback
        return e


def test_ingest_target(monkeypatch):
    harness.smoke(fuzz_ingest.check, fuzz_ingest.seeds(), iterations=60)


def test_ingest_target_catches_lost_text_and_leftover_files(monkeypatch):
    import diagnose.ingest.sources as sources

    real = sources._map_file

    def drops_a_byte(real_path, display_path, **hints):
        source = real(real_path, display_path, **hints)
        source.buffer = bytes(source.buffer)[1:]
        source.size -= 1
        return source

    monkeypatch.setattr(sources, "_map_file", drops_a_byte)
    with pytest.raises(AssertionError, match="text changed"):
        fuzz_ingest.check(harness.encode(0, 1, "rank1", 1, b"[rank1]: hello\n"))
    monkeypatch.setattr(sources, "_map_file", real)
    monkeypatch.setattr(sources.tempfile, "TemporaryDirectory", lambda prefix: _Kept())
    with pytest.raises(AssertionError, match="left behind"):
        fuzz_ingest.check(harness.encode(2, gzip.compress(b"x\n")))


class _Kept:
    """A temporary folder that is not removed (what a leak in open_inputs would look like)."""

    def __enter__(self) -> str:
        import tempfile

        return tempfile.mkdtemp(prefix="kept-")

    def __exit__(self, *exc) -> None:
        return None


def test_cli_target_reaches_every_command_and_exit_code():
    seen: dict[str, set[int]] = {}
    for seed in fuzz_cli.seeds():
        if fuzz_cli.Choices(seed).pick(fuzz_cli.COMMANDS) == "check":
            continue  # the memory plan takes seconds; the long run covers it
        fuzz_cli.check(seed)
        argv, rc = fuzz_cli.LAST
        seen.setdefault(argv[0], set()).add(rc)
    assert set(seen) == {"analyze", "replay", "rules", "verify"}
    assert seen["analyze"] >= {1, 2} and 0 in seen["rules"]


def test_cli_target_short_run():
    seeds = [s for s in fuzz_cli.seeds() if fuzz_cli.Choices(s).pick(fuzz_cli.COMMANDS) != "check"]
    rng_seeds = [s for s in seeds if fuzz_cli.Choices(s).pick(fuzz_cli.COMMANDS).startswith("analyze")]
    harness.smoke(lambda d: fuzz_cli.check(d) if fuzz_cli.Choices(d).pick(fuzz_cli.COMMANDS) != "check" else None,
                  rng_seeds, iterations=12)


def test_cli_target_catches_a_raw_escape_in_the_output(monkeypatch):
    from diagnose.present import cli

    real = cli.main

    def leaky(argv):
        print("\x1b]0;owned\x07")
        return real(argv)

    monkeypatch.setattr(fuzz_cli, "main", leaky)
    with pytest.raises(AssertionError, match="raw"):
        fuzz_cli.check(fuzz_cli.seeds()[0])


def test_tui_text_target():
    harness.smoke(fuzz_tui_text.check, fuzz_tui_text.seeds(), iterations=80)


def test_tui_text_target_catches_markup_obeyed(monkeypatch):
    from rich.text import Text

    monkeypatch.setattr(fuzz_tui_text, "job_row", lambda j: tuple(Text.from_markup(j.name) for _ in range(6)))
    with pytest.raises(AssertionError, match="markup obeyed"):
        fuzz_tui_text.check(harness.encode("a.log", 0, 0, "[b]x[/b]", b"line\n"))


def test_tui_pilot_target():
    for seed in fuzz_tui_pilot.seeds()[:1]:  # seconds each: the long run does the mutants
        fuzz_tui_pilot.check(seed)


def test_tui_pilot_target_catches_a_crash(monkeypatch):
    from rich.text import Text

    def markup_toast(self, message, **kwargs):  # what App.notify did before it passed markup=False
        Text.from_markup(message)

    monkeypatch.setattr(DiagnoseApp, "notify", markup_toast)
    with pytest.raises(Exception, match="closing tag"):
        fuzz_tui_pilot.check(harness.encode("j", 6, harness.encode(0, 13, "[/]"), b"x\n"))


def test_scripts_fuzz_sh_names_every_target():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "scripts", "fuzz.sh"), encoding="utf-8") as fh:
        script = fh.read()
    targets = sorted(n[len("fuzz_"):-3] for n in os.listdir(os.path.join(root, "tests", "fuzz"))
                     if n.startswith("fuzz_") and n not in ("fuzz_diagnose.py", "fuzz_normalize.py"))
    assert targets == ["cli", "ingest", "tui_pilot", "tui_text"]
    assert all(t in script for t in targets)
