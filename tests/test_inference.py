"""Categories from the evidence (rules' [[infer]] tables, diagnose/match/inference.py): every table's examples, the
first-match order, and the whole path through the matcher (a generic exception whose frames decide)."""

from __future__ import annotations

import pytest
import regex

from diagnose.match import inference, load_catalogue, match_text
from diagnose.match.inference import (
    exception_type,
    infer,
    raised_in_library,
    raising_package,
    refused_unlike_listed,
    release_named_before,
)
from diagnose.match.rules import parse_inference

CATALOGUE = load_catalogue()
EXAMPLES = [(inf.code, ex) for inf in CATALOGUE.inferences for ex in inf.examples]


def test_the_catalogue_has_inference_tables_with_examples():
    assert len(CATALOGUE.inferences) >= 15
    assert not CATALOGUE.errors
    assert all(inf.examples for inf in CATALOGUE.inferences), [i.code for i in CATALOGUE.inferences if not i.examples]
    codes = [inf.code for inf in CATALOGUE.inferences]
    assert len(codes) == len(set(codes))


def _captured_exc_type(code: str, line: str) -> str:
    """The ``exc_type`` the rule ``code`` captures from ``line`` (its patterns, or the line ending a traceback): the
    fact the engine gives ``infer``."""
    rule = next(r for r in CATALOGUE.rules if r.code == code)
    for rx in [p.regex for p in rule.patterns] + [rule.context.traceback_ends_with]:
        m = regex.search(rx, line) if rx else None
        if m is not None and m.groupdict().get("exc_type"):
            return m.group("exc_type")
    return ""


@pytest.mark.parametrize(("code", "example"), EXAMPLES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(EXAMPLES)])
def test_every_inference_example(code, example):
    rule = example.get("rule", "PY001")  # a table limited to some generic rules names one in its examples
    got = infer(CATALOGUE.inferences, rule, example["line"], example.get("frames", []), example.get("phase", "unknown"),
                example.get("release", ""), _captured_exc_type(rule, example["line"]))
    expected = example["category"]
    if expected == "none":
        assert got is None or got.inference.code != code, f"{code} should not decide {example['line']!r}"
    else:
        assert got is not None, f"nothing inferred for {example['line']!r}"
        assert got.inference.category == expected, got.basis


def test_first_table_in_order_decides():
    # a disk-full error inside checkpoint code is an I/O failure (IF004 comes before the frames of IF020)
    frames = ['File "/opt/m/megatron/core/dist_checkpointing/strategies/filesystem_async.py", line 3, in write']
    got = infer(CATALOGUE.inferences, "PY001", "OSError: [Errno 28] No space left on device", frames, "checkpoint_save")
    assert got is not None and got.inference.code == "IF004"


def test_helpers():
    assert exception_type("torch.distributed.DistNetworkError: timed out") == "torch.distributed.DistNetworkError"
    assert exception_type("the job failed") == ""
    assert raised_in_library(['File "/usr/lib/python3/dist-packages/x.py", line 1, in f'])
    assert not raised_in_library(['File "/usr/lib/python3/dist-packages/x.py", line 1, in f', 'File "train.py", line 2'])


def test_a_windows_traceback_is_read_as_library_code_too():
    assert raised_in_library([r'File "C:\Users\u\envs\yolo\lib\site-packages\ultralytics\cfg\__init__.py", line 4, in f'])
    assert not raised_in_library([r'File "D:\work\proj\train.py", line 2, in main'])


