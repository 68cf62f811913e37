"""fixer38: what qa-report-10 left (L1, L3, L4, L5, L7, L8, L9) and the Slurm states listed three times.

Each test failed on the tree before its fix. Logs are synthetic, in the formats of the messages they quote
(hosts, pids, paths invented)."""

from __future__ import annotations

from conftest import root_finding

# ------------------------------------------------------------------------------ L3: the NCCL WARN among the evidence

_TWO_NODES = [
    "server101: server101:18804:19350 [0] NCCL INFO Using network Socket",
    "server100: server100:30211:30744 [0] misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer 10.0.3.101<38422>",
    "server101: server101:18804:19391 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer server100<45318>",
    "server101: server101:18804:19391 [0] NCCL INFO misc/socket.cc:750 -> 6",
    "server101: server101:18804:19391 [0] misc/socket.cc:49 NCCL WARN socketProgress: a later warning",
    "server101: Traceback (most recent call last):",
    'server101:   File "/home/u/main.py", line 285, in evaluation',
    "server101:     torch.distributed.all_reduce(tensor)",
    "server101: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1333,"
    " remote process exited or there was a network error, NCCL version 2.18.6",
]


def test_root_nccl_error_shows_the_failing_ranks_first_nccl_warn(builtin_catalogue):
    """NC013's evidence was only the DistBackendError lines; the WARN that says why (a socket closed by the peer)
    was a context finding of its own. The failing host's first WARN now comes first among the root's evidence;
    the other host's WARN (printed earlier) and the same host's later WARN do not."""
    f = root_finding(builtin_catalogue, _TWO_NODES)
    assert f.rule == "NC013"
    texts = [e.text for e in f.evidence]
    assert "socketProgress: Connection closed by remote peer server100" in texts[0]
    assert f.evidence[0].line == 3 and f.facts["nccl_warning_line"] == 3
    assert f.evidence[1].line == f.first_line == 9
    assert not any("10.0.3.101" in t or "a later warning" in t for t in texts)


def test_no_warning_is_added_to_a_root_that_is_not_an_nccl_error(builtin_catalogue):
    """A CUDA OOM after an NCCL warning keeps its own evidence."""
    lines = [
        "node1:1:2 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer node2<1>",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.10 GiB of which 1.00 GiB is free.",
    ]
    f = root_finding(builtin_catalogue, lines)
    assert f.category != "nccl_error"
    assert all("NCCL WARN" not in e.text for e in f.evidence)


# ------------------------------------------------------------------------------ L5: mcp answers a line that is not JSON


def test_mcp_answers_a_line_that_is_not_json_with_a_parse_error_and_keeps_serving():
    """``garbage{`` got no answer (the SDK's transport passes the server an exception, which it logs). JSON-RPC
    answers -32700 with id null; JSON that is no message is -32600; the next valid request is still answered."""
    import json
    import os
    import queue
    import subprocess
    import sys
    import threading

    import pytest

    pytest.importorskip("mcp", reason="the MCP SDK (pip install mcp)")
    from cli_run import ROOT

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "0"}}}
    lines = ["garbage{", json.dumps(init), "[1,2", '{"a": 1}',
             json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
             json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})]
    env = dict(os.environ, PYTHONPATH=str(ROOT), DIAGNOSE_SKIP_SLURM="1")
    proc = subprocess.Popen([sys.executable, "-m", "diagnose", "mcp"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(ROOT), text=True)
    assert proc.stdin is not None and proc.stdout is not None
    got: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [got.put(out) for out in proc.stdout], daemon=True).start()
    answers = []
    try:
        for line in lines:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
        while len(answers) < 5:
            try:
                answers.append(json.loads(got.get(timeout=30)))
            except queue.Empty:
                break
    finally:
        proc.kill()
        proc.wait(timeout=10)
    errors = [a["error"]["code"] for a in answers if "error" in a]
    assert errors == [-32700, -32700, -32600]
    assert all(a["id"] is None for a in answers if "error" in a)
    assert {a.get("id") for a in answers if "result" in a} == {1, 2}


# ------------------------------------------------------------------------------ L1: CK008's phase from its frames

_CKPT_EXC = ("[rank0]: megatron.core.dist_checkpointing.core.CheckpointingException: Flattened ranges dont cover the "
             "whole shard ShardedTensor(key='optimizer.state.exp_avg.decoder.layers.mlp.experts.linear_fc2.bias') of "
             "size 2880. Ranges: (array([0, 0]), array([2880, 2880]))")


def _traceback(*frames: tuple[str, str]) -> list[str]:
    out = ["[rank0]: Traceback (most recent call last):"]
    for path, fn in frames:
        out += [f'[rank0]:   File "{path}", line 10, in {fn}', "[rank0]:     call()"]
    return out + [_CKPT_EXC]


