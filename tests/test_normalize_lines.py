"""normalize_line / decode: transport prefixes, ANSI, carriage returns, and that nothing ever raises."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.normalize import collapse_carriage_returns, decode, normalize_line, strip_ansi

# Lines copied from ../shared/real_logs (H200 captures) and from the formats in ../shared/knowledge.
REAL_NESTED = "[default0]:[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9"
REAL_C10_GLOG = "[default1]:[rank1]:[W1129 15:26:43.269700705 ProcessGroupNCCL.cpp:5188] Guessing device ID based on global rank."
REAL_AGENT = "E1129 15:26:45.546000 1098 torch/distributed/elastic/multiprocessing/api.py:986] failed (exitcode: 1) local_rank: 1 (pid: 1124) of binary: /opt/venv/bin/python"
REAL_RANK_FRAME = '[rank0]:   File "/workspace/repro.py", line 92, in <module>'
REAL_TEE = "[default1]:  warnings.warn("


def test_torchrun_tee_and_rank_prefixes_nested():
    line = normalize_line(REAL_NESTED, "job.log", 7)
    assert line.text.startswith("torch.distributed.DistBackendError: NCCL error in:")
    assert (line.rank, line.local_rank, line.path, line.lineno) == (0, 0, "job.log", 7)
    assert line.raw == REAL_NESTED


def test_rank_prefix_keeps_traceback_indentation():
    line = normalize_line(REAL_RANK_FRAME)
    assert line.text == '  File "/workspace/repro.py", line 92, in <module>'
    assert line.rank == 0


def test_tee_prefix_has_no_space_and_keeps_indentation():
    line = normalize_line(REAL_TEE)
    assert line.text == "  warnings.warn("
    assert line.local_rank == 1 and line.rank is None


def test_c10_glog_inside_rank_prefix():
    line = normalize_line(REAL_C10_GLOG)
    assert line.text == "Guessing device ID based on global rank."
    assert (line.rank, line.local_rank, line.level) == (1, 1, "W")
    assert line.timestamp == "1129 15:26:43.269700705"


def test_python_glog_header():
    line = normalize_line(REAL_AGENT)
    assert line.text.startswith("failed (exitcode: 1) local_rank: 1")
    assert line.level == "E" and line.timestamp == "1129 15:26:45.546000"


def test_old_c10_glog_header():
    line = normalize_line("[E ProcessGroupNCCL.cpp:475] [Rank 0] Watchdog caught collective operation timeout")
    assert line.text.startswith("[Rank 0] Watchdog caught")
    assert line.level == "E"


@pytest.mark.parametrize(
    "raw, text, rank",
    [
        ("3: hello", "hello", 3),
        (" 3: hello", "hello", 3),
        ("15: [rank15]: boom", "boom", 15),
    ],
)
def test_srun_label(raw, text, rank):
    line = normalize_line(raw)
    assert (line.text, line.rank) == (text, rank)


def test_srun_label_around_tee_prefix_names_the_node():
    line = normalize_line(" 2: [default5]:Traceback (most recent call last):")
    assert line.text == "Traceback (most recent call last):"
    assert line.local_rank == 5 and line.rank is None and line.host == "task2"
    other = normalize_line(" 3: [default5]:Traceback (most recent call last):")
    assert line.stream != other.stream


def test_bracketed_host_rank():
    line = normalize_line("[gpu-node-17:3]: RuntimeError: boom")
    assert (line.host, line.rank, line.text) == ("gpu-node-17", 3, "RuntimeError: boom")


def test_pdsh_host_outermost():
    line = normalize_line("node017: 3: [default0]:[rank24]: x")
    assert (line.host, line.rank, line.local_rank, line.text) == ("node017", 24, 0, "x")


@pytest.mark.parametrize(
    "raw",
    [
        "INFO: something happened",
        "ValueError: x must be positive",
        "Traceback (most recent call last):",
        '  File "/a/b.py", line 3, in f',
        "E1129 is not a header without time",
        "torch.OutOfMemoryError: CUDA out of memory.",
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
        "bf16: true",
        "fp8: null",
        "slurmstepd-node01: error: *** JOB 1 ON node01 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***",
        "srun: error: node01: task 3: Exited with exit code 1",
        "INFO:megatron.core.timers:(min, max) time across ranks (ms):",
        "[1]:",
        "  rank      : 0 (local_rank: 0)",
        "12:00:01 is a time",
    ],
)
def test_message_text_is_not_mistaken_for_a_prefix(raw):
    line = normalize_line(raw)
    assert line.text == raw
    assert line.host is None and line.rank is None


def test_python_logging_header_with_level():
    line = normalize_line("[2024-07-25 06:36:18,293] torch.distributed.run: [WARNING] Setting OMP_NUM_THREADS")
    assert line.text == "Setting OMP_NUM_THREADS"
    assert line.timestamp == "2024-07-25 06:36:18,293" and line.level == "WARNING"


def test_iso_timestamp_and_level():
    line = normalize_line("2024-07-25T06:36:18.293Z ERROR something broke")
    assert (line.timestamp, line.level, line.text) == ("2024-07-25T06:36:18.293Z", "ERROR", "something broke")


def test_fastchat_worker_fields_are_peeled_and_frame_indentation_kept():
    # FastChat's build_logger: "<date> <time> | <LEVEL> | <logger name> | <message>", stderr relayed line by line
    frame = normalize_line('2024-02-20 21:46:23 | ERROR | stderr |   File "/w/vllm/worker/worker.py", line 71, in init_model')
    assert (frame.timestamp, frame.level) == ("2024-02-20 21:46:23", "ERROR")
    assert frame.text == '  File "/w/vllm/worker/worker.py", line 71, in init_model'
    info = normalize_line("2024-02-20 21:45:51 | INFO | model_worker | args: Namespace(port=7801)")
    assert (info.level, info.text) == ("INFO", "args: Namespace(port=7801)")
    # a loguru-style "| module:function:line - " field is not a logger name: only the bar goes
    loguru = normalize_line("2023-12-14 11:04:06.118 | INFO     | __main__:main:378 - Model args: x")
    assert (loguru.level, loguru.text) == ("INFO", "__main__:main:378 - Model args: x")


def test_megatron_iteration_timestamp():
    raw = " [2025-01-02 03:04:05.678901] iteration       10/  500000 | consumed samples:         5120 |"
    line = normalize_line(raw)
    assert line.timestamp == "2025-01-02 03:04:05.678901"
    assert line.text.startswith("iteration       10/  500000 |")


def test_ansi_csi_osc_and_others_are_stripped():
    raw = "\x1b[31mRuntimeError\x1b[0m: \x1b]0;title\x07boom\x1b]52;c;ZXZpbA==\x1b\\ \x1b(Bdone\x1b[2J"
    line = normalize_line(raw)
    assert line.text == "RuntimeError: boom done"
    assert "\x1b" not in line.text and line.raw == raw


def test_ansi_before_prefix():
    line = normalize_line("\x1b[1m[rank2]: \x1b[0mValueError: bad")
    assert (line.rank, line.text) == (2, "ValueError: bad")


def test_carriage_return_rewrites_show_what_a_terminal_shows():
    assert collapse_carriage_returns("10%|#   |\r50%|##  |\r100%|####|\r") == "100%|####|"
    assert collapse_carriage_returns("abcdef\rXY") == "XYcdef"
    assert collapse_carriage_returns("abcdef\r\x1b[KXY") == "XY"
    assert normalize_line("line with CRLF\r\n").text == "line with CRLF"


def test_progress_bar_with_rank_prefix():
    line = normalize_line("[rank0]: loading  1%\r[rank0]: loading 100%\r")
    assert (line.rank, line.text) == (0, "loading 100%")


def test_decode_escapes_invalid_utf8_and_nul():
    assert decode(b"ok \xff\xfe end") == "ok \\xff\\xfe end"
    assert decode(b"a\x00b") == "a\\x00b"
    assert decode("é".encode()) == "é"
    assert decode(b"cut \xe2\x82") == "cut \\xe2\\x82"
    assert decode(memoryview(b"mv")) == "mv"


def test_strip_ansi_leaves_plain_text_alone():
    text = "plain [bold]markup[/] stays"
    assert strip_ansi(text) is text


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300), st.integers(0, 10**9))
def test_normalize_line_never_raises_and_keeps_its_origin(raw, lineno):
    line = normalize_line(raw, "p.log", lineno)
    assert line.lineno == lineno and line.path == "p.log"
    assert isinstance(line.text, str)
    assert "\x1b" not in line.text
    assert "\r" not in line.text


PREFIXES = st.sampled_from(
    ["", "[rank3]: ", "[default1]:", "[default0]:[rank0]: ", " 7: ", "node12: ", "[host-1:4]: ",
     "E1129 15:24:33.203000 421 f.py:986] ", "[rank1]:[E1129 15:25:31.123456789 ProcessGroupNCCL.cpp:683] ",
     "2024-07-25T06:36:18Z "]
)


@settings(max_examples=300, deadline=None)
@given(PREFIXES, st.text(alphabet=st.characters(codec="ascii", min_codepoint=32), max_size=80))
def test_prefixes_are_removed_and_message_kept(prefix, message):
    # Messages that themselves start like a prefix are ambiguous by nature; start them with a letter.
    message = "M" + message
    line = normalize_line(prefix + message)
    assert line.text == message


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_decode_never_raises_and_has_no_nul(data):
    text = decode(data)
    assert "\x00" not in text
    if b"\\" not in data:  # no ambiguity from literal backslashes: every byte is accounted for
        assert text.encode("utf-8", "surrogatepass").count(b"\\x") == len(data) - len(
            data.decode("utf-8", "ignore").replace("\x00", "").encode()
        )


@pytest.mark.parametrize(
    "huge",
    [
        "node" + "1" * 2_000_000 + "x",
        "[E1129 15:25:31.1 " + "a" * 2_000_000,
        "[rank" + "a" * 2_000_000,
        "A" * 2_000_000 + "\rb" * 500_000,
        "\x1b[" + "1;" * 1_000_000,
    ],
)
def test_normalize_line_is_linear_on_huge_lines(huge):
    # A hang guard, not a speed test (speed is measured in benchmarks/): a quadratic regex would take minutes here.
    start = time.perf_counter()
    line = normalize_line(huge)
    assert time.perf_counter() - start < 10.0
    assert line.raw == huge


def test_carriage_return_overlay_of_long_line_keeps_the_tail():
    assert collapse_carriage_returns("A" * 10 + "\rbb" * 3) == "bb" + "A" * 8


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200).filter(lambda t: "\n" not in t))
def test_each_logline_is_its_input_line_and_text_is_a_suffix_of_the_screen(raw):
    line = normalize_line(raw, "f", 3)
    assert line.raw == raw  # the line as read, untouched
    assert collapse_carriage_returns(raw).endswith(line.text)  # only leading prefixes are ever removed


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=100))
def test_decode_of_valid_utf8_is_plain_decoding(text):
    assert decode(text.encode("utf-8")) == text


def test_mpirun_tag_output_and_lightning_rank_prefixes():
    line = normalize_line("[1,3]<stderr>:Traceback (most recent call last):")
    assert (line.rank, line.text) == (3, "Traceback (most recent call last):")
    line = normalize_line("[rank: 2] Seed set to 1234")
    assert (line.rank, line.text) == (2, "Seed set to 1234")


def test_horovodrun_ctime_rank_prefix():
    line = normalize_line("Tue Nov 10 10:05:04 2020[13]<stderr>:Traceback (most recent call last):")
    assert (line.rank, line.text, line.timestamp) == (13, "Traceback (most recent call last):", "Tue Nov 10 10:05:04 2020")
    line = normalize_line("Sat Dec  5 01:02:03 2026[0]<stdout>:epoch 1")
    assert (line.rank, line.text) == (0, "epoch 1")
    assert normalize_line("Tue is the day the job ran").rank is None  # a weekday alone is text
    assert normalize_line("Tue is the day the job ran").text == "Tue is the day the job ran"


def test_pdsh_prefix_keeps_the_line_indentation_behind_it():
    """pdsh (the DeepSpeed launcher's multi-node runner) writes "host: " before each line as written, so a traceback's
    indented frame lines keep the host too: the frames and the exception are one stream."""
    from diagnose.normalize import normalize_line

    frame = normalize_line('worker-1:   File "/w/pretrain_gpt.py", line 39, in model_provider')
    assert frame.host == "worker-1" and frame.text == '  File "/w/pretrain_gpt.py", line 39, in model_provider'
    assert normalize_line("model:   gpt").host is None  # no digit: a config line, not a host


def test_vllm_logger_header_inside_ray_prefix_keeps_the_traceback_frame():
    """vLLM's logger writes "LEVEL MM-DD HH:MM:SS file.py:N] " (newer releases bracket the file); under Ray the actor
    tag comes first. Both are peeled so a worker's traceback frames are frames, as on any other line."""
    raw = ('(RayWorkerWrapper pid=5528, ip=10.0.3.17) ERROR 08-27 06:14:33 worker_base.py:464]   File '
           '"/usr/local/lib/python3.10/dist-packages/vllm/worker/worker.py", line 176, in init_device')
    line = normalize_line(raw)
    assert line.host == "10.0.3.17" and line.level == "E" and line.timestamp == "0827 06:14:33"
    assert line.text == '  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/worker.py", line 176, in init_device'
    line = normalize_line("INFO 06-03 08:13:58 [pynccl.py:65] vLLM is using nccl==2.20.5")
    assert (line.level, line.text) == ("I", "vLLM is using nccl==2.20.5")
    # the words alone, without the date and the file:line], are message text
    assert normalize_line("ERROR 42 things went wrong").text == "ERROR 42 things went wrong"


def test_vllm_v1_process_tag_with_its_tp_rank_is_peeled():
    """vLLM V1's multiproc executor tags worker lines "(VllmWorker TP3 pid=N) ": the TP word belongs to the tag."""
    raw = ('(VllmWorker TP0 pid=40622) ERROR 08-31 14:02:46 [multiproc_executor.py:559]   File '
           '"/opt/venv/lib/python3.12/site-packages/vllm/distributed/utils.py", line 27, in ensure_divisibility')
    line = normalize_line(raw)
    assert (line.host, line.pid) == (None, 40622) and line.level == "E"  # the actor's name is no host
    assert line.text == '  File "/opt/venv/lib/python3.12/site-packages/vllm/distributed/utils.py", line 27, in ensure_divisibility'
    # a parenthesised aside that is not a process tag stays text
    assert normalize_line("(see TP0 docs) pid=3").text == "(see TP0 docs) pid=3"


def test_ray_actor_tag_with_a_rank_nemo_rl():
    """NeMo-RL names its Ray actors with their rank ("(MegatronPolicyWorker[rank=8] pid=N, ip=...) "): the tag is
    peeled and the rank kept, as for torch's own "[rankN]:"."""
    line = normalize_line("(MegatronPolicyWorker[rank=8] pid=1081, ip=10.0.3.22) FileNotFoundError: x")
    assert (line.text, line.rank, line.host) == ("FileNotFoundError: x", 8, "10.0.3.22")
    plain = normalize_line("(MegatronPolicyWorker pid=1081, ip=10.0.3.22) y")
    assert (plain.text, plain.rank) == ("y", None)
    assert normalize_line("(Worker[rank=x] pid=3) z").text == "(Worker[rank=x] pid=3) z"


# ---- launcher prefixes of multi-node and actor runtimes (shapes measured over corpus/dev: each carries a rank's
# traceback that stayed unread while its prefix was left in the text)


def test_pdsh_host_given_as_an_ipv4_address():
    """DeepSpeed's multi-node runner (pdsh) names hosts as the hostfile does, often by address."""
    line = normalize_line("10.20.3.101:   File \"/opt/app/train.py\", line 372, in <module>")
    assert (line.host, line.text) == ("10.20.3.101", '  File "/opt/app/train.py", line 372, in <module>')
    assert normalize_line("10.20.3.101: Traceback (most recent call last):").text == "Traceback (most recent call last):"
    # not an address: a version, an octet out of range, a time
    for raw in ("1.2.3: x", "999.1.1.1: x", "10.20.3.101:29500 refused", "12:00:01: x"):
        line = normalize_line(raw)
        assert (line.text, line.host) == (raw, None)


def test_pdsh_host_of_a_lettered_small_cluster():
    line = normalize_line("gpu-b:   File \"/data/app/finetune.py\", line 194, in <module>")
    assert (line.host, line.text) == ("gpu-b", '  File "/data/app/finetune.py", line 194, in <module>')
    for raw in ("cross-entropy: 3.2", "error: x", "x--: y", "warning-: z"):
        assert normalize_line(raw).text == raw


def test_monarch_rank_tag_is_peeled_with_its_rank():
    """Monarch (torchforge) prefixes each rank's output with "[N] "; some trainers' loggers add "| LEVEL | "."""
    frame = normalize_line('[3]   File "/opt/forge/apps/sft/main.py", line 318, in train')
    assert (frame.rank, frame.text) == (3, '  File "/opt/forge/apps/sft/main.py", line 318, in train')
    assert normalize_line("[0] Traceback (most recent call last):").text == "Traceback (most recent call last):"
    assert (normalize_line("[2] KeyError: 397").rank, normalize_line("[2] KeyError: 397").text) == (2, "KeyError: 397")
    titan = normalize_line("[0] [titan] 2026-01-21 09:13:10,884 - root - INFO - Building 1-D device mesh")
    assert titan.rank == 0 and titan.text.startswith("[titan] ")
    logged = normalize_line("[5] | INFO | world size 8, rank 5, local rank 5, device cuda:5")
    assert (logged.rank, logged.level, logged.text) == (5, "I", "world size 8, rank 5, local rank 5, device cuda:5")


@pytest.mark.parametrize(
    "raw",
    [
        "[0] : new - latest",  # an interactive menu
        "[0] is not a valid index",
        "[1]:",  # torchelastic's failure table
        "[80602] [INFO|trainer.py:2414] 2025-03-21 01:42:11,305 >> ***** Running training *****",  # a line number
        "Failures: [3] x",
        "[rank3]: [1] x",  # message text after a rank prefix keeps its brackets
    ],
)
def test_bracketed_number_look_alikes_keep_their_text(raw):
    line = normalize_line(raw)
    expected = raw.removeprefix("[rank3]: ")
    assert line.text == expected
    assert line.rank in (None, 3)


def test_torchx_role_replica_prefix_names_the_node():
    """torchx (NeMo-Run's launcher) writes "role/replica " before torchrun's own "[defaultN]:[rankN]:"."""
    line = normalize_line('my_64k_pretrain/1 [default1]:[rank9]:   File "/usr/local/bin/nemo", line 8, in <module>')
    assert (line.host, line.local_rank, line.rank) == ("my_64k_pretrain/1", 1, 9)
    assert line.text == '  File "/usr/local/bin/nemo", line 8, in <module>'
    # a ratio or a path before a bracket is text: the tag needs a name first and sits at the start of the line
    for raw in ("1/10 [00:01<00:09]", "see a/b/0 [x]", "[rank0]: trainer/0 [x]"):
        assert normalize_line(raw).text == raw.removeprefix("[rank0]: ")


def test_subprocess_stream_tag_is_peeled_only_outermost():
    line = normalize_line("stderr: [rank0]: Traceback (most recent call last):")
    assert (line.rank, line.text) == (0, "Traceback (most recent call last):")
    assert normalize_line("[rank0]: stderr: x").text == "stderr: x"
    assert normalize_line("stderr:x").text == "stderr:x"


def test_ray_actor_tags_of_vllm_multiproc_and_roll():
    vllm = normalize_line("(VllmWorker rank=7 pid=23051) ERROR 03-16 06:27:38 [multiproc_executor.py:375] Traceback "
                          "(most recent call last):")
    assert (vllm.rank, vllm.level, vllm.text) == (7, "E", "Traceback (most recent call last):")
    roll = normalize_line('(ActorWorker(actor_train-1) pid=18175, ip=33.199.184.82)   File "/opt/roll/a.py", line 3, in f')
    assert (roll.host, roll.text) == ("33.199.184.82", '  File "/opt/roll/a.py", line 3, in f')
    assert normalize_line("(see rank=3 docs) pid=4").text == "(see rank=3 docs) pid=4"


def test_pdsh_host_after_a_collectors_time_stamp():
    """A log collector (ts, a CI runner, a shipping agent) can stamp pdsh's lines again: "2023-12-17 18:09:08
    10.0.1.12: ". The host behind a time stamp alone is peeled as at the start of a line, so the traceback is read
    (before, the whole failure was text behind an unknown prefix and the log read "no failure found")."""
    frame = normalize_line('2023-12-17 18:09:08 10.0.1.12:   File "/w/train.py", line 3, in main')
    assert (frame.host, frame.timestamp) == ("10.0.1.12", "2023-12-17 18:09:08")
    assert frame.text == '  File "/w/train.py", line 3, in main'
    assert normalize_line("2023-12-17 18:09:08 node017: Traceback (most recent call last):").text == (
        "Traceback (most recent call last):")
    # a level or a logger's name between the stamp and the word makes it a message, not pdsh's line
    for raw in ("2023-12-17 18:09:08 ERROR step10: loss 3.2", "[2023-12-17 18:09:08] trainer: [INFO] node3: x"):
        assert normalize_line(raw).host is None


# ------------------------------------------------------------------ container, k8s and syslog layers (issue 14)


@pytest.mark.parametrize(
    "raw, text, host, timestamp",
    [
        # docker compose: the container's name padded to the widest one, then " | "
        ("trainer-1  | Traceback (most recent call last):", "Traceback (most recent call last):", "trainer-1", None),
        ("proj_trainer_12 |   File \"/x/train.py\", line 3, in main", '  File "/x/train.py", line 3, in main',
         "proj_trainer_12", None),
        ("trainer-1  |", "", "trainer-1", None),
        ("trainer-1  | [default3]:[rank3]: x", "x", "trainer-1", None),
        # kubectl logs --prefix: "[pod/NAME/CONTAINER] "
        ("[pod/train-0-abc12/trainer] [rank0]: boom", "boom", "train-0-abc12", None),
        ("[pod/train-0-abc12/trainer]     open(p)", "    open(p)", "train-0-abc12", None),
        # syslog / journalctl (short, short-iso, short-iso-precise)
        ("Dec 17 18:09:08 node1 python[123]: ValueError: x", "ValueError: x", "node1", "Dec 17 18:09:08"),
        ("Dec  7 18:09:08 node1 kernel: NVRM: Xid 79", "NVRM: Xid 79", "node1", "Dec  7 18:09:08"),
        ("2023-12-17T18:09:08+0000 node1 python3[123]: x", "x", "node1", "2023-12-17T18:09:08+0000"),
        ("2023-12-17T18:09:08.123456+00:00 gpu-7 torchrun[9]:   File", "  File", "gpu-7",
         "2023-12-17T18:09:08.123456+00:00"),
    ],
)
def test_container_k8s_and_syslog_layers(raw, text, host, timestamp):
    line = normalize_line(raw)
    assert (line.text, line.host, line.timestamp) == (text, host, timestamp)


def test_rank_behind_a_container_layer_is_kept():
    line = normalize_line("trainer-1  | [rank5]: RuntimeError: x")
    assert (line.host, line.rank, line.text) == ("trainer-1", 5, "RuntimeError: x")
    line = normalize_line("Dec 17 18:09:08 node3 python[1]: [default2]:x")
    assert (line.host, line.local_rank, line.text) == ("node3", 2, "x")


@pytest.mark.parametrize(
    "raw",
    [
        "| trainer-0 | running |",  # a table row
        "[rank0]: trainer-0 | 3.2 GB",  # a table's cell after a rank layer
        "Loss: trainer-0 | 3",
        "trainer | 3",  # a name without a replica number
        "2023-12-17 18:09:08 Loading model: foo",  # a collector's stamp, then a sentence with a colon
        "2023-12-17T18:09:08Z node1 kernel: x",  # ISO stamp with a program but no pid: not journald's shape
        "Dec 17 was: x",
        "[pod/a] x",
    ],
)
def test_message_text_under_the_new_layers_is_kept(raw):
    line = normalize_line(raw)
    assert raw.endswith(line.text)
    assert line.host is None


def test_iso_stamp_then_sentence_keeps_the_sentence():
    line = normalize_line("2023-12-17 18:09:08 Loading model: foo")
    assert line.text == "Loading model: foo" and line.timestamp == "2023-12-17 18:09:08"


# ------------------------------------------------------------------ prefixes learned from the log


from diagnose.normalize.learned import LearnedPrefixes, candidate, shape_of  # noqa: E402

UNKNOWN_PREFIXES = [
    "[worker-3 stdout] ", "pod/train-0-abc12 ", "<stderr> ", "job.1234.0 ",
    "[2023-12-17T18:09:08Z] [node1] ", "myjob | ",
]


def _traceback(pre: str) -> list[str]:
    return [f"{pre}Traceback (most recent call last):", f'{pre}  File "/x/train.py", line 3, in main',
            f"{pre}    open(p)", f"{pre}FileNotFoundError: [Errno 2] No such file or directory: '/a/b'"]


def test_candidate_is_the_text_before_a_traceback_start():
    assert candidate("<stderr> Traceback (most recent call last):") == "<stderr> "
    assert candidate("job.1 Fatal Python error: Segmentation fault") == "job.1 "
    assert candidate("Traceback (most recent call last):") is None
    assert candidate("    Traceback (most recent call last):") is None  # indentation, not a prefix
    assert candidate("raise X('Traceback (most recent call last):\\n  File') ") is None  # a quoted traceback
    assert candidate("plain line") is None


def test_shape_masks_digits_and_padding_keeps_the_rest():
    import re

    shape = re.compile(shape_of("job.1234.0 "))
    assert shape.match("job.98.7 x") and not shape.match("job.x.7 x") and not shape.match("jobs.1.0 x")
    padded = re.compile(shape_of("trainer-0  | "))
    assert padded.match("trainer-12 | x").end() == len("trainer-12 | ")
    # the trailing space is kept exactly: a frame's indentation behind the prefix is not eaten
    assert re.compile(shape_of("<stderr> ")).match('<stderr>   File "x"').end() == len("<stderr> ")


@pytest.mark.parametrize("pre", UNKNOWN_PREFIXES)
def test_learned_prefix_is_peeled_from_the_lines_around(pre):
    lines = _traceback(pre)
    learned = LearnedPrefixes()
    header = normalize_line(lines[0]).text
    assert learned.learn(header, [normalize_line(x).text for x in lines[1:]])
    got = [normalize_line(x, learned=learned).text for x in lines]
    assert got == [x[len(pre):] for x in lines]


def test_prefix_is_not_learned_without_a_frame_behind_it():
    learned = LearnedPrefixes()
    assert not learned.learn("note: Traceback (most recent call last): was printed", ["note: all good", "other"])
    assert not learned  # nothing learned: normalize_line reads every line as before
    assert normalize_line("note: x", learned=learned).text == "note: x"


def test_known_layers_behind_a_learned_prefix_are_read():
    learned = LearnedPrefixes()
    assert learned.learn("[w3 out] Traceback (most recent call last):", ['[w3 out]   File "a.py", line 1, in f'])
    line = normalize_line("[w3 out] [rank3]: ValueError: x", learned=learned)
    assert (line.rank, line.text) == (3, "ValueError: x")


def test_fatal_python_error_teaches_with_faulthandler_lines():
    learned = LearnedPrefixes()
    assert learned.learn("job.7 Fatal Python error: Segmentation fault", ["job.7 ", "job.7 Current thread 0x1 (most"])
    assert normalize_line("job.7 Thread 0x2 (most recent call first):", learned=learned).text.startswith("Thread")


def test_only_the_unknown_head_of_a_prefix_is_learned_and_the_rank_behind_it_kept():
    pre = "4-task-1-0/0 [default0]:[rank7]: "
    learned = LearnedPrefixes()
    assert learned.learn(pre + "Traceback (most recent call last):", [pre + '  File "a.py", line 1, in f'])
    line = normalize_line("4-task-1-0/0 [default3]:[rank3]: ValueError: x", learned=learned)
    assert (line.local_rank, line.rank, line.text) == (3, 3, "ValueError: x")


def test_exception_group_header_behind_a_prefix_teaches_the_prefix_only():
    assert candidate("job.1 Exception Group Traceback (most recent call last):") == "job.1 "
    assert candidate("Exception Group Traceback (most recent call last):") is None


def test_learning_stops_after_its_attempt_budget():
    from diagnose.normalize import learned as module

    learned = LearnedPrefixes()
    for i in range(module.MAX_ATTEMPTS + 5):
        assert not learned.learn(f"w{'x' * (i % 50)} Traceback (most recent call last):", ["nothing"])
    assert learned.attempts == module.MAX_ATTEMPTS
    assert learned.learn("ok Traceback (most recent call last):", ['ok   File "a.py", line 1, in f']) is False


def test_absl_short_glog_prefix_gives_its_level_and_time():
    """absl's and some job systems' loggers write glog's level and date without the thread id and file:line
    ("E0803 23:08:13.511 iris.job: ..."): the level is kept (a catch-all reads error-level lines by it)."""
    line = normalize_line("E0803 23:08:13.511 iris.job: task j/train/0 exited with signal 15 (SIGTERM)")
    assert (line.level, line.timestamp) == ("E", "0803 23:08:13.511")
    assert line.text == "iris.job: task j/train/0 exited with signal 15 (SIGTERM)"
    for raw in ("E0803 is an error code", "W0803 23:08:13 no fraction", "E0803 23:08:13.511x"):
        assert normalize_line(raw).text == raw


def test_an_exception_line_a_progress_bar_redrew_is_kept():
    """qa-report-19 L9: another thread's tqdm redrew its bar over a traceback's last line before the newline; the
    screen shows the bar, but the line is the exception that ended the run (the log read "No failure found")."""
    bar = " 45%|####      | 45/100 [00:10<00:12,  4.4it/s]"
    line = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert collapse_carriage_returns(line + "\r" + bar) == line
    assert collapse_carriage_returns("torch.OutOfMemoryError: CUDA out of memory.\r\x1b[K" + bar) == (
        "torch.OutOfMemoryError: CUDA out of memory.")
    # a bar's own description is no exception line: the terminal's view stands
    assert collapse_carriage_returns("eval loss: 0.31\r" + bar) == bar
    assert collapse_carriage_returns(bar + "\r" + line) == line
