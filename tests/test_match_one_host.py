"""NCCL errors of a node's own that only one host raises, while other hosts report the consequence: that host.

Synthetic multi-node output with pdsh-style ``host: `` prefixes and Ray's ``(Actor pid=N)`` prefixes, in torch's and
NCCL's message formats; hosts, ranks and paths invented.
"""

from __future__ import annotations

import pytest
from conftest import make_catalogue, make_rule, root_finding

from diagnose.match.rules import parse_rule

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


# The rules, not one_host.py, say which wording is a node's own failure and which reports another's.
_OWN = "gn-201: [rank0]: RuntimeError: widget failed here"
_PEER = "gn-202: [rank4]: RuntimeError: widget peer vanished"


def _rules(own_fault_on: str = "own_node", peer_fault_on: str = "other_node"):
    generic = make_rule("PY9", "Error: ", r"\w+Error: .*", category="other", confidence=0.3)
    own = make_rule("NC8", "widget failed", r"widget failed", category="nccl_error", fault_on=own_fault_on)
    peer = make_rule("NC9", "peer vanished", r"peer vanished", category="nccl_error", role="cascade",
                     fault_on=peer_fault_on)
    return make_catalogue(generic, own, peer)


def test_the_rule_attribute_decides_not_the_words():
    assert root_finding(_rules(), [_OWN, _PEER]).category == "hardware"
    # the same lines, rules that tell nothing (or the other way round): no reading
    assert root_finding(_rules(own_fault_on=""), [_OWN, _PEER]).category == "nccl_error"
    assert root_finding(_rules(peer_fault_on=""), [_OWN, _PEER]).category == "nccl_error"
    assert root_finding(_rules(own_fault_on="other_node"), [_OWN, _PEER]).category == "nccl_error"


def test_a_pattern_says_it_for_its_wording_over_the_rule():
    raw = {"code": "NC7", "slug": "nc7", "title": "t", "category": "nccl_error", "phase": "auto",
           "explanation": "x", "patterns": [
               {"anchor": "Test NCCL failure", "regex": r"Test NCCL failure '(?P<m>widget failed)",
                "fault_on": "own_node"},
               {"anchor": "Test NCCL failure", "regex": r"Test NCCL failure '(?P<m>[^']*)"}],
           "fault_on": "other_node"}
    rule = parse_rule(raw, "test")
    assert [rule.fault_on_of(n) for n in (1, 2)] == ["own_node", "other_node"]
    lines = ["gn-201: Test NCCL failure 'widget failed'", "gn-202: Test NCCL failure 'anything else'"]
    assert root_finding(make_catalogue(rule), lines).category == "hardware"


def test_fault_on_is_one_of_its_values():
    with pytest.raises(ValueError, match="fault_on 'peer' is not one of own_node, other_node"):
        make_rule("NC6", "x y z", "x y z", fault_on="peer")
    with pytest.raises(ValueError, match="pattern 1: fault_on 'mine' is not one of own_node, other_node"):
        parse_rule({"code": "NC6", "slug": "s", "title": "t", "category": "nccl_error", "explanation": "x",
                    "patterns": [{"anchor": "xyz", "regex": "xyz", "fault_on": "mine"}]}, "test")


def test_the_catalogue_marks_the_nccl_wordings_it_teaches(builtin_catalogue):
    # NCCL's own error strings and a peer's exit, as the built-in rules read them
    own = [OWN.format(host="gn-201", r=0, what=w) for w in ("cuda", "system")]
    own += ["RuntimeError: NCCL error: internal error, NCCL version 2.18.1", "ncclSystemError: System call failed.",
            "gpu-c12: Test NCCL failure common.cu:959 'unhandled cuda error (run with NCCL_DEBUG=INFO for details)'"]
    peer = [REMOTE.format(host="gn-202", r=4),
            "gpu-c12: Test NCCL failure common.cu:1005 'remote process exited or there was a network error / '",
            "gn-116:8812:8960 [0] misc/socket.cc:50 NCCL WARN socketProgressOpt: Call to recv from 172.20.14.117<51870>"
            " failed : Connection reset by peer"]
    neither = ["torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
               "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3",
               "gpu-c12: Test NCCL failure common.cu:777 'invalid argument'"]
    for lines, want in ((own, "own_node"), (peer, "other_node"), (neither, "")):
        for line in lines:
            f = root_finding(builtin_catalogue, [line])
            assert f.fault_on == want, (line, f.rule, f.fault_on)
