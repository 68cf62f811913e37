"""qa-report-8 L8: replay's summary quotes the fix in the job's words, as the Fix does (render.fix_style): a
Megatron-LM job reads its flags, a Bridge job the Bridge overrides. The summary printed the Bridge keys replay
rendered for the config's framework, so a Megatron-LM job whose stack (not its config) said so read
``ddp.use_distributed_optimizer=true`` beside a Fix of ``--use-distributed-optimizer``."""

from __future__ import annotations

import pytest
from conftest import render_to_string

from diagnose.configview import ConfigView
from diagnose.explain.render import render_fix
from diagnose.explained import ReplayResult, ValidationResult
from diagnose.model import Evidence, Finding, Fix, Override, Report
from diagnose.present.markdown import render_markdown

FIX = [Override("ddp.use_distributed_optimizer", True), Override("train.micro_batch_size", 1)]
BRIDGE = "ddp.use_distributed_optimizer=true train.micro_batch_size=1"
FLAGS = "--use-distributed-optimizer --micro-batch-size 1"


def _report(framework: str | None, stack: str | None) -> Report:
    finding = Finding(rule="OOM102", name="oom", title="CUDA OOM while wrapping the model", category="cuda_oom",
                      phase="dp_wrap", severity="error", role="root", confidence=0.9, ranks=[0], count=1,
                      first_line=3, evidence=[Evidence("job.log", 3, "torch.OutOfMemoryError: CUDA out of memory.")],
                      explanation="Why it failed.", fix=Fix(summary="Shard", safety="unsafe", overrides=list(FIX)))
    replay = ReplayResult(True, ValidationResult(), list(FIX), ValidationResult(), framework=framework,
                          rendered=render_fix(FIX, framework))
    config = ConfigView(framework=framework) if framework else None  # Report.framework: the config's
    return Report(findings=[finding], root_cause=0, replay=replay, stack=stack, config=config)


def _replay_part(out: str) -> str:
    """The replay section and what follows it: after the Fix, which is in the job's words in every case."""
    at = min(out.find(m) for m in ("REPLAY", "### Replay") if m in out)
    return out[at:].replace("\\_", "_")  # markdown escapes the underscores of a key


@pytest.mark.parametrize("framework, stack, said, unsaid", [
    (None, "megatron-lm", FLAGS, BRIDGE),  # Megatron-LM by its traceback, no config printed
    ("megatron-lm", None, FLAGS, BRIDGE),
    ("megatron-lm", "megatron-bridge", BRIDGE, FLAGS),  # a Bridge traceback decides (qa-report-8 L2)
    (None, None, BRIDGE, FLAGS),
])
def test_replay_summary_speaks_the_jobs_fix_style(framework, stack, said, unsaid):
    report = _report(framework, stack)
    for out in (render_to_string(report, width=200), render_markdown(report),
                render_to_string(report, width=200, detail="default")):
        replay = _replay_part(out)
        assert said in replay, replay
        assert unsaid not in replay


def test_replay_added_overrides_follow_the_style_too():
    from diagnose.present.replay_text import replay_lines

    replay = _report(None, "megatron-lm").replay
    assert replay is not None
    replay.added = [Override("ddp.use_distributed_optimizer", True)]
    assert any("--use-distributed-optimizer" in ln for ln in replay_lines(replay, "megatron-lm"))
    assert any("ddp.use_distributed_optimizer=True" in ln for ln in replay_lines(replay, "bridge"))


def test_json_summary_keeps_replays_own_words():
    report = _report(None, "megatron-lm")
    assert report.replay is not None and BRIDGE in report.replay.summary
