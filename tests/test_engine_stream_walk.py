"""_LineReader.stream_backwards yields exactly the lines of one stream that filtering backwards gives."""

from __future__ import annotations

import random

from diagnose.match.engine import _LineReader


def _log(seed: int, lines: int) -> bytes:
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        rank = rng.choice([0, 0, 0, 1, 2, 3, None])
        body = rng.choice(["x" * rng.randint(0, 40), "Traceback (most recent call last):", '  File "a.py", line 3',
                           "", "RuntimeError: boom"])
        out.append(body if rank is None else f"[rank{rank}]:{body} {i}")
    return ("\n".join(out) + ("\n" if seed % 2 else "")).encode()


def _starts(buf: bytes) -> list[tuple[int, int]]:
    starts, pos, n = [], 0, 1
    while pos < len(buf):
        starts.append((pos, n))
        nl = buf.find(b"\n", pos)
        if nl == -1:
            break
        pos, n = nl + 1, n + 1
    return starts


def test_same_lines_as_filtered_backwards_in_any_order_and_bounds():
    for seed in range(12):
        buf = _log(seed, 600)
        plain, skipping = _LineReader(buf, "x.log"), _LineReader(buf, "x.log")
        skipping.block_bytes = [64, 100, 1000, 16 << 10][seed % 4]  # lines straddle blocks; blocks without a start
        starts = _starts(buf)
        rng = random.Random(seed)
        order = list(range(len(starts)))
        if seed % 3:
            rng.shuffle(order)  # blocks read by one walk serve later walks from anywhere, read on where partial
        for i in order[:300]:
            start, lineno = starts[i]
            stream = plain.line_at(start, buf.find(b"\n", start) if buf.find(b"\n", start) != -1 else len(buf),
                                   lineno).stream
            max_lines, max_bytes = rng.choice([(4000, 1 << 20), (30, 1 << 20), (4000, 700), (7, 300)])
            want = [(s, ln.lineno, ln.text) for s, ln in plain.backwards(start, lineno, max_lines, max_bytes)
                    if ln.stream == stream]
            got = [(s, ln.lineno, ln.text)
                   for s, ln in skipping.stream_backwards(start, lineno, stream, max_lines, max_bytes)]
            assert got == want, (seed, start, max_lines, max_bytes)
        assert skipping.blocks  # the walks did index blocks


def test_a_walk_stopped_early_by_its_reader_leaves_later_walks_exact():
    buf = _log(5, 400)
    plain, skipping = _LineReader(buf, "x.log"), _LineReader(buf, "x.log")
    skipping.block_bytes = 128
    starts = _starts(buf)
    for start, lineno in starts[::7]:
        stream = plain.line_at(start, buf.find(b"\n", start), lineno).stream
        walk = skipping.stream_backwards(start, lineno, stream, 4000, 1 << 20)
        for _ in zip(range(3), walk):  # the caller breaks off (a header found)
            pass
    for start, lineno in starts[::5]:
        stream = plain.line_at(start, buf.find(b"\n", start), lineno).stream
        want = [s for s, ln in plain.backwards(start, lineno, 4000, 1 << 20) if ln.stream == stream]
        assert [s for s, _ in skipping.stream_backwards(start, lineno, stream, 4000, 1 << 20)] == want
