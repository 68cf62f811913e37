"""Coverage-guided fuzz target for the log reader: bytes -> lines -> LogLines -> tracebacks -> facts -> phase.

Run with atheris (``pip install atheris``)::

    python3 tests/fuzz/fuzz_normalize.py -max_total_time=1800 -max_len=4096 [corpus_dir]

Without atheris it falls back to a seeded random-mutation loop over the same target (``--iterations N``), so the
check still runs anywhere. Every input must go through without an exception and keep these invariants: one LogLine
per input line with its line number, no escape character or carriage return left in a line's text, every line in
at most one traceback, every parser returning a dict or None, and a phase from ``diagnose.model.PHASES``. A crash
found here is turned into a test in tests/test_normalize_*.py.
"""

from __future__ import annotations

import os
import random
import sys

if __name__ == "__main__":  # run as a script from a checkout: import the checkout's package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from diagnose.model import PHASES  # noqa: E402
from diagnose.normalize.facts import PARSERS  # noqa: E402
from diagnose.normalize.lines import decode, normalize_line  # noqa: E402
from diagnose.normalize.phases import phase_of  # noqa: E402
from diagnose.normalize.tracebacks import rebuild, traceback_ending_at  # noqa: E402

# Seeds: the shapes real logs have, so mutations start close to interesting paths.
SEEDS = [
    b"[default0]:[rank0]: Traceback (most recent call last):\n[default0]:[rank0]:   File \"a.py\", line 1, in f\n"
    b"[default0]:[rank0]:     f()\n[default0]:[rank0]:     ^^^\n[default0]:[rank0]: ValueError: x\n",
    b"[rank3]:[E1129 15:25:31.123456789 ProcessGroupNCCL.cpp:683] [Rank 3] Watchdog caught collective operation "
    b"timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 "
    b"milliseconds before timing out.\n",
    b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 "
    b"GiB of which 6.75 MiB is free. Including non-PyTorch memory, this process has 79.14 GiB memory in use. Of the "
    b"allocated memory 78.03 GiB is allocated by PyTorch, and 580.96 MiB is reserved by PyTorch but unallocated.\n",
    b"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====\nx.py FAILED\n----\nFailures:\n"
    b"  <NO_OTHER_FAILURES>\n----\nRoot Cause (first observed failure):\n[0]:\n  time      : t\n  host      : h\n"
    b"  rank      : 1 (local_rank: 1)\n  exitcode  : -6 (pid: 9)  (SIGABRT)\n====\n",
    b"slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***\n"
    b"srun: error: n1: tasks 0-3: Killed\n 3: \x1b[31mred\x1b[0m\r50%\r100%\n",
    b"During handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n"
    b"terminate called after throwing an instance of 'c10::Error'\n  what():  boom\nException raised from f at "
    b"a.cpp:1 (most recent call first):\nframe #0: f() + 0x1\n",
    # a Python 3.11+ exception group: nested group, chained member, width cut, the group as a later context
    b"[rank1]:   + Exception Group Traceback (most recent call last):\n[rank1]:   |   File \"a.py\", line 1, in f\n"
    b"[rank1]:   | ExceptionGroup: g (3 sub-exceptions)\n[rank1]:   +-+---------------- 1 ----------------\n"
    b"[rank1]:     | Exception Group Traceback (most recent call last):\n[rank1]:     | ExceptionGroup: h (1 sub-exception)\n"
    b"[rank1]:     +-+---------------- 1 ----------------\n[rank1]:       | OSError: x\n"
    b"[rank1]:       +------------------------------------\n[rank1]:     +---------------- 2 ----------------\n"
    b"[rank1]:     | KeyError: 1\n[rank1]:     | \n[rank1]:     | The above exception was the direct cause of the "
    b"following exception:\n[rank1]:     | \n[rank1]:     | Traceback (most recent call last):\n"
    b"[rank1]:     |   File \"b.py\", line 2, in g\n[rank1]:     | torch.OutOfMemoryError: CUDA out of memory.\n"
    b"[rank1]:     +---------------- ... ----------------\n[rank1]:     | and 1 more exception\n"
    b"[rank1]:     +------------------------------------\n\nDuring handling of the above exception, another "
    b"exception occurred:\n\nTraceback (most recent call last):\nSystemError: y\n",
]
MAX_INPUT = 1 << 16


def check(data: bytes) -> None:
    """The fuzz target: raises AssertionError (or anything else) when an invariant breaks."""
    text = decode(data)
    assert "\x00" not in text
    raw_lines = text.split("\n")
    lines = [normalize_line(raw, "fuzz.log", i + 1) for i, raw in enumerate(raw_lines)]
    assert len(lines) == len(raw_lines)
    for i, line in enumerate(lines):
        assert line.lineno == i + 1
        assert "\x1b" not in line.text and "\r" not in line.text
    owners: set[int] = set()
    tracebacks = rebuild(lines)
    for tb in tracebacks:
        for ln in tb.lines:
            assert id(ln) not in owners
            owners.add(id(ln))
        if tb.exc_line is not None:
            assert any(ln is tb.exc_line for ln in tb.lines)
    index_of = {id(line): i for i, line in enumerate(lines)}
    first_of_exc = {id(tb.exc_line): index_of[id(tb.lines[0])] for tb in tracebacks if tb.exc_line is not None}
    markers = []
    for i, line in enumerate(lines[:200]):
        for name, parser in PARSERS.items():
            out = parser(line, lines[i + 1 : i + 6])
            assert out is None or isinstance(out, dict), name
        markers.append(("iteration", line))
        frames: list[str] = []
        start = first_of_exc.get(id(line))
        if start is not None:
            # A window that starts at the traceback's first line (any streams mixed in) finds the same traceback.
            tb = traceback_ending_at(lines[start : i + 1], i - start)
            assert tb is not None and tb.exc_line is line
            frames = [f.text for f in tb.frames]
        elif i % 16 == 0:
            tb = traceback_ending_at(lines[max(0, i - 60) : i + 1], min(i, 60))
            frames = [f.text for f in tb.frames] if tb is not None else []
        assert phase_of(line.lineno, line.path, markers, frames) in PHASES


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        choice = rng.random()
        pos = rng.randint(0, len(buf)) if buf else 0
        if choice < 0.3 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randint(0, 255)
        elif choice < 0.55:
            buf[pos:pos] = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 8)))
        elif choice < 0.75 and buf:
            del buf[pos : pos + rng.randint(1, 16)]
        else:
            other = rng.choice(SEEDS)
            start = rng.randint(0, len(other))
            buf[pos:pos] = other[start : start + rng.randint(1, 120)]
    return bytes(buf[:MAX_INPUT])


def _fallback(iterations: int, seed: int) -> int:
    rng = random.Random(seed)
    corpus = list(SEEDS)
    for n in range(iterations):
        data = _mutate(rng, rng.choice(corpus))
        try:
            check(data)
        except Exception:
            sys.stderr.write(f"crash at iteration {n}: {data!r}\n")
            raise
        if n % 50 == 0 and len(corpus) < 500:
            corpus.append(data)
    print(f"{iterations} inputs, no crash")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    if "--iterations" in argv:  # the random-mutation loop, with or without atheris installed
        return _fallback(int(argv[argv.index("--iterations") + 1]), seed=0)
    try:
        import atheris  # type: ignore[import-not-found]
    except ImportError:
        return _fallback(20000, seed=0)

    def target(data: bytes) -> None:
        check(data[:MAX_INPUT])

    atheris.instrument_all()  # coverage for everything loaded, the normalize and facts modules included
    atheris.Setup(argv, target)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
