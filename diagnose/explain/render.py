"""The one renderer of a fix: Bridge CLI overrides, Python recipe lines, YAML, Megatron-LM flags, ``export`` lines.

Every presenter (replay's ``render`` section, the text and markdown reports, the TUI's tabs) calls this module, so
a value is quoted the same way wherever a user copies it from. Each target gets the quoting its reader needs:

* Bridge CLI: one shell word per override. Bridge hands the words to Hydra's override parser and applies the
  result through OmegaConf (``omegaconf_utils.parse_hydra_overrides`` then ``to_container(resolve=True)``), so a
  value passes three readers, innermost first:

  1. OmegaConf: ``${`` starts an interpolation; a literal one is written ``\\${`` (and a backslash run right
     before it is doubled, so it stays literal too).
  2. Hydra's grammar: ``true``/``false``/``null`` (any case), ints, floats (``1e-05``, ``inf``, ``nan``) and
     ``[a,b]`` / ``{k:v}`` are typed; a string that is not a plain word (``fsdp_dtensor``, ``/ckpt/dir``,
     ``expandable_segments:True``) or that would read as another type (``"true"``, ``"1e3"``, ``""``) is put in
     double quotes. Inside Hydra quotes only a backslash run that precedes a quote (an escaped ``\\"`` or the
     closing one) is an escape, so such a run is doubled and ``"`` becomes ``\\"``; other backslashes are literal.
  3. The shell: the whole ``key=value`` word goes through ``shlex.quote`` (a plain word is left bare), so spaces,
     quotes, ``$``, globs and ``;`` reach Hydra unchanged. A deletion is ``'~key'`` (quoted: a bare ``~`` would be
     tilde-expanded).
* Python: ``repr`` (``float('inf')`` for the values that have no literal), so ``ast.literal_eval`` of the right-hand
  side gives the value back.
* YAML: ``yaml.safe_dump`` picks the quoting (``'true'``, ``'1e3'``, ``''``, ``': x'``, ``'#x'``), so
  ``yaml.safe_load`` gives the value back. (A string holding ``${`` would read as an interpolation when Bridge loads
  the file through OmegaConf; no fix of ours sets one.)
* Megatron-LM flags and ``export`` lines: ``shlex.quote``.

Text that goes into a comment line (the environment note, the launch note) has its control characters escaped, so
a value with a line break cannot end the comment and become code.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from diagnose.configview import _jsonable
from diagnose.explain.config.mlm_args import BRIDGE_TO_MLM, INVERTED, MLM_REMOVE
from diagnose.explain.config.overrides import is_delete
from diagnose.explain.config.releases import FIELD_MOVES
from diagnose.explain.config.values import parse_scalar
from diagnose.model import Fix, Override, WordedOverride

# A string Hydra reads back as the same string without quotes; _HYDRA_TYPED words would read as bool/null/float.
_HYDRA_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*(?::[A-Za-z0-9_./-]+)*", re.ASCII)
_HYDRA_TYPED = {"true", "false", "null", "inf", "nan"}
_BACKSLASHES_BEFORE_QUOTE = re.compile(r'(\\+)(?="|$)')
_BACKSLASHES_BEFORE_INTERPOLATION = re.compile(r"(\\*)\$\{")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_ATTRIBUTE_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

ENV_NOTE = "# environment, in the launch script (cfg.env_vars cannot override an exported value): "


# ------------------------------------------------------------------------------------------------ values


def hydra_value(value: Any) -> str:
    """A value as Hydra override text, before shell quoting (``true``, ``null``, ``[1,"a b"]``, ``"1e3"``)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # 1e-05, 0.1, inf, -inf, nan: all Hydra FLOAT tokens
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_hydra_key(k)}:{hydra_value(v)}" for k, v in value.items()) + "}"
    return _hydra_string(str(value))


