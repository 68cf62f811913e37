"""QA round 8 (docs/qa-report-8.md): a hostile new user reads diagnose's answers on the newest dev logs.

Each test failed on the tree before its fix. The output tests run the real command line (``python -m diagnose``) on
small logs shaped as the corpus logs read (the tracebacks' packages decide the job's stack, match/stack.py); the TUI
tests drive the app with Pilot on the real pipeline's report of the same logs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_fix_stack import DEEPSPEED, MEGATRON_LM, NO_STACK, PLAIN_TORCH, SITE
from test_tui_reports import run_async

from diagnose.explain.render import fix_style, fix_words
from diagnose.match.rules import load_catalogue
from diagnose.pipeline import analyze
from diagnose.present.tui.app import DiagnoseApp
from diagnose.present.tui.fixrender import TAB_ORDER, render_fix

ROOT = Path(__file__).resolve().parents[1]
SIZE = (140, 45)


def run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160", "DIAGNOSE_SKIP_SLURM": "1"}
    proc = subprocess.run([sys.executable, "-m", "diagnose", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert proc.returncode in (0, 1, 2), proc.stderr
    return proc.stdout


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def section(text: str, title: str) -> str:
    """The lines of a text report's section (``title`` at column 0) up to the next section."""
    m = re.search(rf"^{title}\b.*?(?=^[A-Z][A-Z ]+(?:\(|$)|\Z)", text, re.S | re.M)
    return m.group(0) if m else ""


def root_fix(text: str) -> str:
    """The root cause's Fix block of a text report."""
    m = re.search(r"^  Fix .*?(?=^  Why|^[A-Z]|\Z)", text, re.S | re.M)
    return m.group(0) if m else ""


# -------------------------------------------------------------------- Part B: the TUI's fix tabs follow the stack

@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    d = tmp_path_factory.mktemp("qa8")
    return {name: analyze([str(write(d, f"{name}.log", text))]) for name, text in
            (("torch", PLAIN_TORCH), ("mlm", MEGATRON_LM), ("ds", DEEPSPEED), ("none", NO_STACK))}


def test_tui_fix_forms_follow_the_reports_decision(reports):
    """Every form the tabs show is the one the text report shows for that job (render.fix_style / fix_words)."""
    for name, report in reports.items():
        root = report.root
        assert root is not None
        rendered = render_fix(report, root)
        style = fix_style(report.framework, report.stack)
        assert rendered.style == style
        assert rendered.steps == fix_words(root.shown_fix, style).steps
        if style == "neutral":  # DeepSpeed, plain PyTorch: no Megatron form at all
            assert not {"cli", "python", "yaml", "mlm"} & set(rendered.tabs), name
            assert "ddp." not in "".join(rendered.forms.values())
        elif style == "megatron-lm":
            assert rendered.tabs[0] == "mlm" and "--use-distributed-optimizer" in rendered.forms["mlm"]
            assert "cli" not in rendered.tabs  # every key has a flag: no Bridge words
        else:  # a job with no stack evidence keeps the four Megatron forms
            assert [k for k in rendered.tabs if k != "env"] == ["cli", "python", "yaml", "mlm"]
    assert {fix_style(r.framework, r.stack) for r in reports.values()} == {"neutral", "megatron-lm", "bridge"}


def _tabs_shown(app: DiagnoseApp) -> list[str]:
    from textual.widgets import TabbedContent

    tabs = app.screen.query_one("#fix-tabs", TabbedContent)
    if not tabs.display:
        return []
    return [key for key, _ in TAB_ORDER if tabs.get_tab(f"fix-{key}").display]


@run_async
async def test_tui_shows_a_deepspeed_job_no_bridge_tab_and_its_own_steps(reports) -> None:
    report = reports["ds"]
    app = DiagnoseApp([], report=report)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not {"cli", "python", "yaml", "mlm"} & set(_tabs_shown(app))
        header = str(app.screen.query_one("#fix-summary").content)
        assert "DeepSpeed ZeRO" in header  # the rule's other_stacks step, as the text report has it
        assert "ddp.use_megatron_fsdp" not in header
        await pilot.press("1", "c")  # a hidden Bridge CLI tab is not copied from
        assert app.clipboard != "ddp.use_distributed_optimizer=true optimizer.use_distributed_optimizer=true"


