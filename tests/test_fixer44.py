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


# --------------------------------------------------------------------- HF Trainer checkpoint rotation: phase

_HF = '  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line {n}, in {fn}\n    pass\n'
_HF_HEAD = (
    "{'loss': 1.2345, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
    "{'loss': 1.1345, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 1.0}\n"
    "Traceback (most recent call last):\n"
    '  File "/work/train.py", line 120, in <module>\n    trainer.train()\n'
)


def _analyze_text(tmp_path, text: str):
    from diagnose.pipeline import AnalyzeOptions, analyze

    log = tmp_path / "job.log"
    log.write_text(text)
    report = analyze([str(log)], AnalyzeOptions(replay=False))
    assert report.root is not None
    return report.root


def test_hf_sorted_checkpoints_at_the_end_of_train_reads_checkpoint_save(tmp_path):
    """train() with save_total_limit=1 lists the checkpoints (_sorted_checkpoints) to delete all but the best: a
    failure there is checkpoint housekeeping, not a training step."""
    text = _HF_HEAD + "".join(_HF.format(n=n, fn=fn) for n, fn in (
        (1885, "train"), (2410, "_inner_training_loop"), (3507, "_sorted_checkpoints"),
    )) + "ValueError: '/shared/out/checkpoint-500' is not in list\n"
    assert _analyze_text(tmp_path, text).phase == "checkpoint_save"


def test_hf_rotate_checkpoints_deleting_a_folder_reads_checkpoint_save(tmp_path):
    """_rotate_checkpoints removing an old checkpoint folder that another node already removed (shutil.rmtree)."""
    text = _HF_HEAD + "".join(_HF.format(n=n, fn=fn) for n, fn in (
        (1885, "train"), (2291, "_inner_training_loop"), (2732, "_maybe_log_save_evaluate"),
        (3540, "_rotate_checkpoints"),
    )) + ('  File "/usr/lib/python3.10/shutil.py", line 725, in rmtree\n    pass\n'
          "FileNotFoundError: [Errno 2] No such file or directory: '/shared/out/checkpoint-400'\n")
    assert _analyze_text(tmp_path, text).phase == "checkpoint_save"


def test_a_training_step_under_the_same_loop_still_reads_training():
    from diagnose.normalize.phases import phase_from_frames

    frames = [_HF.format(n=n, fn=fn).splitlines()[0] for n, fn in (
        (1885, "train"), (2291, "_inner_training_loop"), (3000, "training_step"))]
    assert phase_from_frames(frames) == "training"
