"""``diagnose check CONFIG --gpus N``: before launch, will this config fail validation or run out of memory?

Loads the config (run_config.yaml, a recipe's YAML dump, a Megatron-LM argument list), applies ``--set``
overrides, replays it through the validator (every violation with the fix proven by replay), then plans memory
per GPU for the config as given and the alternatives at the same GPU count.
Exit codes: 0 validates and fits, 1 does not validate or does not fit, 2 bad input.
JSON (``--format json``): schema ``diagnose/check@1`` = {"schema", "replay", "memory"}.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from diagnose.explain.memory.gpus import fmt_gib, gpu_by_name, parse_gpu_memory
from diagnose.model import DiagnoseError, Override
from diagnose.units import format_gib_short

if TYPE_CHECKING:
    from rich.console import JustifyMethod

    from diagnose.explain.memory.plan import MemoryPlan

SCHEMA = "diagnose/check@1"
EXIT_OK, EXIT_FAIL = 0, 1
DEFAULT_GPU = "h100-80gb"
SHORT = {"distributed_optimizer": "dist-opt", "fsdp:optim_grads_params": "fsdp:ogp", "fsdp:optim_grads": "fsdp:og",
         "fsdp:no_shard": "fsdp:none"}
LEGEND = ("dist-opt = distributed_optimizer, fsdp:og = fsdp:optim_grads, fsdp:ogp = fsdp:optim_grads_params, "
          "fsdp:none = fsdp:no_shard")


# ------------------------------------------------------------------------------------------ inputs


def capacity_from_args(args: Any) -> tuple[int, str]:
    """(bytes, where the number came from)."""
    if getattr(args, "gpu_memory", None):
        n, note = parse_gpu_memory(args.gpu_memory)
        return n, f"--gpu-memory {args.gpu_memory}" + (f"; {note}" if note else "")
    name = getattr(args, "gpu", None) or DEFAULT_GPU
    gpu = gpu_by_name(name)
    where = f"--gpu {gpu.name}" if getattr(args, "gpu", None) else f"default GPU {gpu.name} (use --gpu or --gpu-memory)"
    return gpu.capacity_bytes, where


def load_view(path: str) -> Any:
    """The config engineer's loader (YAML, Megatron-LM args, logs); a plain YAML fallback while it is absent."""
    try:
        from diagnose.explain.config import load_config
    except (ImportError, AttributeError):
        load_config = None
    if load_config is not None:
        return load_config(path)
    return _load_yaml_view(path)


