"""The line that ends a traceback is its exception, whatever its class is called (PY013, context.traceback_ends_with).

PY001 and PY010 read class names ending in Error/Exception or living in an errors module; huggingface_hub's
OfflineModeIsEnabled, a library's ...Denied or ...Timeout end a traceback the same way. PY013 is anchored on the
traceback's header and reads forwards, on the header's stream, to the first line at the margin after the frames.
A Ctrl-C (KeyboardInterrupt) or a sys.exit (SystemExit) ends a program on purpose and is not read; a line another rule
reads is left to that rule (no second finding for one line)."""

from __future__ import annotations

import pytest
from conftest import make_rule

from diagnose.match import match_text
from diagnose.match.engine import TRACEBACK_END_LINES
from diagnose.match.inference import exception_type
from diagnose.match.rules import load_catalogue

CATALOGUE = load_catalogue()
HEADER = "Traceback (most recent call last):"
SAVE_FRAMES = [
    '  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line 2336, in _save_checkpoint',
    "    self.save_model(output_dir, _internal_call=True)",
    '  File "/env/lib/python3.10/site-packages/peft/utils/save_and_load.py", line 146, in get_peft_model_state_dict',
    '    has_remote_config = file_exists(model_id, "config.json")',
    '  File "/env/lib/python3.10/site-packages/huggingface_hub/utils/_http.py", line 77, in send',
    "    raise OfflineModeIsEnabled(",
]
OFFLINE = ("huggingface_hub.utils._http.OfflineModeIsEnabled: Cannot reach https://huggingface.co/org/m/resolve/main/"
           "config.json: offline mode is enabled. To disable it, please unset the `HF_HUB_OFFLINE` environment variable.")
STEP = "{'loss': 0.91, 'learning_rate': 0.0002, 'epoch': 0.25}"
CHILD_FAILED = ("[2024-02-08 21:55:52,087] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) "
                "local_rank: 0 (pid: 4242) of binary: /env/bin/python")


def _findings(lines: list[str]):
    return match_text("\n".join(lines) + "\n", CATALOGUE).findings


def _root(lines: list[str]):
    return next((f for f in _findings(lines) if f.role == "root"), None)


def test_an_exception_named_neither_error_nor_exception_is_the_root_before_the_launchers_summary():
    lines = [STEP, HEADER, *SAVE_FRAMES, OFFLINE, CHILD_FAILED]
    root = _root(lines)
    assert root is not None and root.rule == "PY013"
    assert root.evidence[0].line == len(lines) - 1  # the exception line, not the header
    assert root.phase == "checkpoint_save"  # the save frames above it
    assert root.category == "import_version"  # IF402: the Hub refused a library's request under offline mode


def test_the_end_is_read_on_the_headers_stream_past_other_ranks_lines():
    lines = ["[rank1]: " + HEADER, "[rank0]: starting step 7", '[rank1]:   File "/w/run.py", line 9, in <module>',
             "[rank0]: " + STEP, "[rank1]:     sync()", "[rank1]: mylib.rpc.CallTimeout: peer 3 did not answer"]
    root = _root(lines)
    assert root is not None and root.rule == "PY013" and root.evidence[0].line == 6


@pytest.mark.parametrize("end", ["KeyboardInterrupt", "SystemExit: 0", "SystemExit", "GeneratorExit"])
def test_a_program_ended_on_purpose_is_not_a_failure(end):
    lines = [STEP, HEADER, '  File "/w/train.py", line 99, in <module>', "    raise SystemExit(main())", end]
    assert [f.rule for f in _findings(lines) if f.severity == "error"] == []


@pytest.mark.parametrize("end", ["INFO: retrying in 5 s", "NCCL: ok", "the job went on", "12:00:01 step 3"])
def test_a_log_line_after_the_frames_is_no_exception(end):
    lines = [HEADER, '  File "/w/train.py", line 12, in <module>', "    main()", end]
    assert "PY013" not in [f.rule for f in _findings(lines)]


def test_a_line_another_rule_reads_gives_one_finding():
    lines = [HEADER, '  File "/w/train.py", line 12, in <module>', "    main()", "ValueError: bad value"]
    assert [f.rule for f in _findings(lines)] == ["PY001"]


def test_a_header_without_frames_or_with_a_blank_run_is_not_read():
    assert "PY013" not in [f.rule for f in _findings([HEADER, "WriteDenied: printed as text"])]
    lines = [HEADER, '  File "/w/train.py", line 12, in <module>', "    main()", "", "", "", "WriteDenied: later"]
    assert "PY013" not in [f.rule for f in _findings(lines)]


def test_the_first_link_of_a_chain_is_read_and_the_last_keeps_its_rule():
    lines = [HEADER, '  File "pyarrow/_json.pyx", line 308, in pyarrow._json.read_json',
             "pyarrow.lib.ArrowInvalid: JSON parse error: Missing a comma", "",
             "During handling of the above exception, another exception occurred:", "",
             HEADER, '  File "/env/lib/python3.10/site-packages/datasets/builder.py", line 1973, in _prepare_split',
             "    for _, table in generator:", "datasets.builder.DatasetGenerationError: An error occurred"]
    assert {f.rule: f.evidence[0].line for f in _findings(lines)} == {"PY013": 3, "PY001": 10}


def test_frames_that_never_end_are_read_within_bounds():
    frames = ['  File "/w/r.py", line 1, in f', "    f()"] * (TRACEBACK_END_LINES // 2 + 10)
    assert "PY013" not in [f.rule for f in _findings([HEADER, *frames, "RecursionDepth: never reached"])]


def test_the_exception_type_of_a_traceback_end_is_the_class_name_its_rule_captured():
    root = _root([STEP, HEADER, *SAVE_FRAMES, OFFLINE])
    assert root is not None and root.facts["exc_type"] == "huggingface_hub.utils._http.OfflineModeIsEnabled"
    assert exception_type(OFFLINE, root.facts["exc_type"]) == root.facts["exc_type"]
    assert exception_type("WriteDenied", "WriteDenied") == "WriteDenied"
    assert exception_type("E   mylib.rpc.CallTimeout: peer 3", "mylib.rpc.CallTimeout") == "mylib.rpc.CallTimeout"
    assert exception_type("ValueError: x") == "ValueError"  # the usual endings need no rule's capture
    # what a class name looks like is the rule's to say: no capture, no other name; a capture not starting the line
    # (an echo that quotes the exception) is not the line's type
    assert exception_type(OFFLINE) == ""
    assert exception_type("Pretrain failed on rank=3 with mylib.CallTimeout: x", "mylib.CallTimeout") == ""
    assert exception_type("mylib.CallTimeoutX: x", "mylib.CallTimeout") == ""
    for not_a_class in ("INFO: retrying", "the job failed", "Epoch 3: loss 1.2", "NCCL WARN x"):
        assert exception_type(not_a_class) == ""


def test_a_traceback_ends_with_regex_that_does_not_compile_is_refused():
    with pytest.raises(ValueError, match="traceback_ends_with"):
        make_rule("ZZ950", "Traceback", "^Traceback", context={"traceback_ends_with": "(unclosed"})
