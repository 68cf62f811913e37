"""Fix rendering (the four tabs), rank-set formatting and the findings order: pure helpers of the TUI."""

from __future__ import annotations

from dataclasses import replace

from diagnose.explain.render import mlm_flag
from diagnose.explained import CapacityFit, ReplayResult, ValidationResult, Violation
from diagnose.model import EnvVar, Evidence, Finding, Fix, Override, Report
from diagnose.present.tui.findings import finding_order
from diagnose.present.tui.fixrender import render_fix
from diagnose.present.tui.fmt import format_bytes, format_ranks, rank_phrase


def finding(rule: str, role: str = "root", severity: str = "error", line: int = 1, **kw) -> Finding:
    return Finding(rule=rule, name=rule.lower(), title=f"title {rule}", category="other", phase="unknown",
                   severity=severity, role=role, confidence=0.5, first_line=line,
                   evidence=[Evidence("x.log", line, "text")], **kw)


def replayed(fix: list[Override], rule: str | None = None, reproduced: bool | None = None, passes: bool = True,
             rendered: dict[str, str] | None = None, notes: tuple[str, ...] = ()) -> ReplayResult:
    after = ValidationResult(violations=[] if passes else [Violation("c", "m", [])],
                             notes=[Violation("n", n, [], kind="note") for n in notes])
    return ReplayResult(reproduced, ValidationResult(), list(fix), after, rule=rule, rendered=dict(rendered or {}))


def test_format_ranks_compresses_runs() -> None:
    assert format_ranks([9, 0, 1, 2, 3, 4, 5, 6, 7]) == "0-7, 9"
    assert format_ranks([5]) == "5"
    assert format_ranks([3, 3, 4, 10, 11, 12, 20]) == "3-4, 10-12, 20"
    assert format_ranks([]) == ""
    assert rank_phrase(list(range(512)), ["a", "b"], 512) == "ranks 0-511 · 2 hosts · ×512"
    assert rank_phrase([3], ["node7"], 1) == "rank 3 · node7"
    scattered = list(range(1, 512, 3))
    assert rank_phrase(scattered, [], 200) == "171 ranks in 1-511 · ×200"  # too long to list in the left pane


def test_format_bytes_in_binary_units() -> None:
    assert format_bytes(int(135.33 * 1024**3)) == "135.33 GiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(None) == "?"


def test_rule_overrides_render_in_four_forms() -> None:
    fix = Fix(summary="s", safety="unsafe",
              overrides=[Override("dist.use_torch_fsdp2", False), Override("ddp.use_megatron_fsdp", True),
                         Override("checkpoint.ckpt_format", "fsdp_dtensor"), Override("train.micro_batch_size", 1)],
              env=[EnvVar("CUDA_DEVICE_MAX_CONNECTIONS", "8")])
    f = finding("MB101", fix=fix)
    rendered = render_fix(Report(findings=[f], root_cause=0), f)
    assert not rendered.proven
    assert rendered.forms["cli"].splitlines() == [
        "export CUDA_DEVICE_MAX_CONNECTIONS=8",
        "dist.use_torch_fsdp2=false ddp.use_megatron_fsdp=true checkpoint.ckpt_format=fsdp_dtensor "
        "train.micro_batch_size=1",
    ]
    assert "cfg.ddp.use_megatron_fsdp = True" in rendered.forms["python"]
    assert "cfg.checkpoint.ckpt_format = 'fsdp_dtensor'" in rendered.forms["python"]
    # the environment is a launch-script line in every form (cfg.env_vars cannot beat an exported value)
    assert rendered.forms["python"].splitlines()[0].startswith("# environment, in the launch script")
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=8" in rendered.forms["python"].splitlines()[0]
    assert "os.environ" not in rendered.forms["python"]
    yaml_lines = rendered.forms["yaml"].splitlines()
    assert yaml_lines[0].startswith("# environment")
    assert yaml_lines[1:5] == ["dist:", "  use_torch_fsdp2: false", "ddp:", "  use_megatron_fsdp: true"]
    assert "--use-megatron-fsdp" in rendered.forms["mlm"].splitlines()
    assert "--ckpt-format fsdp_dtensor" in rendered.forms["mlm"].splitlines()
    assert "not replayed" in rendered.verdict