def _load_yaml_view(path: str) -> Any:
    import yaml

    from diagnose.explain.config import ConfigView

    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise DiagnoseError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DiagnoseError(f"{path}: is a directory, expected a config file") from None
    except PermissionError:
        raise DiagnoseError(f"{path}: permission denied") from None
    except yaml.YAMLError as e:
        raise DiagnoseError(f"{path}: not valid YAML ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(data, dict):
        raise DiagnoseError(f"{path}: expected a YAML mapping of config sections (model:, ddp:, ...)")
    view = ConfigView(framework="megatron-bridge", sources=[path])

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if str(k) == "_target_":
                    continue
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            view.set(prefix, node, f"file:{path}")

    walk("", data)
    return view


def prepare_view(args: Any) -> Any:
    from diagnose.explain.config import apply_defaults, apply_overrides, parse_set

    view = load_view(args.config)
    sets = [parse_set(s) for s in (getattr(args, "sets", None) or [])]
    from diagnose.explain.config.keycheck import check_overrides

    check_overrides(sets)
    if sets:
        view = apply_overrides(view, sets)
    view.set("launch.world_size", int(args.gpus), "override")
    apply_defaults(view, getattr(args, "bridge_version", None))
    return view


# ------------------------------------------------------------------------------------------ replay


def replay_section(view: Any, bridge_version: str | None, accept=None) -> dict[str, Any]:
    """The report's ``replay`` section for the config as given: its violations, the smallest fix the validator's
    suggestions give that passes (and that ``accept``, the memory check, takes), and the result after the fix
    (``diagnose.explain.replay``)."""
    from diagnose.explain.replay import replay

    out = replay(view, [], bridge_version, accept=accept).to_dict()
    out["passes"] = not out.get("violations")
    return out


def memory_accept(view: Any, gpus: int, capacity: int):
    """A validator's fix must not put the model where it no longer fits (a layout fix that sets PP 1 on a 671B
    model): when the config as given fits, a fix must fit too; when it does not, memory is the plans' question
    and any valid fix is taken. Returns (accept, fits_of) for ``replay`` and for the report."""
    from diagnose.explain.memory.plan import fix_plan

    cache: dict[str, Any] = {}

    def fits_of(overrides: list) -> bool | None:
        key = repr([(o.key, o.value) for o in overrides])
        if key not in cache:
            try:
                plan = fix_plan(view, overrides, gpus, capacity)
            except DiagnoseError:
                plan = None
            cache[key] = None if plan is None else plan.fits
        return cache[key]

    given = fits_of([])

    def accept(overrides: list) -> bool:
        return given is not True or fits_of(overrides) is not False

    return accept, fits_of


# ------------------------------------------------------------------------------------------ output


def _render_text(out: dict[str, Any], where: str, console_file=None, color: str = "auto") -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from diagnose.present.safe import inert

    force = {"always": True, "never": False}.get(color)
    stream = console_file or sys.stdout
    is_tty = bool(getattr(stream, "isatty", lambda: False)())
    # a pipe or a file gets the text report's width (100), not rich's 80, so override lines are not broken mid-key
    width = 140 if console_file is not None and color != "always" else (None if is_tty else 100)
    console = Console(file=stream, force_terminal=force, no_color=(color == "never"), highlight=False, width=width)
    rep = out["replay"]
    violations = rep.get("violations", [])
    if rep.get("assumed_release"):
        console.print(Text("Validated as: " + inert(str(rep["assumed_release"])), style="dim"))
    if not violations:
        console.print(Text("Validation: passes", style="bold green"))
    else:
        console.print(Text(f"Validation: {len(violations)} violation(s)", style="bold red"))
        for v in violations:
            line = Text("  - ")
            line.append(inert(str(v.get("message", ""))))
            console.print(line)
        fix = rep.get("fix") or []
        after = rep.get("after_fix") or {}
        if fix:
            ov = _fix_text(fix, _mlm(where))
            proven = "passes after replay" if after.get("passes") else "still fails after replay"
            console.print(Text(f"  fix ({proven}): " + inert(ov), style="green" if after.get("passes") else "yellow"))
        gbs = rep.get("changes_global_batch_size")
        if gbs:
            console.print(Text(f"  note: this fix changes train.global_batch_size {gbs['from']} -> {gbs['to']}, a "
                               "training hyper-parameter (numerics, LR schedule); the memory plans below keep it "
                               "where a split allows", style="yellow"))
    mem: MemoryPlan = out["memory"]
    cap = mem.capacity
    plans = mem.plans
    source = mem.params_source + (", with ASSUMED values" if mem.assumed else "")
    console.print(Text(f"\nMemory per GPU (GiB): {mem.params / 1e9:.2f}B parameters ({source}), "
                       f"GPU {fmt_gib(cap)} ({inert(where)})", style="bold"))
    table = Table(show_lines=False, pad_edge=False, box=None)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("#", "right"), ("strategy", "left"), ("dp/tp/pp/cp", "left"), ("state", "right"),
        ("activ.", "right"), ("peak", "right"), ("", "left"), ("fits", "left"))
    for col, just in columns:
        table.add_column(col, justify=just, no_wrap=True, min_width=len(col) if col != "fits" else 7)
    for i, p in enumerate(plans):
        frac = (p.peak_bytes or 0) / cap if cap else 0
        bar = "█" * min(5, int(round(frac * 5))) + ("▶" if frac > 1 else "")
        table.add_row(
            "given" if i == 0 else str(i), SHORT.get(p.strategy, p.strategy), f"{p.dp}/{p.tp}/{p.pp}/{p.cp}",
            format_gib_short(p.model_state_bytes), format_gib_short(p.activation_bytes),
            format_gib_short(p.peak_bytes), Text(bar, style="red" if frac > 1 else "green"),
            Text("invalid" if p.valid is False else "yes" if p.fits else "NO",
                 style="green" if p.fits and p.valid is not False else "bold red"),
        )
    console.print(table)
    if any(p.strategy in SHORT for p in plans):
        console.print(Text(LEGEND, style="dim"))
    for i, p in enumerate(plans):
        if i == 0 or not p.overrides:
            continue
        line = Text(f"{i:>2}  ", style="bold")
        line.append(inert(_fix_text(p.overrides, _mlm(where))))
        console.print(line, soft_wrap=True)  # one line, so that it can be copied into a shell
        console.print(Text("    " + inert(p.cost or ""), style="dim"))
    for note in mem.notes:
        warn = note.startswith("WARNING")
        console.print(Text(("" if warn else "note: ") + inert(note), style="bold yellow" if warn else "dim"))
    given = plans[0]
    cheapest = next((i for i, p in enumerate(plans) if i and p.fits and p.valid is not False), None)
    if given.valid is False:
        msg = "\nAs given: INVALID (fails validation above), so it cannot run whatever its memory."
        msg += (f" Cheapest valid plan that fits: #{cheapest}." if cheapest else
                " No valid alternative at this GPU count fits.")
        console.print(Text(msg, style="bold red"))
    elif given.fits:
        console.print(Text(f"\nAs given: fits (peak {fmt_gib(given.peak_bytes)} of {fmt_gib(cap)}).",
                           style="bold green"))
    else:
        msg = f"\nAs given: does NOT fit (peak {fmt_gib(given.peak_bytes)} of {fmt_gib(cap)})."
        msg += f" Cheapest working change: #{cheapest}." if cheapest else " No alternative at this GPU count fits."
        console.print(Text(msg, style="bold red"))


