"""A launcher's or Slurm's report that tasks exited (srun's ``Exited with exit code``) says no cause of its own: a
catch-all of the program's own output printed before it (a CUDA check's ``Failed: Cuda error``, nccl-tests' ``Test
CUDA failure``) leads it (qa-report-19 L7). Slurm's own error lines (a catch-all of category slurm) do not: they
are reports too, and the exit report keeps the lead over them."""

from __future__ import annotations

from conftest import analyzed

SRUN_EXIT = "srun: error: gpu-h100-017: tasks 0-1: Exited with exit code 1"
UB_FAIL = ("{t}: Failed: Cuda error /opt/te/transformer_engine/pytorch/csrc/userbuffers/userbuffers-host.cpp:300 "
           "'operation not supported'")


def _roles(report) -> dict[str, str]:
    return {f.rule: f.role for f in report.findings}


def test_a_cuda_check_before_srun_exit_report_leads_it(tmp_path):
    text = "\n".join(["0: [NeMo I 2026-03-01 10:00:01 train:51] building model", UB_FAIL.format(t=0),
                      UB_FAIL.format(t=1), SRUN_EXIT]) + "\n"
    report = analyzed(tmp_path, text)
    assert report.root is not None and report.root.rule == "CA520"
    assert "userbuffers-host.cpp:300" in report.root.evidence[0].text
    assert _roles(report)["SL010"] == "cascade"


def test_nccl_tests_check_line_before_srun_leads_it(tmp_path):
    text = "\n".join(["#  nccl-tests version 2.13.9 nccl-headers=22105 nccl-library=22105",
                      "#       size         count      type   redop    root     time   algbw   busbw #wrong",
                      "hgx-c08: Test CUDA failure common.cu:733 'operation not supported'",
                      " .. hgx-c08 pid 188410: Test failure common.cu:1046",
                      "srun: error: hgx-c08: task 8: Exited with exit code 2"]) + "\n"
    report = analyzed(tmp_path, text)
    assert report.root is not None and report.root.rule == "CA510"
    assert report.root.evidence[0].text.endswith("Test CUDA failure common.cu:733 'operation not supported'")


def test_the_exit_report_still_leads_slurms_own_error_lines(tmp_path):
    text = "\n".join(["srun: error: gpu-h100-017: task 0: some step-level complaint srun printed",
                      SRUN_EXIT]) + "\n"
    report = analyzed(tmp_path, text)
    assert report.root is not None and report.root.rule == "SL010"


def test_a_catch_all_after_the_exit_report_does_not_lead(tmp_path):
    text = "\n".join([SRUN_EXIT, UB_FAIL.format(t=0)]) + "\n"
    report = analyzed(tmp_path, text)
    assert report.root is not None and report.root.rule == "SL010"


def test_nccl_tests_failure_summary_is_the_same_finding_as_its_check_line(tmp_path):
    """testResult's `` .. <host> pid <pid>: Test failure <file>:<line>`` summarises the check line above it: one
    finding with both lines, not a second CONTEXT of the same rule (qa-report-19 L7, second half)."""
    lines = ["#  nccl-tests version 2.13.9 nccl-headers=22105 nccl-library=22105"]
    for host, pid in (("hgx-c08", 188410), ("hgx-c09", 190122)):
        lines += [f"{host}: Test CUDA failure common.cu:733 'operation not supported'",
                  f" .. {host} pid {pid}: Test failure common.cu:1046"]
    lines.append("srun: error: hgx-c08: task 8: Exited with exit code 2")
    report = analyzed(tmp_path, "\n".join(lines) + "\n")
    assert report.root is not None and report.root.rule == "CA510"
    assert [f.rule for f in report.findings].count("CA510") == 1
    assert any("pid 188410: Test failure" in e.text for e in report.root.evidence)


def test_a_failure_summary_alone_is_still_a_finding(tmp_path):
    text = " .. hgx-c08 pid 188410: Test failure common.cu:1046\nsrun: error: hgx-c08: task 8: Exited with exit code 2\n"
    report = analyzed(tmp_path, text)
    assert report.root is not None and report.root.rule == "CA510"