@pytest.mark.parametrize(("line", "unlike"), [
    ("SyntaxError: 'save_period' is not a valid YOLO argument. Similar arguments are ['save_hybrid', 'save_crop'].", True),
    ("SyntaxError: 'copy_paste_mode' is not a valid YOLO argument. Similar arguments are i.e. ['copy_paste=0.0'].", True),
    ("SyntaxError: 'compile' is not a valid YOLO argument. ", True),
    ("ValueError: adalomo is not a valid OptimizerNames, please select one of ['adamw_hf', 'adamw_torch', 'sgd']", True),
    # typos of a listed name (case, spaces, a default after '=', up to two edits) are configuration
    ("SyntaxError: 'momentum ' is not a valid YOLO argument. Similar arguments are i.e. ['momentum=0.937'].", False),
    ("SyntaxError: 'imgsize' is not a valid YOLO argument. Similar arguments are i.e. ['imgsz=640'].", False),
    ("ValueError: COSINE_WITH_MIN_LR is not a valid SchedulerType, please select one of ['linear', 'cosine_with_min_lr']", False),
    ("ValueError: lr_scheduler_type must be one of ['linear', 'cosine', 'constant'], got 'cosin'", False),
    ("ValueError: lr_scheduler_type must be one of ['linear', 'cosine', 'constant'], got 'onecycle'", True),
    ("vllm: error: argument --reasoning-parser: invalid choice: 'qwen3' (choose from 'deepseek_r1', 'granite')", True),
    ("vllm: error: argument --dtype: invalid choice: 'bfloat' (choose from 'auto', 'half', 'bfloat16')", False),
    ("x: error: argument --algo: invalid choice: 'gkd' (choose from 'dpo', 'kto')", True),  # short: one edit at most
    ("x: error: argument --algo: invalid choice: 'ppo' (choose from 'dpo', 'kto')", False),
    # an unquoted refused value after "got" / "method:" is read too
    ("ValueError: Unknown quantization type, got fp8 - supported types are: ['awq', 'gptq', 'fbgemm_fp8']", True),
    ("ValueError: Unknown quantization type, got gptqq - supported types are: ['awq', 'gptq']", False),
    ("ValueError: Unknown quantization method: fp8. Must be one of ['aqlm', 'awq', 'fbgemm_fp8']", True),
    ("RuntimeError: something failed", False),  # no refused name to read
])
def test_a_refused_name_unlike_every_listed_one_is_not_a_typo(line, unlike):
    assert refused_unlike_listed(line) is unlike


def test_the_release_of_the_package_that_raised_is_read_from_earlier_lines():
    assert raising_package(['File "/env/lib/python3.10/site-packages/datasets/builder.py", line 5, in f']) == "datasets"
    assert raising_package(['File "/home/u/train.py", line 5, in f']) == ""
    log = (b"2024-07-18 | INFO | dspy 2.4.12, datasets 2.14.6, python 3.10\n"
           b"Successfully installed thop-0.1.1 ultralytics-8.0.20\n"
           b"Requirement already satisfied: transformers<5.0.0,>=4.34.0 in ./venv (from x) (4.35.2)\n"
           b"INFO: PyTorch version 2.2.0 available.\n  File \"/env/site-packages/datasets/load.py\", line 2\n")
    assert release_named_before(log, len(log), "datasets") == "datasets 2.14.6"
    assert release_named_before(log, len(log), "ultralytics") == "ultralytics 8.0.20"
    assert release_named_before(log, len(log), "transformers") == ""  # a requirement range is no installed release
    assert release_named_before(log, len(log), "torch") == ""  # "PyTorch version" is not the torch package's name
    assert release_named_before(log, 10, "datasets") == ""  # only lines before the error count


def test_the_release_memo_gives_the_answers_of_a_fresh_search(monkeypatch):
    monkeypatch.setattr(inference, "RELEASE_LOOKBACK_BYTES", 100)
    log = b"x" * 50 + b" datasets 2.14.6 " + b"y" * 200 + b" datasets==2.19.0 " + b"z" * 30
    memo: dict = {}
    for start in (80, 200, 300, len(log), 80):
        assert release_named_before(log, start, "datasets", memo) == release_named_before(log, start, "datasets")
    assert release_named_before(log, 200, "datasets") == ""  # the 2.14.6 mention is too far back


