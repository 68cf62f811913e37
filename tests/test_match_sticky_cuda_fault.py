"""A sticky CUDA fault (an illegal memory access) is hardware only with hardware evidence; without it, the frames
that launched the kernel say whose fault it is (HW001 is generic; rules/05_inference.toml IF910/IF911)."""

from __future__ import annotations

from diagnose.match import match_text
from diagnose.match.rules import load_catalogue

CATALOGUE = load_catalogue()
ERROR = "RuntimeError: CUDA error: an illegal memory access was encountered"
SITE = "/opt/venv/lib/python3.10/site-packages"


def _traceback(*frames: str) -> list[str]:
    lines = ["Traceback (most recent call last):", '  File "/srv/job/train.py", line 12, in <module>', "    main()"]
    for f in frames:
        lines += [f"  {f}", "    x = call()"]
    return lines + [ERROR, "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"]


def _root(lines: list[str]):
    return match_text("\n".join(lines), CATALOGUE, backend="python").root


def test_a_kernel_in_an_installed_package_is_that_release():
    root = _root(_traceback(f'File "{SITE}/vllm/model_executor/layers/sampler.py", line 512, in _random_sample'))
    assert (root.rule, root.category, root.basis) == ("HW001", "import_version", "inferred")
    assert "IF911" in root.basis_detail
    assert root.fix.env and root.fix.env[0].name == "CUDA_LAUNCH_BLOCKING"  # still says how to find the kernel


def test_a_kernel_of_the_selected_attention_backend_is_the_backend_setting():
    root = _root(_traceback(f'File "{SITE}/vllm/attention/backends/flash_attn.py", line 556, in forward',
                            f'File "{SITE}/vllm_flash_attn/flash_attn_interface.py", line 1295, in fwd'))
    assert (root.rule, root.category) == ("HW001", "config_validation")


def test_the_users_own_code_or_a_lone_line_stays_hardware():
    assert _root([ERROR]).category == "hardware"
    own = _root(_traceback('File "/srv/job/model.py", line 40, in forward'))
    assert (own.rule, own.category) == ("HW001", "hardware")


def test_hardware_evidence_leads_a_kernel_fault_in_a_package():
    lines = ["[Mon Jan  5 10:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."]
    lines += _traceback(f'File "{SITE}/vllm/model_executor/layers/sampler.py", line 512, in _random_sample')
    assert _root(lines).category == "hardware"


def test_a_watchdog_report_without_a_traceback_is_read_from_the_later_traceback():
    """The NCCL watchdog reports the fault first with C++ frames only; the same finding's later Python traceback
    shows which package launched the kernel."""
    lines = [
        "[rank3]:[E201 09:21:07.441920137 ProcessGroupNCCL.cpp:1515] [PG 0 Rank 3] Process group watchdog thread "
        "terminated with exception: CUDA error: an illegal memory access was encountered",
        "Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43 (most recent call first):",
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f5b1c6b9446 in /x/libc10.so)",
    ]
    lines += _traceback(f'File "{SITE}/vllm/model_executor/layers/sampler.py", line 512, in _random_sample')
    root = _root(lines)
    assert (root.rule, root.category) == ("HW001", "import_version")
    assert root.first_line == 1  # the finding still starts at the watchdog's line


def test_a_context_lines_later_hit_keeps_its_category():
    """Bridge's one-line summary is printed before its rank's traceback: the frames before its second hit are the
    first rank's traceback, not its own, so they do not re-read the context finding."""
    summary = ("ERROR:megatron.bridge.training.pretrain:Pretrain failed on rank={} with ModuleNotFoundError: No module "
               "named 'scaled_masked_softmax_cuda'. Bridge is aborting framework-owned distributed resources because "
               "peer ranks may be blocked in collectives.")
    tb = ["Traceback (most recent call last):",
          f'  File "{SITE}/megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py", line 1490, in forward',
          "    x = call()",
          f'  File "{SITE}/megatron/core/fusions/fused_softmax.py", line 357, in get_batch_per_block',
          "    import scaled_masked_softmax_cuda",
          "ModuleNotFoundError: No module named 'scaled_masked_softmax_cuda'"]
    result = match_text("\n".join([summary.format(0), *tb, summary.format(1), *tb]), CATALOGUE, backend="python")
    context = [f for f in result.findings if f.rule == "EC001"]
    assert context and context[0].count == 2
    assert context[0].basis != "inferred"
