"""qa-report-7 L3 and L7: a fix's override words follow the job's stack.

Match reads the packages of the tracebacks its hits end (``Report.stack``); a job of another stack than Megatron's
(plain PyTorch, HF Trainer, DeepSpeed) gets the rule's stack-neutral steps instead of Megatron-Bridge overrides, a
Megatron-LM job its flags, and a job whose log names no stack keeps the Bridge words. The text, markdown, GitHub and
JSON-lines reports take the decision from one helper (render.fix_style / fix_words / fix_one_line)."""

from __future__ import annotations

import io
import json

import pytest

from diagnose.explain.render import fix_one_line, fix_style, fix_words
from diagnose.match import match_text
from diagnose.match.stack import decide_stack, stack_of_frames
from diagnose.model import Fix, Override
from diagnose.present.ci import render_github, render_jsonl
from diagnose.present.markdown import render_markdown
from diagnose.present.text import make_console, render


def render_text(report, width: int = 200) -> str:
    out = io.StringIO()
    render(report, make_console(out, color="never", width=width), detail="default")
    return out.getvalue()

OOM = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.22 GiB (GPU 0; 79.35 GiB total "
       "capacity; 77.41 GiB already allocated; 407.19 MiB free; 78.05 GiB reserved in total by PyTorch)")
SITE = "/opt/conda/lib/python3.10/site-packages"
ADAM = [f'  File "{SITE}/torch/optim/adamw.py", line 160, in step', "    self._init_group(",
        f'  File "{SITE}/torch/optim/adamw.py", line 114, in _init_group',
        '    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)']


def _log(*frames: str) -> str:
    return "\n".join(["Traceback (most recent call last):", *frames, *ADAM, OOM]) + "\n"


PLAIN_TORCH = _log('  File "/home/u/accessory/main_finetune.py", line 300, in <module>', "    main(args)",
                   '  File "/home/u/accessory/engine_finetune.py", line 69, in train_one_epoch',
                   "    optimizer.step()")
MEGATRON_LM = _log('  File "/workspace/Megatron-LM/pretrain_gpt.py", line 300, in <module>', "    pretrain(",
                   '  File "/workspace/Megatron-LM/megatron/training/training.py", line 1200, in train_step',
                   "    update_successful, grad_norm, num_zeros_in_grad = optimizer.step()")
DEEPSPEED = _log('  File "/home/u/train.py", line 30, in <module>', "    engine.step()",
                 f'  File "{SITE}/deepspeed/runtime/engine.py", line 2213, in step', "    self._take_model_step()")
NO_STACK = _log()  # PyTorch's frames alone: no package of the job's, no config


@pytest.fixture(scope="module")
def reports(builtin_catalogue):
    return {name: match_text(text, builtin_catalogue) for name, text in
            (("torch", PLAIN_TORCH), ("mlm", MEGATRON_LM), ("ds", DEEPSPEED), ("none", NO_STACK))}


def test_stack_of_frames_names_the_most_decisive_package():
    assert stack_of_frames([f'  File "{SITE}/megatron/bridge/training/train.py", line 1, in f',
                            f'  File "{SITE}/megatron/core/optimizer/optimizer.py", line 2, in g']) == "megatron-bridge"
    assert stack_of_frames([f'  File "{SITE}/transformers/trainer.py", line 1, in train',
                            f'  File "{SITE}/deepspeed/runtime/engine.py", line 2, in step']) == "deepspeed"
    assert stack_of_frames(['  File "/w/train.py", line 1, in main',
                            f'  File "{SITE}/torch/optim/adam.py", line 2, in step']) == "pytorch"
    # PyTorch's own frames alone (a watchdog thread) say nothing of the code that drove them
    assert stack_of_frames([f'  File "{SITE}/torch/utils/data/_utils/worker.py", line 2, in loop']) == ""
    assert decide_stack(["", "pytorch", "megatron-lm"]) == "megatron-lm"
    assert decide_stack(["", ""]) is None