def _hydra_string(s: str) -> str:
    if _HYDRA_PLAIN.fullmatch(s) and s.lower() not in _HYDRA_TYPED and _reads_back_bare(s):
        return s
    # OmegaConf first (it reads last): keep ${ literal; a backslash run before it is doubled so it stays literal
    s = _BACKSLASHES_BEFORE_INTERPOLATION.sub(lambda m: m.group(1) * 2 + "\\${", s)
    # then Hydra's quoted string: backslash runs before a quote or the closing quote are doubled, quotes escaped
    s = _BACKSLASHES_BEFORE_QUOTE.sub(lambda m: m.group(1) * 2, s).replace('"', '\\"')
    return f'"{s}"'


def _reads_back_bare(s: str) -> bool:
    """Bare only if ``--set`` (diagnose's own reader, which also takes Python-printed values: ``None``, ``yes``,
    ``torch.bfloat16``) reads the word back as this same string; Hydra reads a quoted word the same either way."""
    back = parse_scalar(s)
    return isinstance(back, str) and back == s


def _hydra_key(key: Any) -> str:
    """A dict key, with Hydra's backslash escapes (its grammar has no quoted keys). Hydra cannot write every key
    as a string: one that reads as another type (``true``, ``1``) stays that type, and quotes or ``#`` in a key do
    not parse. Config dict keys are identifiers in practice."""
    return re.sub(r"([\\ ()\[\]{}:=,\t])", r"\\\1", str(key))


def python_value(value: Any) -> str:
    """A value as a Python literal; non-finite floats as ``float('inf')`` (no literal exists for them)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float('{value}')"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(python_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_value(k)}: {python_value(v)}" for k, v in value.items()) + "}"
    return repr(str(value))


def shell_word(value: Any) -> str:
    """A value as one shell word (``True`` -> ``true``, lists space-joined by the caller)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return shlex.quote(str(value))


def comment_safe(text: str) -> str:
    """Text for a ``#`` comment line: control characters (a line break above all) shown as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


# ------------------------------------------------------------------------------------------------ lines


def cli_token(o: Override) -> str:
    """One override as one shell word for a Bridge training script's command line."""
    if is_delete(o):
        return shlex.quote(f"~{o.key}")
    return shlex.quote(f"{o.key}={hydra_value(o.value)}")


def cli_line(overrides: list[Override]) -> str:
    """Bridge / Hydra ``key=value`` overrides, space separated, ready to paste after the training script."""
    return " ".join(cli_token(o) for o in overrides)


def python_line(o: Override, var: str = "cfg") -> str:
    if not _ATTRIBUTE_PATH.fullmatch(o.key):  # never let a key write code
        return f"# not a Python attribute path: {comment_safe(repr(o.key))}"
    if is_delete(o) and o.key in FIELD_MOVES:  # a field the release removed: assigning it would be a no-op
        return f"# delete the line that sets {var}.{o.key} (no such field from Megatron-Bridge 0.7.0)"
    return f"{var}.{o.key} = {python_value(None if is_delete(o) else o.value)}"


def python_lines(overrides: list[Override], var: str = "cfg") -> list[str]:
    return [python_line(o, var) for o in overrides]


def env_line(name: str, value: Any) -> str:
    """``export NAME=value`` (``unset NAME`` for a deletion or None) with the value shell-quoted."""
    if not _IDENTIFIER.fullmatch(name):
        return f"# not a shell variable name: {comment_safe(repr(name))}"
    if value is None:
        return f"unset {name}"
    return f"export {name}={shell_word(value)}"


def _env_override_line(o: Override) -> str:
    return env_line(o.key[4:], None if is_delete(o) else o.value)


