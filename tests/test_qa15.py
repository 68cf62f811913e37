"""QA round 15 (helper qa15): a hostile new user on Slurm and the plain install. Each test failed before its fix."""

from __future__ import annotations

from diagnose.ingest.slurm.commands import CommandResult
from diagnose.ingest.slurm.job import SACCT_FIELDS, lookup_job
from diagnose.ingest.slurm.jobid import parse_job_id

# scontrol lists an array's tasks newest first; tasks 1 and 3 failed, task 1 first (06:20:40 before 06:20:41)
_ARRAY = "\n".join(
    f"JobId={raw} JobName=arr ArrayJobId=7 ArrayTaskId={task} JobState={state} ExitCode={code} EndTime={end}"
    for raw, task, state, code, end in [
        (10, 3, "FAILED", "1:0", "2026-12-07T06:20:41"),
        (9, 2, "COMPLETED", "0:0", "2026-12-07T06:20:40"),
        (8, 1, "FAILED", "1:0", "2026-12-07T06:20:40"),
        (7, 0, "COMPLETED", "0:0", "2026-12-07T06:20:39"),
    ]
) + "\n"


def _sacct(rows: list[dict[str, str]]) -> str:
    fields = [*SACCT_FIELDS, "SubmitLine"]
    return "\n".join(["|".join(fields), *("|".join(r.get(f, "") for f in fields) for r in rows)]) + "\n"


def test_an_array_asked_by_its_id_says_which_other_tasks_failed_and_reports_the_first():
    """`diagnose slurm 7` on an array where tasks 1 and 3 failed: it reported 7_3 (scontrol's first line) and never
    said 7_1 had failed too; a 100-task array with 5 failures showed one and hid four."""

    def runner(argv):
        if argv[0] == "scontrol":
            return CommandResult(argv, 0, _ARRAY, "")
        return CommandResult(argv, 1, "", "sacct: error: accounting storage is disabled")

    job = lookup_job(parse_job_id("7"), runner, settle_s=0, sleep=lambda s: None)
    assert job.job_id == "7_1"
    notes = [n for n in job.notes if "ended badly" in n]
    assert notes and "2 of the array's 4 tasks" in notes[0] and "diagnose slurm 7_3" in notes[0]
    # a task asked for by its own id gets no such note
    one = lookup_job(parse_job_id("7_3"), runner, settle_s=0, sleep=lambda s: None)
    assert not [n for n in one.notes if "ended badly" in n]


def test_an_array_slurmctld_forgot_says_the_same_through_sacct():
    rows = [
        {"JobID": f"7_{t}", "JobIDRaw": str(7 + t), "JobName": "arr", "State": st, "ExitCode": code, "End": end,
         "WorkDir": "/tmp"}
        for t, st, code, end in [(0, "COMPLETED", "0:0", "2026-12-07T06:20:39"), (1, "FAILED", "1:0",
                                 "2026-12-07T06:20:42"), (2, "TIMEOUT", "0:0", "2026-12-07T06:20:40"),
                                 (3, "COMPLETED", "0:0", "2026-12-07T06:20:40")]
    ]

    def runner(argv):
        if argv[0] == "scontrol":
            return CommandResult(argv, 1, "", "slurm_load_jobs error: Invalid job id specified")
        if "--helpformat" in argv:
            return CommandResult(argv, 0, "JobID JobName State", "")
        return CommandResult(argv, 0, _sacct(rows), "")

    job = lookup_job(parse_job_id("7"), runner, settle_s=0, sleep=lambda s: None)
    assert job.job_id == "7_2"  # the time limit came first
    notes = [n for n in job.notes if "ended badly" in n]
    assert notes and "2 of the array's 4 tasks" in notes[0] and "diagnose slurm 7_1" in notes[0]