def test_the_report_keeps_the_stack_its_tracebacks_name(reports):
    assert [reports[k].stack for k in ("torch", "mlm", "ds", "none")] == ["pytorch", "megatron-lm", "deepspeed",
                                                                            None]
    assert all(r.root is not None and r.root.rule == "OOM105" for r in reports.values())
    assert reports["torch"].to_dict()["stack"] == "pytorch"
    assert "stack" not in reports["none"].to_dict()


def test_text_report_shows_megatron_words_only_to_megatron_jobs(reports):
    plain = render_text(reports["torch"], width=200)
    assert "Bridge CLI" not in plain and "ddp.use_distributed_optimizer" not in plain
    assert "DeepSpeed ZeRO stage 1 or higher" in plain  # OOM105's other_stacks step
    assert "Megatron FSDP: ddp.use_megatron_fsdp" not in plain  # its Megatron step is not shown
    mlm = render_text(reports["mlm"], width=200)
    assert "Megatron-LM --use-distributed-optimizer" in mlm and "Bridge CLI" not in mlm
    # no stack evidence, no config: today's words
    assert "Bridge CLI  ddp.use_distributed_optimizer=true" in render_text(reports["none"], width=200)


def test_markdown_follows_the_same_decision(reports):
    md = render_markdown(reports["ds"])
    assert "Bridge command line" not in md and "- Shard the optimizer state across the data-parallel ranks" in md
    assert "Bridge command line" in render_markdown(reports["none"])


def test_github_and_jsonl_one_line_fix_follows_the_stack(reports):
    fixes = {k: json.loads(render_jsonl(r).splitlines()[0])["fix"] for k, r in reports.items()}
    assert fixes["mlm"] == "--use-distributed-optimizer"
    assert fixes["none"].startswith("ddp.use_distributed_optimizer=true")
    # another stack: the rule's summary (stack-neutral since qa-report-8), not its overrides
    assert fixes["torch"] == fixes["ds"] == reports["torch"].root.fix.summary
    assert "ddp." not in fixes["torch"] and "Megatron" not in fixes["torch"]
    assert "Fix: --use-distributed-optimizer" in render_github(reports["mlm"])
    assert "ddp.use_distributed_optimizer" not in render_github(reports["torch"])


def test_one_helper_decides_for_every_presenter():
    fix = Fix(summary="s", overrides=[Override("ddp.use_distributed_optimizer", True)], steps=["megatron step"],
              other_stacks=["neutral step"])
    assert fix_style(None, None) == fix_style("megatron-bridge", "deepspeed") == "bridge"
    assert fix_style("megatron-lm", None) == fix_style(None, "megatron-lm") == "megatron-lm"
    assert fix_style(None, "transformers") == "neutral"
    neutral = fix_words(fix, "neutral")
    assert (neutral.flags, neutral.overrides, neutral.steps) == ("", [], ["neutral step"])
    assert fix_words(fix, "megatron-lm").flags == "--use-distributed-optimizer"
    assert fix_one_line(fix, "bridge") == "ddp.use_distributed_optimizer=true"
    assert fix_one_line(fix, "neutral") == "s"


def test_a_misspelt_fix_field_is_refused():
    """A [rule.fix] key the schema does not know (other_stack for other_stacks) is an error, as an unknown
    [rule.context] condition is: dropped in silence, its words would never be shown."""
    from conftest import make_rule

    assert make_rule("ZZ932", "boom", r"boom", fix={"summary": "s", "other_stacks": ["x"]}).fix.other_stacks == ["x"]
    with pytest.raises(ValueError, match="unknown fix field"):
        make_rule("ZZ932", "boom", r"boom", fix={"summary": "s", "other_stack": ["x"]})


def test_the_tui_fix_follows_the_stack_too(reports):
    """The TUI's fix tabs and steps (present/tui/fixrender.render_fix) read the same decision as the reports: a
    DeepSpeed job gets OOM105's other_stacks steps and no Bridge overrides; a job that names no stack keeps them."""
    from diagnose.present.tui.fixrender import render_fix

    ds, none = (render_fix(reports[k], reports[k].root) for k in ("ds", "none"))
    assert ds.overrides == [] and not ds.forms["cli"]
    assert any("DeepSpeed ZeRO stage 1 or higher" in step for step in ds.steps)
    assert none.overrides and "ddp.use_distributed_optimizer" in none.forms["cli"]
    assert none.steps == reports["none"].root.shown_fix.steps


