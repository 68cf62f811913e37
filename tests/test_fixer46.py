"""qa-report-15's "Left" list (helper fixer46): L4, L1, L3, L5, L7. Each test failed before its fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli_run import root_finding, run, write

# L4: seml's `start` relays sbatch's refusal as a CalledProcessError; the user's rerun by hand shows sbatch's reason
_SEML = """\
$ seml mllab_gnn start
Starting 12 experiments in 12 Slurm jobs in 1 Slurm job array.
Traceback (most recent call last):
  File "/home/u/env/lib/python3.8/site-packages/seml/start.py", line 216, in start_sbatch_job
    output = subprocess.run(f'sbatch {path}', shell=True, check=True, capture_output=True).stdout
  File "/home/u/env/lib/python3.8/subprocess.py", line 512, in run
    raise CalledProcessError(retcode, process.args,
subprocess.CalledProcessError: Command 'sbatch /tmp/414481.sh' returned non-zero exit status 1.
$ sbatch /tmp/414481.sh
sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified
"""


def test_sbatch_own_error_leads_the_evidence_of_its_wrappers_called_process_error(tmp_path: Path):
    root = root_finding(tmp_path, _SEML)
    assert root["rule"] == "SL043"
    first = root["evidence"][0]
    assert first["line"] == 10 and "Invalid account or account/partition combination" in first["text"]
    # the wrapper's line is still shown, after it; one finding, not a second SL043 as context
    assert [e["line"] for e in root["evidence"]] == [10, 8]
    assert "Invalid account" in root["facts"]["reason"]
    text = run("analyze", str(write(tmp_path, "seml.log", _SEML))).stdout
    assert "line 10  sbatch: error: Batch job submission failed" in text
    assert "CONTEXT  SL043" not in text


def test_sbatch_error_printed_before_the_traceback_leads_too(tmp_path: Path):
    """A job manager that prints sbatch's stderr and then raises: the error leads, the finding's place stays."""
    log = _SEML.splitlines()
    text = "\n".join([log[0], log[9], *log[1:8]]) + "\n"
    root = root_finding(tmp_path, text)
    assert root["rule"] == "SL043" and root["evidence"][0]["line"] == 2


def test_a_called_process_error_alone_is_still_sl043(tmp_path: Path):
    root = root_finding(tmp_path, "\n".join(_SEML.splitlines()[:8]) + "\n")
    assert root["rule"] == "SL043" and root["confidence"] == pytest.approx(0.85)
    assert root["evidence"][0]["text"].startswith("subprocess.CalledProcessError: Command 'sbatch")


def test_a_rule_whose_every_pattern_relays_is_refused(tmp_path: Path):
    rules = write(tmp_path, "mine.toml", """\
[[rule]]
code = "USR001"
slug = "only-relay"
title = "only a relay"
category = "slurm"
phase = "init"
severity = "error"
role = "root"
confidence = 0.5
patterns = [{ anchor = "CalledProcessError", regex = 'CalledProcessError: Command .sbatch', relays = true }]
explanation = "x"
[rule.fix]
summary = "x"
[rule.examples]
match = ["subprocess.CalledProcessError: Command 'sbatch a.sh' returned non-zero exit status 1."]
no_match = ["x"]
""")
    proc = run("rules", "lint", "--rules", str(rules), code=(0, 1, 2))
    assert "every pattern relays" in proc.stdout + proc.stderr


# L1: accelerate + DeepSpeed on two nodes, each node running the same launch with no hostfile
_NO_HOSTFILE = """\
[worker-0] + accelerate launch --config_file ds.yaml --num_processes 16 --num_machines 2 --machine_rank 0 --main_process_ip 10.0.0.1 --main_process_port 29500 train.py
[worker-0] [2023-07-17 21:06:13,552] [WARNING] [runner.py:196:fetch_hostfile] Unable to find hostfile, will proceed with training with local resources only.
[worker-0] [2023-07-17 21:06:15,870] [INFO] [launch.py:151:main] nnodes=1, num_local_procs=8, node_rank=0
[worker-1] + accelerate launch --config_file ds.yaml --num_processes 16 --num_machines 2 --machine_rank 1 --main_process_ip 10.0.0.1 --main_process_port 29500 train.py
[worker-1] [2023-07-17 21:06:13,552] [WARNING] [runner.py:196:fetch_hostfile] Unable to find hostfile, will proceed with training with local resources only.
[worker-1] [2023-07-17 21:06:15,870] [INFO] [launch.py:151:main] nnodes=1, num_local_procs=8, node_rank=0
[worker-1] RuntimeError: The server socket has failed to listen on any local network address. The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).
"""


def test_a_multinode_deepspeed_launch_without_hostfile_leads_with_the_launcher_not_the_port(tmp_path: Path):
    root = root_finding(tmp_path, _NO_HOSTFILE)
    assert root["rule"] == "LA298" and root["category"] == "launcher" and root["phase"] == "init"
    assert "--deepspeed_multinode_launcher standard" in root["fix"]["summary"]
    assert "MASTER_PORT" not in root["fix"]["summary"]
    # the runner's warning is in the evidence, above the bind error
    texts = [e["text"] for e in root["evidence"]]
    assert "Unable to find hostfile" in texts[0] and "Address already in use" in texts[-1]
    out = run("analyze", str(write(tmp_path, "two.log", _NO_HOSTFILE))).stdout
    assert "ROOT CAUSE  LA298" in out


def test_a_plain_port_clash_stays_la010(tmp_path: Path):
    lines = _NO_HOSTFILE.splitlines()
    # no hostfile warning: a port another process holds
    assert root_finding(tmp_path, "\n".join(lines[:1] + lines[2:4] + lines[5:]) + "\n")["rule"] == "LA010"
    # the warning on a one-node launch (DeepSpeed's normal start): still the port
    one = "\n".join(line for line in lines if "accelerate launch" not in line) + "\n"
    assert root_finding(tmp_path, one)["rule"] == "LA010"


# L3: a verl worker's OOM in the actor's old log-prob pass, entropy over the full vocabulary
_VERL = """\
(TaskRunner pid=20117) step:1 - timing_s/gen:412.381 - timing_s/old_log_prob:148.204 - actor/entropy:0.412
(WorkerDict pid=21003) Traceback (most recent call last):
(WorkerDict pid=21003)   File "/verl/verl/single_controller/base/decorator.py", line 540, in inner
(WorkerDict pid=21003)     return func(*args, **kwargs)
(WorkerDict pid=21003)   File "/verl/verl/workers/fsdp_workers.py", line 782, in compute_log_prob
(WorkerDict pid=21003)     output, entropys = self.actor.compute_log_prob(data=data, calculate_entropy=True)
(WorkerDict pid=21003)   File "/verl/verl/workers/actor/dp_actor.py", line 266, in _forward_micro_batch
(WorkerDict pid=21003)     entropy = verl_F.entropy_from_logits(logits)  # (bsz, response_length)
(WorkerDict pid=21003)   File "/verl/verl/utils/torch_functional.py", line 148, in entropy_from_logits
(WorkerDict pid=21003)     entropy = torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)
(WorkerDict pid=21003) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 13.91 GiB. GPU 0 has a total capacity of 79.11 GiB of which 8.85 GiB is free. Process 23444 has 70.25 GiB memory in use. Of the allocated memory 60.49 GiB is allocated by PyTorch, and 6.77 GiB is reserved by PyTorch but unallocated.
"""

_BRIDGE_WORDS = ("train.micro_batch_size", "ddp.", "model.recompute_granularity", "Megatron")


def test_a_verl_oom_names_verls_own_knobs_not_bridge_keys(tmp_path: Path):
    root = root_finding(tmp_path, _VERL)
    assert root["rule"] == "OOM112" and root["category"] == "cuda_oom" and root["phase"] == "training"
    steps = " ".join(root["fix"]["steps"])
    for key in ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "use_dynamic_bsz",
                "ppo_max_token_len_per_gpu", "entropy_from_logits_with_chunking",
                "actor_rollout_ref.model.enable_gradient_checkpointing"):
        assert key in steps, key
    assert not [w for w in _BRIDGE_WORDS if w in steps + root["fix"]["summary"]]
    assert not root["fix"].get("overrides")
    out = run("analyze", str(write(tmp_path, "verl.log", _VERL))).stdout
    fix = out[out.index("  Fix"):out.index("  Why")]
    assert "log_prob_micro_batch_size_per_gpu" in fix
    assert not [w for w in _BRIDGE_WORDS if w in fix]


def test_a_verl_rollout_oom_names_the_rollout_engines_share(tmp_path: Path):
    rollout = _VERL.replace("/verl/verl/workers/actor/dp_actor.py\", line 266, in _forward_micro_batch",
                            "/verl/verl/workers/rollout/vllm_rollout/vllm_rollout.py\", line 288, in generate_sequences")
    assert "generate_sequences" in rollout
    root = root_finding(tmp_path, rollout)
    assert root["rule"] == "OOM112"
    steps = " ".join(root["fix"]["steps"])
    assert "actor_rollout_ref.rollout.gpu_memory_utilization" in steps and "max_num_seqs" in steps


def test_an_oom_without_verl_frames_keeps_oom001(tmp_path: Path):
    plain = _VERL.replace("/verl/verl/workers/", "/home/u/mytrainer/")
    assert root_finding(tmp_path, plain)["rule"] == "OOM001"


# L5 and L7: `slurm --failed` and the fleet against a fake sacct/scontrol on PATH (rows as sacct --parsable2 prints)
def _fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, str]]) -> None:
    from test_issue19_slurm_fields import install_fake_slurm

    bin_dir = install_fake_slurm(tmp_path, rows)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("NO_COLOR", "1")


def _job(tmp_path: Path, job_id: str, name: str, **extra: str) -> dict[str, str]:
    import pwd

    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / f"slurm-{job_id}.out").write_text("step 10 loss 2.1\nRuntimeError: boom\n")
    return {"JobID": job_id, "JobIDRaw": job_id, "JobName": name, "User": pwd.getpwuid(os.geteuid()).pw_name,
            "WorkDir": str(work), "State": "FAILED", "ExitCode": "1:0", "DerivedExitCode": "1:0",
            "Start": "2026-12-01T07:30:00", "End": "2026-12-01T09:00:00", "Elapsed": "01:30:00",
            "Timelimit": "04:00:00", "NodeList": "gpu-node-01", "NNodes": "1", "AllocCPUS": "8", **extra}


def test_failed_text_caps_a_long_job_name_and_keeps_it_inert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    long_name = "\x1b]8;;https://evil.example/\x07click-here\x1b]8;;\x07" + "x" * 60
    _fake_slurm(tmp_path, monkeypatch, [_job(tmp_path, "601", long_name), _job(tmp_path, "602", "short")])
    out = run("slurm", "--failed").stdout
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("JOBID"))
    row = next(line for line in lines if line.startswith("601"))
    assert "\x1b" not in out and "\x07" not in out
    name = row[header.index("NAME"):header.index("STATE")].rstrip()
    assert len(name) == 32 and name.endswith("…") and name.startswith("\\x1b]8;;")
    assert header.index("STATE") - header.index("NAME") == 34  # 32 and the two spaces between columns
    # the whole (escaped) name stays where a program reads it
    parsable = run("slurm", "--failed", "--fields", "JobID,JobName", "--parsable").stdout
    assert "x" * 60 in parsable and "\x1b" not in parsable


def test_fleet_and_failed_count_a_jobs_gpus_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A job whose TRES name no GPU was NNodes x 8 GPUs in the fleet and 0 in `--failed` (qa-report-15 L7): both read
    AllocTRES, else ReqTRES; NNodes x --gpus-per-node only where sacct gave no TRES list at all."""
    import json
    import sqlite3

    rows = [
        _job(tmp_path, "701", "cpu-prep", NNodes="2", ElapsedRaw="82", AllocTRES="billing=8,cpu=8,mem=64G,node=2",
             ReqTRES="billing=8,cpu=8,mem=64G,node=2"),
        _job(tmp_path, "702", "train", ElapsedRaw="3600", AllocTRES="billing=8,cpu=8,gres/gpu=4,node=1",
             ReqTRES="billing=8,cpu=8,gres/gpu=4,node=1"),
        # never allocated: AllocTRES empty, the request names its GPUs
        _job(tmp_path, "703", "queued", ElapsedRaw="0", AllocTRES="", ReqTRES="cpu=16,gres/gpu=8,node=1"),
        # no TRES list from sacct at all: the --gpus-per-node fallback
        _job(tmp_path, "704", "old", NNodes="2", ElapsedRaw="60"),
    ]
    _fake_slurm(tmp_path, monkeypatch, rows)
    failed = json.loads(run("slurm", "--failed", "--format", "json").stdout)
    listed = {j["job_id"]: j["gpus"] for j in failed["jobs"]}
    store = tmp_path / "fleet.db"
    run("fleet", "scan", "--sacct", "--since", "30d", "--store", str(store), "--jobs", "1", "--no-progress",
        code=(0, 1))
    with sqlite3.connect(store) as db:
        fleet = {key.rsplit(":", 1)[1]: gpus for key, gpus in db.execute("SELECT job_key, gpus FROM jobs")}
    assert listed["701"] == 0 and fleet["701"] == 0  # was 2 x 8 = 16 in the fleet
    assert listed["702"] == fleet["702"] == 4
    assert listed["703"] == fleet["703"] == 8
    assert listed["704"] is None and fleet["704"] == 16  # no TRES: the fleet's documented fallback


def test_the_epilog_counts_gpus_from_sacct_as_the_others_do():
    from diagnose.fleet.epilog import _gpus
    from diagnose.ingest.slurm.job import SlurmJob
    from diagnose.ingest.slurm.jobid import parse_job_id
    from diagnose.ingest.slurm.usage import Usage

    job = SlurmJob(ref=parse_job_id("7"), job_id="7", state="FAILED")
    assert _gpus(job, ["n1", "n2"], 8) == 16  # no sacct: node count x --gpus-per-node
    job.usage = Usage(nnodes=2, gpus=0)
    assert _gpus(job, ["n1", "n2"], 8) == 0  # sacct's TRES named no GPU
    job.usage = Usage(nnodes=2, gpus=None)
    assert _gpus(job, ["n1", "n2"], 8) == 16
