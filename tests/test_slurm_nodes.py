"""What Slurm knows about a job's nodes (``scontrol show node``): the pure parser, the lookup through a fake runner
(hostlist expansion, unknown nodes, scontrol failing or hanging), the node findings and when a node that went bad is
the job's root cause, and hostile Reason text in the text report. The real cluster: test_slurm_nodes_cluster.py."""

from __future__ import annotations

import re

import pytest
from conftest import render_to_string
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.ingest.slurm.commands import CommandResult, SlurmUnavailable
from diagnose.ingest.slurm.nodes import MAX_NODES, lookup_nodes
from diagnose.ingest.slurm.parse import MAX_REASON_CHARS, parse_node_state, parse_scontrol_nodes
from diagnose.match import match_text
from diagnose.match.rules import load_catalogue
from diagnose.match.slurm_nodes import (
    RIGHT_AFTER_S,
    findings_of_scontrol_node,
    merge_node_findings,
    node_findings,
    node_timing,
)

ONE_LINE = (
    "NodeName=gpu-b012 Arch=x86_64 CoresPerSocket=56 CPUAlloc=0 CPUEfctv=224 CPUTot=224 CPULoad=3.10 "
    "AvailableFeatures=h200 ActiveFeatures=h200 Gres=gpu:h200:8 NodeAddr=gpu-b012 NodeHostName=gpu-b012 "
    "Version=23.11.4 OS=Linux 5.15.0-105-generic #115-Ubuntu SMP  RealMemory=2000000 AllocMem=0 FreeMem=1890000 "
    "Sockets=2 Boards=1 State=IDLE+DRAIN ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=batch  BootTime=2026-12-01T08:00:00 SlurmdStartTime=2026-12-01T08:01:00 "
    "LastBusyTime=2026-12-05T09:58:00 CfgTRES=cpu=224,mem=2000000M,billing=224,gres/gpu=8 AllocTRES= "
    "CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=NHC: check_nv_healthmon: GPU 6 has uncorrectable ECC errors [root@2026-12-05T10:01:02]"
)
MULTI_LINE = """\
NodeName=gpu-b013 Arch=x86_64 CoresPerSocket=56
   CPUAlloc=224 CPUEfctv=224 CPUTot=224 CPULoad=80.02
   Gres=gpu:h200:8
   NodeAddr=gpu-b013 NodeHostName=gpu-b013 Version=23.11.4
   RealMemory=2000000 AllocMem=1800000 FreeMem=100000 Sockets=2 Boards=1
   State=MIXED+DRAIN ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=batch
   BootTime=2026-12-01T08:00:00 SlurmdStartTime=2026-12-01T08:01:00
   Reason=Kill task failed [slurm@2026-12-05T10:20:00]
   Comment=rack 7

NodeName=gpu-b014 Arch=x86_64 CoresPerSocket=56
   State=ALLOCATED ThreadsPerCore=2
   Partitions=batch
"""
CATALOGUE = load_catalogue()
JOB_START, JOB_END = "2026-12-05T09:00:00", "2026-12-05T10:15:00"
NCCL_TIMEOUT = (
    "[rank3]:[E1205 10:14:02.123456789 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=4121, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran "
    "for 600042 milliseconds before timing out."
)
CUDA_OOM = (
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.11 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory in use. Of "
    "the allocated memory 75.20 GiB is allocated by PyTorch, and 1.31 GiB is reserved by PyTorch but unallocated."
)


def node_line(name: str, state: str, reason: str, stamp: str = "root@2026-12-05T10:01:02") -> str:
    return f"NodeName={name} Arch=x86_64 State={state} ThreadsPerCore=2 Partitions=batch Reason={reason} [{stamp}]"


# ---------------------------------------------------------------------------------------------- parser


def test_one_line_record():
    (rec,), missing = parse_scontrol_nodes(ONE_LINE)
    assert missing == []
    assert (rec.name, rec.state.base, rec.state.flags) == ("gpu-b012", "IDLE", {"DRAIN"})
    assert rec.reason == "NHC: check_nv_healthmon: GPU 6 has uncorrectable ECC errors"
    assert (rec.reason_user, rec.reason_time, rec.line) == ("root", "2026-12-05T10:01:02", 1)
    assert rec.fields["OS"] == "Linux 5.15.0-105-generic #115-Ubuntu SMP"  # values with spaces stay whole


