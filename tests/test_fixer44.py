"""fixer44: bounded per-thread Hyperscan scratches; checkpoint-rotation and Caffe/CNTK phases."""

from __future__ import annotations

import sys
import threading

import pytest

from diagnose.match import anchors


def _db(word: bytes):
    hs = pytest.importorskip("hyperscan")
    db = hs.Database(mode=hs.HS_MODE_BLOCK)
    db.compile(expressions=[word], ids=[0], elements=1, flags=[0])
    return db


def _in_thread(fn):
    out: list = []
    err: list = []

    def body():
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            err.append(e)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def test_thread_scratch_keeps_a_bounded_number_of_databases_alive():
    first = _db(b"first")

    def scan_many():
        base = sys.getrefcount(first)
        first.scan(b"the first line", match_event_handler=lambda *a: None, scratch=anchors.thread_scratch(first))
        held_first = sys.getrefcount(first)
        for i in range(anchors.SCRATCH_KEEP * 2):
            db = _db(b"word%d" % i)
            db.scan(b"no word here", match_event_handler=lambda *a: None, scratch=anchors.thread_scratch(db))
            del db
        return base, held_first, sys.getrefcount(first), len(anchors._PER_THREAD.scratch)

    base, held_first, after, kept = _in_thread(scan_many)
    assert held_first > base  # held while it is among the recent ones
    assert after == base  # then let go: the thread no longer keeps the evicted database alive
    assert kept == anchors.SCRATCH_KEEP


def test_thread_scratch_is_reused_for_the_same_database():
    db = _db(b"same")
    first, second = _in_thread(lambda: (anchors.thread_scratch(db), anchors.thread_scratch(db)))
    assert first is second


def test_thread_scratch_never_serves_another_database_under_a_recycled_id():
    db, other = _db(b"mine"), _db(b"other")

    def stale():
        foreign = anchors.thread_scratch(other)
        held = anchors._PER_THREAD.scratch
        held[id(db)] = (other, foreign)  # as if ``other`` had lived at db's address
        return foreign, anchors.thread_scratch(db)

    foreign, mine = _in_thread(stale)
    assert mine is not foreign
    found: list[int] = []
    db.scan(b"this is mine", match_event_handler=lambda i, *_: found.append(i), scratch=mine)
    assert found == [0]