def test_the_fleet_names_who_cancelled_a_job_as_the_job_view_does():
    """`fleet report` titled a cancelled job "Slurm job state CANCELLED by 0" (sacct's uid) where `diagnose slurm`
    and `--failed` say "by root"."""
    from diagnose.fleet.slurm_source import SlurmRow, job_from_row

    fields = {"JobID": "2720", "JobIDRaw": "2720", "JobName": "qa15-cancel", "User": "root", "State": "CANCELLED by 0",
              "ExitCode": "0:15", "NodeList": "vm", "ElapsedRaw": "4", "WorkDir": "/tmp"}
    job = job_from_row(SlurmRow(tuple(fields.items()), 1, "|".join(fields.values())))
    assert job.state == "CANCELLED" and job.cancelled_by == "root"


def test_a_report_with_no_log_says_so_in_its_first_line():
    """`diagnose slurm JOB` on a job whose output file was deleted printed a bare "diagnose" as its first line."""
    from diagnose.model import Report
    from diagnose.present.text import _header

    line = _header(Report()).plain
    assert line.startswith("diagnose · no log read") and "Slurm" in line


def test_a_why_paragraph_whose_toml_line_starts_with_inline_code_is_reflowed_not_printed_ragged():
    """40 rules' explanations have a hard-wrapped TOML line that starts with an inline `code` span or a --flag; the
    text report took such a paragraph for a list or code, kept its 115-column lines and let the terminal wrap each
    again: "...(DA004), on the CPU or\\nunder\\n    `CUDA_LAUNCH_BLOCKING`: ..." at 100 columns."""
    from diagnose.present.text import wrap_paragraphs

    prose = ("The same bounds check as the GPU's assert, on the CPU or under\n`CUDA_LAUNCH_BLOCKING`: the index is"
             " at or above the table's size\n--ntasks-per-node is larger than the GPUs visible.")
    lines = wrap_paragraphs(prose, 60, "    ")
    assert all(len(ln) <= 60 for ln in lines), lines
    assert "    under `CUDA_LAUNCH_BLOCKING`: the index is" in lines or any("under `CUDA" in ln for ln in lines)
    # real lists and code keep their lines
    assert wrap_paragraphs("- one\n- two", 60, "  ") == ["  - one", "  - two"]
    assert wrap_paragraphs("```\nexport A=1\n```", 60, "") == ["```", "export A=1", "```"]


def test_the_why_of_an_embedding_index_error_is_reflowed_on_the_command_line(tmp_path):
    from tests.cli_run import run, write

    log = write(tmp_path, "train.log",
                '  File "/venv/lib/python3.10/site-packages/torch/nn/functional.py", line 2264, in embedding\n'
                "    return torch.embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)\n"
                "IndexError: index out of range in self\n")
    out = run("analyze", str(log)).stdout  # 160 columns
    why = out.split("  Why\n", 1)[1]
    assert "DA240" in out and "on the CPU or under `CUDA_LAUNCH_BLOCKING`" in why, why


def test_an_embedding_index_error_in_layoutlms_box_embedding_is_not_only_told_to_resize_the_vocabulary(tmp_path):
    """dd-unilm-layoutlmv2-funsd-like-bad-bbox-hw-embedding-index-error: the lookup that failed was LayoutLMv2's
    h_position_embeddings (word boxes not normalised); DA240 said "a token id at or above the vocabulary size" and
    offered only resize_token_embeddings."""
    from tests.cli_run import finding_words, root_finding

    f = root_finding(tmp_path, (
        '  File "/venv/lib/python3.8/site-packages/transformers/models/layoutlmv2/modeling_layoutlmv2.py", line 94, '
        "in _calc_spatial_position_embeddings\n"
        "    h_position_embeddings = self.h_position_embeddings(bbox[:, :, 3] - bbox[:, :, 1])\n"
        '  File "/venv/lib/python3.8/site-packages/torch/nn/functional.py", line 2199, in embedding\n'
        "    return torch.embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)\n"
        "IndexError: index out of range in self\n"))
    words = finding_words(f)
    assert f["rule"] == "DA240" and "token id at or above the vocabulary size" not in f["title"]
    assert "0-1000" in words and "position_embeddings" in words