def overrides_yaml(fix: list[Override]) -> str:
    """Dotted overrides as nested YAML (``ddp.x=1`` -> ``ddp:\\n  x: 1``); a deletion becomes null."""
    tree: dict[str, Any] = {}
    for o in fix:
        parts = o.key.split(".")
        node = tree
        for p in parts[:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = node[p] = {}
            node = nxt
        node[parts[-1]] = None if is_delete(o) else _jsonable(o.value)  # what safe_dump can write: plain data
    if not tree:
        return ""
    # width: a long path stays on one line (a folded scalar reads back the same, but is awkward to copy).
    # allow_unicode keeps "ü" readable, but PyYAML then writes some line separators (U+0085, U+2028) raw, which a
    # reader folds; when the text does not read back, every non-ASCII character is escaped instead.
    import yaml  # here: only a fix written as YAML needs it (start-up time)

    text = yaml.safe_dump(tree, default_flow_style=False, sort_keys=False, allow_unicode=True, width=1 << 30)
    if text.isascii() or yaml.safe_load(text) == tree:
        return text
    return yaml.safe_dump(tree, default_flow_style=False, sort_keys=False, allow_unicode=False, width=1 << 30)


def mlm_flag(o: Override) -> str:
    """The Megatron-LM flag for one override; ``(remove --flag)`` when the fix turns a flag off; "" when no flag
    is known for the key."""
    if isinstance(o, WordedOverride) and o.mlm:
        return o.mlm  # words that depend on the job
    if o.key == "ddp.grad_reduce_in_fp32" and o.value is False:
        # --bf16 turns --accumulate-allreduce-grads-in-fp32 on unless this flag is given (arguments.py)
        return "--grad-reduce-in-bf16"
    inverted = next((flag for flag, key in INVERTED.items() if key == o.key), None)
    if inverted is not None and isinstance(o.value, bool):
        flag = "--" + inverted.replace("_", "-")
        return flag if o.value is False else f"(remove {flag})"
    if o.key in MLM_REMOVE and (o.value is False or o.value is None or is_delete(o)):
        return f"(remove {MLM_REMOVE[o.key]})"
    name = BRIDGE_TO_MLM.get(o.key)
    if name is None:
        return ""
    flag = "--" + name.replace("_", "-")
    if o.value is True:
        return flag
    if o.value is False or o.value is None or is_delete(o):
        return f"(remove {flag})"
    if isinstance(o.value, (list, tuple)):  # argparse nargs: one word per item
        return " ".join([flag] + [shell_word(v) for v in o.value])
    return f"{flag} {shell_word(o.value)}"


def mlm_flags(overrides: list[Override]) -> list[str]:
    return [f for f in (mlm_flag(o) for o in overrides) if f]


def mlm_fix_line(overrides: list[Override]) -> tuple[str, bool]:
    """A fix's config overrides as the Megatron-LM flags a job launched with pretrain_*.py takes (each once: the
    two distributed-optimizer keys are one flag), and whether every override has one (when not, the Bridge words
    stay beside them)."""
    config = [o for o in overrides if not o.key.startswith(("env.", "launch."))]
    flags = [mlm_flag(o) for o in config]
    return " ".join(dict.fromkeys(f for f in flags if f)), bool(config) and all(flags)


# ------------------------------------------------------------------------------------ a fix in the job's words

def fix_style(framework: str | None, stack: str | None) -> str:
    """How a fix's config overrides are written for this job: "megatron-lm" (its command-line flags, the Bridge
    words for what has none), "bridge" (Megatron-Bridge overrides) or "neutral" (none: the job ran another stack,
    and the rule's stack-neutral words stand in for them).

    ``framework``: what the config the log printed says (decisive when known); ``stack``: what its tracebacks'
    packages name (diagnose.match.stack). A job with neither keeps the Bridge words, as before the stack was read.

    One exception to the config deciding: a traceback through ``megatron/bridge/`` is a Megatron-Bridge job whatever
    the printed config reads as. Bridge runs on Megatron Core and prints Megatron-LM's own lines (``> initialized
    tensor model parallel with size 1``, a run_config's Megatron-LM names), so a config read as Megatron-LM does not
    rule Bridge out, while Bridge's frames in the failing traceback are code that ran (qa-report-8 L2: a Bridge
    export script was shown ``--use-megatron-fsdp``)."""
    if stack == "megatron-bridge":
        return "bridge"
    if framework == "megatron-lm":
        return "megatron-lm"
    if framework == "megatron-bridge" or stack is None:
        return "bridge"
    return "megatron-lm" if stack == "megatron-lm" else "neutral"


def replay_speaks_to(style: str) -> bool:
    """Whether replay's verdict means something to this job (``style``: fix_style). Replay checks a fix's overrides
    against a Megatron-Bridge config (the job's, else release defaults): a Megatron job, or one whose stack is unknown,
    learns from it; a job of another stack (DeepSpeed, HF Trainer, plain PyTorch) would read Bridge keys it does not
    have ("fix valid but does not fit: ddp.use_distributed_optimizer=true"), so the reports leave it out there (JSON
    keeps it)."""
    return style != "neutral"


@dataclass(frozen=True, slots=True)
class FixWords:
    """What of a fix to show a job: ``flags`` (Megatron-LM's, "" when none), ``overrides`` (to show as Bridge
    CLI, Python and YAML; [] when the flags say them all or the job is not Megatron's) and ``steps``."""

    flags: str = ""
    overrides: list[Override] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)

    @property
    def commands(self) -> list[str]:
        """The override words as command lines, each on one line: the Megatron-LM flags, the Bridge CLI words."""
        return [c for c in (self.flags, cli_line(self.overrides)) if c]


