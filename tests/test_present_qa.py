"""Presentation fixes from the QA report: commands never hard-wrapped, user-meaningful facts, silent NCCL ranks."""

from __future__ import annotations

import json

from conftest import render_to_string

from diagnose.explained import ReplayResult, ValidationResult
from diagnose.model import EnvVar, Evidence, Finding, FindingReplay, Fix, Override, Report
from diagnose.present.json_report import render_json
from diagnose.present.markdown import render_markdown
from diagnose.present.text import shown_facts

LONG_OVERRIDES = [
    Override("ddp.use_megatron_fsdp", True),
    Override("ddp.data_parallel_sharding_strategy", "optim_grads_params"),
    Override("model.init_model_with_meta_device", True),
    Override("checkpoint.ckpt_format", "fsdp_dtensor"),
]
CLI = ("ddp.use_megatron_fsdp=true ddp.data_parallel_sharding_strategy=optim_grads_params "
       "model.init_model_with_meta_device=true checkpoint.ckpt_format=fsdp_dtensor")

OOM_FACTS = {
    "requested": "135.33 GiB", "exception": "torch.OutOfMemoryError", "device": "CUDA", "template": "2.1+", "gpu": 0,
    "requested_bytes": 145309481042, "total_bytes": 150109106995, "free_bytes": 4080218931,
    "capacity_typo": False, "old_reserved_word": None, "private_pool_bytes": None, "other_processes": [],
    "hint": "expandable_segments",
}


def _finding(**kw) -> Finding:
    base = dict(rule="OOM102", name="oom", title="CUDA OOM while wrapping the model", category="cuda_oom",
                phase="dp_wrap", severity="error", role="root", confidence=0.9, ranks=[0], count=1, first_line=3,
                evidence=[Evidence("job.log", 3, "torch.OutOfMemoryError: CUDA out of memory.")],
                explanation="Why it failed.")
    base.update(kw)
    return Finding(**base)


def _replayed(reproduced: bool | None = None, rendered: dict[str, str] | None = None, rule: str | None = None,
              assumed_release: str = "") -> ReplayResult:
    return ReplayResult(reproduced, ValidationResult(assumed_release=assumed_release), [], ValidationResult(),
                        rule=rule, rendered=dict(rendered or {}))


def _report(findings, root=0, **kw) -> Report:
    return Report(findings=findings, root_cause=root, **kw)


# ------------------------------------------------------------------ QA #16: never hard-wrap commands


def test_cli_python_yaml_and_env_lines_are_never_wrapped_on_a_narrow_terminal():
    fix = Fix(summary="Shard", safety="unsafe", overrides=LONG_OVERRIDES,
              env=[EnvVar("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,garbage_collection_threshold:0.8")])
    out = render_to_string(_report([_finding(fix=fix)]), width=50)
    lines = out.splitlines()
    assert any(ln.strip() == f"Bridge CLI  {CLI}" for ln in lines), out
    assert any(ln.strip() == "cfg.ddp.data_parallel_sharding_strategy = 'optim_grads_params'"
               or ln.strip().endswith("cfg.ddp.data_parallel_sharding_strategy = 'optim_grads_params'")
               for ln in lines)
    assert any(ln.strip() == "data_parallel_sharding_strategy: optim_grads_params" for ln in lines)
    assert any(ln.strip().endswith("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,"
                                   "garbage_collection_threshold:0.8") for ln in lines)


def test_replay_section_says_what_replay_proved_without_repeating_the_fix():
    """Issue 19 item 8: -v REPLAY printed the fix a third and fourth time (``fix:``, ``render: cli/python/yaml``);
    it now says in words what replay found; the fix is the finding's fix block, shown once."""
    from diagnose.model import Override

    replay = _replayed(True, {"cli": CLI, "python": "cfg.ddp.data_parallel_sharding_strategy = 'optim_grads_params'",
                              "yaml": "ddp:\n  data_parallel_sharding_strategy: optim_grads_params\n"})
    replay.fix = [Override("ddp.data_parallel_sharding_strategy", "optim_grads_params")]
    for out in (render_to_string(_report([_finding()], replay=replay), width=80),
                render_markdown(_report([_finding()], replay=replay))):
        assert "Reproduced: yes" in out and "After the fix (1 change): passes validation." in out
        assert not any(ln.strip().startswith(("render:", "cli:", "python:", "yaml:", "fix:")) for ln in out.splitlines())


