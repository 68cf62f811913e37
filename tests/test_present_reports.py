"""Text, JSON and markdown reports of a real match: root first, cascades collapsed, log text inert, schema kept."""

from __future__ import annotations

import json

import pytest
from conftest import make_catalogue, make_rule, render_to_string

from diagnose.match import match_text
from diagnose.model import CATEGORIES, PHASES, REPORT_SCHEMA
from diagnose.present.json_report import render_json
from diagnose.present.markdown import fenced, render_markdown
from diagnose.present.text import compact_ranks, yaml_text

OOM = make_rule(
    "OOM9", "CUDA out of memory", r"CUDA out of memory\. Tried to allocate (?P<requested>[\d.]+ GiB)",
    category="cuda_oom", title="CUDA OOM while wrapping the model", phase="dp_wrap", confidence=0.9,
    fix={"summary": "Shard with Megatron FSDP", "safety": "unsafe",
         "overrides": [{"key": "ddp.use_megatron_fsdp", "value": True}, {"key": "ddp.data_parallel_sharding_strategy",
                                                                          "value": "optim_grads_params"}],
         "env": [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}],
         "steps": ["Check the memory section"]},
)
NCCL = make_rule("NC9", "Watchdog caught", "Watchdog caught collective operation timeout", role="cascade",
                 category="nccl_timeout", title="NCCL watchdog timeout")
WARN = make_rule("WA9", "deprecated", "deprecated", severity="warning", title="Deprecated API")
CAT = make_catalogue(OOM, NCCL, WARN)

HOSTILE = "\x1b]52;c;ZXZpbA==\x07\x1b[2J[bold red]pwn[/] \u202eevil ```<img src=x onerror=alert(1)>"


def _report():
    lines = ["[rank0]: this API is deprecated"]
    lines += [f"[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB {HOSTILE}"
              for r in (0, 1, 2, 3, 9)]
    lines += [f"[rank{r}]: Watchdog caught collective operation timeout" for r in range(10, 521)]
    return match_text("\n".join(lines) + "\n", CAT, path="job.log")


def test_compact_ranks():
    assert compact_ranks([9, 0, 1, 2, 3, 4, 5, 6, 7]) == "0-7, 9"
    assert compact_ranks([5]) == "5"
    assert compact_ranks([]) == ""
    assert compact_ranks(range(0, 100, 2)).endswith("(50 ranks)")


def test_text_report_root_first_cascade_collapsed_and_inert():
    out = render_to_string(_report(), color="never", width=120)
    assert out.index("ROOT CAUSE") < out.index("OTHER FINDINGS") < out.index("CASCADE")
    assert "OOM9" in out and "ranks 0-3, 9" in out
    assert "Evidence  job.log" in out and "line 2 " in out  # evidence with its line number
    assert "NCCL watchdog timeout on 511 ranks, caused by the OOM above" in out
    assert "ddp.use_megatron_fsdp=true ddp.data_parallel_sharding_strategy=optim_grads_params" in out
    assert "cfg.ddp.use_megatron_fsdp = True" in out
    assert "use_megatron_fsdp: true" in out  # YAML
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "[bold red]pwn[/]" in out  # shown as typed, not interpreted


@pytest.mark.parametrize("env_no_color", [True, False])
def test_color_modes(monkeypatch, env_no_color):
    if env_no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    report = _report()
    assert "\x1b[" in render_to_string(report, color="always")
    auto = render_to_string(report, color="auto")
    assert "\x1b" not in auto  # StringIO is not a terminal, and NO_COLOR is honoured
    # log escapes stay inert even with colour on
    assert "\x1b]52" not in render_to_string(report, color="always")


def test_json_report_is_report_to_dict_with_schema_shape():
    report = _report()
    data = json.loads(render_json(report))
    assert data == json.loads(json.dumps(report.to_dict(), default=str))
    assert data["schema"] == REPORT_SCHEMA
    assert set(data) >= {"schema", "inputs", "root_cause", "findings", "config", "replay", "memory"}
    assert data["inputs"] == [{"path": "job.log", "bytes": report.inputs[0].bytes, "lines": 517}]
    keys = {"rule", "name", "title", "category", "phase", "severity", "role", "confidence", "ranks", "hosts",
            "count", "first_line", "evidence", "explanation", "fix", "facts", "basis", "basis_detail"}
    for f in data["findings"]:
        assert set(f) == keys
        assert f["category"] in CATEGORIES and f["phase"] in PHASES
        assert f["role"] in ("root", "cascade", "context") and f["severity"] in ("error", "warning", "info")
        assert set(f["fix"]) == {"summary", "safety", "overrides", "env", "steps"}
        for e in f["evidence"]:
            assert set(e) == {"path", "line", "text"} and isinstance(e["line"], int)
    root = data["findings"][data["root_cause"]]
    assert root["rule"] == "OOM9" and root["ranks"] == [0, 1, 2, 3, 9] and root["facts"]["requested"] == "2.00 GiB"
    assert root["fix"]["overrides"][0] == {"key": "ddp.use_megatron_fsdp", "value": True}
    raw = render_json(report)
    assert "\x1b" not in raw and "\u202e" not in raw and raw.isascii()