# qa-report-8 L2: a Megatron-Bridge export script (``convert_bridge_example.py export --hf-model ... --megatron-path
# ...``) was read as a Megatron-LM launch because its flags are hyphenated, and the config then decided the fix's
# words over the traceback's Bridge frames: the job was shown ``--use-megatron-fsdp``
BRIDGE_EXPORT = ("python3 convert_bridge_example.py export --hf-model deepseek-ai/DeepSeek-V3 "
                 "--megatron-path /data/ckpt/iter_0060000 --hf-path ./export")


def test_an_argparse_script_with_hyphenated_flags_is_not_megatron_lm():
    from diagnose.explain.config.cmdline import parse_command

    assert parse_command(BRIDGE_EXPORT, "log:1").framework is None
    mlm = parse_command("python train.py --tensor-model-parallel-size 2 --micro-batch-size 1", "log:1")
    assert mlm.framework == "megatron-lm"
    assert mlm.get("model.tensor_model_parallel_size") == 2
    assert parse_command("python pretrain_gpt.py --foo-bar 1", "log:1").framework == "megatron-lm"
    # timm's train.py: Megatron-LM names, but other scripts' too
    timm = "python train.py /data/imagenet --model vit_base_patch16_224 --weight-decay 0.05 --clip-grad 1.0 --min-lr 1e-6"
    assert parse_command(timm, "log:1").framework is None
    assert parse_command("python pretrain_gpt.py --weight-decay 0.1", "log:1").get("optimizer.weight_decay") == 0.1


def test_a_traceback_through_megatron_bridge_decides_over_the_config():
    assert fix_style("megatron-lm", "megatron-bridge") == "bridge"
    assert fix_style("megatron-lm", "megatron-lm") == fix_style("megatron-lm", None) == "megatron-lm"


def test_a_bridge_export_oom_is_shown_bridge_words(builtin_catalogue):
    from diagnose.pipeline import analyze

    frames = ['  File "/home/u/convert_bridge_example.py", line 118, in export_megatron_to_hf',
              "    bridge.export_ckpt(megatron_path=megatron_path, hf_path=hf_path)",
              '  File "/workspace/Megatron-Bridge/src/megatron/bridge/models/conversion/auto_bridge.py", line 622, '
              "in export_ckpt", "    self.save_hf_pretrained(megatron_model, hf_path)"]
    text = "\n".join(["$ " + BRIDGE_EXPORT, "> initialized tensor model parallel with size 1",
                      "Traceback (most recent call last):", *frames, OOM]) + "\n"
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "export.log"
        log.write_text(text)
        report = analyze([str(log)])
    assert report.stack == "megatron-bridge"
    assert fix_style(report.framework, report.stack) == "bridge"
    assert "--use-megatron-fsdp" not in render_text(report)


def test_a_misspelt_rule_or_examples_key_is_refused_with_the_key_it_meant():
    """``confidnce = 0.9`` in a [[rule]] table left the rule at the default confidence in silence, and
    ``[rule.examples] matches = [...]`` left it untested; each is now refused by name, with the nearest key."""
    from conftest import make_rule

    with pytest.raises(ValueError, match=r"unknown rule key\(s\): 'confidnce' \(did you mean 'confidence'\?\)"):
        make_rule("ZZ933", "boom", r"boom", confidnce=0.9)
    with pytest.raises(ValueError, match=r"unknown examples key\(s\): 'matches' \(did you mean 'match'\?\)"):
        make_rule("ZZ934", "boom", r"boom", examples={"matches": ["boom"]})
    assert make_rule("ZZ935", "boom", r"boom", confidence=0.9, examples={"match": ["boom"]}).confidence == 0.9