_STEP_KEY = re.compile(r"(?<![\w./-])([a-z_]+\.[a-z0-9_]+)(?:=([^\s,;)]+))?(?![\w.(-])", re.ASCII)


def _step_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        return text


def mlm_step(step: str) -> str:
    """A fix step in a Megatron-LM job's words: each Megatron-Bridge key it names (``train.micro_batch_size``,
    ``ddp.grad_reduce_in_fp32=false``) as the command-line flag pretrain_*.py takes (``--micro-batch-size``), from
    the same tables as its overrides (mlm_flag); a key with no flag stays. A step that already names Megatron-LM's
    words beside the Bridge ones is left as written."""
    if "Megatron-LM" in step:
        return step

    def flag(m: re.Match[str]) -> str:
        key, value = m.group(1), m.group(2)
        if value is None:
            name = BRIDGE_TO_MLM.get(key)
            return "--" + name.replace("_", "-") if name else m.group(0)
        return mlm_flag(Override(key, _step_value(value))) or m.group(0)

    return _STEP_KEY.sub(flag, step)


def fix_words(fix: Fix, style: str) -> FixWords:
    """The fix in the words of the job's stack (``style``: fix_style). For another stack than Megatron's the
    overrides are dropped and the rule's ``other_stacks`` steps (stack-neutral: ZeRO, FSDP, a smaller batch) stand
    in for its own steps, which name Megatron's keys; a rule without them keeps its steps."""
    if style == "neutral":
        return FixWords(steps=list(fix.other_stacks or fix.steps))
    if style != "megatron-lm":
        return FixWords(overrides=list(fix.overrides), steps=list(fix.steps))
    flags, only_flags = mlm_fix_line(fix.overrides)
    return FixWords(flags=flags, overrides=[] if only_flags else list(fix.overrides),
                    steps=[mlm_step(step) for step in fix.steps])


def overrides_in_style(overrides: list[Override], style: str) -> str:
    """Overrides as one line in the job's words (``style``: fix_style), as a summary quotes them: a Megatron-LM
    job's flags (Bridge words for what has no flag), else the Bridge CLI words; ``env.*`` as export lines after
    them, each after "; "; ``launch.*`` left out (not a setting). For "neutral" the Bridge words too: the caller
    decides whether a job of another stack is shown them at all (replay_speaks_to)."""
    config = [o for o in overrides if not o.key.startswith(("env.", "launch."))]
    env = "; ".join(_env_override_line(o) for o in overrides if o.key.startswith("env."))
    if style == "megatron-lm":
        words = [mlm_fix_line(config)[0], cli_line([o for o in config if not mlm_flag(o)])]
    else:
        words = [cli_line(config)]
    # "; " before the exports: a space made "--ckpt-format fsdp_dtensor export X=32" one command line
    return "; ".join(w for w in (" ".join(w for w in words if w), env) if w)


def fix_one_line(fix: Fix, style: str) -> str | None:
    """A fix as one line (CI annotations, JSON lines): the job's override words (Megatron-LM flags, else the
    Bridge CLI words), else its summary, else its first step; None when it says nothing."""
    words = fix_words(fix, style)
    return "; ".join(words.commands) or fix.summary or (words.steps[0] if words.steps else None)


# ------------------------------------------------------------------------------------------------ a fix


GPUS_PER_NODE = 8  # an HGX/DGX node (H100, H200, B200): the per-node count when the job did not say its own


