"""NCCL errors of a node's own that only one host raises, while other hosts report the consequence: that host.

Synthetic multi-node output with pdsh-style ``host: `` prefixes and Ray's ``(Actor pid=N)`` prefixes, in torch's and
NCCL's message formats; hosts, ranks and paths invented.
"""

from __future__ import annotations

import pytest
from conftest import root_finding

OWN = ("{host}: [rank{r}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
       "NCCLUtils.hpp:317, unhandled {what} error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")
REMOTE = ("{host}: [rank{r}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
          "NCCLUtils.hpp:317, remote process exited or there was a network error, NCCL version 2.21.5")


@pytest.mark.parametrize("what", ["cuda", "system"])
def test_own_error_on_one_host_consequence_elsewhere_is_that_host(builtin_catalogue, what):
    lines = [OWN.format(host="gn-201", r=r, what=what) for r in (0, 1)]
    lines += [REMOTE.format(host="gn-202", r=r) for r in (4, 5)]
    f = root_finding(builtin_catalogue, lines)
    assert f.category == "hardware"
    assert f.basis == "inferred" and "gn-201" in f.basis_detail
    assert any("--exclude=gn-201" in s for s in f.fix.steps)


def test_own_errors_on_every_host_are_a_job_wide_problem(builtin_catalogue):
    lines = [OWN.format(host=h, r=r, what="system") for h, r in (("gn-201", 0), ("gn-202", 4))]
    lines += [REMOTE.format(host="gn-203", r=8)]
    assert root_finding(builtin_catalogue, lines).category == "nccl_error"


def test_one_host_alone_says_nothing(builtin_catalogue):
    # a log of one node: no other host told what happened to it
    lines = [OWN.format(host="gn-201", r=r, what="cuda") for r in (0, 1)]
    lines += [REMOTE.format(host="gn-201", r=2)]
    assert root_finding(builtin_catalogue, lines).category == "nccl_error"


def test_ray_actor_names_are_not_hosts(builtin_catalogue):
    lines = [
        "(WorkerDict pid=16502) RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        "(Runner pid=16018) torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:317, remote process exited or there was a network error, NCCL version 2.21.5",
    ]
    assert root_finding(builtin_catalogue, lines).category == "nccl_error"


def test_a_specific_cause_is_kept(builtin_catalogue):
    # NCCL said why (its shared memory segment could not grow): that explanation stands, wherever it happened
    lines = [
        "gn-201: gn-201:811:902 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-Xa1 to "
        "9637892 bytes",
        REMOTE.format(host="gn-202", r=4),
    ]
    f = root_finding(builtin_catalogue, lines)
    assert f.category == "nccl_error" and f.basis != "inferred"
