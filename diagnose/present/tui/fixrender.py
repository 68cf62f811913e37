"""The fix in the four forms a user pastes somewhere: Bridge CLI overrides, Python recipe lines, YAML, Megatron-LM flags.

The replay stage renders the proven set (``report.replay["render"]``); this module is the fallback for findings
the replay did not cover, rendering straight from ``Fix.overrides`` and ``Fix.env``. No Textual import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from diagnose.model import Finding, Fix, Override, Report

# Bridge config paths whose Megatron-LM flag is not simply the last segment with dashes.
_MLM_FLAG_NAMES = {
    "ddp.grad_reduce_in_fp32": "accumulate-allreduce-grads-in-fp32",
    "ddp.use_megatron_fsdp": "use-megatron-fsdp",
    "dist.use_torch_fsdp2": "use-torch-fsdp2",
    "optimizer.use_distributed_optimizer": "use-distributed-optimizer",
    "model.tensor_model_parallel_size": "tensor-model-parallel-size",
    "model.pipeline_model_parallel_size": "pipeline-model-parallel-size",
    "model.context_parallel_size": "context-parallel-size",
    "model.expert_model_parallel_size": "expert-model-parallel-size",
    "model.sequence_parallel": "sequence-parallel",
}

TAB_ORDER = (("cli", "Bridge CLI"), ("python", "Python"), ("yaml", "YAML"), ("mlm", "Megatron-LM flags"))


@dataclass
class RenderedFix:
    """The fix for one finding, each form ready to copy, plus what replay said about it."""

    forms: dict[str, str]  # keys of TAB_ORDER; "" where a form has nothing to say
    verdict: str  # one line: "passes validation after the fix (reproduced the failure first)" ...
    proven: bool  # True when the overrides are replay's own proven set
    overrides: list[Override]


def _cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return value if value and all(c.isalnum() or c in "._-:/" for c in value) else json.dumps(value)
    return json.dumps(value)


def _python_value(value: Any) -> str:
    return repr(value)


def render_cli(overrides: list[Override], env: list[tuple[str, str]]) -> str:
    lines = [f"export {name}={_shell_quote(value)}" for name, value in env]
    if overrides:
        lines.append(" ".join(f"{o.key}={_cli_value(o.value)}" for o in overrides))
    return "\n".join(lines)


def render_python(overrides: list[Override], env: list[tuple[str, str]]) -> str:
    lines = [f"os.environ[{name!r}] = {value!r}" for name, value in env]
    lines += [f"cfg.{o.key} = {_python_value(o.value)}" for o in overrides]
    return "\n".join(lines)


def render_yaml(overrides: list[Override], env: list[tuple[str, str]]) -> str:
    tree: dict[str, Any] = {}
    for o in overrides:
        node = tree
        *parents, leaf = o.key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # a key both set and nested: keep the nested form
                child = node[part] = {}
            node = child
        node[leaf] = o.value
    lines: list[str] = []
    _yaml_lines(tree, 0, lines)
    if env:
        lines.append("# environment")
        lines += [f"# {name}={value}" for name, value in env]
    return "\n".join(lines)


def _yaml_lines(tree: dict[str, Any], depth: int, out: list[str]) -> None:
    for key, value in tree.items():
        pad = "  " * depth
        if isinstance(value, dict):
            out.append(f"{pad}{key}:")
            _yaml_lines(value, depth + 1, out)
        else:
            out.append(f"{pad}{key}: {json.dumps(value)}")


def mlm_flag(override: Override) -> str:
    name = _MLM_FLAG_NAMES.get(override.key, override.key.rsplit(".", 1)[-1].replace("_", "-"))
    if override.value is True:
        return f"--{name}"
    if override.value is False:
        return f"# drop --{name}"
    return f"--{name} {_cli_value(override.value)}"


def render_mlm(overrides: list[Override], env: list[tuple[str, str]]) -> str:
    lines = [f"export {name}={_shell_quote(value)}" for name, value in env]
    lines += [mlm_flag(o) for o in overrides]
    return "\n".join(lines)


def _shell_quote(value: str) -> str:
    return value if value and all(c.isalnum() or c in "._-:/=," for c in value) else "'" + value.replace("'", "'\\''") + "'"


def _env_pairs(fix: Fix) -> list[tuple[str, str]]:
    return [(e.name, e.value) for e in fix.env]


def _as_overrides(items: Any) -> list[Override]:
    out: list[Override] = []
    for item in items or []:
        if isinstance(item, Override):
            out.append(item)
        elif isinstance(item, dict) and "key" in item:
            out.append(Override(str(item["key"]), item.get("value")))
    return out


def replay_covers(report: Report, finding: Finding) -> bool:
    """Replay names the rule it proved (``replay["rule"]``); without that it worked on the root cause and on any
    finding whose overrides it extended."""
    replay = report.replay
    if not replay or not replay.get("fix"):
        return False
    if replay.get("rule"):
        return replay["rule"] == finding.rule
    if report.root is finding:
        return True
    proven_keys = {o.key for o in _as_overrides(replay.get("fix"))}
    own = {o.key for o in finding.fix.overrides}
    return bool(own) and own <= proven_keys


def replay_verdict(replay: dict[str, Any]) -> str:
    reproduced = replay.get("reproduced")
    after = replay.get("after_fix") or {}
    passes = after.get("passes")
    if passes is True:
        head = "✔ passes validation with these overrides"
    elif passes is False:
        remaining = len(after.get("violations") or [])
        head = f"✘ still fails validation after the fix ({remaining} check{'s' if remaining != 1 else ''})"
    else:
        head = "replay did not run the fix"
    if reproduced is True:
        tail = "replay reproduced the failure first"
    elif reproduced is False:
        tail = "replay did not reproduce the failure"
    else:
        tail = "the log did not carry enough config to reproduce"
    fit = replay.get("fit") if isinstance(replay.get("fit"), dict) else {}
    fits = replay.get("fits")
    if fits is True:
        gpus, job = fit.get("gpus"), fit.get("job_gpus")
        more = f" on {gpus} GPUs (the job had {job})" if gpus and job and gpus != job else ""
        head += f"; fits in memory{more}"
    elif fits is False:
        head += "; but does NOT fit in GPU memory"
    launch = (replay.get("render") or {}).get("launch")
    notes = [str(n) for n in replay.get("notes") or [] if n]
    lines = [f"{head}; {tail}"]
    if launch:
        lines.append(str(launch))
    return "\n".join(lines) + "".join(f"\n  note: {n}" for n in notes)


def _split_env(overrides: list[Override], env: list[tuple[str, str]]) -> tuple[list[Override], list[tuple[str, str]]]:
    """Replay writes environment variables as ``env.NAME`` keys: move them to the environment list."""
    config = [o for o in overrides if not o.key.startswith("env.")]
    names = {name for name, _ in env}
    extra = [(o.key[4:], str(o.value)) for o in overrides if o.key.startswith("env.") and o.key[4:] not in names]
    return config, env + extra


def render_fix(report: Report, finding: Finding) -> RenderedFix:
    env = _env_pairs(finding.fix)
    if replay_covers(report, finding):
        replay = report.replay or {}
        overrides, env = _split_env(_as_overrides(replay.get("fix")), env)
        given = replay.get("render") or {}
        forms = {
            "cli": given.get("cli") or render_cli(overrides, env),
            "python": given.get("python") or render_python(overrides, env),
            "yaml": given.get("yaml") or render_yaml(overrides, env),
            "mlm": given.get("mlm") or render_mlm(overrides, env),
        }
        return RenderedFix(forms, replay_verdict(replay), True, overrides)
    overrides, env = _split_env(list(finding.fix.overrides), env)
    forms = {
        "cli": render_cli(overrides, env),
        "python": render_python(overrides, env),
        "yaml": render_yaml(overrides, env),
        "mlm": render_mlm(overrides, env),
    }
    verdict = "not replayed: overrides from the rule" if overrides else "no config change suggested"
    return RenderedFix(forms, verdict, False, overrides)