# ------------------------------------------------------------------ QA #17: user-meaningful facts only


def test_facts_hide_internals_and_humanise_sizes():
    shown = dict(shown_facts(OOM_FACTS))
    assert not {"capacity_typo", "old_reserved_word", "private_pool_bytes", "template", "device",
                "other_processes", "hint"} & set(shown)
    assert shown["requested"] == "135.33 GiB"
    assert shown["GPU capacity"] == "139.80 GiB" and shown["free"] == "3.80 GiB"
    assert shown["GPU"] == "0"
    assert all("None" not in v and v not in ("False", "{}", "[]") for v in shown.values())


def test_nccl_facts_read_as_the_watchdog_line():
    facts = {"seq_num": "1", "op_type": "ALLREDUCE", "numel_in": "1", "numel_out": "1", "timeout_ms": "600000",
             "ran_for_ms": 600081, "prefix_style": "pg_id", "rank": 0, "pg": 0, "pg_guid": "0",
             "pg_desc": "default_pg", "silent_ranks": [8]}
    shown = dict(shown_facts(facts, ranks_known=True))
    assert shown["SeqNum"] == "1" and shown["OpType"] == "ALLREDUCE" and shown["NumelIn"] == "1"
    assert shown["Timeout"] == "600000 ms (10 min)"
    assert shown["ran for"].startswith("600081 ms")
    assert shown["process group"] == "default_pg"
    assert not {"prefix_style", "rank", "pg", "pg_guid"} & set(shown)


def test_nested_facts_are_summarised_not_dumped():
    facts = {"root_cause": {"index": 0, "time": "2026-11-29_10:29:59", "host": "node01", "rank": 0, "local_rank": 0,
                            "exitcode": 1, "pid": 4000, "signal": None, "error_file": "<N/A>",
                            "traceback": "To enable traceback see: https://x"},
             "failures": [{"rank": 1, "host": "node01", "exitcode": 1}, {"rank": 2, "host": "node02", "exitcode": -9}],
             "no_other_failures": False, "exitcode": "1", "core_dumped": True}
    shown = dict(shown_facts(facts))
    assert shown["first failure"] == "rank 0 on node01, exit code 1"
    assert shown["other failures"] == "ranks 1-2"
    assert shown["exit code"] == "1" and shown["core dumped"] == "yes"
    assert not any("{" in v for v in shown.values())


def test_text_and_markdown_facts_blocks_hide_internals_but_json_keeps_every_fact():
    report = _report([_finding(facts=dict(OOM_FACTS), replay=FindingReplay(None, None))])
    for out in (render_to_string(report, width=100), render_markdown(report)):
        assert "capacity_typo" not in out and "old_reserved_word" not in out and "proven" not in out
        assert "135.33 GiB" in out
    replayed = {"replay": {"proven": None, "reproduced": None, "added": []}}
    assert json.loads(render_json(report))["findings"][0]["facts"] == json.loads(json.dumps(OOM_FACTS | replayed))


# ------------------------------------------------------------------ QA #13: the silent NCCL rank


def _nccl(**kw) -> Finding:
    return _finding(rule="NC007", name="nccl", title="NCCL watchdog timeout", category="nccl_timeout",
                    phase="training", **kw)


def test_silent_rank_line_on_a_secondary_and_on_a_cascade():
    root = _finding(ranks=[211])
    casc = _nccl(role="cascade", ranks=[r for r in range(512) if r != 211], facts={"silent_ranks": [211]})
    casc.cause_of = 0
    report = _report([root, casc])
    for out in (render_to_string(report, width=200), render_markdown(report)):
        assert "rank 211, where the OOM above happened, did not report the timeout" in out
    other = _nccl(role="context", ranks=[0, 1, 2, 3, 4, 5, 6, 7, 9], facts={"silent_ranks": [8]})
    report = _report([_finding(ranks=[3]), other])
    for out in (render_to_string(report, width=200), render_markdown(report)):
        assert "rank 8 did not report the timeout: it is the likely culprit (stuck, or died without a trace)" in out.lower()