def test_an_int_parse_of_slurms_compressed_task_count_is_named_with_its_fix(tmp_path):
    """dd-dmlcloud-srun-two-nodes-step-tasks-per-node-1x2-parse: PY001 with the slurm category's fix ("Read Slurm's own
    account of the step ... sacct"): Slurm did nothing wrong; the program's int() cannot read '1(x2)'."""
    from tests.cli_run import finding_words, root_finding

    f = root_finding(tmp_path, (
        "Traceback (most recent call last):\n"
        '  File "/opt/dml/dmlcloud/core/distributed.py", line 88, in _init_process_group_slurm\n'
        "    _WorkerInfo.LOCAL_WORLD_SIZE = int(os.environ['SLURM_STEP_TASKS_PER_NODE'])\n"
        "ValueError: invalid literal for int() with base 10: '1(x2)'\n"))
    assert f["rule"] == "SL213" and f["category"] == "slurm"
    assert "SLURM_NODEID" in finding_words(f) and "sacct" not in f["fix"]["summary"]


def test_a_port_in_use_after_deepspeeds_no_hostfile_warning_names_accelerates_standard_launcher(tmp_path):
    """di-lf-accelerate-ds-multinode-pdsh-default-no-hostfile-addr-in-use: LA010 (confidence 0.95) said only "use a free
    MASTER_PORT"; every node had run a one-node job (DeepSpeed: "Unable to find hostfile") because accelerate's
    DeepSpeed launcher defaulted to pdsh. The thread: --deepspeed_multinode_launcher standard."""
    from tests.cli_run import finding_words, root_finding

    f = root_finding(tmp_path, (
        "[worker-1] [2023-07-17 21:06:13,552] [WARNING] [runner.py:196:fetch_hostfile] Unable to find hostfile, will "
        "proceed with training with local resources only.\n"
        "[worker-1] RuntimeError: The server socket has failed to listen on any local network address. The server "
        "socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).\n"))
    assert f["rule"] == "LA010"
    assert "--deepspeed_multinode_launcher standard" in finding_words(f)


def test_a_missing_transformer_engine_extra_state_key_is_told_to_relax_the_load_strictness(tmp_path):
    """dh-nemo-export-legacy-nemotron-ckpt-te-extra-state-missing-key: CK009's steps were about prefixes, sizes and
    frozen weights; a missing `..._extra_state` key is a checkpoint of an older Transformer Engine, loaded with
    dist-ckpt strictness log_all (the documented known issue)."""
    from tests.cli_run import finding_words, root_finding

    f = root_finding(tmp_path, "RuntimeError: Missing key in checkpoint state_dict: "
                               "module.decoder.layers.self_attention.core_attention._extra_state/shard_0_32.\n")
    words = finding_words(f)
    assert f["rule"] == "CK009" and "_extra_state" in words and "dist_ckpt_strictness=log_all" in words


def test_fsdp2s_uniform_dtype_assertion_is_named_with_the_cast_before_fully_shard(tmp_path):
    """dg-accelerate-fsdp2-bf16-model-with-fp32-params-uniform-orig-dtype-assert (and four other dev threads):
    PY002 "Assertion failed" with generic FSDP steps, phase unknown on four of them; the one fix is one storage dtype
    per fully_shard group."""
    from tests.cli_run import finding_words, root_finding

    f = root_finding(tmp_path, (
        '[rank0]:   File "/venv/lib/python3.12/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py",'
        " line 234, in _init_mp_dtypes\n"
        "[rank0]:     raise AssertionError(\n"
        "[rank0]: AssertionError: FSDP expects uniform original parameter dtype but got {torch.bfloat16, torch.float32}\n"))
    assert f["rule"] == "MB251" and f["category"] == "fsdp_config" and f["phase"] == "first_iteration"
    assert "before fully_shard" in finding_words(f)
