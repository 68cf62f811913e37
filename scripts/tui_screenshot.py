"""Make the README screenshot: the real TUI (real pipeline) on a log, saved as SVG and, if rsvg-convert is on
PATH, as PNG.  ``python3 scripts/tui_screenshot.py LOG docs/tui.svg [--png docs/tui.png] [KEY ...]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's diagnose, not an installed one

from diagnose.present.tui.app import DiagnoseApp, pipeline_analyzer  # noqa: E402


async def capture(log: str, keys: list[str], size: tuple[int, int]) -> str:
    name = os.path.basename(log)
    app = DiagnoseApp([log], analyzer=pipeline_analyzer([]), display_names={log: name})
    async with app.run_test(size=size) as pilot:
        for _ in range(1200):
            if app.report is not None or app.error:
                break
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.3)
        return app.export_screenshot(title=f"diagnose tui {name}")


def svg_to_png(svg: str, png: Path) -> bool:
    """rsvg-convert drops leading no-break spaces: give it plain spaces with xml:space="preserve"."""
    converter = shutil.which("rsvg-convert")
    if converter is None:
        return False
    fixed = svg.replace("&#160;", " ").replace("<svg ", '<svg xml:space="preserve" ', 1)
    with tempfile.NamedTemporaryFile("w", suffix=".svg", delete=False) as tmp:
        tmp.write(fixed)
    try:
        subprocess.run([converter, tmp.name, "-o", str(png)], check=True)
    finally:
        os.unlink(tmp.name)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("log")
    parser.add_argument("svg")
    parser.add_argument("--png")
    parser.add_argument("--size", default="150x50")
    parser.add_argument("keys", nargs="*")
    args = parser.parse_args()
    width, height = (int(n) for n in args.size.split("x"))
    svg = asyncio.run(capture(args.log, args.keys, (width, height)))
    Path(args.svg).write_text(svg, encoding="utf-8")
    if args.png and not svg_to_png(svg, Path(args.png)):
        print("rsvg-convert not found (apt package librsvg2-bin): PNG not written")


if __name__ == "__main__":
    main()