def test_replay_env_keys_render_as_environment() -> None:
    root = finding("OOM104", fix=Fix(env=[EnvVar("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")]))
    replay = replayed([Override("env.PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
                       Override("train.micro_batch_size", 1)], rule="OOM104", rendered={"cli": ""})
    rendered = render_fix(Report(findings=[root], root_cause=0, replay=replay), root)
    assert rendered.forms["cli"].splitlines() == [
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "train.micro_batch_size=1"]
    assert "env." not in rendered.forms["python"] + rendered.forms["yaml"] + rendered.forms["mlm"]


def test_yaml_form_parses_back_to_the_overrides() -> None:
    import yaml

    fix = Fix(overrides=[Override("ddp.use_megatron_fsdp", True), Override("ddp.bucket_size", 1000),
                         Override("model.seq_length", 8192), Override("checkpoint.save", "/ckpt dir/a")])
    f = finding("X1", fix=fix)
    data = yaml.safe_load(render_fix(Report(findings=[f]), f).forms["yaml"])
    assert data == {"ddp": {"use_megatron_fsdp": True, "bucket_size": 1000}, "model": {"seq_length": 8192},
                    "checkpoint": {"save": "/ckpt dir/a"}}


def test_mlm_flag_names() -> None:
    assert mlm_flag(Override("ddp.grad_reduce_in_fp32", True)) == "--accumulate-allreduce-grads-in-fp32"
    assert mlm_flag(Override("ddp.data_parallel_sharding_strategy", "optim_grads_params")) == (
        "--data-parallel-sharding-strategy optim_grads_params")
    assert mlm_flag(Override("dist.use_torch_fsdp2", False)) == "(remove --use-torch-fsdp2)"
    assert mlm_flag(Override("checkpoint.save", "/ckpt dir/x")) == "--save '/ckpt dir/x'"
    assert mlm_flag(Override("no.such_key", 3)) == ""  # no Megatron-LM flag is guessed


def test_tabs_show_what_the_text_report_prints() -> None:
    """One renderer: the TUI's CLI and Python tabs carry the exact lines the text report prints for the fix."""
    from conftest import render_to_string

    fix = Fix(summary="s", safety="safe",
              overrides=[Override("checkpoint.save", "/ckpt dir/it's"), Override("model.name", "true"),
                         Override("train.tags", ["a b", 1, None])],
              env=[EnvVar("NCCL_DEBUG", "INFO WARN")])
    f = finding("X9", fix=fix)
    report = Report(findings=[f], root_cause=0)
    forms = render_fix(report, f).forms
    text = render_to_string(report, width=400)
    assert forms["cli"].splitlines()[0] == "export NCCL_DEBUG='INFO WARN'"
    cli = forms["cli"].splitlines()[1]
    assert f"Bridge CLI  {cli}" in text
    for line in forms["python"].splitlines()[1:]:
        assert line in text
    assert "export NCCL_DEBUG='INFO WARN'" in text
    assert "--save '/ckpt dir/it'\"'\"'s'" in forms["mlm"].splitlines()
    assert "# no Megatron-LM flag known for model.name" in forms["mlm"].splitlines()


def test_replay_render_is_preferred_for_the_root_cause() -> None:
    own = Fix(overrides=[Override("ddp.use_megatron_fsdp", True)])
    root = finding("MB1", fix=own)
    other = finding("MB2", role="context", severity="warning", fix=Fix(overrides=[Override("x.y", 1)]))
    replay = replayed([Override("ddp.use_megatron_fsdp", True), Override("checkpoint.ckpt_format", "fsdp_dtensor")],
                      reproduced=True, rendered={"cli": "REPLAY-CLI", "python": "REPLAY-PY", "yaml": "REPLAY-YAML"})
    report = Report(findings=[root, other], root_cause=0, replay=replay)
    rendered = render_fix(report, root)
    assert rendered.proven
    assert rendered.forms["cli"] == "REPLAY-CLI" and rendered.forms["python"] == "REPLAY-PY"
    assert "--ckpt-format fsdp_dtensor" in rendered.forms["mlm"]  # not in render: built from replay's fix
    assert rendered.verdict.startswith("✔") and "reproduced" in rendered.verdict
    assert not render_fix(report, other).proven  # replay did not cover x.y
    # a replay that names no rule proved the root cause's fix only, not another finding whose keys it happens to set
    same_keys = finding("MB3", role="context", severity="warning", fix=own)
    assert not render_fix(Report(findings=[root, same_keys], root_cause=0, replay=replay), same_keys).proven

    failing = replace(replay, after=ValidationResult(violations=[Violation("c", "m", [])]))
    assert render_fix(Report(findings=[root], root_cause=0, replay=failing), root).verdict.startswith("✘ still fails")


def test_findings_order_root_first_then_errors_warnings_cascade_context() -> None:
    findings = [
        finding("CASC", role="cascade", line=50),
        finding("WARN", role="context", severity="warning", line=5),
        finding("ROOT", line=30),
        finding("ERR2", role="root", line=40),
        finding("INFO", role="context", severity="info", line=1),
        finding("WARN2", role="root", severity="warning", line=2),
    ]
    sections = finding_order(Report(findings=findings, root_cause=2))
    titles = [s.title for s in sections]
    assert titles == ["Root cause", "Other errors", "Warnings", "Consequences of the root cause", "Context"]
    assert [[findings[i].rule for i in s.indices] for s in sections] == [
        ["ROOT"], ["ERR2"], ["WARN2"], ["CASC"], ["WARN", "INFO"]]
    assert finding_order(Report()) == []


def test_replay_that_names_its_rule_covers_that_finding_only() -> None:
    root = finding("OOM102", fix=Fix(overrides=[Override("ddp.use_megatron_fsdp", True)]))
    other = finding("MB111", role="context", severity="warning",
                    fix=Fix(overrides=[Override("ddp.use_megatron_fsdp", True)]))
    replay = replayed([Override("ddp.use_megatron_fsdp", True)], rule="MB111", notes=("Activating \x1b[31m...",),
                      rendered={"cli": "REPLAYED"})
    report = Report(findings=[root, other], root_cause=0, replay=replay)
    assert not render_fix(report, root).proven
    covered = render_fix(report, other)
    assert covered.proven and covered.forms["cli"] == "REPLAYED"
    assert "enough config" in covered.verdict and "note: Activating" in covered.verdict


def test_reflow_joins_hard_wrapped_explanations() -> None:
    from diagnose.present.tui.detail import reflow

    text = "The model was built, but\nwrapping it ran out.\n\nSecond paragraph\n- one\n  indented\n- two\n"
    assert reflow(text).splitlines() == [
        "The model was built, but wrapping it ran out.", "", "Second paragraph", "- one", "  indented", "- two"]


def test_verdict_says_the_fix_fits_and_how_many_gpus_it_needs():
    from diagnose.present.tui.fixrender import replay_verdict

    replay = replayed([Override("launch.world_size", 8)], rendered={"launch": "# needs >= 8 GPUs: launch with world size 8"})
    replay.fit = CapacityFit(finding("OOM102"), replay.fix, True, gpus=8, job_gpus=1)
    replay.fits = True
    text = replay_verdict(replay)
    assert "fits in memory on 8 GPUs (the job had 1)" in text
    assert "needs >= 8 GPUs" in text
    replay.fits = False
    assert "does NOT fit" in replay_verdict(replay)


def test_memory_picture_shows_fsdp_transient_buffers_apart_from_model_state():
    from diagnose.memory_types import Breakdown, MemoryAnalysis, MemoryPrediction, PhasePeaks
    from diagnose.present.tui.memoryview import memory_text

    current = MemoryPrediction(
        strategy="fsdp:optim_grads_params", dp=64, dp_known=True, gpus=64, grad_dtype="fp32", bytes_per_param=0.28,
        model_state_bytes=20 << 30, transient_bytes=6 << 30,
        components=Breakdown(params=5 << 30, grads=5 << 30, main_params=5 << 30, optimizer=5 << 30,
                             buffers=6 << 30),
        activation_bytes=None, phase_peaks=PhasePeaks(*(5 * [90 << 30])), peak_bytes=90 << 30,
        usable_bytes=77 << 30)
    memory = MemoryAnalysis(80 << 30, None, "capacity", None, None, "training", current=current)
    text = memory_text(memory).plain
    assert "transient" in text and "6.00 GiB" in text
    assert "20.00 GiB" in text  # model state total, without the transient buffers


def test_replay_render_with_env_shows_the_exports_above_the_overrides() -> None:
    """A proven fix that sets both config keys and environment variables: the CLI tab carries both."""
    from diagnose.explain.render import render_fix as render_overrides

    fix = [Override("env.PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"), Override("checkpoint.save", "/a b")]
    root = finding("OOM104")
    replay = replayed(fix, rule="OOM104", rendered=render_overrides(fix))
    forms = render_fix(Report(findings=[root], root_cause=0, replay=replay), root).forms
    assert forms["cli"].splitlines() == ["export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                                         "'checkpoint.save=\"/a b\"'"]
    assert forms["python"] == replay.rendered["python"] and forms["yaml"] == replay.rendered["yaml"]
    assert forms["mlm"].splitlines() == ["export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "--save '/a b'"]