@run_async
async def test_tui_opens_a_megatron_lm_job_on_its_flags(reports) -> None:
    app = DiagnoseApp([], report=reports["mlm"])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert _tabs_shown(app)[0] == "mlm" and "cli" not in _tabs_shown(app)
        await pilot.press("c")
        assert "--use-distributed-optimizer" in app.clipboard


@run_async
async def test_tui_keeps_the_four_forms_for_a_job_with_no_stack_evidence(reports) -> None:
    app = DiagnoseApp([], report=reports["none"])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert _tabs_shown(app) == ["cli", "python", "yaml", "mlm"]
        await pilot.press("c")
        assert "ddp.use_distributed_optimizer=true" in app.clipboard


# ------------------------------------------------------------ Part B: OOM fix summaries that any stack reads

def test_a_rule_with_other_stacks_words_has_a_summary_any_stack_can_read():
    """The summary is shown to every job (the overrides and steps are what other_stacks replaces): a rule that
    writes other_stacks must not name Megatron's own machinery in it."""
    for rule in load_catalogue().rules:
        if rule.fix.other_stacks:
            assert not re.search(r"Megatron|distributed optimizer|\b(ddp|model|train|optimizer)\.\w", rule.fix.summary), \
                (rule.code, rule.fix.summary)


def test_a_plain_torch_oom_report_names_no_megatron_machinery(tmp_path):
    out = run("analyze", str(write(tmp_path, "torch.log", PLAIN_TORCH)))
    assert "Megatron FSDP" not in root_fix(out) and "distributed optimizer" not in root_fix(out)


# ----------------------------------------------- Part A: replay of Megatron keys is no answer to a DeepSpeed job

@pytest.mark.parametrize("fmt", ["text", "verbose", "markdown"])
def test_replay_of_megatron_keys_is_not_shown_to_a_job_of_another_stack(tmp_path, fmt):
    args = {"text": [], "verbose": ["-v"], "markdown": ["--format", "markdown"]}[fmt]
    for text in (PLAIN_TORCH, DEEPSPEED):
        out = run("analyze", str(write(tmp_path, "job.log", text)), *args)
        assert "ddp.use_distributed_optimizer" not in out and "optimizer.use_distributed_optimizer" not in out
        assert not re.search(r"^(REPLAY|#+ Replay)", out, re.M)


def test_replay_stays_for_a_megatron_job_and_a_job_with_no_stack_evidence(tmp_path):
    for text in (MEGATRON_LM, NO_STACK):
        assert re.search(r"^REPLAY", run("analyze", str(write(tmp_path, "job.log", text))), re.M)


# --------------------------------------- Part A: OOM001, the commonest answer on non-Megatron OOMs, says a lever

GENERIC_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 250.00 MiB. GPU 2 has a total capacity "
               "of 39.59 GiB of which 114.19 MiB is free. Including non-PyTorch memory, this process has 39.47 GiB "
               "memory in use. Of the allocated memory 38.01 GiB is allocated by PyTorch, and 10.00 MiB is reserved "
               "by PyTorch but unallocated.")


def _generic_oom(*frames: str) -> str:
    return "\n".join(["Traceback (most recent call last):", *frames, GENERIC_OOM]) + "\n"


def test_a_generic_cuda_oom_fix_names_levers_in_the_jobs_words(tmp_path):
    ds = _generic_oom('  File "/home/u/train.py", line 30, in <module>', "    loss = engine(batch)",
                      f'  File "{SITE}/deepspeed/runtime/engine.py", line 1846, in forward', "    loss = self.module(",
                      f'  File "{SITE}/torch/nn/modules/module.py", line 1501, in _call_impl', "    return f()")
    out = run("analyze", str(write(tmp_path, "ds.log", ds)))
    assert "OOM001" in out.splitlines()[2]
    fix = root_fix(out)
    assert "phase-specific advice" not in fix  # pointed at advice the report never showed
    assert "ZeRO-3" in fix and "checkpointing" in fix  # the DeepSpeed job's own levers
    assert not re.search(r"\b(train|ddp|model)\.\w+=", fix)  # no Megatron-Bridge key
    meg = run("analyze", str(write(tmp_path, "none.log", _generic_oom(
        f'  File "{SITE}/megatron/bridge/training/train.py", line 10, in train_step', "    out = model(x)"))))
    assert "train.micro_batch_size" in root_fix(meg)  # a Megatron job is told its own key