def _mlm(where: str) -> bool:
    return where.endswith("; changes as Megatron-LM flags")


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f}G"


def _mark_global_batch_change(replay: dict[str, Any], view: Any) -> None:
    """train.global_batch_size is a hyper-parameter: a validator fix that changes it must say so."""
    for o in replay.get("fix") or []:
        if o.get("key") == "train.global_batch_size":
            try:
                was = view.get("train.global_batch_size")
            except Exception:  # noqa: BLE001
                was = None
            if was != o.get("value"):
                replay["changes_global_batch_size"] = {"from": was, "to": o.get("value")}


def _fix_text(overrides: list[dict[str, Any]] | list[Override], mlm: bool = False) -> str:
    """Overrides as the reports print them (one renderer): Bridge CLI words, then ``export`` lines for env.* keys.
    With ``mlm`` (the input was a Megatron-LM argument list) in its dialect: Megatron-LM flags, Bridge words only
    for the keys that have no flag. A field the release removed is deleted (``~key``)."""
    from diagnose.explain.config.overrides import parse_set
    from diagnose.explain.config.releases import FIELD_MOVES
    from diagnose.explain.render import inline_fix, mlm_flag

    def one(o: dict[str, Any] | Override) -> Override:
        o = o if isinstance(o, Override) else Override(o["key"], o["value"])  # replay's fix is still JSON-shaped
        return parse_set("~" + o.key) if o.value is None and o.key in FIELD_MOVES else o  # a removed field: delete

    ovs = [one(o) for o in overrides]
    if not mlm:
        return inline_fix(ovs)
    words = []
    for o in ovs:
        flag = "" if o.key.startswith(("env.", "launch.")) or o.key.startswith("~") else mlm_flag(o)
        words.append(flag or inline_fix([o]))
    return " ".join(w for w in words if w)


def _prefetch_param_count(view: Any) -> None:
    """Start megatron-core's meta-device parameter count now, in a child, while the validator imports megatron-core
    here: the two imports take seconds each and no longer add up."""
    from diagnose.explain.memory import from_config as fc
    from diagnose.explain.memory.meta_count import prefetch
    from diagnose.explain.memory.plan import _exact_wanted

    if not _exact_wanted():
        return
    try:
        shape = fc.shape_from_config(view)
    except Exception:  # noqa: BLE001 - memory_plan reports a bad shape itself, with its own message
        return
    if shape is not None:
        prefetch(shape)


