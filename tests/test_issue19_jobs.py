"""Issue 19 item 6: inputs of different jobs get a report per job, through the real command line.

Jobs are told apart by what their logs carry (Slurm job id in a file name or a slurmstepd line, torchrun's run id,
the master, the world size) and, across named inputs, by a rank failing in both. Per-rank files of one job and a
stdout/stderr pair stay one job; a folder whose files only clash by rank keeps one report and the warning.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hostile_cli import ROOT, cli

from diagnose.ingest.job_identity import conflict, identity_from_name, identity_from_text

jsonschema = pytest.importorskip("jsonschema")

LOGS = ROOT / "sample_logs"
DDP_OOM = (LOGS / "ddp_wrap_oom.log").read_text()  # rank 0: OOM102
WARMUP_OOM = (LOGS / "b042_first_iter_oom.log").read_text()  # rank 0: OOM110
TASK_OOM = (ROOT / "tests" / "slurm_jobs" / "task_oom.log").read_text()
TASK_NCCL = (ROOT / "tests" / "slurm_jobs" / "task_nccl_timeout.log").read_text()
CANCELLED = "slurmstepd: error: *** JOB {job} ON gpu-node-07 CANCELLED AT 2026-01-01T00:00:00 ***\n"
TORCHRUN_BANNER = """\
[2026-01-01 00:00:00,000] torch.distributed.launcher.api: [INFO] Starting elastic_operator with launch configs:
[2026-01-01 00:00:00,000] torch.distributed.launcher.api: [INFO]   entrypoint       : pretrain_gpt.py
  min_nodes        : 1
  max_nodes        : 1
  nproc_per_node   : 8
  run_id           : {run_id}
  rdzv_backend     : c10d
  rdzv_endpoint    : 127.0.0.1:29500
"""


def _json(*args: str) -> tuple[int, dict]:
    res = cli("analyze", *args, "--no-replay", "-f", "json")
    assert res.returncode in (0, 1), res.stderr
    data = json.loads(res.stdout)
    schema = json.loads((ROOT / "schemas" / "report-1.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    return res.returncode, data


def _roots(data: dict) -> list[str | None]:
    out = []
    for job in data["jobs"]:
        r = job["report"]
        out.append(None if r["root_cause"] is None else r["findings"][r["root_cause"]]["rule"])
    return out


def test_two_single_gpu_jobs_named_together_get_a_report_each(tmp_path: Path) -> None:
    a, b = LOGS / "b042_first_iter_oom.log", LOGS / "ddp_wrap_oom.log"
    code, data = _json(str(a), str(b))
    assert code == 1 and _roots(data) == ["OOM110", "OOM102"]
    assert [j["paths"] for j in data["jobs"]] == [[str(a)], [str(b)]]
    assert data["findings"][data["root_cause"]]["rule"] == "OOM110"  # the top level: the first failing job's
    assert "these inputs hold 2 jobs" in data["warnings"][0]
    text = cli("analyze", str(a), str(b), "--no-replay").stdout.decode()
    assert text.startswith("2 jobs in these inputs") and "JOB 1 OF 2:" in text and "JOB 2 OF 2:" in text
    assert text.index("OOM110") < text.index("JOB 2 OF 2") < text.index("OOM102")
    jsonl = [json.loads(x) for x in cli("analyze", str(a), str(b), "--no-replay", "-f", "jsonl").stdout.splitlines()]
    assert {(r["job"].split(":")[0], r["rule"]) for r in jsonl if r["root_cause"]} == {
        ("job 1 of 2", "OOM110"), ("job 2 of 2", "OOM102")}
    md = cli("analyze", str(a), str(b), "--no-replay", "-f", "markdown").stdout.decode()
    assert md.startswith("# diagnose: 2 jobs") and md.count("## diagnose: CUDA OOM") == 2


def test_slurm_job_ids_in_file_names_and_slurmstepd_lines_split_a_folder(tmp_path: Path) -> None:
    (tmp_path / "slurm-100.out").write_text(DDP_OOM)
    (tmp_path / "slurm-100.err").write_text("srun: error: gpu-node-07: task 0: Exited with exit code 1\n")
    (tmp_path / "slurm-200.out").write_text("step 1 loss 2.0\n")  # a clean job
    (tmp_path / "train.log").write_text(TASK_NCCL + CANCELLED.format(job=300))  # the id is only in the text
    code, data = _json(str(tmp_path))
    jobs = {j["identity"].get("slurm_job"): sorted(Path(p).name for p in j["paths"]) for j in data["jobs"]}
    assert jobs == {"100": ["slurm-100.err", "slurm-100.out"], "200": ["slurm-200.out"], "300": ["train.log"]}
    roots = dict(zip([j["identity"]["slurm_job"] for j in data["jobs"]], _roots(data), strict=True))
    assert roots["100"] == "OOM102" and roots["200"] is None and roots["300"] is not None
    assert code == 1  # the worst of the jobs


def test_a_clean_job_and_a_failed_one_exit_with_the_worst(tmp_path: Path) -> None:
    (tmp_path / "slurm-7.out").write_text("step 1 loss 2.0\nstep 2 loss 1.9\n")
    (tmp_path / "slurm-8.out").write_text(DDP_OOM)
    code, data = _json(str(tmp_path / "slurm-7.out"), str(tmp_path / "slurm-8.out"))
    assert code == 1 and _roots(data) == [None, "OOM102"]
    assert data["findings"][data["root_cause"]]["rule"] == "OOM102"


def test_torchrun_run_ids_and_masters_tell_jobs_apart(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "node0.log").write_text(TORCHRUN_BANNER.format(run_id="pretrain-a") + TASK_OOM)
    (tmp_path / "a" / "node1.log").write_text(TORCHRUN_BANNER.format(run_id="pretrain-b") + TASK_NCCL)
    _, data = _json(str(tmp_path / "a"))
    assert [j["identity"].get("run_id") for j in data["jobs"]] == ["pretrain-a", "pretrain-b"]
    # torchrun's default run id ("none") names no job: these two stay one report
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "rank0.log").write_text(TORCHRUN_BANNER.format(run_id="none") + "[rank0]: " + TASK_OOM)
    (tmp_path / "b" / "rank1.log").write_text(TORCHRUN_BANNER.format(run_id="none") + TASK_NCCL)
    _, data = _json(str(tmp_path / "b"))
    assert "jobs" not in data


def test_ranks_of_one_job_and_stdout_stderr_pairs_stay_one_report(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text(TASK_OOM)
    (tmp_path / "rank1.log").write_text(TASK_NCCL)
    code, data = _json(str(tmp_path / "rank0.log"), str(tmp_path / "rank1.log"))
    assert code == 1 and "jobs" not in data
    pair = tmp_path / "attempt_0" / "0"
    pair.mkdir(parents=True)
    (pair / "stdout.log").write_text(DDP_OOM)
    (pair / "stderr.log").write_text(DDP_OOM)
    _, data = _json(str(pair / "stdout.log"), str(pair / "stderr.log"))
    assert "jobs" not in data


def test_two_folders_of_per_rank_logs_are_two_jobs(tmp_path: Path) -> None:
    for job, oom in (("job1", DDP_OOM), ("job2", WARMUP_OOM)):
        (tmp_path / job).mkdir()
        (tmp_path / job / "rank0.log").write_text(oom)
        (tmp_path / job / "rank1.log").write_text("[rank1]: step 1 loss 2.0\n")
    code, data = _json(str(tmp_path / "job1"), str(tmp_path / "job2"))
    assert code == 1 and _roots(data) == ["OOM102", "OOM110"]
    assert [len(j["paths"]) for j in data["jobs"]] == [2, 2]


def test_a_folder_whose_logs_clash_only_by_rank_keeps_one_report_and_warns(tmp_path: Path) -> None:
    """Unsure (per-node logs of one job look the same): today's single report, with the warning."""
    (tmp_path / "a.log").write_text(DDP_OOM)
    (tmp_path / "b.log").write_text(WARMUP_OOM)
    _, data = _json(str(tmp_path))
    assert "jobs" not in data and any("look like logs of different jobs" in w for w in data["warnings"])


