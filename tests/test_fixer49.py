"""fixer49: qa-report-17's left items L5 (score one corpus case), L2 (replay JSON carries the migrated key),
L7 (stack and config.framework agree), L6 (fleet report folds hex suffixes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import accuracy  # noqa: E402

# ------------------------------------------------------------------------------------------ L5: --only

ONE = "a-automodel-qwen3-32b-ce-fp32-upcast-oom"
TWO = "a-bridge-etp-defaults-to-tp-expert-grid-too-big"


def test_only_scores_just_the_cases_asked_and_prints_each_answer(capsys: pytest.CaptureFixture[str]) -> None:
    assert (ROOT / "corpus" / "dev" / f"{ONE}.case.json").exists()
    assert accuracy.main(["--only", ONE, "--only", TWO[:30]]) == 0
    out = capsys.readouterr().out
    assert "== dev: 2 failure logs, 0 clean logs" in out
    assert "2 cases in" in out
    answers = [line for line in out.splitlines() if line.startswith(("  RIGHT ", "  MISS "))]
    assert len(answers) == 2
    assert answers[0].startswith(f"  RIGHT dev/{ONE}: expected cuda_oom/training, got cuda_oom/training, rule ")
    assert "confidence 0." in answers[0] and "evidence hit yes" in answers[0]
    assert answers[1].startswith(f"  RIGHT dev/{TWO}: expected config_validation/init")


def test_only_reads_dev_unless_the_part_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[tuple[str, ...], tuple[str, ...]]] = []

    def fake_run(parts, replay=False, only=()):  # never loads a case: test/ is not read here
        seen.append((parts, only))
        return {p: accuracy.figures([], p) for p in parts}, []

    monkeypatch.setattr(accuracy, "run", fake_run)
    assert accuracy.main(["--only", "x-"]) == 2  # nothing matched: refused, not an empty table
    assert seen[-1] == (("dev",), ("x-",))
    accuracy.main(["--only", "x-", "--part", "test"])
    assert seen[-1] == (("test",), ("x-",))
    accuracy.main([])  # without --only the default stays both parts
    assert seen[-1] == (accuracy.PARTS, ())


def test_load_cases_filters_by_prefix_before_scoring() -> None:
    cases = accuracy.load_cases(("dev",), (ONE, TWO))
    assert [c.id for c in cases] == [ONE, TWO]
    assert all(c.part == "dev" for c in cases)


def test_only_refuses_record_and_writes_nothing(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    record = ROOT / "corpus" / "accuracy.json"
    before = record.read_bytes() if record.exists() else None
    monkeypatch.setattr(accuracy, "run", lambda *a, **k: pytest.fail("a refused run must score nothing"))
    with pytest.raises(SystemExit) as exc:
        accuracy.main(["--only", ONE, "--record"])
    assert exc.value.code == 2
    assert "never recorded" in capsys.readouterr().err
    assert (record.read_bytes() if record.exists() else None) == before


def test_corpus_readme_step_three_uses_only() -> None:
    text = (ROOT / "corpus" / "README.md").read_text(encoding="utf-8")
    step = text.split("## Adding a case", 1)[1].split("\n3. ", 1)[1].split("\n4. ", 1)[0]
    assert "accuracy.py --only <id>" in step


# ------------------------------------------------------------------------------------------ L2: replay JSON migration


def _replay_json(*sets: str) -> dict:
    import json

    from cli_run import run

    args = [a for s in sets for a in ("--set", s)]
    proc = run("replay", "examples/run_config.yaml", "--bridge-version", "0.7.0", *args, "-f", "json", code=(0, 1))
    return json.loads(proc.stdout)


def test_replay_json_carries_the_migration_not_the_refused_moved_key() -> None:
    import json

    from jsonschema import Draft202012Validator

    data = _replay_json("dist.use_megatron_fsdp=true")
    Draft202012Validator(json.loads((ROOT / "schemas" / "replay-1.schema.json").read_text())).validate(data)
    replay = data["replay"]
    assert replay["fix"] == [{"key": "ddp.use_megatron_fsdp", "value": True}]
    assert replay["render"]["cli"] == "ddp.use_megatron_fsdp=true"
    assert replay["render"]["python"] == "cfg.ddp.use_megatron_fsdp = True"
    assert "dist." not in replay["render"]["yaml"]
    assert replay["replaced"] == [{"key": "dist.use_megatron_fsdp", "value": True, "check": "stale_moved_field",
                                   "by": [{"key": "ddp.use_megatron_fsdp", "value": True}]}]
    assert "dist.use_megatron_fsdp is refused" in replay["summary"]
    assert "use ddp.use_megatron_fsdp=true instead" in replay["summary"]
    assert replay["after_fix"]["passes"] is False and data["requested_passes"] is False  # as replayed: unchanged
    # the key it names is what to replay next (replay then extends it until it passes), and nothing is replaced
    again = _replay_json("ddp.use_megatron_fsdp=true")
    assert "replaced" not in again["replay"] and again["replay"]["after_fix"]["passes"] is True
    assert again["replay"]["fix"][0] == {"key": "ddp.use_megatron_fsdp", "value": True}


def test_replaced_is_in_every_schema_that_holds_a_replay_section() -> None:
    import json

    for name in ("replay", "report", "check"):
        schema = json.loads((ROOT / "schemas" / f"{name}-1.schema.json").read_text())
        props = schema["$defs"]["replay"]["properties"]
        assert props["replaced"]["items"]["required"] == ["key", "value", "check", "by"], name


# ------------------------------------------------------------------------------------------ L7: stack vs framework


def test_cascade_sample_stack_and_config_framework_agree() -> None:
    """The log's traceback runs megatron/bridge/training/train.py (`pretrain(config=cfg, ...)`, Bridge's API) under
    `python pretrain_gpt.py --config llama3_70b.yaml`: a Megatron-Bridge job. The script's name alone made the
    config read as Megatron-LM (with `mlm.config: llama3_70b.yaml`) beside stack megatron-bridge."""
    import json

    from cli_run import run

    data = json.loads(run("analyze", "-f", "json", "sample_logs/cascade_512_ranks_oom.log").stdout)
    assert data["stack"] == "megatron-bridge"
    assert data["config"]["framework"] == "megatron-bridge"
    assert "mlm.config" not in data["config"]["values"]
    text = run("analyze", "-v", "sample_logs/cascade_512_ranks_oom.log").stdout
    assert "framework: megatron-lm" not in text and "Release checked: Megatron-LM" not in text


def test_a_config_file_argument_is_bridge_and_megatron_lm_flags_stay_megatron_lm() -> None:
    from diagnose.explain.config.cmdline import parse_command

    for cmd in ("python pretrain_gpt.py --config llama3_70b.yaml",
                "torchrun --nproc-per-node 8 examples/recipes/llama/pretrain_llama3_8b.py --config-file conf/x.yml",
                "python pretrain_gpt.py --config=llama.yaml"):
        assert parse_command(cmd, "log:1").framework == "megatron-bridge", cmd
    for cmd in ("python pretrain_gpt.py --micro-batch-size 2 --seq-length 4096",
                "python pretrain_gpt.py --yaml-cfg gpt.yaml --micro-batch-size 2",
                "python pretrain_gpt.py --config notes.txt --micro-batch-size 2"):
        assert parse_command(cmd, "log:1").framework == "megatron-lm", cmd


def test_config_section_names_a_stack_that_differs_from_the_framework() -> None:
    from diagnose.configview import ConfigView
    from diagnose.present.section_lines import config_lines

    view = ConfigView()
    view.framework = "megatron-lm"
    view.sources.append("log:3 Megatron-LM arguments")
    lines = config_lines(view, "megatron-bridge")
    assert lines[lines.index("framework: megatron-lm") + 1].startswith("stack: megatron-bridge  (")
    assert not any(line.startswith("stack:") for line in config_lines(view, "megatron-lm"))
    assert not any(line.startswith("stack:") for line in config_lines(view, None))


# ------------------------------------------------------------------------------------------ L6: fleet CONFIGS folding


def test_config_key_folds_hex_ids_and_keeps_words() -> None:
    from diagnose.fleet.record import config_key

    assert config_key("fleet-mix-3-9a4bb") == config_key("fleet-mix-12-1cdf2") == "fleet-mix-#-#"
    assert config_key("job_1f3c2d7") == "job_#"
    assert config_key("train-7b-12") == "train-#b-#"  # digits only, as before
    assert config_key("deadbeef-run-3") == "deadbeef-run-#"  # an all-letter hex word stays a word
    assert config_key("cafe") == "cafe" and config_key("added-12") == "added-#"
    assert config_key("llama-bf16-a100") == "llama-bf#-a#"  # a word with a number keeps its word
    assert config_key("a1b2") == "#" and config_key("abc1") == "abc#"  # interleaved: an id; letters, digits: a word
    assert config_key("fleet-mix-#-#a#bb") == "fleet-mix-#-#"  # a key stored before folds the same again


def _job(key: str, name: str, sig: str | None, config: str | None = None, end: float = 1_800_000_000.0 - 60):
    from diagnose.fleet.record import config_key
    from diagnose.fleet.store import JobRecord

    return JobRecord(job_key=key, failed=sig is not None, status="diagnosed", via="sacct", signature=sig,
                     root_rule=sig, root_category="x" if sig else None, root_title=f"title of {sig}" if sig else None,
                     nodes=["n1"], blamed_nodes=["n1"] if sig else [], end_ts=end, user="alice", name=name,
                     config=config if config is not None else config_key(name), gpu_hours=1.0,
                     job_id=key.split(":")[-1])


def test_fleet_report_gives_one_config_row_for_hex_suffixed_names(tmp_path: Path) -> None:
    from diagnose.fleet.report import build_report
    from diagnose.fleet.store import FleetStore
    from diagnose.present.fleet_render import render_text

    records = [_job(f"k:{i}", f"fleet-mix-3-{suffix}", "OOM102" if i % 2 else None)
               for i, suffix in enumerate(["9a4bb", "1cdf2", "77e0a", "b3c4d"])]
    # rows a store written before hex folding holds (digits folded only): they join the same row
    records += [_job("k:old1", "fleet-mix-3-4fa2c", "OOM102", config="fleet-mix-#-#fa#c"),
                _job("k:old2", "fleet-mix-3-e5e5e", "NC001", config="fleet-mix-#-e#e#e")]
    records.append(_job("k:w", "deadbeef-eval-1", None))
    with FleetStore(str(tmp_path / "f.db")) as store:
        store.add(records)
        report = build_report(store, since="7d", now=1_800_000_000.0)
    rows = {g.key: g for g in report.configs}
    assert set(rows) == {"fleet-mix-#-#", "deadbeef-eval-#"}
    mix = rows["fleet-mix-#-#"]
    assert (mix.jobs, mix.failed, mix.top_signature, mix.top_count) == (6, 4, "OOM102", 3)
    assert "digits and hex ids folded" in render_text(report).lower()
