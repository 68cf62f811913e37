"""The runner every fuzz target in this folder shares: coverage-guided with atheris when it is installed, else a
seeded random-mutation loop, both bounded by a time budget.

A target is a ``check(data: bytes) -> None`` that raises when an invariant breaks. In a long run a crash does not
stop the run: the input and its traceback are saved once per distinct crash (exception type and the innermost frame)
under ``--crash-dir``, so 30 minutes find every crash, not only the first. ``stats.json`` there is rewritten every
few seconds with the inputs tried, the elapsed time and the crashes (libFuzzer ends the process with ``exit()``, so
the file is written while running, not at the end)::

    python3 tests/fuzz/fuzz_ingest.py --seconds 1800 --crash-dir /tmp/fuzz-ingest
    python3 tests/fuzz/fuzz_ingest.py --seconds 60 --no-atheris     # the plain loop, no coverage guidance

Targets read their choices (sub-command, file name, option values) from the input's first bytes through
:class:`Choices`, so both engines mutate choices and content alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MAX_LEN = 1 << 14


class Choices:
    """Decisions taken from the front of a fuzz input; what is left is the payload. Never raises: an input too
    short for a decision gives 0 / the empty string."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def byte(self) -> int:
        if self._pos >= len(self._data):
            return 0
        self._pos += 1
        return self._data[self._pos - 1]

    def pick(self, options: Sequence):
        return options[self.byte() % len(options)]

    def flag(self) -> bool:
        return self.byte() & 1 == 1

    def text(self, max_len: int = 64) -> str:
        """A short string: a length byte, then that many bytes decoded as UTF-8 (surrogate escapes kept)."""
        n = min(self.byte(), max_len)
        chunk = self._data[self._pos : self._pos + n]
        self._pos += len(chunk)
        return chunk.decode("utf-8", "surrogateescape")

    def rest(self) -> bytes:
        out = self._data[self._pos :]
        self._pos = len(self._data)
        return out


def encode(*parts: int | str | bytes) -> bytes:
    """The inverse of Choices for seeds: ints are one byte, strings a length byte and their UTF-8, bytes as is."""
    out = bytearray()
    for part in parts:
        if isinstance(part, int):
            out.append(part & 0xFF)
        elif isinstance(part, str):
            raw = part.encode("utf-8", "surrogateescape")
            out.append(len(raw))
            out += raw
        else:
            out += part
    return bytes(out)


@dataclass
class Stats:
    target: str
    engine: str
    started: float = field(default_factory=time.time)
    iterations: int = 0
    crashes: dict[str, str] = field(default_factory=dict)  # signature -> saved input
    _written: float = 0.0

    def save(self, crash_dir: str, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._written < 5:
            return
        self._written = now
        record = {"target": self.target, "engine": self.engine, "iterations": self.iterations,
                  "wall_s": round(now - self.started, 1), "crashes": self.crashes}
        tmp = os.path.join(crash_dir, "stats.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(record, fh, indent=1)
        os.replace(tmp, os.path.join(crash_dir, "stats.json"))


def signature(exc: BaseException) -> str:
    """Exception type and innermost line; for an assertion also the head of its message (up to the first ':' or
    ';'), so that two different invariants broken at one ``assert`` (an internal TypeError, then a KeyError) are
    two crashes, not one."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"
    head = ""
    if isinstance(exc, AssertionError):
        head = " " + re.split(r"[;:]", str(exc), maxsplit=1)[0][:48]
    return f"{type(exc).__name__}@{where}{head}"


def guarded(check: Callable[[bytes], None], stats: Stats, crash_dir: str) -> Callable[[bytes], None]:
    def one(data: bytes) -> None:
        stats.iterations += 1
        try:
            check(data)
        except Exception as e:  # noqa: BLE001 - every exception is a finding, saved and counted
            sig = signature(e)
            if sig not in stats.crashes:
                name = f"crash-{hashlib.sha1(data).hexdigest()[:12]}"
                with open(os.path.join(crash_dir, name), "wb") as fh:
                    fh.write(data)
                with open(os.path.join(crash_dir, name + ".txt"), "w") as fh:
                    fh.write(f"{sig}\n{data!r}\n\n{''.join(traceback.format_exception(e))}")
                stats.crashes[sig] = name
                sys.stderr.write(f"[{stats.target}] new crash {sig}: {name}\n")
                stats.save(crash_dir, force=True)
        stats.save(crash_dir)

    return one


def mutate(rng: random.Random, data: bytes, seeds: Sequence[bytes], max_len: int = MAX_LEN) -> bytes:
    """Flip, insert, delete and splice bytes (splices from the seeds keep mutations close to real shapes)."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        choice = rng.random()
        pos = rng.randint(0, len(buf)) if buf else 0
        if choice < 0.25 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randint(0, 255)
        elif choice < 0.45:
            buf[pos:pos] = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 8)))
        elif choice < 0.55:
            buf[pos:pos] = rng.choice([b"\x1b[31m", b"[bold]", b"[/]", b"[@click=app.quit]", b"\r", b"\x00",
                                       b"\xff\xfe", "\u202e".encode(), b"\n", b"%s"])
        elif choice < 0.7 and buf:
            del buf[pos : pos + rng.randint(1, 16)]
        else:
            other = rng.choice(seeds)
            start = rng.randint(0, len(other))
            buf[pos:pos] = other[start : start + rng.randint(1, 200)]
    return bytes(buf[:max_len])


