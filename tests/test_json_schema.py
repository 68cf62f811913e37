"""The JSON Schemas in ``schemas/`` describe what ``--format json`` really prints, and cannot drift.

* the enums in the schemas are the constants of ``diagnose/model.py`` (and of the memory model);
* the definitions shared by the report and check schemas are the same text in both files;
* every sample log's report (with and without replay), a few ``check`` and ``replay`` outputs and a ``slurm`` report
  built with a fake Slurm validate; reports with a key removed, a wrong enum or an unknown key do not;
* ``diagnose schema [report|check|replay]`` prints the files.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")
from jsonschema import Draft202012Validator  # noqa: E402

from diagnose.explain.memory.state import COMPONENTS, OPTIONAL_COMPONENTS, STRATEGIES  # noqa: E402
from diagnose.explain.memory.verdict import VERDICTS  # noqa: E402
from diagnose.model import CATEGORIES, PHASES, REPORT_SCHEMA, ROLES, SAFETIES, SEVERITIES  # noqa: E402
from diagnose.pipeline import AnalyzeOptions, analyze  # noqa: E402
from diagnose.present.cli import main  # noqa: E402
from diagnose.present.json_report import render_json  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCHEMAS = REPO / "schemas"
SAMPLES = REPO / "sample_logs"
LOGS = sorted(p for p in SAMPLES.rglob("*.log") if "reproduce" not in p.relative_to(SAMPLES).parts)
CONFIGS = REPO / "tests" / "data" / "configs"


def _load(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))


REPORT = _load("report-1")
CHECK = _load("check-1")
REPLAY = _load("replay-1")


def _validator(schema: dict) -> Draft202012Validator:
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _errors(schema: dict, doc: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}"
            for e in _validator(schema).iter_errors(doc)]


# ------------------------------------------------------------------------------------------ the schemas


@pytest.mark.parametrize("schema", [REPORT, CHECK, REPLAY], ids=["report", "check", "replay"])
def test_schema_is_valid_draft_2020_12(schema):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_report_enums_are_the_model_constants():
    defs = REPORT["$defs"]
    finding = defs["finding"]["properties"]
    assert defs["category"]["enum"] == list(CATEGORIES)
    assert defs["phase"]["enum"] == list(PHASES)
    assert finding["severity"]["enum"] == list(SEVERITIES)
    assert finding["role"]["enum"] == list(ROLES)
    assert defs["fix"]["properties"]["safety"]["enum"] == list(SAFETIES)
    assert finding["category"] == {"$ref": "#/$defs/category"} and finding["phase"] == {"$ref": "#/$defs/phase"}
    assert REPORT["properties"]["schema"] == {"const": REPORT_SCHEMA}


def test_memory_enums_are_the_memory_model_constants():
    for schema in (REPORT, CHECK):
        assert schema["$defs"]["strategy"]["enum"] == list(STRATEGIES)
        assert list(schema["$defs"]["components"]["properties"]) == list(COMPONENTS + OPTIONAL_COMPONENTS)
        assert schema["$defs"]["components"]["required"] == list(COMPONENTS)
    assert REPORT["$defs"]["memory"]["properties"]["verdict"]["enum"] == list(VERDICTS)


def test_schema_names_are_the_commands():
    from diagnose.checking import CHECK_SCHEMA, REPLAY_SCHEMA
    from diagnose.present.commands import schema

    assert CHECK["properties"]["schema"] == {"const": CHECK_SCHEMA}
    assert REPLAY["properties"]["schema"] == {"const": REPLAY_SCHEMA}
    for file_name, document_schema in schema.SCHEMAS.values():
        on_disk = json.loads((SCHEMAS / file_name).read_text(encoding="utf-8"))
        assert on_disk["properties"]["schema"] == {"const": document_schema}


SHARED = ("category", "phase", "strategy", "components", "override", "violation", "render", "fit", "replay")


@pytest.mark.parametrize("name", SHARED)
def test_definitions_shared_by_report_and_check_are_identical(name):
    assert REPORT["$defs"][name] == CHECK["$defs"][name]


@pytest.mark.parametrize("name", [*(n for n in SHARED if n in REPLAY["$defs"]), "config", "config_value"])
def test_definitions_shared_by_report_and_replay_are_identical(name):
    assert REPORT["$defs"][name] == REPLAY["$defs"][name]


def test_objects_fixed_by_the_model_are_closed():
    defs = REPORT["$defs"]
    assert REPORT["additionalProperties"] is False
    for name in ("input", "finding", "evidence", "fix", "override", "env_var", "config", "config_value",
                 "violation", "render", "components"):
        assert defs[name].get("additionalProperties") is False, name
        assert set(defs[name]["required"]) <= set(defs[name]["properties"]), name


# ------------------------------------------------------------------------------------------ real output


def _report_doc(log: Path, replay: bool) -> dict:
    report = analyze([str(log)], AnalyzeOptions(jobs=1, replay=replay))
    return json.loads(render_json(report))  # what --format json prints


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "no-replay"])
@pytest.mark.parametrize("log", LOGS, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_every_sample_logs_report_validates(log, replay):
    doc = _report_doc(log, replay)
    assert _errors(REPORT, doc) == []
    # what a schema cannot say: root_cause indexes findings
    assert doc["root_cause"] is None or doc["root_cause"] < len(doc["findings"])
    if not replay:
        assert doc["replay"] is None and doc["memory"] is None


def test_the_sample_logs_exercise_the_optional_sections():
    """Enough of the schema is checked against real data: some reports have each section."""
    docs = [_report_doc(SAMPLES / name, True) for name in ("ddp_wrap_oom.log", "fsdp2_pg_collection.log")]
    assert all(d["config"] is not None for d in docs)
    assert any(d["memory"] is not None for d in docs) and any(d["replay"] is not None for d in docs)


def test_analyze_json_on_the_command_line_validates(capsys):
    code = main(["analyze", str(SAMPLES / "ddp_wrap_oom.log"), "--format", "json", "--no-progress"])
    assert code == 1
    assert _errors(REPORT, json.loads(capsys.readouterr().out)) == []


@pytest.mark.parametrize(
    "config, extra",
    [
        ("run_config.yaml", ["--gpus", "8"]),
        ("llama8b_bridge.yaml", ["--gpus", "8", "--gpu", "h100-80gb"]),
        ("mlm_arguments.log", ["--gpus", "8"]),
        ("llama8b_bridge.yaml", ["--gpus", "6", "--set", "model.tensor_model_parallel_size=4"]),  # fails validation
        # QA2 #7: the fp8 and cuda_graphs components were not in the schema
        ("llama8b_bridge.yaml", ["--gpus", "8", "--set", "model.fp8=hybrid", "--set", "model.use_te_rng_tracker=true",
                                 "--set", "model.cuda_graph_impl=transformer_engine"]),
    ],
)
def test_check_output_validates(capsys, config, extra):
    code = main(["check", str(CONFIGS / config), *extra, "--format", "json"])
    assert code in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert _errors(CHECK, doc) == []
    assert doc["replay"]["passes"] == (not doc["replay"]["violations"])


@pytest.mark.parametrize(
    "argv",
    [
        [str(CONFIGS / "run_config.yaml"), "--bridge-version", "0.4.2"],  # reproduced, fix suggested
        [str(CONFIGS / "llama8b_bridge.yaml"), "--set", "ddp.use_megatron_fsdp=true", "--set", "checkpoint.save=/c",
         "--set", "env.NCCL_DEBUG=INFO"],  # extended fix, an env var
        [str(CONFIGS / "mlm_arguments.log")],  # Megatron-LM
        [str(SAMPLES / "ddp_wrap_oom.log")],  # a log: the root cause's fix, with the memory fit
    ],
)
def test_replay_output_validates(capsys, argv):
    assert main(["replay", *argv, "--format", "json"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert _errors(REPLAY, doc) == []
    broken = copy.deepcopy(doc)
    del broken["requested_passes"]
    assert _errors(REPLAY, broken) != []


def _fake_slurm(tmp_path: Path):
    """A failed one-task batch job whose output is the sample OOM log; sacct refuses (accounting disabled)."""
    from diagnose.ingest.slurm.commands import CommandResult

    out = tmp_path / "train-77.out"
    out.write_bytes((SAMPLES / "ddp_wrap_oom.log").read_bytes())
    record = (f"JobId=77 JobName=train UserId=me(1000) JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 "
              f"DerivedExitCode=0:0 RunTime=00:03:05 TimeLimit=01:00:00 NodeList=gpu01 BatchHost=gpu01 NumTasks=1 "
              f"BatchFlag=1 WorkDir={tmp_path} StdErr={out} StdOut={out}")

    def runner(argv):
        if argv[:3] == ["scontrol", "write", "batch_script"]:
            return CommandResult(argv, 1, "", "error: job script not found")
        if argv[0] == "scontrol":
            return CommandResult(argv, 0, record + "\n", "")
        return CommandResult(argv, 1, "", "sacct: error: accounting storage is disabled")

    return runner


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "no-replay"])
def test_slurm_report_validates(tmp_path, replay):
    from diagnose.ingest.slurm.jobid import parse_job_id
    from diagnose.slurm_diagnosis import diagnose_job

    report = diagnose_job(parse_job_id("77"), AnalyzeOptions(replay=replay), runner=_fake_slurm(tmp_path)).report
    doc = json.loads(render_json(report))
    assert doc["slurm"]["job_id"] == "77" and doc["slurm"]["state"] == "FAILED"
    assert any(f["category"] == "slurm" for f in doc["findings"])
    assert _errors(REPORT, doc) == []


# ------------------------------------------------------------------------------------------ broken reports


@pytest.fixture(scope="module")
def good_report() -> dict:
    doc = _report_doc(SAMPLES / "ddp_wrap_oom.log", True)
    assert doc["findings"] and doc["replay"] and doc["memory"] and doc["config"]
    return doc


def _del(path):
    def edit(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return edit


def _set(path, value):
    def edit(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


BROKEN = {
    "no findings key": _del(["findings"]),
    "finding without severity": _del(["findings", 0, "severity"]),
    "evidence without line": _del(["findings", 0, "evidence", 0, "line"]),
    "replay without render": _del(["replay", "render"]),
    "memory without verdict": _del(["memory", "verdict"]),
    "severity not an enum value": _set(["findings", 0, "severity"], "fatal"),
    "role not an enum value": _set(["findings", 0, "role"], "primary"),
    "category not an enum value": _set(["findings", 0, "category"], "oom"),
    "phase not an enum value": _set(["findings", 0, "phase"], "backward"),
    "safety not an enum value": _set(["findings", 0, "fix", "safety"], "maybe"),
    "verdict not an enum value": _set(["memory", "verdict"], "too_big"),
    "unknown key in a finding": _set(["findings", 0, "colour"], "red"),
    "unknown top-level key": _set(["extra"], 1),
    "root_cause as text": _set(["root_cause"], "0"),
    "confidence above 1": _set(["findings", 0, "confidence"], 1.5),
    "rank as text": _set(["findings", 0, "ranks"], ["0"]),
    "another schema name": _set(["schema"], "diagnose/report@2"),
    "empty warnings list": _set(["warnings"], []),
    "override without key": _set(["replay", "fix"], [{"value": True}]),
}


@pytest.mark.parametrize("edit", BROKEN.values(), ids=BROKEN.keys())
def test_broken_report_fails_validation(good_report, edit):
    assert _errors(REPORT, good_report) == []
    doc = copy.deepcopy(good_report)
    edit(doc)
    assert _errors(REPORT, doc) != []


def test_broken_check_output_fails_validation(capsys):
    main(["check", str(CONFIGS / "run_config.yaml"), "--gpus", "8", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert _errors(CHECK, doc) == []
    for edit in (_del(["replay", "passes"]), _set(["memory", "plans"], []),
                 _set(["memory", "plans", 0, "strategy"], "zero3"), _set(["schema"], REPORT_SCHEMA)):
        broken = copy.deepcopy(doc)
        edit(broken)
        assert _errors(CHECK, broken) != []


# ------------------------------------------------------------------------------------------ the command


@pytest.mark.parametrize("argv, name", [(["schema"], "report-1"), (["schema", "report"], "report-1"),
                                        (["schema", "check"], "check-1"), (["schema", "replay"], "replay-1")])
def test_schema_command_prints_the_file(capsys, argv, name):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out == (SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8")
    assert json.loads(out)["$id"].endswith(name)


def test_schema_command_writes_a_file(tmp_path, capsys):
    dest = tmp_path / "report.schema.json"
    assert main(["schema", "--output", str(dest)]) == 0
    assert capsys.readouterr().out == ""
    assert json.loads(dest.read_text()) == REPORT


def test_schema_command_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert main(["schema", "nope"]) == 2  # main() returns a usage error's code (issue 19), the CLI exits with it
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice" in err
    assert main(["schema", "-o", str(tmp_path / "missing" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diagnose: error: cannot write") and err.count("\n") == 1


def test_installed_layout_ships_the_schemas():
    """A wheel carries schemas/ as diagnose/_schemas (pyproject package-data), as it does rules/."""
    from diagnose.present.commands.schema import schemas_dir

    link = REPO / "diagnose" / "_schemas"
    assert link.is_symlink() and link.resolve() == SCHEMAS.resolve()
    assert schemas_dir().resolve() == SCHEMAS.resolve()
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"_schemas/*.json"' in pyproject


def test_a_worded_override_in_a_proven_fix_is_written_as_key_and_value():
    """An fp16 Megatron-LM job's "grads reduced in fp16" plan carries its own Megatron-LM words (WordedOverride.mlm);
    chosen as a finding's proven fix, it is written as any override is: the schema's override has key and value."""
    from diagnose.model import Fix, WordedOverride

    report = analyze([str(SAMPLES / "ddp_wrap_oom.log")], AnalyzeOptions(replay=False))
    root = report.root
    assert root is not None
    root.proven_fix = Fix(summary="reduce grads in fp16", safety="unsafe",
                          overrides=[WordedOverride("ddp.grad_reduce_in_fp32", False,
                                                    "(remove --accumulate-allreduce-grads-in-fp32)")])
    doc = json.loads(render_json(report))
    fix = doc["findings"][doc["root_cause"]]["fix"]
    assert fix["overrides"] == [{"key": "ddp.grad_reduce_in_fp32", "value": False}]
    assert _errors(REPORT, doc) == []
