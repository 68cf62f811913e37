"""QA round 19 (docs/qa-report-19.md): each test failed on the tree before its fix; CLI output through cli_run."""

from __future__ import annotations

from cli_run import ROOT, run

MLM_ARGS = str(ROOT / "examples" / "mlm_args.txt")


def _words(text: str) -> str:
    return " ".join(text.split())


def test_check_on_blackwell_does_not_tell_a_tp_job_it_must_export_one():
    """`check examples/mlm_args.txt --gpus 8 --gpu b200` (TP 2) said the job "must export 1 on GPUs before
    Blackwell; change the launch script's export with the plan": on a B200 Megatron-LM asserts
    CUDA_DEVICE_MAX_CONNECTIONS=1 for TP/CP > 1 only when get_device_arch_version() < 10, so there is no such
    export to change. FSDP's own refusal of 1 holds on every GPU, so the plans are still named."""
    b200 = _words(run("check", MLM_ARGS, "--gpus", "8", "--gpu", "b200").stdout)
    assert "also need CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 (e.g. 32): Megatron-LM refuses 1 with FSDP" in b200
    assert "must export 1" not in b200
    assert "on b200 (Blackwell) this TP/CP > 1 job does not need 1" in b200
    hopper = _words(run("check", MLM_ARGS, "--gpus", "8", "--gpu", "h100").stdout)
    assert "must export 1 on GPUs before Blackwell; change the launch script's export with the plan" in hopper
    # a size alone names no architecture: the Hopper-and-earlier words stay
    sized = _words(run("check", MLM_ARGS, "--gpus", "8", "--gpu-memory", "180GiB").stdout)
    assert "must export 1 on GPUs before Blackwell" in sized