def test_multi_line_records_and_a_field_after_the_reason():
    records, _ = parse_scontrol_nodes(MULTI_LINE)
    assert [r.name for r in records] == ["gpu-b013", "gpu-b014"]
    first, second = records
    assert (first.state.text, first.reason, first.reason_user, first.line) == (
        "MIXED+DRAIN", "Kill task failed", "slurm", 1)
    assert first.fields["Comment"] == "rack 7"
    assert (second.state.base, second.reason, second.reason_time, second.line) == ("ALLOCATED", "", "", 12)


def test_nodes_scontrol_does_not_know_are_listed_apart():
    text = node_line("gpu-b012", "IDLE", "x") + "\nNode gpu-b099 not found\n" + node_line("gpu-b013", "IDLE", "y")
    records, missing = parse_scontrol_nodes(text)
    assert [r.name for r in records] == ["gpu-b012", "gpu-b013"]
    assert missing == ["gpu-b099"]
    assert records[0].reason == "x"  # the "not found" line ends the record before it, it is not glued to it


@pytest.mark.parametrize(("text", "base", "flags"), [
    ("IDLE+DRAIN", "IDLE", {"DRAIN"}),
    ("DOWN*", "DOWN", {"NOT_RESPONDING"}),
    ("DOWN+NOT_RESPONDING", "DOWN", {"NOT_RESPONDING"}),
    ("MIXED+DRAIN+NOT_RESPONDING", "MIXED", {"DRAIN", "NOT_RESPONDING"}),
    ("draining", "ALLOCATED", {"DRAIN"}),
    ("drained*", "IDLE", {"DRAIN", "NOT_RESPONDING"}),
    ("IDLE+DRAIN+REBOOT_REQUESTED", "IDLE", {"DRAIN", "REBOOT_REQUESTED", "REBOOT"}),
    ("ALLOCATED+FAIL", "ALLOCATED", {"FAIL"}),
    ("", "", set()),
])
def test_state_flags(text, base, flags):
    state = parse_node_state(text)
    assert (state.base, set(state.flags)) == (base, flags)


def test_hostile_reason_keeps_the_fields_before_it_and_is_bounded():
    reason = 'State=IDLE NodeName=evil "q" <b>[bold red]x[/] \x1b]52;c;ZXZpbA==\x07 [x@2026-01-01T00:00:00] ' + "A" * 9000
    (rec,), _ = parse_scontrol_nodes(node_line("gpu-b012", "DOWN+DRAIN", reason))
    assert (rec.name, rec.state.text, rec.reason_user) == ("gpu-b012", "DOWN+DRAIN", "root")
    assert rec.reason.startswith("State=IDLE NodeName=evil") and len(rec.reason) == MAX_REASON_CHARS


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("NodeName=State=Reason=[]@T:-+* \n\t\x1bDRAIN0129")), max_size=300))
def test_any_text_parses_without_raising(text):
    records, missing = parse_scontrol_nodes(text)
    assert len(records) <= text.count("NodeName=")
    assert all(len(r.reason) <= MAX_REASON_CHARS and r.line >= 1 for r in records)
    findings_of_scontrol_node(text)  # the findings never raise either


def test_record_without_a_stamp_reads_the_reason_to_the_next_key():
    (rec,), _ = parse_scontrol_nodes("NodeName=n1 State=DOWN Reason=gone dark Comment=x")
    assert (rec.reason, rec.reason_time, rec.fields["Comment"]) == ("gone dark", "", "x")


# ---------------------------------------------------------------------------------------------- lookup


class FakeScontrol:
    """scontrol's answers by argv; records each call."""

    def __init__(self, nodes: str = "", hostnames: str | None = None, node_rc: int = 0, hang: bool = False):
        self.nodes, self.hostnames, self.node_rc, self.hang = nodes, hostnames, node_rc, hang
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> CommandResult:
        self.calls.append(argv)
        if self.hang:
            raise SlurmUnavailable("scontrol show node did not answer within 15 s (is slurmctld up?)")
        if argv[1:3] == ["show", "hostnames"]:
            if self.hostnames is None:
                return CommandResult(argv, 1, "", "scontrol: error: bad hostlist")
            return CommandResult(argv, 0, self.hostnames, "")
        return CommandResult(argv, self.node_rc, self.nodes, "")


