"""A wrapper that names no category, read with the rest of its own message (ranking._wrapper_detail).

Ray's ActorDiedError (EC141, category other) says only that a remote worker died; the same exception message goes on
with the dead actor's fields and how its worker died ("Worker exit type: SYSTEM_ERROR ... connection error code 2",
OOM026, host_oom). With nothing else in the log, that detail is the root cause, not the wrapper; another process's
line is never taken for it."""

from __future__ import annotations

from conftest import analyzed_root

HEAD = ("Traceback (most recent call last):\n"
        '  File "/opt/verl/verl/trainer/main_ppo.py", line 64, in run_ppo\n'
        "    ray.get(runner.run.remote(config))\n"
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
        "\tclass_name: TaskRunner\n"
        "\tactor_id: 1c3e5a7b9d2f4a6c8e0b1d3f02000000\n"
        "\tpid: 51877\n"
        "\tnamespace: 9a1c3e5b-7d2f-4a6c-8e0b-2d4f6a8c1e3b\n"
        "\tip: 192.168.31.20\n")
DETAIL = ("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
          "Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root causes. "
          "(1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is called. "
          "(3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.\n")


def test_the_wrappers_own_death_detail_leads_it(tmp_path):
    root = analyzed_root(tmp_path, "step:10 - actor/entropy:0.570\n" + HEAD + DETAIL)
    assert (root.rule, root.category) == ("OOM026", "host_oom")


def test_a_wrapper_without_a_detail_stays_the_root(tmp_path):
    root = analyzed_root(tmp_path, "step:10 - actor/entropy:0.570\n" + HEAD)
    assert root.rule == "EC141"


def test_a_detail_far_after_the_wrapper_is_not_its_own(tmp_path):
    filler = "".join(f"(TaskRunner pid=51877) validation batch {n}\n" for n in range(20))
    root = analyzed_root(tmp_path, "step:10 - actor/entropy:0.570\n" + HEAD + filler + DETAIL)
    assert root.rule == "EC141"
