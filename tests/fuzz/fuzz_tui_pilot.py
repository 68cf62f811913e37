"""Fuzz target: the TUI itself, driven by Textual's Pilot on a fuzzed log under a fuzzed file name.

Each input is a log and a short script of keys taken from its first bytes: the app analyzes the log through the
real pipeline, opens the log view, then searches (``/`` with a fuzzed term, ``n``, ``N``), filters by rank (``r``
with a fuzzed value), jumps (``:``), toggles colour codes (``a``), copies a line (``y``), moves, exports (``e`` with
a fuzzed name) and raises toasts with fuzzed text (``notify``, ``show_error``). Slower than the other targets
(a second or more per input): run it with fewer iterations.

Invariants: the app never raises (Pilot re-raises a crash, a ``MarkupError`` included, when the test ends); every
row the log view draws and every toast the app raised itself holds no escape, control, bidi or zero-width
character; nothing is written outside the input's folder.

    python3 tests/fuzz/fuzz_tui_pilot.py --seconds 1800 --crash-dir /tmp/fuzz-tui-pilot --max-len 4096
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # run as a script from a checkout: import the checkout's package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # the harness beside it, also from the test suite
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Choices, encode  # noqa: E402
from textual.widgets import Input  # noqa: E402

from diagnose.present.tui.app import DiagnoseApp, pipeline_analyzer  # noqa: E402
from diagnose.present.tui.logview import LogView  # noqa: E402
from diagnose.present.tui.screens import ConfirmScreen, ExportScreen, LogScreen  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SIZE = (100, 30)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069"
                     "\u2028\u2029\ufeff\u00ad\u180e]")
ACTIONS = ("search", "next", "prev", "rank", "line", "raw", "copy", "down", "end", "home", "pagedown", "back",
           "export", "toast", "error", "help", "log")
MAX_STEPS = 8


def _assert_clean(text: str, what: str) -> None:
    bad = _UNSAFE.search(text)
    assert bad is None, f"{what}: raw {bad.group()!r} in {text[max(0, bad.start() - 60):bad.end() + 20]!r}"


async def _until(pilot, condition, steps: int = 200) -> None:
    for _ in range(steps):
        if condition():
            return
        await pilot.pause(0.02)


async def _prompt(app, pilot, key: str, value: str) -> None:
    if not isinstance(app.screen, LogScreen):
        return
    await pilot.press(key)
    prompt = app.screen.query_one("#log-prompt", Input)
    prompt.value = value
    await pilot.press("enter")


async def _drive(app: DiagnoseApp, c: Choices, work: Path) -> list[str]:
    own_toasts: list[str] = []  # what this script raised itself, not checked for inertness
    async with app.run_test(size=SIZE) as pilot:
        await _until(pilot, lambda: app.report is not None or app.error is not None, steps=500)
        await pilot.press("l")
        await pilot.pause()
        for _ in range(c.byte() % MAX_STEPS + 1):
            action = c.pick(ACTIONS)
            if action == "search":
                await _prompt(app, pilot, "slash", c.text(24))
            elif action == "rank":
                await _prompt(app, pilot, "r", c.text(8) if c.flag() else str(c.byte() % 8))
            elif action == "line":
                await _prompt(app, pilot, "colon", str(c.byte() * c.byte()))
            elif action == "export":
                if isinstance(app.screen, LogScreen):
                    await pilot.press("escape")
                await pilot.press("e")
                if isinstance(app.screen, ExportScreen):
                    name = c.text(24).replace("/", "_").replace("\x00", "_") or "r.md"
                    app.screen.query_one(Input).value = str(work / name)
                    await pilot.press("enter")
                    await pilot.pause()
                    if isinstance(app.screen, ConfirmScreen):
                        await pilot.press("n")
            elif action == "toast":
                message = c.text(32)
                own_toasts.append(message)
                app.notify(message, title=c.text(8))
            elif action == "error":
                app.show_error(c.text(32))
            else:
                key = {"next": "n", "prev": "N", "raw": "a", "copy": "y", "down": "down", "end": "end",
                       "home": "home", "pagedown": "pagedown", "back": "escape", "help": "question_mark",
                       "log": "l"}[action]
                await pilot.press(key)
            await pilot.pause()
        await pilot.pause(0.05)
        if isinstance(app.screen, LogScreen):
            view = app.screen.query_one(LogView)
            for y in range(view.size.height):
                _assert_clean(view.render_line(y).text, "log view row")
            _assert_clean(str(app.screen.query_one("#log-status").content), "log status")
        for note in app._notifications:
            if note.message not in own_toasts:
                _assert_clean(note.message, "toast")
                _assert_clean(note.title, "toast title")
    return own_toasts


def check(data: bytes) -> None:
    c = Choices(data)
    root = Path(tempfile.mkdtemp(prefix="fuzz-tui-"))
    work = root / "work"
    work.mkdir()
    name = (c.text(32).replace("/", "_").replace("\x00", "_") or "job") + ".log"
    head = c.byte() % 48  # the script's bytes come next, the log is what follows
    script = Choices(c.rest()[:head] + b"")
    log = work / name
    log.write_bytes(data[len(data) - len(c.rest()) + head:] if len(c.rest()) > head else b"")
    saved_cwd = os.getcwd()
    before = set(os.listdir(root))
    try:
        os.chdir(work)
        app = DiagnoseApp([str(log)], analyzer=pipeline_analyzer([]), display_names={str(log): name})
        app.plan_real_mcore = False
        asyncio.run(_drive(app, script, work))
    finally:
        os.chdir(saved_cwd)
        after = set(os.listdir(root))
        shutil.rmtree(root, ignore_errors=True)
    assert before == after, f"written beside the work folder: {after - before}"


def _sample(name: str, limit: int = 3000) -> bytes:
    return (ROOT / "sample_logs" / name).read_bytes()[:limit]


def seeds() -> list[bytes]:
    oom = _sample("ddp_wrap_oom.log")
    script = encode(7, 0, "OOM", 1, 2, 3, 0, "[/]", 1, 5, 6)  # search, next, prev, rank 1, search, raw, copy
    return [
        encode("run[t=10:30]", len(script), script, oom),
        encode("x\x1b[2J", 12, encode(5, 13, "[@click=app.quit]", "t", 14, "[b]x[/]", 7, 2, 1), oom),
        encode("e", 8, encode(3, 12, "out[/].md", 0, "\x1b]0;x\x07", 10), _sample("nccl_desync_seqnum.log")),
        encode("colours", 6, encode(4, 5, 8, 8, 3, 3), "\x1b[31mred\x1b[0m \x1b[2J\r50%\r100%\n\u202eevil\n".encode() * 20),
    ]


if __name__ == "__main__":
    from harness import main

    sys.exit(main("tui_pilot", check, seeds(), max_len=4096))
