"""Line numbers of captured lines (diagnose/match/captures.py): right wherever they are asked, counted from the nearest
known point, and for the lines a capture keeps for good, counted while their window is still in memory.

The scan releases each window's mapped pages once it is done with it. A kept line numbered only afterwards (in
``materialise``) maps its stretch of the file back in: the loss series' 256 earliest loss lines, spread over the first
28 MiB of a 1 GiB log, kept those 28 MiB resident to the end of the run (peak RSS 80 MiB instead of 57)."""

from __future__ import annotations

import random

from diagnose.match.captures import BlockCollector, LineIndex, WindowView
from diagnose.match.compiled import compile_catalogue
from diagnose.match.rules import Catalogue
from diagnose.model import CaptureSpec


class RecordingBuffer:
    """bytes that record every slice read from them."""

    def __init__(self, data: bytes):
        self.data = data
        self.reads: list[tuple[int, int]] = []

    def __getitem__(self, key):
        if isinstance(key, slice):
            self.reads.append((key.start or 0, len(self.data) if key.stop is None else key.stop))
        return self.data[key]

    def __len__(self) -> int:
        return len(self.data)

    def __getattr__(self, name):  # find, rfind, ...
        return getattr(self.data, name)


def _log(lines: int, seed: int = 7) -> bytes:
    rng = random.Random(seed)
    return b"".join(b"x" * rng.randrange(0, 90) + b"\n" for _ in range(lines))


def _index(data, step: int) -> LineIndex:
    """A LineIndex with a checkpoint every ``step`` bytes, as the scan records them."""
    raw = data.data if isinstance(data, RecordingBuffer) else data
    index = LineIndex(data)
    for offset in range(step, len(raw), step):
        index.add(offset, raw.count(b"\n", 0, offset))
    return index


def _truth(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def test_line_numbers_are_right_in_any_order():
    data = _log(4000)
    offsets = random.Random(1).sample(range(len(data)), 600)
    for order in (sorted(offsets), sorted(offsets, reverse=True), offsets):
        index = _index(data, 4096)
        assert [index.lineno(o) for o in order] == [_truth(data, o) for o in order]


def test_ascending_offsets_count_only_the_bytes_between_them():
    buf = RecordingBuffer(_log(4000))
    index = _index(buf, 1 << 16)
    offsets = sorted(random.Random(2).sample(range(1 << 16, 2 << 16), 200))  # one checkpoint's stretch
    assert [index.lineno(o) for o in offsets] == [_truth(buf.data, o) for o in offsets]
    read = sum(stop - start for start, stop in buf.reads)
    assert read == offsets[-1] - (1 << 16)  # not 200 counts from the checkpoint each


def test_a_capture_that_keeps_every_line_numbers_them_while_its_window_is_read():
    data = b"".join(b"step %d | lm loss: %.4f |\n" % (i, 10 - i / 100) if i % 3 == 0 else b"noise line %d\n" % i
                    for i in range(300))
    spec = CaptureSpec("loss_series.test", "loss", regex=r"loss: \d", keep="all", max_blocks=50)
    compiled = compile_catalogue(Catalogue(rules=[]), [spec])
    buf = RecordingBuffer(data)
    view = WindowView(0, "log", buf, 0, len(data), _index(buf, 1024), ascii_only=True)
    collector = BlockCollector(compiled.captures)
    collector.window(view, [0])
    kept = collector.occurrences(0)
    assert len(kept) == 50
    assert all(occ.index is None for occ in kept)  # counted already: nothing left to read once the window is gone
    assert [occ.line.lineno for occ in kept] == [3 * k + 1 for k in range(50)]


def _blocks(data: bytes, specs: list[CaptureSpec]) -> dict[str, list[tuple[int, str]]]:
    from diagnose.match import TextSource
    from diagnose.match.engine import scan

    compiled = compile_catalogue(Catalogue(rules=[]), specs)
    _hits, blocks, _infos = scan([TextSource("a.log", data), TextSource("b.log", data[: len(data) // 3])], compiled,
                                 [], window_size=4096)
    return {name: [(b.path, b.start_line, b.lines[0].text) for b in got] for name, got in blocks.items()}


def test_a_deferred_capture_keeps_the_lines_a_capture_read_during_the_scan_keeps():
    # loss lines in many small windows, qualifying or not ("loss scale" has no loss value), the last ones not
    lines = []
    for i in range(2000):
        if i % 7 == 0:
            lines.append(b"step %d | lm loss: %.4f |" % (i, 11 - i / 1000))
        elif i % 11 == 0:
            lines.append(b"step %d | loss scale: 1.0 |" % i)
        else:
            lines.append(b"noise %d" % i)
    data = b"\n".join(lines + [b"loss scale: 2.0 |"] * 300) + b"\n"
    for keep, most in (("all", 40), ("all", 100000), ("last", 64), ("first", 64), ("first_last", 64)):
        specs = [CaptureSpec(f"c.{keep}", "loss", regex=r"lm loss: \d", keep=keep, max_blocks=most, deferred=d)
                 for d in (False, True)]
        now, later = _blocks(data, specs[:1]), _blocks(data, specs[1:])
        assert now == later and now[f"c.{keep}"], keep


def test_the_loss_series_is_read_only_when_nothing_else_is_the_root_cause():
    from diagnose.match import TextSource, load_catalogue, scan_and_match

    steps = b"".join(b" iteration %d/ 100 | lm loss: 1.%04d |\n" % (i, 5000 + i % 7) for i in range(1, 40))
    oom = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    catalogue = load_catalogue()
    clean = scan_and_match([TextSource("a.log", steps)], catalogue)
    assert clean.report.root_cause is None and clean.blocks["loss_series.loss.all"]
    failed = scan_and_match([TextSource("a.log", steps + oom)], catalogue)
    assert failed.report.root_cause is not None
    assert not any(name.startswith("loss_series.") for name in failed.blocks)


def test_a_line_two_captures_verify_is_normalised_once_per_window(monkeypatch):
    """A tqdm bar is a candidate of every bar marker: normalising it is most of a verification's cost, so the window
    normalises each line once for all its captures (qa-report-21 L1), and forgets them when it is done."""
    from diagnose.match import captures as captures_module

    calls: list[str] = []
    real = captures_module.normalize_line

    def counting(raw, path, lineno):
        calls.append(raw)
        return real(raw, path, lineno)

    monkeypatch.setattr(captures_module, "normalize_line", counting)
    bars = b"".join(b"Loading shards: %3d%%|###   | %d/100 [00:01<00:09]\n" % (p, p) for p in range(0, 100, 10))
    specs = [CaptureSpec("bar.a", "%|", regex=r"^\s*\d+%\|", keep="last"),
             CaptureSpec("bar.b", "%|", regex=r"^\s*0%\|", keep="first")]
    compiled = compile_catalogue(Catalogue(rules=[]), specs)
    view = WindowView(0, "log", bars, 0, len(bars), _index(bars, 1024), ascii_only=False)
    collector = BlockCollector(compiled.captures)
    collector.window(view, [0, 1])
    assert collector.occurrences(0) == [] and collector.occurrences(1) == []  # no bare bar: every line verified
    assert len(calls) == len(set(calls)) == 10
    assert view._lines == {}  # forgotten once the window is done: memory stays flat