def test_checkpointing_exception_raised_while_saving_is_in_checkpoint_save(builtin_catalogue):
    """CK008 said checkpoint_load for the exception dist_checkpointing raised in save_checkpoint."""
    f = root_finding(builtin_catalogue, _traceback(
        ("/opt/Megatron-Bridge/src/megatron/bridge/training/train.py", "train"),
        ("/opt/Megatron-Bridge/src/megatron/bridge/training/checkpointing.py", "save_checkpoint"),
        ("/opt/megatron-lm/megatron/core/dist_checkpointing/serialization.py", "save"),
        ("/opt/megatron-lm/megatron/core/dist_checkpointing/validation.py", "validate_sharding_integrity"),
    ))
    assert (f.rule, f.category, f.phase) == ("CK008", "checkpoint_format", "checkpoint_save")


def test_checkpointing_exception_in_the_async_writer_is_in_checkpoint_save(builtin_catalogue):
    """Only the asynchronous save's frames (its writer and the loop's finalize) in the traceback."""
    f = root_finding(builtin_catalogue, _traceback(
        ("/opt/megatron-lm/megatron/training/async_utils.py", "maybe_finalize_async_save"),
        ("/opt/megatron-lm/megatron/core/dist_checkpointing/strategies/filesystem_async.py", "write_preloaded_data"),
    ))
    assert (f.rule, f.phase) == ("CK008", "checkpoint_save")


def test_checkpointing_exception_loading_or_without_frames_stays_checkpoint_load(builtin_catalogue):
    loading = root_finding(builtin_catalogue, _traceback(
        ("/opt/megatron-lm/megatron/training/checkpointing.py", "load_checkpoint"),
        ("/opt/megatron-lm/megatron/core/dist_checkpointing/serialization.py", "load"),
    ))
    bare = root_finding(builtin_catalogue, [_CKPT_EXC])
    assert (loading.rule, loading.phase) == ("CK008", "checkpoint_load")
    assert (bare.rule, bare.phase) == ("CK008", "checkpoint_load")


# ------------------------------------------------------------------------------ L4: enroot's user namespace and AppArmor


def test_enroot_userns_permission_denied_is_apparmors_restriction(builtin_catalogue):
    """The catch-all CA002 said "read the Slurm component"; the rule names AppArmor's restriction and both fixes."""
    lines = ["$ enroot start --rw pt2504 python train.py",
             "enroot-nsenter: failed to create user namespace: Permission denied"]
    f = root_finding(builtin_catalogue, lines)
    assert (f.rule, f.category, f.phase, f.basis) == ("SL060", "slurm", "init", "rule")
    said = " ".join(f.fix.steps)
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in said and "apparmor_parser -r /etc/apparmor.d/enroot" in said
    # under pyxis, slurmstepd relays enroot's line: the same rule, not the catch-all
    relayed = root_finding(builtin_catalogue, [
        "slurmstepd: error: pyxis: container start failed with error code: 1",
        "slurmstepd: error: pyxis:     enroot-nsenter: failed to create user namespace: Permission denied"])
    assert relayed.rule == "SL060"


# ------------------------------------------------------------------------------ L7: NC002's title where nothing trains


def test_nc002_title_does_not_claim_a_training_that_a_server_never_had(builtin_catalogue):
    """An sglang server's idle collective timing out got "timed out before training started"; the title now says
    what the rule knows (an early or barrier-sized collective, no training step seen), true on a server too."""
    lines = [
        "[2025-06-01 10:00:00] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
        "[rank0]:[E601 10:30:00.1 ProcessGroupNCCL.cpp:683] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600096 "
        "milliseconds before timing out.",
    ]
    f = root_finding(builtin_catalogue, lines)
    assert f.rule == "NC002"
    assert "training started" not in f.title and "no training step seen" in f.title


# ------------------------------------------------------------------------------ L8, L9: check and replay in the user's words


def test_check_names_the_megatron_lm_flag_the_user_wrote(tmp_path):
    """``--seq-length 0`` in a Megatron-LM argument list was refused as "model.seq_length=0 ...;
    dataset.seq_length=0 ...": Bridge keys the user never wrote, twice. Now the flag, once."""
    from cli_run import ROOT, run, write

    text = (ROOT / "examples" / "mlm_args.txt").read_text(encoding="utf-8")
    args = write(tmp_path, "args.txt", text.replace("--seq-length 8192", "--seq-length 0"))
    err = run("check", str(args), "--gpus", "8", code=(2,)).stderr.strip()
    assert "--seq-length 0 is not a positive integer" in err
    assert "seq_length" not in err and err.count("--seq-length") == 1
    # a --set of a Bridge key keeps the key the user typed
    err = run("check", str(args), "--gpus", "8", "--set", "model.hidden_size=-5", code=(2,)).stderr
    assert "model.hidden_size=-5 is not a positive integer" in err