def test_a_table_without_a_condition_or_with_other_as_category_is_refused():
    with pytest.raises(ValueError, match="no condition"):
        parse_inference({"code": "IF999", "category": "data", "why": "x"}, "t")
    with pytest.raises(ValueError, match="but 'other'"):
        parse_inference({"code": "IF999", "category": "other", "why": "x", "text_any": ["x"]}, "t")
    with pytest.raises(ValueError, match="refused_unlike_listed"):
        parse_inference({"code": "IF999", "category": "data", "why": "x", "text_any": ["x"], "refused_unlike_listed": 1}, "t")


LOG = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/pretrain_gpt.py", line 40, in <module>
[rank0]:     pretrain(train_valid_test_datasets_provider, model_provider)
[rank0]:   File "/opt/megatron-lm/megatron/training/training.py", line 350, in pretrain
[rank0]:     save_checkpoint(iteration, model, optimizer, opt_param_scheduler)
[rank0]:   File "/opt/megatron-lm/megatron/training/checkpointing.py", line 512, in save_checkpoint
[rank0]:     state_dict = generate_state_dict(args, model, optimizer)
[rank0]:   File "/opt/megatron-lm/megatron/core/optimizer/distrib_optimizer.py", line 1204, in sharded_state_dict
[rank0]:     x = param.to_local()
[rank0]: AttributeError: 'Tensor' object has no attribute 'to_local'
"""


def test_a_generic_exception_gets_its_category_from_the_frames_and_says_so():
    report = match_text(LOG, CATALOGUE)
    root = report.root
    assert root is not None and root.rule == "PY001"
    assert root.category == "checkpoint_format"
    assert root.basis == "inferred" and root.basis_detail.startswith("IF020")
    assert root.basis_detail.endswith('distrib_optimizer.py", line 1204, in sharded_state_dict)')
    assert 0.3 < root.confidence < 0.8
    assert report.to_dict()["findings"][0]["basis"] == "inferred"


def test_a_specific_rule_keeps_its_own_category_and_basis():
    report = match_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n", CATALOGUE)
    assert report.root is not None and report.root.basis == "rule" and report.root.category == "cuda_oom"


TIMEOUT_THEN_ABORT = """\
[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800300 milliseconds before timing out.
[E ProcessGroupNCCL.cpp:414] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data. To avoid this inconsistency, we are taking the entire process down.
terminate called after throwing an instance of 'std::runtime_error'
  what():  [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800300 milliseconds before timing out.
"""

ERROR_THEN_TIMEOUT = """\
[rank3]: Traceback (most recent call last):
[rank3]:   File "/home/u/train.py", line 3, in <module>
[rank3]: ValueError: my own check failed
[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800300 milliseconds before timing out.
"""


def test_a_generic_error_after_the_watchdog_timeout_is_part_of_the_cascade():
    root = match_text(TIMEOUT_THEN_ABORT, CATALOGUE).root
    assert root is not None and root.category == "nccl_timeout", root


def test_a_generic_error_before_the_timeout_stays_the_root():
    root = match_text(ERROR_THEN_TIMEOUT, CATALOGUE).root
    assert root is not None and root.rule == "PY001" and root.ranks == [3]


def test_a_catch_all_speaks_only_when_nothing_else_did_and_says_so():
    # (a port error has its own rule now, HW050: a WARN no rule knows is the catch-all's)
    only_warn = "gpu7:77:88 [0] transport/net_ib.cc:818 NCCL WARN NET/IB : Got async event : local work queue catastrophic error\n"
    root = match_text(only_warn, CATALOGUE).root
    assert root is not None and root.rule == "PY007" and root.basis == "catchall" and root.severity == "error"
    with_error = only_warn + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    root = match_text(with_error, CATALOGUE).root
    assert root is not None and root.category == "cuda_oom"


def test_known_harmless_lines_never_make_a_failure():
    clean = (
        "slurmstepd: error: _is_a_lwp: open() /proc/121771/status failed: No such file or directory\n"
        "node01:1234:5678 [0] misc/ibvwrap.cc:110 NCCL WARN Call to ibv_open_device failed\n"
        "==== job finished with exit code 0 ====\n"
    )
    assert match_text(clean, CATALOGUE).root is None


def test_an_nccl_warn_catch_all_names_the_subsystem():
    line = "gpu-7:7713:7928 [0] transport/net_ib.cc:818 NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0\n"
    root = match_text(line, CATALOGUE).root
    assert root is not None and root.facts.get("subsystem") == "network (InfiniBand/RoCE)"


def test_raised_in_reads_only_the_innermost_frame():
    # the DeepSpeed batch check called from transformers' from_pretrained (zero.Init): the check speaks, not the caller
    called_from_load = [
        'File "/env/lib/python3.9/site-packages/transformers/modeling_utils.py", line 2670, in from_pretrained',
        'File "/env/lib/python3.9/site-packages/deepspeed/runtime/config.py", line 883, in _batch_assertion',
    ]
    line = "AssertionError: Check batch related parameters. train_batch_size is not equal to 256 != 8 * 1 * 8"
    got = infer(CATALOGUE.inferences, "PY002", line, called_from_load, "unknown")
    assert got is not None and got.inference.code == "IF082"
    assert got.basis.endswith('config.py", line 883, in _batch_assertion)')
    # the same check one frame further out is not where it was raised: the frames tables decide as before
    outer = list(reversed(called_from_load))
    got = infer(CATALOGUE.inferences, "PY002", line, outer, "unknown")
    assert got is not None and got.inference.code != "IF082"
    inf = parse_inference({"code": "IF999", "category": "data", "why": "x", "raised_in": ["reader.py"]}, "t")
    assert infer([inf], "PY001", "ValueError: x", ['File "/a/reader.py", line 1, in f', 'File "/a/b.py", line 2, in g'], "unknown") is None
    assert infer([inf], "PY001", "ValueError: x", ['File "/a/b.py", line 2, in g', 'File "/a/reader.py", line 1, in f'], "unknown") is not None


def test_a_collective_that_timed_out_is_a_timeout_not_a_launcher_failure():
    # barrier inside transformers' main_process_first: rank 0 was busy longer than the timeout
    frames = ['File "/usr/lib/python3.8/dist-packages/transformers/training_args.py", line 1276, in main_process_first',
              'File "/usr/lib/python3.8/dist-packages/torch/distributed/distributed_c10d.py", line 2776, in barrier']
    got = infer(CATALOGUE.inferences, "PY001", "RuntimeError: Socket Timeout", frames, "init")
    assert got is not None and got.inference.category == "nccl_timeout"
    # the same words while the store is being set up are the launcher's
    got = infer(CATALOGUE.inferences, "PY001", "RuntimeError: Socket Timeout",
                ['File "/t/torch/distributed/rendezvous.py", line 198, in _create_c10d_store'], "init")
    assert got is not None and got.inference.category == "launcher"


def test_text_none_leaves_the_line_to_a_later_table():
    # a signature error at a library call is version skew (IF112) unless it names an FSDP class (IF022 decides)
    frames = ['File "/opt/megatron-lm/megatron/training/training.py", line 560, in get_model']
    skew = "TypeError: VocabParallelEmbedding.__init__() missing 2 required keyword-only arguments: 'init_method' and 'config'"
    fsdp = "TypeError: TorchFullyShardedDataParallel.__init__() got an unexpected keyword argument 'disable_bucketing'"
    got = infer(CATALOGUE.inferences, "PY001", skew, frames, "model_build")
    assert got is not None and got.inference.code == "IF112" and got.inference.category == "import_version"
    got = infer(CATALOGUE.inferences, "PY001", fsdp, frames, "dp_wrap")
    assert got is not None and got.inference.code != "IF112" and got.inference.category == "fsdp_config"


def test_a_bad_text_none_regex_is_refused():
    with pytest.raises(ValueError, match="text_none"):
        parse_inference({"code": "IF999", "category": "data", "why": "x", "text_any": ["x"], "text_none": ["("]}, "t")


RICH_LOG = """\
╭──────────────────── Traceback (most recent call last) ────────────────────╮
│ /work/train.py:58 in <module>                                              │
│                                                                            │
│ ❱ 58 │   model = LlamaForCausalLM.from_pretrained(path, config=config)     │
│                                                                            │
│ /env/lib/python3.10/site-packages/collie/models/base.py:305 in from_pretra │
│ ined                                                                       │
│                                                                            │
│ /env/lib/python3.10/site-packages/collie/models/llama/m                    │
│ odel.py:235 in __init__                                                    │
│                                                                            │
│ ❱ 235 │   │   self.embed_tokens = tensor_parallel.VocabParallelEmbedding(  │
╰────────────────────────────────────────────────────────────────────────────╯
TypeError: VocabParallelEmbedding.__init__() missing 2 required keyword-only arguments: 'init_method' and 'config'
"""


def test_a_rich_boxed_traceback_gives_its_frames_to_the_inference():
    # the innermost frame (collie, an installed package) calls megatron-core with an old signature: version skew,
    # even though an outer frame (from_pretrained) would otherwise say checkpoint loading
    report = match_text(RICH_LOG, CATALOGUE)
    root = report.root
    assert root is not None and root.rule == "PY001"
    assert root.category == "import_version" and root.basis_detail.startswith("IF112")


def test_phase_when_unknown_gives_set_up_failures_a_phase_but_never_overrides_a_told_one():
    cfg = "pydantic_core._pydantic_core.ValidationError: 3 validation errors for TrainConfig\n"
    report = match_text("Traceback (most recent call last):\n  File \"/w/train.py\", line 3, in <module>\n" + cfg, CATALOGUE)
    assert report.root is not None and report.root.category == "config_validation" and report.root.phase == "init"
    told = (
        "Traceback (most recent call last):\n"
        '  File "/opt/megatron-lm/megatron/training/checkpointing.py", line 512, in save_checkpoint\n' + cfg
    )
    report = match_text(told, CATALOGUE)
    assert report.root is not None and report.root.phase == "checkpoint_save"


def test_a_bad_phase_when_unknown_is_refused():
    with pytest.raises(ValueError, match="phase_when_unknown"):
        parse_inference({"code": "IF999", "category": "data", "why": "x", "text_any": ["x"], "phase_when_unknown": "later"}, "t")


PYTEST_LOG = """\
=================================== FAILURES ===================================
_____________________ test_save_load_layout[2-1] ______________________

    def test_save_load_layout(tmp_path_dist_ckpt, tp, pp):
>       loaded = dist_checkpointing.load(sharded_state_dict, ckpt_dir)

tests/unit_tests/pipeline_parallel/test_pipeline_layout.py:212:
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _
megatron/core/dist_checkpointing/serialization.py:148: in load
    loaded_state_dict = sharded_strategy.load(sharded_state_dict, checkpoint_dir)
megatron/core/dist_checkpointing/strategies/torch.py:890: in load
    checkpoint.load(
>           return func(args[0], **kwargs)
E           TypeError: load() got an unexpected keyword argument 'no_dist'

/usr/local/lib/python3.12/dist-packages/torch/distributed/checkpoint/utils.py:438: TypeError
=========================== short test summary info ============================
FAILED tests/unit_tests/pipeline_parallel/test_pipeline_layout.py::test_save_load_layout[2-1] - TypeError: load() got an unexpected keyword argument 'no_dist'
"""


def test_a_pytest_failure_report_is_read_like_a_traceback():
    # the E line is the exception; the report's call locations (innermost: the raise site in torch) are its frames
    report = match_text(PYTEST_LOG, CATALOGUE)
    root = report.root
    assert root is not None and root.rule == "PY140"
    assert root.category == "import_version" and root.basis_detail.startswith("IF112")
    assert root.phase == "checkpoint_load"  # from the dist_checkpointing frames of the report


def test_a_pytest_line_without_its_report_header_has_no_frames():
    lone = "E           TypeError: load() got an unexpected keyword argument 'no_dist'\n"
    root = match_text(lone, CATALOGUE).root
    assert root is not None and root.rule == "PY140" and root.category != "import_version"


RAY_LOG = """\
Traceback (most recent call last):
  File "/opt/nemo-rl/examples/run_dpo.py", line 294, in main
    ) = setup(master_config, tokenizer, train_dataset, val_dataset)
  File "/opt/nemo-rl/nemo_rl/distributed/worker_groups.py", line 648, in _create_workers_from_bundle_indices
    workers = ray.get(worker_refs)
  File "/opt/venv/lib/python3.12/site-packages/ray/_private/worker.py", line 970, in get_objects
    raise value
ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, ray::lm_policy-1-0:MegatronPolicyWorker.__init__() (pid=1081, ip=10.0.3.22, actor_id=7c1e, repr=MegatronPolicyWorker[rank=8])
  File "/opt/nemo-rl/nemo_rl/models/megatron/setup.py", line 188, in setup_megatron_model
    raise FileNotFoundError(
FileNotFoundError: Pretrained run config not found at /cache/nemo_rl/model_x/iter_0000000/run_config.yaml on rank=8.
"""


def test_ray_relay_header_leaves_the_category_to_the_remote_exception():
    # the driver's frames (a tokenizer argument in a call) would file the relay header as data; the remote
    # exception after it says what failed
    report = match_text(RAY_LOG, CATALOGUE)
    root = report.root
    assert root is not None and root.rule == "PY001"
    assert root.category == "checkpoint_io" and root.basis_detail.startswith("IF280")
    assert any(f.rule == "EC140" and f.role == "context" for f in report.findings)


def test_raised_none_leaves_a_frame_to_other_tables():
    """``raised_none``: a table does not decide when the innermost frame contains one of these substrings."""
    table = parse_inference({
        "code": "IF999", "category": "import_version", "why": "w", "exc_types": ["TypeError"],
        "raised_none": ["instantiate"],
        "examples": [{"line": "TypeError: x", "category": "import_version"}],
    }, "t")
    line = "TypeError: __init__() missing 1 required positional argument: 'optimizer'"
    built = ['File "/home/u/proj/utils/config.py", line 12, in instantiate_from_config return cls(cfg)']
    called = ['File "/home/u/proj/tools/convert.py", line 40, in main model = model_provider(']
    assert infer([table], "PY001", line, built, "unknown") is None
    got = infer([table], "PY001", line, called, "unknown")
    assert got is not None and got.inference.code == "IF999"
    assert table.raised_none == ["instantiate"]


def test_frames_none_leaves_any_frame_on_that_path_to_other_tables():
    """``frames_none``: a table does not decide when ANY frame (not only the innermost) contains one of these."""
    table = parse_inference({
        "code": "IF999", "category": "checkpoint_io", "why": "w", "text_any": ["Input/output error"],
        "frames_none": ["build_train_dataloader"],
        "examples": [{"line": "OSError: [Errno 5] Input/output error", "category": "checkpoint_io"}],
    }, "t")
    line = "OSError: [Errno 5] Input/output error"
    data = ['File "/code/proj/data/__init__.py", line 99, in build_train_dataloader',
            'File "/env/lib/python3.10/site-packages/numpy/core/memmap.py", line 230, in __new__']
    ckpt = ['File "/code/proj/checkpointing.py", line 40, in save_checkpoint']
    assert infer([table], "PY001", line, data, "unknown") is None
    got = infer([table], "PY001", line, ckpt, "unknown")
    assert got is not None and got.inference.code == "IF999"
    assert table.frames_none == ["build_train_dataloader"]


def test_an_io_error_while_building_the_dataloader_is_the_data_paths_not_a_checkpoints():
    # IF004 (file system -> checkpoint_io) steps aside for data frames; IF357 names the data path
    line = "OSError: [Errno 5] Input/output error"
    data = ['File "/code/OLMo/olmo/data/__init__.py", line 99, in build_train_dataloader',
            'File "/env/lib/python3.10/site-packages/numpy/core/memmap.py", line 230, in __new__']
    got = infer(CATALOGUE.inferences, "PY001", line, data, "unknown")
    assert got is not None and got.inference.code == "IF357" and got.inference.category == "data"
    plain = infer(CATALOGUE.inferences, "PY001", line, [], "unknown")
    assert plain is not None and plain.inference.code == "IF004"


def test_a_windows_tracebacks_frames_match_the_same_path_needles():
    # the frames of a traceback printed on Windows use backslashes: the tables' path needles ("datasets/builder.py")
    # must read them as they read a Linux traceback
    frames = [r'File "C:\Users\u\envs\lf\lib\site-packages\datasets\builder.py", line 1985, in _prepare_split_single']
    got = infer(CATALOGUE.inferences, "PY001", "json.decoder.JSONDecodeError: Expecting ',' delimiter", frames, "unknown")
    linux = [f.replace("\\", "/") for f in frames]
    want = infer(CATALOGUE.inferences, "PY001", "json.decoder.JSONDecodeError: Expecting ',' delimiter", linux, "unknown")
    assert got is not None and want is not None
    assert got.inference.code == want.inference.code
    assert got.inference.category == "data"


RELEASE_LOG = """\
Successfully installed datasets-2.14.6
Traceback (most recent call last):
  File "/home/u/train.py", line 3, in <module>
    load_dataset("hotpot_qa", "fullwiki", trust_remote_code=True)
  File "/env/lib/python3.10/site-packages/datasets/builder.py", line 539, in _create_builder_config
    raise ValueError(msg)
ValueError: BuilderConfig BuilderConfig(name='fullwiki', version=1.0.0) doesn't have a 'trust_remote_code' key.
"""


def test_the_release_before_a_generic_error_is_looked_up_only_when_a_table_reads_it(monkeypatch):
    from conftest import make_rule

    from diagnose.match import engine
    from diagnose.match.compiled import compile_catalogue
    from diagnose.match.rules import Catalogue

    generic = make_rule("PY1", "Error: ", r"\w+Error: .*")
    named = parse_inference({"code": "IF1", "category": "import_version", "why": "a release is named",
                             "library_frame": True, "release_named": True}, "t")
    data = parse_inference({"code": "IF2", "category": "data", "why": "datasets raised",
                            "frames_any": ["site-packages/datasets/"]}, "t")
    reads, ignores = Catalogue([generic], inferences=[named, data]), Catalogue([generic], inferences=[data])
    assert compile_catalogue(reads).reads_releases and not compile_catalogue(ignores).reads_releases
    root = match_text(RELEASE_LOG, reads).root
    assert root.category == "import_version" and "the log names datasets 2.14.6" in root.basis_detail

    calls: list = []
    monkeypatch.setattr(engine, "release_named_before", lambda *args: calls.append(args) or "")
    assert match_text(RELEASE_LOG, ignores).root.category == "data" and calls == []  # no table asks: no search
    assert match_text(RELEASE_LOG, reads).root.category == "data" and len(calls) == 1  # a table asks: searched


def test_an_evaluation_loop_named_validate_is_not_a_configuration_check():
    """``validate`` is what trainers call their evaluation loop (litgpt's pretrain, Lightning's ``Trainer.validate``):
    a crash inside it is not a configuration check refusing the job's settings, whereas Bridge's
    ``ConfigContainer.validate`` and Megatron's ``validate_args`` are."""
    eval_loop = [
        'File "/opt/litgpt/litgpt/pretrain.py", line 301, in fit',
        'File "/opt/venv/lib/python3.11/site-packages/torch/utils/_contextlib.py", line 116, in decorate_context',
        'File "/opt/litgpt/litgpt/pretrain.py", line 372, in validate',
    ]
    got = infer(CATALOGUE.inferences, "PY001", "RuntimeError: stack expects a non-empty TensorList", eval_loop, "unknown")
    assert got is None or got.inference.category != "config_validation"
    config_check = ['File "/opt/Megatron-Bridge/src/megatron/bridge/training/config.py", line 1210, in validate']
    got = infer(CATALOGUE.inferences, "PY002", "AssertionError: seq_length must be divisible by 2 * context_parallel_size",
                config_check, "unknown")
    assert got is not None and got.inference.category == "config_validation"


def test_raised_match_reads_the_innermost_frame_with_a_regex():
    """``raised_match``: a regex searched in the innermost frame (its function and the source line the traceback
    printed); another frame holding the same text does not count, and a table without a match does not decide."""
    table = parse_inference({
        "code": "IF999", "category": "config_validation", "why": "w", "exc_types": ["AssertionError"],
        "raised_match": [r"\bin __init__\b.*?\bassert\s+[^,]*?%[^,]*?[=!]=\s*0\b"],
        "examples": [{"line": "AssertionError", "category": "config_validation"}],
    }, "t")
    assert table.raised_match == [r"\bin __init__\b.*?\bassert\s+[^,]*?%[^,]*?[=!]=\s*0\b"]
    ctor = ['File "/env/site-packages/mamba_ssm/modules/mamba2.py", line 77, in __init__ assert self.d_ssm % self.headdim == 0']
    got = infer([table], "PY002", "AssertionError", ctor, "model_build")
    assert got is not None and got.inference.code == "IF999" and "assert self.d_ssm" in got.detail
    at_run_time = ['File "/x/verl/utils/seqlen_balancing.py", line 110, in karmarkar_karp assert len(xs) % k == 0']
    assert infer([table], "PY002", "AssertionError", at_run_time, "training") is None
    outer_only = ctor + ['File "/env/site-packages/torch/nn/modules/module.py", line 10, in forward return x']
    assert infer([table], "PY002", "AssertionError", outer_only, "training") is None
    try:
        parse_inference({"code": "IF998", "category": "data", "why": "w", "raised_match": ["("]}, "t")
    except ValueError as e:
        assert "raised_match" in str(e)
    else:
        raise AssertionError("a raised_match regex that does not compile must be refused")


def test_raising_frames_any_reads_only_the_frames_of_the_package_that_raised():
    """``raising_frames_any``: a needle counts in the innermost frame and the frames of the same package right above
    it, not in an outer frame of another package that called the code that raised (IF520: transformers'
    from_pretrained running DeepSpeed's zero.Init)."""
    table = parse_inference({
        "code": "IF999", "category": "checkpoint_format", "why": "w", "raising_frames_any": ["from_pretrained"],
        "examples": [{"line": "KeyError: 'x'", "category": "checkpoint_format"}],
    }, "t")
    assert table.raising_frames_any == ["from_pretrained"]
    line = "TypeError: '>' not supported between instances of 'str' and 'int'"
    hf = 'File "/env/lib/python3.11/site-packages/transformers/modeling_utils.py", line 4986, in from_pretrained'
    hf_inner = 'File "/env/lib/python3.11/site-packages/transformers/modeling_utils.py", line 5300, in _load_pretrained_model'
    ds = ['File "/env/lib/python3.11/site-packages/deepspeed/runtime/zero/partition_parameters.py", line 1013, in __init__',
          'File "/env/lib/python3.11/site-packages/deepspeed/runtime/config.py", line 855, in _batch_assertion']
    user = 'File "/home/u/train.py", line 40, in main'
    assert infer([table], "PY001", line, [user, hf, *ds], "unknown") is None
    got = infer([table], "PY001", line, [user, hf, hf_inner], "unknown")
    assert got is not None and got.inference.code == "IF999" and "from_pretrained" in got.detail
    # the user's own files are one package: a script's from_pretrained that raised itself counts
    own = 'File "/home/u/model.py", line 9, in from_pretrained'
    assert infer([table], "PY001", line, [user, own], "unknown") is not None
    assert infer([table], "PY001", line, [], "unknown") is None