def node_split(world: int, per_node: int | None = None) -> tuple[int, int]:
    """(nodes, GPUs per node) for ``world`` GPUs: the job's own GPUs per node when known, else 8; a world size
    that the per-node count does not divide goes on the largest per-node count that does (12 -> 2 x 6)."""
    cap = per_node if per_node and per_node > 0 else GPUS_PER_NODE
    if world <= cap:
        return 1, world
    per = next(d for d in range(cap, 0, -1) if world % d == 0)
    return world // per, per


def launch_commands(world: int, per_node: int | None = None) -> dict[str, str]:
    """The launch lines for ``world`` GPUs: ``torchrun`` (per node) and ``srun`` (the whole job)."""
    nodes, per = node_split(world, per_node)
    rdzv = " --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:29500" if nodes > 1 else ""
    return {
        "torchrun": f"torchrun --nnodes={nodes} --nproc-per-node={per}{rdzv} TRAIN_SCRIPT [ARGS...]",
        "srun": (f"srun --nodes={nodes} --ntasks-per-node={per} --gpus-per-node={per} "
                 "TRAIN_SCRIPT [ARGS...]"),
    }


def launch_comment(launch: list[Override], per_node: int | None = None) -> str:
    world = next((o.value for o in launch if o.key == "launch.world_size"), None)
    if world is None:
        return ""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        world = comment_safe(str(world))
        return (f"# needs >= {world} GPUs: launch with world size {world} "
                f"(torchrun: nnodes x nproc_per_node = {world}; srun: --ntasks={world})")
    nodes, per = node_split(world, per_node)
    return (f"# needs >= {world} GPUs: launch with world size {world} "
            f"({nodes} node{'s' if nodes != 1 else ''} x {per} GPUs)")


def render_fix(fix: list[Override], framework: str | None = None, per_node: int | None = None) -> dict[str, str]:
    """A fix in every form: ``cli``, ``python``, ``yaml``; ``env`` (export/unset lines) when it sets ``env.*``;
    ``launch`` when it needs a GPU count (``launch.world_size``); ``mlm`` for a Megatron-LM job.

    ``env.*`` keys are launch-script lines only: Bridge applies ``cfg.env_vars`` with ``os.environ.setdefault``,
    so a recipe value never beats an exported one; the Python and YAML forms carry them as a comment line.
    ``launch.*`` is not a config key: a comment line in the Python and YAML forms, never a Bridge override.
    """
    launch = [o for o in fix if o.key.startswith("launch.")]
    rest = [o for o in fix if not o.key.startswith("launch.")]
    config = [o for o in rest if not o.key.startswith("env.")]
    env = [_env_override_line(o) for o in rest if o.key.startswith("env.")]
    comment = launch_comment(launch, per_node)
    env_note = ENV_NOTE + comment_safe("; ".join(env)) if env else ""
    heads = [c for c in (comment, env_note) if c]
    python = "\n".join(python_lines(config))
    out = {
        "cli": cli_line(config),
        "python": "\n".join(heads + ([python] if python else [])),
        "yaml": "".join(h + "\n" for h in heads) + overrides_yaml(config),
    }
    if comment:
        out["launch"] = comment
        world = next((o.value for o in launch if o.key == "launch.world_size"), None)
        if isinstance(world, int) and not isinstance(world, bool) and world >= 1:
            commands = launch_commands(world, per_node)
            out["torchrun"], out["srun"] = commands["torchrun"], commands["srun"]
    if env:
        out["env"] = "\n".join(env)
    if framework == "megatron-lm":
        out["mlm"] = mlm_fix_line(config)[0]
    return out


def inline_fix(overrides: list[Override]) -> str:
    """A fix inside a sentence or a one-line summary: the Bridge CLI words, then ``export`` lines for env.* keys,
    joined by ``; `` (what a user would paste, in the same quoting as everywhere else)."""
    cli = cli_line([o for o in overrides if not o.key.startswith("env.")])
    env = [_env_override_line(o) for o in overrides if o.key.startswith("env.")]
    return "; ".join(([cli] if cli else []) + env)