def test_replay_does_not_offer_a_refused_override_as_the_fix():
    """``--set foo.bar=1`` printed "fix: foo.bar=1" and its Python and YAML forms above the refusal."""
    from cli_run import ROOT, run

    out = run("replay", str(ROOT / "examples" / "run_config.yaml"), "--set", "foo.bar=1", code=(1,)).stdout
    assert "override_unknown_key: Could not override 'foo.bar'" in out
    assert "fix:" not in out and "cfg.foo" not in out and "python:" not in out and "yaml:" not in out
    assert "your overrides trip override_unknown_key" in out


# ------------------------------------------------------------------------------ S: the Slurm states of a job not ended


def test_a_job_not_ended_is_the_same_to_the_job_view_the_failed_list_and_the_fleet_scan(tmp_path):
    """The job view knew 13 states of a job not ended; `--failed` and the fleet's sacct scan knew 5, so a job still
    COMPLETING (its epilog running, its final state not recorded) was listed as failed and stored by the scan with
    that state for good. One constant (ingest/slurm/parse.NOT_ENDED) for the three."""
    from diagnose.fleet.slurm_source import FIELDS, list_ended_jobs
    from diagnose.ingest.slurm.commands import CommandResult
    from diagnose.ingest.slurm.listing import _FIELDS, list_failed_jobs
    from diagnose.ingest.slurm.parse import NOT_ENDED, not_ended

    assert not_ended("COMPLETING") and not_ended("REQUEUE_HOLD") and not_ended("RUNNING")
    assert not not_ended("CANCELLED by 0") and not not_ended("FAILED") and not not_ended("")

    fields = _FIELDS.split(",")
    rows = [{"JobID": "42", "JobName": "train", "User": "root", "State": state, "ExitCode": "1:0"}
            for state in ("COMPLETING", "FAILED")]
    rows[1]["JobID"] = "43"
    sacct = "\n".join(["|".join(fields)] + ["|".join(r.get(f, "") for f in fields) for r in rows]) + "\n"
    listed = list_failed_jobs("1d", "root", runner=lambda argv: CommandResult(argv, 0, sacct, ""))
    assert [j.job_id for j in listed] == ["43"]

    header = FIELDS.replace(",", "|")
    width = len(FIELDS.split(","))
    lines = [header] + [
        "|".join([job, job, "prod", "train", "alice", state] + [""] * (width - 6))
        for job, state in (("50", "COMPLETING"), ("51", "STOPPED"), ("52", "FAILED"))
    ]
    scanned = list_ended_jobs("2026-12-01T00:00:00", "2026-12-02T00:00:00",
                              runner=lambda argv, timeout=30: CommandResult(argv, 0, "\n".join(lines) + "\n", ""))
    assert [r.job_id for r in scanned] == ["52"]
    assert {"COMPLETING", "STOPPED"} <= NOT_ENDED


# ------------------------------------------------------------------------------ T: the TUI reads its inputs once


def test_tui_inputs_checked_then_read_once_by_the_first_analysis(tmp_path, monkeypatch):
    """``diagnose tui`` opened its inputs twice: refuse_unreadable's check, then the analysis (a .gz decompressed
    twice, a folder listed twice). The check's opened inputs are now the first analysis's; later analyses open
    anew, and what the check refuses is unchanged."""
    import gzip

    import pytest

    import diagnose.ingest as ingest
    from diagnose.model import DiagnoseError
    from diagnose.pipeline import refuse_unreadable
    from diagnose.present.tui.app import pipeline_analyzer

    log = tmp_path / "job.log.gz"
    log.write_bytes(gzip.compress(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"))
    opened_paths: list[list[str]] = []
    real = ingest.open_inputs

    def counting(inputs, *a, **k):
        opened_paths.append(list(inputs))
        return real(inputs, *a, **k)

    monkeypatch.setattr(ingest, "open_inputs", counting)
    opened = refuse_unreadable([str(log)], keep=True)
    assert opened is not None
    analyzer = pipeline_analyzer([], opened)
    first = analyzer([str(log)], lambda done, total: None)
    assert len(opened_paths) == 1 and first.root is not None and first.root.category == "cuda_oom"
    again = analyzer([str(log)], lambda done, total: None)  # a second analysis (a reload) reads the file anew
    assert len(opened_paths) == 2 and again.root is not None and again.root.rule == first.root.rule
    opened.close()  # taken and closed by the analysis: nothing left to close, no error

    # not taken: closed by the caller; and the refusals stand
    unused = refuse_unreadable([str(log)], keep=True)
    assert unused is not None
    unused.close()
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    with pytest.raises(DiagnoseError, match="empty"):
        refuse_unreadable([str(empty)], keep=True)
    binary = tmp_path / "data.bin"
    binary.write_bytes(b"\x00\x01\x02\x03" * 1000)
    with pytest.raises(DiagnoseError):
        refuse_unreadable([str(binary)], keep=True)