def test_lookup_expands_the_hostlist_and_asks_once():
    fake = FakeScontrol(nodes=node_line("gpu-b012", "IDLE+DRAIN", "Kill task failed") + "\nNode gpu-b014 not found\n"
                        + node_line("gpu-b013", "MIXED", "x"), hostnames="gpu-b012\ngpu-b013\ngpu-b014\n")
    out = lookup_nodes("gpu-b[012-014]", fake)
    assert fake.calls == [["scontrol", "show", "hostnames", "gpu-b[012-014]"],
                          ["scontrol", "show", "node", "-o", "gpu-b012,gpu-b013,gpu-b014"]]
    assert [r.name for r in out.records] == ["gpu-b012", "gpu-b013"]
    assert (out.unknown, out.note) == (["gpu-b014"], "")


def test_lookup_falls_back_to_our_hostlist_parser_and_caps_the_names():
    fake = FakeScontrol(nodes="")
    out = lookup_nodes("rack[1-2]-n[01-02],login", fake)
    assert out.names == ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02", "login"]
    assert len(lookup_nodes("n[0-999999]", FakeScontrol()).names) == MAX_NODES


def test_an_answer_that_is_no_host_list_is_not_taken_for_one():
    fake = FakeScontrol(hostnames="JobId=77 JobName=train NodeList=gpu01 Reason=x;rm\n")
    assert lookup_nodes("gpu0[1-2]", fake).names == ["gpu01", "gpu02"]
    assert lookup_nodes("-o,gpu02", FakeScontrol()).names == ["gpu02"]  # never an option for scontrol


def test_a_forged_record_inside_a_reason_names_no_job_node():
    text = "NodeName=gpu-b012 State=IDLE Reason=ok\nNodeName=gpu-b013 State=DOWN Reason=forged [root@2026-12-05T10:01:02]"
    out = lookup_nodes("gpu-b012", FakeScontrol(nodes=text, hostnames="gpu-b012"))
    assert [r.name for r in out.records] == ["gpu-b012"]


@pytest.mark.parametrize("fake", [FakeScontrol(hang=True), FakeScontrol(nodes="", node_rc=1)])
def test_scontrol_failing_is_a_note_never_an_error(fake):
    out = lookup_nodes("gpu-b012", fake)
    assert out.records == [] and "could not be read" in out.note


def test_no_nodes_asks_nothing_and_a_plain_list_needs_no_expanding():
    fake = FakeScontrol()
    assert lookup_nodes("", fake).records == [] and fake.calls == []
    lookup_nodes("gpu01,gpu02", fake)
    assert fake.calls == [["scontrol", "show", "node", "-o", "gpu01,gpu02"]]


# ---------------------------------------------------------------------------------------------- findings


@pytest.mark.parametrize(("stamp", "when", "seconds"), [
    ("2026-12-05T10:01:02", "during", 3662),
    ("2026-12-05T10:20:00", "after", 300),
    ("2026-12-05T12:15:00", "later", 7200),
    ("2026-12-05T08:00:00", "before", 3600),
    ("", "unknown", None),
])
def test_timing_against_the_job(stamp, when, seconds):
    assert (node_timing(stamp, JOB_START, JOB_END).when, node_timing(stamp, JOB_START, JOB_END).seconds) == (
        when, seconds)


def test_timing_edges():
    assert node_timing("2026-12-05T11:15:00", JOB_START, JOB_END).when == "after"  # RIGHT_AFTER_S exactly
    assert RIGHT_AFTER_S == 3600
    assert node_timing("2026-12-05T11:00:00", JOB_START, "Unknown").when == "during"  # still running
    assert node_timing("2026-12-05T11:00:00", "Unknown", "Unknown").when == "unknown"


@pytest.mark.parametrize(("state", "reason", "code"), [
    ("IDLE+DRAIN", "NHC: check_nv_healthmon: GPU 6 has uncorrectable ECC errors", "SN011"),
    ("IDLE+DRAIN", "NHC: check_hw_ib:  No IB port mlx5_0:1 is ACTIVE (LinkUp 400 Gb/sec).", "SN010"),
    ("IDLE+DRAIN", "NHC: check_fs_mount: /lustre not mounted", "SN009"),
    ("MIXED+DRAIN", "Kill task failed", "SN005"),
    ("DOWN+NOT_RESPONDING", "Not responding", "SN003"),
    ("DOWN", "Node unexpectedly rebooted boot_time=1764900000 last response=1764899000", "SN004"),
    ("IDLE+DRAIN", "gres/gpu count reported lower than configured (7 < 8)", "SN012"),
    ("IDLE+DRAIN", "maintenance: replace GPU 3 after Xid 79", "SN011"),  # the specific words win over maintenance
    ("IDLE+DRAIN", "kernel upgrade", "SN002"),
    ("ALLOCATED+FAIL", "ticket 4411", "SN001"),
    ("IDLE+REBOOT_REQUESTED", "apply firmware", "SN001"),
])
def test_reason_wording_gives_the_rule(state, reason, code):
    assert [f.rule for f in findings_of_scontrol_node(node_line("gpu-b012", state, reason))] == [code]


