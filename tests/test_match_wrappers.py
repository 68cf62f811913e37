"""Wrappers and launch summaries are consequences: the worker's own error, when the log holds it, is the root cause.

An actor or worker-pool framework's driver (Ray's ActorDiedError, Monarch's ActorError, BrokenProcessPool, mp.spawn's
ProcessRaisedException) reports that a remote call failed; the worker's traceback or NCCL error printed before it is
what failed (EC141, a cascade). A rendezvous that only some processes joined, after Lightning warned that the Slurm
job did not start them with srun, is the launch's failure (SL201), not the store's (LA012).
"""

from __future__ import annotations

from diagnose.match import load_catalogue, match_text

CATALOGUE = load_catalogue()

_RAY_WORKER_NCCL = """\
(TrainActor pid=4101) [rank0]: Traceback (most recent call last):
(TrainActor pid=4101) [rank0]:   File "/opt/app/train.py", line 88, in step
(TrainActor pid=4101) [rank0]:     dist.all_reduce(t)
(TrainActor pid=4101) [rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2
"""
_RAY_DRIVER = """\
Traceback (most recent call last):
  File "/opt/app/driver.py", line 40, in main
    ray.get(refs)
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
"""
_MONARCH = """\
[0] [titan] 2026-01-21 09:21:58,614 - root - INFO - Saving the checkpoint.
Traceback (most recent call last):
  File "/opt/app/main.py", line 318, in train
    self.checkpointer.save(
KeyError: 397
[2026-01-21 09:22:03,877] ERROR Trainer actor failed; stopping the host mesh
monarch._src.actor.actor_mesh.ActorError: A remote actor call has failed.
"""


def _rules(report):
    return {f.rule: f for f in report.findings}


def test_the_workers_nccl_error_leads_the_drivers_actor_died_error():
    report = match_text(_RAY_WORKER_NCCL + _RAY_DRIVER, CATALOGUE)
    assert report.root is not None and report.root.category == "nccl_error"
    assert _rules(report)["EC141"].role == "cascade"


def test_an_actor_died_error_alone_still_speaks_with_lower_confidence():
    report = match_text(_RAY_DRIVER, CATALOGUE)
    assert report.root is not None and report.root.rule == "EC141"
    assert report.root.confidence <= 0.6  # a cascade chosen only because nothing else failed


def test_the_workers_exception_leads_monarchs_actor_error_printed_after_it():
    report = match_text(_MONARCH, CATALOGUE)
    assert report.root is not None and report.root.rule == "PY001"
    assert report.root.evidence[0].text == "KeyError: 397"
    assert _rules(report)["EC141"].role == "cascade"


def test_other_pool_wrappers_are_cascades_too():
    for line in (
        "concurrent.futures.process.BrokenProcessPool: A process in the process pool was terminated abruptly while the future was running or pending.",
        "torch.multiprocessing.spawn.ProcessRaisedException: ",
    ):
        text = "ValueError: bad shard 3\n" + line + "\n"
        report = match_text(text, CATALOGUE)
        assert report.root is not None and report.root.rule == "PY001", line
        assert _rules(report)["EC141"].role == "cascade", line


_LIGHTNING_NO_SRUN = (
    "/env/lib/python3.11/site-packages/lightning/fabric/plugins/environments/slurm.py:204: The `srun` command is "
    "available on your system but is not used. HINT: If your intention is to run Lightning on SLURM, prepend your "
    "python command with `srun` like so: srun python train.py ...\n"
)
_STORE_TIMEOUT = (
    "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/16\n"
    "torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 8/16 clients joined.\n"
)


def test_half_the_clients_after_lightnings_no_srun_warning_is_the_slurm_launch():
    report = match_text(_LIGHTNING_NO_SRUN + _STORE_TIMEOUT, CATALOGUE)
    assert report.root is not None and report.root.rule == "SL201" and report.root.category == "slurm"


def test_the_same_timeout_without_the_warning_stays_the_launchers():
    report = match_text(_STORE_TIMEOUT, CATALOGUE)
    assert report.root is not None and report.root.rule == "LA012" and report.root.category == "launcher"