def build(args: Any) -> tuple[dict[str, Any], int, str]:
    from diagnose.explain.memory.plan import memory_plan
    from diagnose.explain.memory.replay_check import prove

    if args.gpus is None or int(args.gpus) < 1:
        raise DiagnoseError("--gpus must be at least 1")
    capacity, where = capacity_from_args(args)
    view = prepare_view(args)
    version = getattr(args, "bridge_version", None)
    _prefetch_param_count(view)
    accept, fits_of = memory_accept(view, int(args.gpus), capacity)
    replay = replay_section(view, version, accept)
    if replay.get("fix"):
        replay["fits"] = fits_of([Override(o["key"], o["value"]) for o in replay["fix"]])
    _mark_global_batch_change(replay, view)
    plan = memory_plan(view, int(args.gpus), capacity, prove=lambda ovs: prove(view, ovs, version))
    out: dict[str, Any] = {"schema": SCHEMA, "replay": replay, "memory": plan}  # serialised by run()
    mlm = getattr(view, "framework", None) == "megatron-lm"
    passes = not replay.get("violations")
    given = plan.given
    if not passes:
        given.valid = False  # the config as given fails validation: its row is for reference, never "working"
        _lead_with_the_fix(plan, view, replay, int(args.gpus), capacity)
        fix = _fix_text(replay.get("fix") or [], mlm)
        plan.notes.append(
            "the config as given fails validation: each plan below changes only memory, so it also needs the "
            + (f"validator's fix ({fix})" if fix else "violations above fixed")
            + (" or its own split (TP x PP) where it changes them" if fix and "parallel_size" in fix else ""))
    elif given.valid is None:
        given.valid = True
    code = EXIT_OK if (passes and given.fits) else EXIT_FAIL
    if mlm:
        where += "; changes as Megatron-LM flags"
    return out, code, where


def _lead_with_the_fix(memory: MemoryPlan, view: Any, replay: dict[str, Any], gpus: int, capacity: int) -> None:
    """When the validator's fix alone makes the config valid and it then fits, that is the first plan (one answer:
    no layout or sharding change is needed), ahead of the memory alternatives."""
    from diagnose.explain.memory.plan import fix_plan, option_of

    fix = [Override(o["key"], o["value"]) for o in replay.get("fix") or []]
    if not fix or not (replay.get("after_fix") or {}).get("passes"):
        return
    plan = fix_plan(view, fix, gpus, capacity)
    if plan is None or not plan.fits:
        return
    plan.overrides = fix
    plan.label = "the validator's fix"
    plan.cost = "the fix above; no memory change needed"
    pinned = {o.key: o.value for o in fix}
    try:
        gbs = int(pinned.get("train.global_batch_size", view.get("train.global_batch_size")) or 0)
        mbs = int(pinned.get("train.micro_batch_size", view.get("train.micro_batch_size")) or 1)
    except (TypeError, ValueError):
        gbs, mbs = 0, 1
    if "train.global_batch_size" in pinned or (gbs and gbs % (mbs * max(1, plan.layout.dp))):
        plan.cost += "; changes train.global_batch_size (a hyper-parameter)"
    plan.valid = True
    memory.plans[:] = [memory.plans[0], option_of(plan)] + [p for p in memory.plans[1:] if p.overrides != fix]


def run(args: Any) -> int:
    out, code, where = build(args)
    from diagnose.present.output import output_stream

    dest = getattr(args, "output", None)
    with output_stream(dest) as fh:
        if getattr(args, "format", "text") == "json":
            fh.write(json.dumps({**out, "memory": out["memory"].to_dict()}, indent=2, default=str) + "\n")
        else:
            _render_text(out, where, fh if dest else None, getattr(args, "color", "auto"))
    return code


__all__ = ["run", "build", "capacity_from_args", "prepare_view"]