def mutation_loop(one: Callable[[bytes], None], seeds: Sequence[bytes], seconds: float, seed: int,
                  max_iterations: int | None = None, max_len: int = MAX_LEN) -> None:
    rng = random.Random(seed)
    corpus = list(seeds)
    deadline = time.monotonic() + seconds
    n = 0
    for s in seeds:
        one(s)
    while time.monotonic() < deadline and (max_iterations is None or n < max_iterations):
        one(mutate(rng, rng.choice(corpus), seeds, max_len))
        n += 1


def smoke(check: Callable[[bytes], None], seeds: Sequence[bytes], iterations: int, seed: int = 1,
          max_len: int = MAX_LEN) -> None:
    """The test suite's short run: every seed, then ``iterations`` mutants; the first failure is raised."""
    rng = random.Random(seed)
    for s in seeds:
        check(s)
    for _ in range(iterations):
        data = mutate(rng, rng.choice(seeds), seeds, max_len)
        try:
            check(data)
        except Exception as e:
            raise AssertionError(f"fuzz input {data!r} broke the target: {type(e).__name__}: {e}") from e


def instrument_project(atheris) -> int:
    """Coverage instrumentation for the project's own code only (``diagnose.*``, loaded so far): instrumenting every
    loaded module (``atheris.instrument_all``) made the CLI and Pilot targets run at a few inputs a minute."""
    import inspect

    count = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "diagnose" or name.startswith("diagnose.")):
            continue
        for obj in list(vars(module).values()):
            functions = []
            if inspect.isfunction(obj) and obj.__module__ == name:
                functions.append(obj)
            elif inspect.isclass(obj) and obj.__module__ == name:
                for attr in list(vars(obj).values()):
                    attr = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
                    attr = attr.fget if isinstance(attr, property) else attr
                    if inspect.isfunction(attr):
                        functions.append(attr)
            for fn in functions:
                try:
                    atheris.instrument_func(fn)
                    count += 1
                except Exception:  # noqa: BLE001,S112 - a function atheris cannot patch stays uninstrumented
                    continue
    return count


def main(name: str, check: Callable[[bytes], None], seeds: Sequence[bytes], argv: list[str] | None = None,
         max_len: int = MAX_LEN) -> int:
    parser = argparse.ArgumentParser(prog=f"fuzz_{name}.py", description=f"fuzz the {name} target")
    parser.add_argument("--seconds", type=float, default=60.0, help="time budget (default 60)")
    parser.add_argument("--crash-dir", default=None, help="where crashes and stats.json go (default: a temp dir)")
    parser.add_argument("--no-atheris", action="store_true", help="plain mutation loop even if atheris is installed")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the plain loop")
    parser.add_argument("--max-len", type=int, default=max_len, help="longest input, bytes")
    args = parser.parse_args(argv)
    crash_dir = args.crash_dir or tempfile.mkdtemp(prefix=f"fuzz-{name}-")
    os.makedirs(crash_dir, exist_ok=True)
    try:
        import atheris
    except ImportError:
        atheris = None
    engine = "atheris" if atheris is not None and not args.no_atheris else "mutation"
    stats = Stats(target=name, engine=engine)
    one = guarded(check, stats, crash_dir)
    print(f"[{name}] engine {engine}, {args.seconds:.0f} s, crashes and stats.json in {crash_dir}", flush=True)
    if engine == "atheris":
        corpus = os.path.join(crash_dir, "corpus")
        os.makedirs(corpus, exist_ok=True)
        for i, s in enumerate(seeds):
            with open(os.path.join(corpus, f"seed-{i:03d}"), "wb") as fh:
                fh.write(s)
        for s in seeds:  # load the modules each path imports lazily, so that they are instrumented too
            one(s)
        instrument_project(atheris)
        atheris.Setup([sys.argv[0], f"-max_total_time={int(args.seconds)}", f"-max_len={args.max_len}",
                       "-timeout=120", "-rss_limit_mb=3072",
                       f"-artifact_prefix={os.path.join(crash_dir, '')}", corpus], one)
        atheris.Fuzz()  # exits the process at the time limit; stats.json is current to within 5 s
        return 0
    mutation_loop(one, seeds, args.seconds, args.seed, max_len=args.max_len)
    stats.save(crash_dir, force=True)
    print(f"[{name}] {stats.iterations} inputs in {time.time() - stats.started:.0f} s, "
          f"{len(stats.crashes)} distinct crashes", flush=True)
    return 1 if stats.crashes else 0