def test_markdown_keeps_log_text_in_fences():
    md = render_markdown(_report())
    assert md.startswith("## diagnose: CUDA OOM while wrapping the model (`OOM9`)")
    assert "### Cascade" in md and "NCCL watchdog timeout on 511 ranks, caused by the OOM above" in md
    # every line carrying log text is inside a fence: outside fences no raw HTML tag or hostile text appears
    outside, fence = [], None
    for line in md.splitlines():
        if fence is None and line.startswith("```"):
            fence = line.rstrip("abcdefghijklmnopqrstuvwxyz")
        elif fence is not None and line == fence:
            fence = None
        elif fence is None:
            outside.append(line)
    assert fence is None
    assert not any("<img" in line for line in outside)
    assert "\x1b" not in md and "\u202e" not in md
    assert "ddp:\n  use_megatron_fsdp: true" in md


def test_fence_is_longer_than_any_backtick_run():
    body = "a ```` b"
    assert fenced(body).startswith("`````text\n")


def test_yaml_nests_dotted_keys():
    from diagnose.model import Override

    assert yaml_text([Override("a.b.c", 1), Override("a.d", False)]) == "a:\n  b:\n    c: 1\n  d: false"


def test_no_failure_report():
    report = match_text("all fine\n", CAT)
    assert "No failure found." in render_to_string(report)
    assert render_markdown(report).startswith("## diagnose: no failure found")
    assert json.loads(render_json(report))["root_cause"] is None


def test_config_lines_read_sourced_values_and_count_defaults():
    from diagnose.configview import ConfigView
    from diagnose.present.section_lines import config_lines

    view = ConfigView(sources=["log:3 launch command"], framework="megatron-bridge")
    for i in range(10):
        view.set(f"model.k{i}", i, "default")
    view.set("ddp.use_megatron_fsdp", True, "log:26")
    lines = config_lines(view)
    assert lines[:3] == ["source:", "  - log:3 launch command", "framework: megatron-bridge"]
    assert "  ddp.use_megatron_fsdp: true  (log:26)" in lines
    assert "  … 10 more at their defaults" in lines
    assert not any("model.k3" in ln for ln in lines)


def test_slurm_lines_nest_steps_and_say_sizes():
    from diagnose.model import SlurmFacts, SlurmStepFacts
    from diagnose.present.section_lines import slurm_lines

    facts = SlurmFacts(job_id="12", state="FAILED", reason="a\nb", max_rss_bytes=3 << 30,
                       steps=[SlurmStepFacts("12.0", "python", "FAILED", 1)], notes=["x"])
    lines = slurm_lines(facts)
    assert lines[:3] == ["job_id: 12", "state: FAILED", "reason: |"]
    assert lines[lines.index("steps:") + 1:][:5] == ["  - id: 12.0", "    name: python", "    state: FAILED",
                                                     "    exit_code: 1", "    signal: null"]
    assert "max_rss_bytes: 3.00 GiB" in lines and "  - x" in lines and "restarts: 0" in lines


def test_text_sections_leave_out_empty_fields_and_say_when_nothing_was_recovered():
    """QA2 #12: `source: []`, `framework: null`, `values: {}` are noise in the text report (JSON keeps them)."""
    from conftest import render_to_string

    from diagnose.configview import ConfigView
    from diagnose.model import Report

    report = Report(config=ConfigView())
    text = render_to_string(report)
    assert "CONFIG" in text and "nothing recovered from the input" in text
    assert "source: []" not in text and "framework: null" not in text and "values: {}" not in text
    known = ConfigView(sources=["log:3 launch command"])
    known.set("a.b", 1, "log:3")
    report = Report(config=known)
    text = render_to_string(report)
    assert "log:3 launch command" in text and "framework" not in text and "nothing recovered" not in text
    from diagnose.present.markdown import render_markdown

    md = render_markdown(Report(config=ConfigView()))
    assert "_nothing recovered from the input_" in md and "source: []" not in md
