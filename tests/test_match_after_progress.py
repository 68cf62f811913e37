"""A line that means one thing at start-up and another after the job trained ([rule.context] after_progress).

NCCL's "remote process exited or there was a network error" on the first collectives is most often a set-up mistake
(NC013, nccl_error); the same words after hours of training, with no error before them, are a link or node that
failed mid-run (HW131, hardware). The phase markers of any trainer say which, not a list of one framework's words."""

from __future__ import annotations

from conftest import analyzed_root, make_catalogue, make_rule

from diagnose.match import match_text
from diagnose.normalize.lines import normalize_line

REMOTE = ("2024-01-11 05:43:11.726254: E external/xla/xla/service/gpu/nccl_utils.cc:211] Aborting communicator: "
          "0x7f3e427e55b0 due to async NCCL error: remote process exited or there was a network error")
GLOG_STEP = "I0111 05:39:40.118823 139877214582592 train.py:412] step {n} | loss 1.83 | 1.44 s/step"


def test_remote_error_at_start_up_stays_an_nccl_error(tmp_path):
    root = analyzed_root(tmp_path, "I0111 05:30:00.000001 139877214582592 train.py:96] JAX version 0.4.23\n" + REMOTE + "\n")
    assert (root.rule, root.category) == ("NC013", "nccl_error")


def test_remote_error_after_training_steps_is_a_failed_link(tmp_path):
    steps = "\n".join(GLOG_STEP.format(n=n) for n in (1000, 2000, 3000))
    root = analyzed_root(tmp_path, steps + "\n" + REMOTE + "\nslurmstepd: error: *** JOB 5512089 ON n1 CANCELLED AT 2024-01-11T12:02:33 ***\n")
    assert (root.rule, root.category, root.phase) == ("HW131", "hardware", "training")


def test_an_earlier_ib_completion_error_still_explains_the_remote_error(tmp_path):
    """HW131 reads hardware into an NCCL message because of when it came: it is no device report, so it does not
    jump ahead of the NCCL error printed before it (RoCE misconfiguration, nccl_error)."""
    ib = ("roce-a07:71830:72047 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.12.40.8<60217>"
          " with error 12, opcode 0, len 0, vendor err 129 (Send) localGid ::ffff:10.12.41.7 remoteGid ::ffff:10.12.41.8")
    torch_remote = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                    "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.21.5")
    root = analyzed_root(tmp_path, "epoch 0 step 300 loss 5.4410 lr 3.00e-04\n" + ib + "\n" + torch_remote + "\n")
    assert (root.rule, root.category) == ("NC011", "nccl_error")


def test_after_progress_context_is_a_phase_condition_for_any_rule():
    catalogue = make_catalogue(
        make_rule("ZZ910", "link lost", r"link lost", category="nccl_error"),
        make_rule("ZZ911", "link lost", r"link lost", category="hardware", context={"after_progress": True},
                  phase="auto"),
    )
    before = match_text("start\nlink lost\n", catalogue)
    after = match_text("iteration       10/     100 | consumed samples: 40 | lm loss: 2.1E+00 |\nlink lost\n", catalogue)
    assert [f.rule for f in before.findings] == ["ZZ910"]
    assert [f.rule for f in after.findings] == ["ZZ911"]


def test_glog_prefix_with_a_python_thread_id_is_peeled():
    """absl's Python logger prints the thread id (15 digits and more): the prefix is a glog one all the same."""
    line = normalize_line(GLOG_STEP.format(n=1285000), "job.log", 1)
    assert line.text.startswith("step 1285000 | loss")
    assert line.level == "I"
