"""QA round 7: a new user reads diagnose's answers (docs/qa-report-7.md), through the real command line.

Each test failed on the tree before its fix. They assert what the answer must say or must not claim for a kind of
log, never one rule's exact words.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CAPTURED = ROOT / "sample_logs" / "captured"
TIMEOUT = 60


def run(*args: str, columns: int = 200) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "COLUMNS": str(columns),
           "DIAGNOSE_SKIP_SLURM": "1"}
    return subprocess.run([sys.executable, "-m", "diagnose", *args], cwd=ROOT, env=env, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)


# ------------------------------------------------------------------ L3: the verify section only for Megatron FSDP


@pytest.mark.parametrize("text", ["hi\n", "epoch 1: loss 0.52\nepoch 2: loss 0.41\ntraining finished\n"])
def test_a_log_without_failure_or_megatron_fsdp_gets_no_verify_section(tmp_path, text):
    """``echo hi | diagnose analyze -`` printed "VERIFY (Megatron FSDP run)" with [FAIL] lines for a log that is no
    Megatron FSDP run at all."""
    log = tmp_path / "plain.log"
    log.write_text(text)
    res = run("analyze", str(log), "--color", "never")
    assert res.returncode == 0, res.stderr
    assert "No failure found" in res.stdout
    assert "VERIFY" not in res.stdout and "[FAIL]" not in res.stdout
    payload = json.loads(run("analyze", str(log), "--format", "json").stdout)
    assert "verify" not in payload


def test_a_megatron_ddp_run_that_worked_gets_no_megatron_fsdp_checklist():
    """A plain Megatron DDP run that trained fine was shown a verify section whose FAIL lines said it was no
    Megatron FSDP run and wrote no fsdp_dtensor checkpoint: nothing it asked for."""
    res = run("analyze", str(CAPTURED / "b062_tiny_train_success.log"), "--color", "never")
    assert res.returncode == 0, res.stderr
    assert "VERIFY" not in res.stdout


def test_the_verify_command_still_checks_any_log(tmp_path):
    """Asked for, the checks still run on any log (the verify command's contract)."""
    log = tmp_path / "plain.log"
    log.write_text("hi\n")
    res = run("verify", str(log), "--format", "json")
    assert res.returncode == 1
    names = {c["name"] for c in json.loads(res.stdout)["verify"]["checks"]}
    assert {"no_failure", "megatron_fsdp_active", "loss_finite"} <= names


# ------------------------------------------------------------------ a fragmentation fix true to the OOM's numbers


def _oom_log(tmp_path: Path, request: str, free: str, cached: str, allocated: str = "12.00") -> Path:
    # fixer39: 12 GiB allocated, so that the cache is a real share of what PyTorch reserved (>= 10 %): with 74.80 GiB
    # allocated these numbers read as a nearly full GPU, not fragmentation, and the fix is the memory lever
    in_use = f"{float(allocated) + float(cached) + 0.5:.2f}"
    line = (f"[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {request} GiB. GPU 0 has a total "
            f"capacity of 79.15 GiB of which {free} GiB is free. Including non-PyTorch memory, this process has "
            f"{in_use} GiB memory in use. Of the allocated memory {allocated} GiB is allocated by PyTorch, and {cached} GiB is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    log = tmp_path / "oom.log"
    log.write_text("[rank0]: Traceback (most recent call last):\n"
                   '[rank0]:   File "train.py", line 10, in <module>\n'
                   "[rank0]:     loss.backward()\n" + line + "\n")
    return log


def _fix_and_replay(log: Path) -> str:
    res = run("analyze", str(log), "--color", "never")
    assert res.returncode == 1, res.stderr
    return res.stdout[res.stdout.index("Fix"):res.stdout.index("MEMORY")]


def test_the_fix_does_not_say_the_cache_would_have_served_a_request_larger_than_it(tmp_path):
    """1.62 GiB cached-but-unallocated and 1.21 GiB free against a 2.32 GiB request: the MEMORY section said so
    right, but the Fix line and the replay verdict said "reserved-but-unallocated memory would have served the
    request", which 1.62 GiB could not. (fixer37: with 1.21 GiB free the slack would leave 0.6 % of the GPU after the
    request, a nearly full GPU whose fix is the memory lever; 3.21 GiB free leaves 3.1 %, fragmentation.)"""
    text = _fix_and_replay(_oom_log(tmp_path, "2.32", "3.21", "1.62"))
    assert "expandable_segments:True" in text
    assert "would have served the request" not in " ".join(text.split())
    assert "together" in text


def test_the_fix_still_says_so_when_the_cache_alone_held_more_than_the_request(tmp_path):
    text = _fix_and_replay(_oom_log(tmp_path, "2.50", "1.87", "3.91"))
    assert "would have served the request" in " ".join(text.split())


# ------------------------------------------------------------------ wrapping never splits a path at its hyphen


def test_wrapped_text_never_splits_dist_packages_at_its_hyphen(tmp_path):
    """"category from IF020: ... (File "/usr/lib/python3/dist-" / "packages/torch/...")": text wrapping broke a
    path at its hyphen, so the path a user copies from the report is wrong."""
    frames = "".join(f'  File "/usr/lib/python3/dist-packages/torch/distributed/fsdp/_mod{i}.py", line {i}, in '
                     f"fn{i}\n    fn{i + 1}()\n" for i in range(3))
    log = tmp_path / "assert.log"
    log.write_text("Traceback (most recent call last):\n" + frames
                   + '  File "/usr/lib/python3/dist-packages/torch/distributed/fsdp/_fsdp_extensions.py", line 99, '
                   "in _ext_pre_load_state_dict_transform\n    assert type(tensor) is ShardedTensor\nAssertionError\n")
    for columns in range(70, 131, 5):
        out = run("analyze", str(log), "--color", "never", columns=columns).stdout
        assert not re.search(r"dist-\n", out), (columns, out)


# ------------------------------------------------------------------ a fix that asks for output the log already has

NVLS_WARN = ("gh-runner-7:4109:4401 [2] transport/nvls.cc:287 NCCL WARN Failed to bind NVLink SHARP (NVLS) Multicast "
             "memory of size 8388608 : CUDA error 401 'the operation cannot be performed in the present state'")
NCCL_ERROR = ("[rank2]:[E207 11:42:17.408113962 ProcessGroupNCCL.cpp:2045] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
              "Process group watchdog thread terminated with exception: NCCL error: unhandled cuda error (run with "
              "NCCL_DEBUG=INFO for details), NCCL version 2.27.3")


def _root_fix(tmp_path: Path, text: str, name: str = "job.log") -> dict:
    log = tmp_path / name
    log.write_text(text)
    payload = json.loads(run("analyze", str(log), "--format", "json").stdout)
    root = payload["findings"][payload["root_cause"]]
    return root.get("proven_fix") or root["fix"]


def test_a_log_with_nccl_warnings_is_not_told_to_rerun_with_nccl_debug(tmp_path):
    """The generic NCCL error's fix was "Rerun with NCCL_DEBUG=INFO" (and replay "validated" export NCCL_DEBUG=INFO)
    for a log whose NCCL WARN line, 5 lines up, already named the cause: a job's rerun for nothing."""
    fix = _root_fix(tmp_path, "\n".join(["setup"] * 4 + [NVLS_WARN, NCCL_ERROR]) + "\n")
    assert not any(e["name"] == "NCCL_DEBUG" for e in fix["env"])
    assert any("line 5" in step and "NCCL WARN" in step for step in fix["steps"]), fix
    text = run("analyze", str(tmp_path / "job.log"), "--color", "never").stdout
    assert "export NCCL_DEBUG" not in text


def test_a_log_without_nccl_warnings_is_still_told_to_turn_them_on(tmp_path):
    fix = _root_fix(tmp_path, NCCL_ERROR + "\n")
    assert any(e["name"] == "NCCL_DEBUG" for e in fix["env"])
    assert not any("already on" in step for step in fix["steps"])


# ------------------------------------------------------------------ sacct -j JOBID with the job the log names

CGROUP_OOM = ("slurmstepd: error: Detected 8 oom-kill event(s) in step {job}.batch cgroup. Some of your processes may "
              "have been killed by the cgroup out-of-memory handler.")


def test_sacct_names_the_job_slurm_lines_name(tmp_path):
    """"sacct -j JOBID ..." was printed as is, though the cgroup line names the job (step 59137890.batch)."""
    fix = _root_fix(tmp_path, "training\n" + CGROUP_OOM.format(job=59137890) + "\n")
    sacct = [s for s in fix["steps"] if s.startswith("sacct")]
    assert sacct and all("-j 59137890 " in s for s in sacct), fix["steps"]


def test_sacct_keeps_jobid_when_the_log_names_two_jobs(tmp_path):
    fix = _root_fix(tmp_path, CGROUP_OOM.format(job=111) + "\n" + CGROUP_OOM.format(job=222) + "\n")
    assert any("sacct -j JOBID" in s for s in fix["steps"]), fix["steps"]


# ------------------------------------------------------------------ a Megatron-LM job gets its flags, not Bridge's

GAF = ("[rank3]: RuntimeError: ColumnParallelLinear was called with gradient_accumulation_fusion set to True but the "
       "custom CUDA extension fused_weight_gradient_mlp_cuda module is not found. To use gradient_accumulation_fusion "
       "you must install APEX with --cpp_ext and --cuda_ext. Otherwise, you must turn off gradient accumulation "
       "fusion.")
MLM_ARGS = ("------------------------ arguments ------------------------\n"
            "  gradient_accumulation_fusion .................... True\n"
            "  num_layers ...................................... 32\n"
            "-------------------- end of arguments ---------------------\n")


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_a_megatron_lm_job_is_given_its_command_line_flag_not_a_bridge_override(tmp_path, fmt):
    """A Megatron-LM job (its arguments block printed: framework megatron-lm) was told "Bridge CLI
    model.gradient_accumulation_fusion=false", an override pretrain_gpt.py does not read."""
    log = tmp_path / "mlm.log"
    log.write_text(MLM_ARGS + GAF + "\n")
    payload = json.loads(run("analyze", str(log), "--format", "json").stdout)
    assert payload["config"]["framework"] == "megatron-lm"
    out = run("analyze", str(log), "--format", fmt, "--color", "never").stdout
    fix = out[out.index("Fix"):]
    assert "--no-gradient-accumulation-fusion" in fix
    assert "Bridge CLI" not in fix and "Bridge command line" not in fix
    assert "gradient_accumulation_fusion=false" not in fix.replace("_fusion = False", "")


def test_without_a_megatron_lm_config_the_bridge_override_stays(tmp_path):
    log = tmp_path / "bridge.log"
    log.write_text(GAF + "\n")
    out = run("analyze", str(log), "--color", "never").stdout
    assert "Bridge CLI  model.gradient_accumulation_fusion=false" in out


# ------------------------------------------------------------------ OTHER FINDINGS: a wrapped line stays indented


def test_a_wrapped_other_finding_line_stays_indented(tmp_path):
    """A long context finding's line wrapped to column 0 ("error  [line 31]"), out of the section's indent."""
    log = tmp_path / "job.log"
    log.write_text("\n".join(["setup"] * 4 + [NVLS_WARN, NCCL_ERROR]) + "\n")
    out = run("analyze", str(log), "--color", "never", columns=32).stdout
    section = out[out.index("OTHER FINDINGS"):].split("\n\n")[0].splitlines()[1:]
    assert section and all(line.startswith("  ") for line in section), section


# ------------------------------------------------------------------ rule words a non-Megatron job can follow


def test_any_stack_rules_name_a_megatron_bridge_key_only_beside_other_stacks_words():
    """NC001/NC002 ("raise dist.distributed_timeout_minutes"), the host-OOM rules ("Lower dataset.num_workers"),
    CK010 and SL003 told an axolotl, DeepSpeed or HF Trainer job to set Megatron-Bridge keys as if they were its own.
    A rule whose message any PyTorch job prints (NCCL timeouts, host OOM, Slurm, disk full, DataLoader workers)
    says whose key it names."""
    from diagnose.match import load_catalogue

    key = re.compile(r"(?<![\w.-])(?:dist|dataset|checkpoint|train)\.[a-z][a-z_]+(?![\w(])")
    any_stack = {"NC001", "NC002", "SL003", "SL007", "LA008", "OOM020", "OOM021", "OOM022", "PY003", "CK010", "DA005"}
    rules = {r.code: r for r in load_catalogue([], strict=True).rules}
    bad = [(code, text) for code in sorted(any_stack & rules.keys())
           for text in [rules[code].fix.summary, *rules[code].fix.steps]
           if key.search(text or "") and "Megatron" not in text]
    assert len(any_stack & rules.keys()) == len(any_stack) and not bad, bad


# ------------------------------------------------------------------ no REPLAY paragraph that proves nothing

UNSLOTH = ("RuntimeError: Unsloth currently does not work on multi GPU setups - sadly we are a 2 brother team so "
           "enabling it will require much more work, so we have to prioritize. Please understand!")


def test_the_default_report_leaves_out_a_replay_that_checks_only_an_env_var_of_a_non_config_failure(tmp_path):
    """An unsloth job's launcher error ended with "REPLAY: the job's config passes validation (a launcher failure is
    not a config check); fix passes validation: export CUDA_VISIBLE_DEVICES=0": Megatron-Bridge defaults checked
    against an env var, which says nothing to that user. -v and JSON keep it."""
    log = tmp_path / "unsloth.log"
    log.write_text("python train.py\n" + UNSLOTH + "\n")
    out = run("analyze", str(log), "--color", "never").stdout
    assert "ROOT CAUSE" in out and "REPLAY" not in out
    assert "REPLAY" in run("analyze", str(log), "--color", "never", "-v").stdout
    assert json.loads(run("analyze", str(log), "--format", "json").stdout).get("replay")


def test_a_replay_that_checks_a_config_key_stays(tmp_path):
    log = tmp_path / "mlm.log"
    log.write_text(MLM_ARGS + GAF + "\n")
    out = run("analyze", str(log), "--color", "never").stdout
    assert "REPLAY" in out and "an import_version failure" in out