# ----------------------------- Part A: the fragmentation answer keeps the rule's words for the job's stack

FRAG_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.62 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 1.87 GiB is free. Including non-PyTorch memory, this process has 77.30 GiB memory in "
            "use. Of the allocated memory 72.94 GiB is allocated by PyTorch, and 2.77 GiB is reserved by PyTorch but "
            "unallocated.")


def test_a_fragmentation_answer_for_a_plain_torch_job_keeps_its_stack_neutral_steps(tmp_path):
    log = PLAIN_TORCH.replace(PLAIN_TORCH.strip().splitlines()[-1], FRAG_OOM)
    out = run("analyze", str(write(tmp_path, "frag.log", log)))
    fix = root_fix(out)
    assert "expandable_segments" in fix
    assert "ddp.use_distributed_optimizer" not in fix  # "If it still does not fit: <Bridge overrides>"
    assert "ZeRO" in fix  # the rule's steps for this stack


# ----------------------- Part A: a sacct step for a job that may not be a Slurm job says it is for Slurm jobs

def test_a_sacct_step_outside_the_slurm_rules_says_it_is_for_slurm_jobs():
    """LA018 on a DeepSpeed-launcher job with no Slurm in sight (ca-ds-gptj-resume-...) said "sacct -j JOBID ...":
    a command for a scheduler the job never used. Rules that any launcher's log fires say whose step it is."""
    for rule in load_catalogue().rules:
        if rule.category == "slurm" or rule.code.startswith("SL"):
            continue
        for step in rule.fix.steps + rule.fix.other_stacks:
            if "sacct -j" in step:
                assert "Slurm" in step, (rule.code, step)


# ---------------------------- Part A: an Env line is pasted as is, so its value cannot be a shell expression

def test_no_rule_sets_an_environment_value_the_shell_would_have_to_expand():
    """LA010 printed ``export MASTER_PORT='$((10000 + SLURM_JOB_ID % 50000))'`` (cb-opennmt-py-...): the Env line
    quotes its value (render.env_line), so the port became that literal text. An expression belongs in a step."""
    for rule in load_catalogue().rules:
        for env in rule.fix.env:
            assert not re.search(r"\$[({]|`", str(env.value)), (rule.code, env.name, env.value)


# --------------------------- Part A: a Megatron-LM job's fix steps name its flags, as its override line does

def test_a_megatron_lm_jobs_fix_steps_name_its_flags_not_bridge_keys(tmp_path):
    """a-mlm-llama3-8b-8k-oom-output-layer: "Megatron-LM --use-megatron-fsdp ..." then "- Or lower
    train.micro_batch_size", "- Long sequences: raise model.context_parallel_size": Bridge keys pretrain_gpt.py does
    not read, under its own flags."""
    from diagnose.explain.config.mlm_args import BRIDGE_TO_MLM

    for args in ([], ["--format", "markdown"]):
        out = run("analyze", str(write(tmp_path, "mlm.log", MEGATRON_LM)), *args)
        fix = root_fix(out) if not args else re.split(r"^#+ (?:Replay|Memory|Config)", out, flags=re.M)[0]
        assert "--use-megatron-fsdp" in fix  # OOM105's Megatron FSDP step, in flags
        named = [k for k in BRIDGE_TO_MLM if re.search(rf"(?<![\w.]){re.escape(k)}\b", fix)]
        assert not named, named
    # a job with no stack evidence keeps the Bridge words in its steps
    assert "ddp.use_megatron_fsdp=true" in root_fix(run("analyze", str(write(tmp_path, "none.log", NO_STACK))))