@pytest.mark.parametrize("line", [
    node_line("gpu-b012", "IDLE", "leftover words"),  # in service: an old Reason is no evidence
    node_line("gpu-b012", "MIXED", "x"),
    "NodeName=gpu-b012 State=IDLE+NOT_RESPONDING",  # a moment without contact, no Reason: nothing said yet
    "NodeName=gpu-b012 State=DOWN Reason=(null)",
])
def test_healthy_or_unexplained_nodes_give_nothing(line):
    assert findings_of_scontrol_node(line) == []


def _records(*lines: str):
    return parse_scontrol_nodes("\n".join(lines))[0]


def _report(*log_lines: str):
    return match_text("\n".join(log_lines) + "\n", CATALOGUE, backend="python")


def test_node_bad_during_the_job_is_the_root_of_an_nccl_timeout():
    report = _report(NCCL_TIMEOUT)
    old_root = report.root
    assert old_root is not None and old_root.category == "nccl_timeout"
    merge_node_findings(report, node_findings(_records(ONE_LINE), JOB_START, JOB_END))
    root = report.root
    assert (report.root_cause, root.rule, root.category, root.role) == (0, "SN011", "hardware", "root")
    assert root.evidence[0].path == "scontrol-node:gpu-b012" and root.hosts == ["gpu-b012"]
    assert root.facts["timing"] == "during" and root.facts["reason_time"] == "2026-12-05T10:01:02"
    assert (old_root.role, old_root.cause_of) == ("cascade", 0)
    assert "during the job" in root.title
    assert "sbatch --exclude=gpu-b012" in " ".join(root.fix.steps)


def test_node_bad_right_after_the_job_leads_and_says_when():
    report = _report(NCCL_TIMEOUT)
    line = node_line("gpu-b012", "MIXED+DRAIN", "Kill task failed", "slurm@2026-12-05T10:20:00")
    merge_node_findings(report, node_findings(_records(line), JOB_START, JOB_END))
    assert report.root.rule == "SN005" and "00:05:00 after the job ended" in report.root.title


def test_a_log_root_of_its_own_is_not_outranked():
    report = _report(CUDA_OOM)
    old_root = report.root
    merge_node_findings(report, node_findings(_records(ONE_LINE), JOB_START, JOB_END))
    assert report.root is old_root and old_root.category == "cuda_oom"
    node = next(f for f in report.findings if f.rule == "SN011")
    assert (node.role, node.cause_of) == ("context", None)


@pytest.mark.parametrize(("stamp", "when"), [("2026-12-05T08:00:00", "before"), ("2026-12-06T10:00:00", "later")])
def test_a_reason_outside_the_run_is_shown_but_never_root(stamp, when):
    report = _report(NCCL_TIMEOUT)
    line = node_line("gpu-b012", "IDLE+DRAIN", "NHC: check_nv_healthmon: GPU 6 has uncorrectable ECC errors",
                     f"root@{stamp}")
    merge_node_findings(report, node_findings(_records(line), JOB_START, JOB_END))
    assert report.root.category == "nccl_timeout"
    node = next(f for f in report.findings if f.rule == "SN011")
    assert node.role == "context" and node.facts["timing"] == when and node.confidence < 0.9
    assert ("before the job started" if when == "before" else "after the job ended") in node.title


def test_a_report_with_no_root_gets_the_node_as_root():
    report = _report("step 10 loss 2.1")
    assert report.root is None
    merge_node_findings(report, node_findings(_records(ONE_LINE), JOB_START, JOB_END))
    assert report.root.rule == "SN011"


def test_a_maintenance_drain_never_leads():
    report = _report(NCCL_TIMEOUT)
    merge_node_findings(report, node_findings(_records(node_line("gpu-b012", "MIXED+DRAIN", "kernel upgrade")),
                                              JOB_START, JOB_END))
    assert report.root.category == "nccl_timeout"