def test_identity_readers() -> None:
    assert identity_from_name("/x/slurm-4242.out") == {"slurm_job": "4242"}
    assert identity_from_name("slurm-4242_3.err") == {"slurm_job": "4242_3"}
    assert identity_from_name("myslurm-run.log") == {}
    text = (b"srun: job 5151 queued and waiting for resources\n"
            b"MASTER_ADDR=gpu-node-01 MASTER_PORT=29512\n"
            b"    world_size ...................................... 16\n")
    assert identity_from_text(text) == {"slurm_job": "5151", "master": "gpu-node-01:29512", "world_size": "16"}
    assert identity_from_text(b"  run_id           : none\n") == {}
    # two different values in one log (a log holding two runs) tell nothing
    assert identity_from_text(CANCELLED.format(job=1).encode() + CANCELLED.format(job=2).encode()) == {}
    assert conflict({"world_size": "8"}, {"world_size": "16"}) == "world_size"
    assert conflict({"slurm_job": "1"}, {"world_size": "16"}) is None


def test_more_jobs_than_reports_keeps_one_report_and_says_why(tmp_path: Path) -> None:
    from diagnose.pipeline import MAX_JOBS

    for i in range(MAX_JOBS + 1):
        (tmp_path / f"slurm-{1000 + i}.out").write_text("step 1 loss 2.0\n" if i else DDP_OOM)
    code, data = _json(str(tmp_path))
    assert code == 1 and "jobs" not in data
    assert any(f"hold {MAX_JOBS + 1} jobs" in w and "too many" in w for w in data["warnings"])


def test_one_rank_naming_the_job_does_not_split_it_from_its_other_ranks(tmp_path: Path) -> None:
    """Only rank 0's file holds slurmstepd's line: the other ranks' files name no job and stay with it."""
    (tmp_path / "rank0.log").write_text("[rank0]: " + TASK_OOM + CANCELLED.format(job=100))
    (tmp_path / "rank1.log").write_text(TASK_NCCL)
    _, data = _json(str(tmp_path))
    assert "jobs" not in data


def test_a_log_that_could_belong_to_either_job_is_reported_on_its_own(tmp_path: Path) -> None:
    a, b, c = (tmp_path / n for n in ("a.log", "b.log", "c.log"))
    a.write_text(DDP_OOM)
    b.write_text(WARMUP_OOM)
    c.write_text("step 1 loss 2.0\n")  # no failure, no job id: a's or b's? it cannot tell
    code, data = _json(str(a), str(b), str(c))
    assert code == 1 and [j["paths"] for j in data["jobs"]] == [[str(a)], [str(b)], [str(c)]]
    assert _roots(data) == ["OOM102", "OOM110", None]
