"""fixer47: qa-report-16's left items L2, L4, L5 (docs/qa-report-16.md, "Left, and why").

Each test failed on the tree before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_run import run, write

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_logs" / "mfsdp_optim_grads_buffer_oom.log"
# megatron-core 0.16.1 megatron_fsdp/param_and_grad_buffer.py, _init_each_parameter_group_buffers: the bf16 weight
# buffer's and the fp32 main-weight buffer's allocation lines
WBUF = "wbuf.init_data("
MBUF = "mbuf.init_data(torch.empty(mbuf.data_size, dtype=mbuf.dtype, device=self.device))"


def _memory(path: Path) -> dict:
    import json

    return json.loads(run("analyze", "--format", "json", str(path)).stdout)["memory"]


def test_the_sample_names_the_buffer_its_numbers_describe():
    """qa-16 L2: the synthetic sample's code line named the grad buffer while its numbers (30.52 GiB asked, 30.60
    GiB allocated before: the module's bf16 copy) fit only the bf16 param buffer."""
    text = SAMPLE.read_text(encoding="utf-8")
    assert "main_grad_buffer" not in text and "gbuf" not in text
    assert f"[rank0]:     {WBUF}\n" in text


@pytest.mark.parametrize("code, params, buffer", [
    (WBUF, 16.4e9, "bf16 param buffer"),  # 2 bytes a parameter, unsharded under optim_grads
    (MBUF, 8.2e9, "fp32 main-weight buffer"),  # 4 bytes a parameter: the code line alone says so
])
def test_the_traceback_code_line_decides_the_fsdp_buffer_through_the_pipeline(tmp_path, code, params, buffer):
    """qa-16 L2: `_fsdp_buffer_in_frames` read the finding's evidence texts, which never held the traceback's code
    line: the buffer was always the one whose size fitted the allocated memory. The same OOM numbers with the fp32
    main-weight buffer's line must give half the parameters."""
    text = SAMPLE.read_text(encoding="utf-8").replace(f"[rank0]:     {WBUF}\n", f"[rank0]:     {code}\n")
    assert code in text
    memory = _memory(write(tmp_path, "job.log", text))
    assert abs(memory["params"] - params) / params < 0.01, memory["params"]
    assert buffer in memory["explanation"]
    assert "named by the traceback" in " ".join(memory["notes"])


B042 = str(ROOT / "sample_logs" / "b042_first_iter_oom.log")


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_analyze_and_check_say_the_same_of_a_count_that_assumed_values():
    """qa-16 L4: `check` of b042's config called its 1.64B count "with ASSUMED values" and warned which (tied
    embeddings, learned position embeddings); `analyze -v` of the same log said only "counted from the config's
    shape". Both now say it with the same words and the same warning."""
    check = _flat(run("check", B042, "--gpus", "8").stdout)
    analyze = _flat(run("analyze", "-v", "--color", "never", "--no-progress", B042).stdout)
    said = "with ASSUMED values: see the WARNING below"
    assert f"1.64B parameters (built by megatron-core on the meta device from the config, {said})" in check
    assert f"Model: 1.64B parameters per GPU (counted from the config's shape, {said})." in analyze
    start = check.index("WARNING: the parameter count assumes")
    warning = check[start:check.index("true count", start)]
    assert "share_embeddings_and_output_weights" in warning and "position_embedding_type" in warning
    assert warning in analyze
    memory = _memory(Path(B042))
    assert memory["params_source"] == "config"
    assert [a.split(" ")[0] for a in memory["params_assumed"]] == ["share_embeddings_and_output_weights",
                                                                    "position_embedding_type"]


def test_replay_of_megatron_lm_arguments_writes_their_flags_not_bridge_forms():
    """qa-16 L5: `replay examples/mlm_args.txt --set ...` printed `python:` and `yaml:` (Megatron-Bridge forms)
    before `mlm:` and a fix line of Bridge overrides, while `check` of the same list writes its flags. The same
    decision as check's (the config is a Megatron-LM argument list) now gives the flags only."""
    out = run("replay", str(ROOT / "examples" / "mlm_args.txt"), "--set", "ddp.use_megatron_fsdp=true").stdout
    lines = out.splitlines()
    assert "python:" not in lines and "yaml:" not in lines, out
    fix = next(line for line in lines if line.startswith("fix"))
    assert fix.startswith("fix: --use-megatron-fsdp --ckpt-format fsdp_dtensor"), fix
    assert "ddp.use_megatron_fsdp=true" not in out and "cfg." not in out
    assert lines[lines.index("mlm:") + 1] == "--use-megatron-fsdp --ckpt-format fsdp_dtensor"
    # a Megatron-Bridge config keeps its forms
    bridge = run("replay", str(ROOT / "examples" / "run_config.yaml"), "--set", "ddp.use_megatron_fsdp=true").stdout
    assert "python:" in bridge.splitlines() and "yaml:" in bridge.splitlines(), bridge