def test_the_earliest_bad_node_leads_the_others_are_context():
    report = _report(NCCL_TIMEOUT)
    lines = (node_line("gpu-b012", "IDLE+DRAIN", "Kill task failed", "slurm@2026-12-05T10:20:00"),
             node_line("gpu-b013", "DOWN+NOT_RESPONDING", "Not responding", "slurm@2026-12-05T10:05:00"))
    merge_node_findings(report, node_findings(_records(*lines), JOB_START, JOB_END))
    assert report.root.hosts == ["gpu-b013"]
    other = next(f for f in report.findings if f.hosts == ["gpu-b012"])
    assert other.role == "context"


def test_hostile_reason_never_reaches_the_terminal_raw():
    reason = "\x1b[2J\x1b]0;pwned\x07[bold red]FAKE ROOT[/] \u202eevil GPU " + "x" * 5000
    report = _report(NCCL_TIMEOUT)
    merge_node_findings(report, node_findings(_records(node_line("gpu-b012", "IDLE+DRAIN", reason)),
                                              JOB_START, JOB_END))
    assert report.root.rule == "SN011"
    text = render_to_string(report, color="always")
    assert "\x1b[2J" not in text and "\x1b]0" not in text and "\u202e" not in text and "\x07" not in text
    assert "\\x1b[2J" in text and "[bold red]FAKE ROOT[/]" in text  # shown as written, markup not applied
    longest = max(len(line) for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines())
    assert longest <= 100
    assert len(report.root.title) < 400 and len(report.root.evidence[0].text) <= 600


def test_rules_show_a_node_rule(capsys):
    """The node rules are catalogue rules: `rules show SN005` reads the states and the Reason patterns."""
    from diagnose.present.cli import main

    assert main(["rules", "show", "SN005"]) == 0
    out = capsys.readouterr().out
    assert "slurm-node-kill-task-failed" in out and "76_slurm_node.toml" in out
    assert "Reads" in out and "kill task failed" in out and "Patterns" not in out
    assert "State=MIXED+DRAIN" in out  # its examples are scontrol show node records


def test_node_rule_keys_are_validated():
    from diagnose.match.rules import parse_rule

    base = {"code": "U900", "slug": "u", "title": "t", "category": "hardware", "explanation": "e"}
    with pytest.raises(ValueError, match="only for input"):
        parse_rule({**base, "patterns": [{"anchor": "abc", "regex": "abc"}], "node_reason_any": ["x"]}, "test")
    with pytest.raises(ValueError, match="not among"):
        parse_rule({**base, "input": "slurm_node", "node_states_any": ["DRAINED"]}, "test")
    with pytest.raises(ValueError, match="does not compile"):
        parse_rule({**base, "input": "slurm_node", "node_reason_any": ["("]}, "test")
    rule = parse_rule({**base, "input": "slurm_node", "node_states_any": ["DOWN"], "node_reason_any": ["x"]}, "test")
    assert (rule.node_states_any, rule.node_reason_any, rule.patterns) == (("DOWN",), ("x",), [])


def test_a_user_node_rule_is_refused_by_lint(tmp_path, capsys):
    from diagnose.present.cli import main

    (tmp_path / "50_mine.toml").write_text("""
[[rule]]
code = "US901"
slug = "my-node-rule"
title = "My node rule"
category = "hardware"
input = "slurm_node"
node_reason_any = ['(?i)psu']
explanation = "A power supply failed."
[rule.examples]
match = ["NodeName=n1 State=DOWN Reason=PSU failed [root@2026-12-05T10:00:00]"]
no_match = ["NodeName=n1 State=IDLE"]
""")
    assert main(["rules", "lint", "--rules", str(tmp_path), "--only-user"]) == 1
    assert "slurm_node rules are built in" in capsys.readouterr().out


def test_hostile_reason_in_markdown_is_escaped():
    from diagnose.present.markdown import render_markdown

    report = _report(NCCL_TIMEOUT)
    reason = "GPU <img src=x onerror=alert(1)> [click](javascript:alert(1)) **bold** `tick`"
    merge_node_findings(report, node_findings(_records(node_line("gpu-b012", "IDLE+DRAIN", reason)),
                                              JOB_START, JOB_END))
    md = render_markdown(report, verbose=True)
    prose = re.sub(r"(?ms)^```.*?^```", "", md)  # the evidence and facts are in code blocks, shown as written
    assert "Root cause: Node gpu-b012" in prose
    assert not re.search(r"(?<!\\)<img", prose) and not re.search(r"(?<!\\)\]\(javascript", prose)
