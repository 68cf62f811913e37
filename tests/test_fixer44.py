"""fixer44: bounded per-thread Hyperscan scratches; checkpoint-rotation and Caffe/CNTK phases."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

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


# --------------------------------------------------------------------- Caffe and CNTK phase markers

_GLOG = "I0420 17:{m:02d}:00.000000 46833 {src}] {text}\n"


def _caffe(*lines: tuple[str, str]) -> str:
    return "".join(_GLOG.format(m=i, src=src, text=text) for i, (src, text) in enumerate(lines))


_CAFFE_SETUP = (
    ("solver.cpp:48", "Initializing solver from parameters: "),
    ("net.cpp:58", "Initializing net from parameters: "),
    ("net.cpp:100", "Creating Layer conv1"),
)
_CAFFE_SOLVE = (
    ("net.cpp:311", "Network initialization done."),
    ("solver.cpp:363", "Solving LeNet"),
    ("solver.cpp:364", "Learning Rate Policy: step"),
)
_CAFFE_OOM = "F0420 17:59:00.000000 46833 syncedmem.cpp:51] Check failed: error == cudaSuccess (2 vs. 0)  out of memory\n"


@pytest.mark.parametrize(("body", "phase"), [
    (_caffe(*_CAFFE_SETUP), "model_build"),
    (_caffe(*_CAFFE_SETUP, *_CAFFE_SOLVE), "first_iteration"),
    (_caffe(*_CAFFE_SETUP, *_CAFFE_SOLVE, ("solver.cpp:428", "Iteration 0, Testing net (#0)")), "eval"),
    (_caffe(*_CAFFE_SETUP, *_CAFFE_SOLVE, ("solver.cpp:428", "Iteration 0, Testing net (#0)"),
            ("solver.cpp:485", "    Test net output #0: accuracy = 0.0035")), "first_iteration"),
    (_caffe(*_CAFFE_SETUP, *_CAFFE_SOLVE, ("solver.cpp:218", "Iteration 100, loss = 0.25"),
            ("solver.cpp:428", "Iteration 500, Testing net (#0)"),
            ("solver.cpp:485", "    Test net output #0: accuracy = 0.91")), "training"),
    (_caffe(*_CAFFE_SETUP, *_CAFFE_SOLVE, ("solver.cpp:239", "Iteration 100 (12.4 iter/s, 8.06s/100 iters), loss = 0.2")),
     "training"),
    (_caffe(*_CAFFE_SETUP, *_CAFFE_SOLVE, ("solver.cpp:218", "Iteration 4900, loss = 0.01"),
            ("solver.cpp:454", "Snapshotting to binary proto file lenet_iter_5000.caffemodel")), "checkpoint_save"),
    (_caffe(*_CAFFE_SETUP, ("parallel.cpp:72", "Starting NCCL initialization on rank 0 of 2")), "init"),
])
def test_caffe_glog_markers_read_the_phase(tmp_path, body, phase):
    assert _analyze_text(tmp_path, body + _CAFFE_OOM).phase == phase


def test_conda_solving_is_not_caffe_solving(tmp_path):
    text = _caffe(*_CAFFE_SETUP) + "Solving environment: done\nSolving environment\n" + _CAFFE_OOM
    assert _analyze_text(tmp_path, text).phase == "model_build"


_CNTK_OOM = ("CUDA failure 2: out of memory ; GPU=0 ; hostname=h ; expr=cudaMalloc((void**) &deviceBufferPtr, "
             "sizeof(AllocatedElemType) * numElements)\n")


@pytest.mark.parametrize(("body", "phase"), [
    ("05/11/2016 14:02:07: Starting Epoch 1: learning rate per sample = 0.020000  effective momentum = 0.9\n"
     "Starting minibatch loop.\n", "first_iteration"),
    ("05/11/2016 14:02:07: Starting Epoch 1: learning rate per sample = 0.020000  effective momentum = 0.9\n"
     "05/11/2016 14:02:08:  Epoch[ 1 of 130]-Minibatch[   1-  10]: CrossEntropyWithSoftmax = 6.9 * 2500\n",
     "training"),
    ("05/11/2016 14:02:10: Finished Epoch[  1 of 130]: [Training] CrossEntropyWithSoftmax = 6.57 * 52000\n"
     "05/11/2016 14:02:10: SGD: Saving checkpoint model '/m/simple.dnn.1'\n", "checkpoint_save"),
    ("05/11/2016 14:02:10: Finished Epoch[  1 of 130]: [Training] CrossEntropyWithSoftmax = 6.57 * 52000\n"
     "05/11/2016 14:02:10: SGD: Saving checkpoint model '/m/simple.dnn.1'\n"
     "05/11/2016 14:02:14: Starting Epoch 2: learning rate per sample = 0.020000  effective momentum = 0.9\n",
     "training"),
    ("05/11/2016 14:24:53: SGD: Saving checkpoint model '/m/simple.dnn'\n"
     '05/11/2016 14:24:53: # Action "test"                    #\n', "eval"),
])
def test_cntk_markers_read_the_phase(tmp_path, body, phase):
    assert _analyze_text(tmp_path, body + _CNTK_OOM).phase == phase


@pytest.mark.parametrize(("case", "phase"), [
    ("df-caffe-tsn-bn-inception-rgb-batch-syncedmem-cuda-oom", "first_iteration"),
    ("df-digits-nvcaffe-alexnet-256px-940mx-1gb-out-of-memory-alloc", "model_build"),
    ("bx-nvcaffe-2gpu-nccl-init-unhandled-cuda-error-libnccl-cuda-mismatch", "init"),
    ("df-cntk-simple2d-130-epochs-test-action-no-minibatchsize-cuda-oom", "eval"),
    ("df-dsod300-pascal-script-lmdb-paths-not-replaced-mdb-status", "init"),  # DA261: init, not the net marker's
])
def test_dev_caffe_and_cntk_cases(case, phase):
    from diagnose.pipeline import AnalyzeOptions, analyze

    report = analyze([str(Path(__file__).resolve().parents[1] / "corpus" / "dev" / f"{case}.log")],
                     AnalyzeOptions(replay=False))
    assert report.root is not None and report.root.phase == phase
