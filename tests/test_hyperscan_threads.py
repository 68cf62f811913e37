"""Hyperscan scans from several threads at once (the TUI's analysis, Slurm-diagnosis and follow workers overlap):
each thread scans with a scratch of its own. A database's one scratch, shared, failed a CI run's TUI Slurm test
with ScratchInUseError (HS_SCRATCH_IN_USE, error -10)."""

from __future__ import annotations

import threading

import pytest


def test_two_threads_scan_one_database_at_once() -> None:
    pytest.importorskip("hyperscan")
    from diagnose.match.anchors import _HyperscanPresence

    presence = _HyperscanPresence([b"CUDA out of memory", b"NCCL WARN", b"Traceback"])
    window = (b"x" * 200 + b"\n") * 20_000 + b"NCCL WARN net\nTraceback (most recent call last):\n"
    errors: list[BaseException] = []
    answers: list[list[int]] = []
    start = threading.Barrier(4)

    def scan() -> None:
        start.wait()
        try:
            answers.extend(presence.present(window) for _ in range(20))
        except BaseException as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    threads = [threading.Thread(target=scan) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert answers == [[1, 2]] * 80