def test_silent_rank_sentence_shown_once_for_a_root_whose_explanation_has_it():
    expl = ("Why.\n\nRank 8 did not report the timeout: it is the likely culprit (stuck, or died without a trace); "
            "look at its log first.")
    report = _report([_nccl(ranks=[0, 1, 2, 3, 4, 5, 6, 7, 9], facts={"silent_ranks": [8]}, explanation=expl)])
    out = render_to_string(report, width=200)
    assert out.lower().count("did not report the timeout") == 1


def test_long_prose_in_a_section_wraps_under_its_key():
    replay = _replayed(assumed_release="Megatron-Bridge <= 0.4.x (the log allows <=0.4.x: validated as this family, "
                       "since the job printed no version line and its config uses keys only that family has)")
    lines = render_to_string(_report([_finding()], replay=replay), width=60).splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("  Release checked: Megatron-Bridge"))
    cont = lines[start + 1]
    assert cont.startswith("      ") and cont.strip(), lines[start:start + 3]  # hanging indent, not column 0
    assert all(len(ln) <= 60 for ln in lines[start:start + 3])


def test_sizes_in_sections_are_humanised_in_text_and_markdown():
    from diagnose.explained import CapacityFit

    finding = _finding()
    replay = _replayed(True)
    replay.fits = True
    replay.fit = CapacityFit(finding, [], True, gpus=8, peak_bytes=99900708864, capacity_bytes=150109106995)
    report = _report([finding], replay=replay)
    for out in (render_to_string(report, width=100), render_markdown(report)):
        assert "predicted peak 93.04 GiB per GPU of 139.80 GiB" in out and "fits on 8 GPUs" in out
        assert "99900708864" not in out  # GiB for people, bytes only in the JSON
    fit = json.loads(render_json(report))["replay"]["fit"]
    assert fit["peak_bytes"] == 99900708864 and fit["capacity_bytes"] == 150109106995 and fit["gpus"] == 8


def test_no_trailing_blanks_after_evidence_and_facts():
    f = _finding(facts=dict(OOM_FACTS), evidence=[Evidence("job.log", 3, "x" * 30), Evidence("job.log", 4, "y" * 300)])
    for color in ("never", "always"):
        out = render_to_string(_report([f]), color=color, width=80)
        assert "Evidence" in out and "135.33 GiB" in out and "y" * 40 in out
        plain = [ln for ln in out.splitlines() if "\x1b" not in ln]
        assert not [ln for ln in plain if ln != ln.rstrip()], out


def test_empty_renderings_are_left_out():
    replay = _replayed(False, {"python": "", "yaml": "", "mlm": ""}, rule="PY003")
    for out in (render_to_string(_report([_finding()], replay=replay)), render_markdown(_report([_finding()],
                                                                                              replay=replay))):
        assert "python:" not in out and "mlm:" not in out and "render:" not in out and "Reproduced: no" in out


def test_meta_line_wraps_indented_on_a_narrow_terminal():
    f = _finding(ranks=[0, 1, 2, 3, 4, 5, 6, 7, 9], hosts=["node00", "node01", "node02"], count=9)
    lines = render_to_string(_report([f]), width=50).splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("  phase dp_wrap"))
    assert lines[start + 1].startswith("  ") and lines[start + 1].strip()


def test_report_sections_open_with_their_one_sentence_summary():
    from conftest import render_to_string

    from diagnose.memory_types import MemoryAnalysis
    from diagnose.model import Report

    report = Report(
        replay=_replayed(True),
        memory=MemoryAnalysis(None, None, "capacity", None, None, "dp_wrap",
                              explanation="The fp32 grad buffer did not fit."),
    )
    out = render_to_string(report, width=100)
    replay_part = out.split("REPLAY", 1)[1]
    memory_part = out.split("MEMORY", 1)[1]
    assert replay_part.lstrip().startswith("reproduced by replay")
    assert memory_part.lstrip().startswith("The fp32 grad buffer did not fit.")
    assert "summary:" not in out and "explanation:" not in out
