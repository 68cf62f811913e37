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


def test_check_on_blackwell_accepts_a_tp_job_that_does_not_export_one():
    """`check examples/mlm_args.txt --gpus 8 --gpu b200 --set CUDA_DEVICE_MAX_CONNECTIONS=32` (TP 2) said "As given:
    INVALID": "Using tensor model parallelism or context parallelism require setting the environment variable
    CUDA_DEVICE_MAX_CONNECTIONS to 1", with the fix `export CUDA_DEVICE_MAX_CONNECTIONS=1`. Megatron-LM runs that
    assert only when get_device_arch_version() < 10: a B200 job with 32 is valid. On an H100 it still is not."""
    b200 = _words(run("check", MLM_ARGS, "--gpus", "8", "--gpu", "b200",
                      "--set", "CUDA_DEVICE_MAX_CONNECTIONS=32").stdout)
    assert "Validation: passes" in b200 and "INVALID" not in b200
    assert "require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1" not in b200
    h100 = _words(run("check", MLM_ARGS, "--gpus", "8", "--gpu", "h100",
                      "--set", "CUDA_DEVICE_MAX_CONNECTIONS=32").stdout)
    assert "require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1" in h100
    assert "As given: INVALID" in h100


def test_tp_job_with_moe_a2a_overlap_is_not_told_to_export_one(tmp_path):
    """A Megatron-LM argument list with CP 2 and --overlap-moe-expert-parallel-comm, CUDA_DEVICE_MAX_CONNECTIONS=32:
    check said the TP/CP assert fails. Megatron-LM only warns then (the `elif args.overlap_moe_expert_parallel_comm`
    before the assert); the overlap's own requirement (expert parallelism) is still reported."""
    args = (ROOT / "examples" / "mlm_args.txt").read_text(encoding="utf-8")
    path = tmp_path / "args.txt"
    path.write_text(args.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 1 "
                                 "--context-parallel-size 2") + "--overlap-moe-expert-parallel-comm\n",
                    encoding="utf-8")
    out = _words(run("check", str(path), "--gpus", "8", "--set", "CUDA_DEVICE_MAX_CONNECTIONS=32").stdout)
    assert "require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1" not in out
    assert "overlap_moe_expert_parallel_comm is only supported" in out


def test_check_json_gives_a_megatron_lm_config_its_flags_per_plan():
    """qa-report-19 L10: `check examples/mlm_args.txt --gpus 8 --format json` carried only Bridge keys per plan,
    while the text printed Megatron-LM flags. Each plan now has ``mlm``, the same words the text prints; a Bridge
    config's plans have none."""
    import json

    doc = json.loads(run("check", MLM_ARGS, "--gpus", "8", "--format", "json").stdout)
    plans = doc["memory"]["plans"]
    assert plans[0]["mlm"] == ""  # the config as given changes nothing
    flags = [p["mlm"] for p in plans[1:]]
    assert flags and all(f.startswith("--") for f in flags)
    assert "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --ckpt-format fsdp_dtensor" in flags
    text = run("check", MLM_ARGS, "--gpus", "8").stdout
    assert all(f in text for f in flags)
    bridge = json.loads(run("check", str(ROOT / "examples" / "run_config.yaml"), "--gpus", "8",
                            "--format", "json").stdout)
    assert all("mlm" not in p for p in bridge["memory"]["plans"])
