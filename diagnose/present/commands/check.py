"""``diagnose check CONFIG --gpus N``: before launch, will this config fail validation or run out of memory?

Loads the config (run_config.yaml, a recipe's YAML dump, a Megatron-LM argument list), applies ``--set``
overrides, replays it through the validator (every violation with the fix proven by replay), then plans memory
per GPU for the config as given and the alternatives at the same GPU count.
Exit codes: 0 validates and fits, 1 does not validate or does not fit, 2 bad input.
JSON (``--format json``): schema ``diagnose/check@1`` = {"schema", "replay", "memory"}.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from diagnose.checking import CheckRequest, CheckResult, check, fix_text
from diagnose.explain.memory.gpus import gpu_by_name, parse_gpu_memory
from diagnose.model import DiagnoseError
from diagnose.present import json_text
from diagnose.present.memory_text import batch_change_words, count_words, usable_words
from diagnose.units import fmt_gib, format_gib_short

if TYPE_CHECKING:
    from rich.console import JustifyMethod


EXIT_OK, EXIT_FAIL = 0, 1
DEFAULT_GPU = "h100-80gb"
SHORT = {"distributed_optimizer": "dist-opt", "fsdp:optim_grads_params": "fsdp:ogp", "fsdp:optim_grads": "fsdp:og",
         "fsdp:no_shard": "fsdp:none"}
PEAK_WORDS = "peak = the largest of wrap, first optimizer step and steady state, not the sum of the columns"
BUFFER_WORDS = "; bufs = Megatron FSDP buffers in flight (gathered parameters, unsharded gradients)"
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


# ------------------------------------------------------------------------------------------ output


def _render_text(result: CheckResult, where: str, console_file=None, color: str = "auto") -> None:
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
    validation = result.replay.result
    if validation.before.assumed_release:
        console.print(Text("Validated as: " + inert(validation.before.assumed_release), style="dim"))
    if result.replay.passes:
        console.print(Text("Validation: passes", style="bold green"))
    else:
        console.print(Text(f"Validation: {len(result.replay.violations)} violation(s)", style="bold red"))
        for v in result.replay.violations:
            console.print(Text("  - ").append(inert(v.message)))
        if validation.fix:
            proven = "passes after replay" if validation.passes else "still fails after replay"
            console.print(Text(f"  fix ({proven}): " + inert(fix_text(validation.fix, result.mlm)),
                               style="green" if validation.passes else "yellow"))
        gbs = result.replay.changes_global_batch_size
        if gbs:
            console.print(Text(f"  note: this fix changes train.global_batch_size {gbs[0]} -> {gbs[1]}, a "
                               "training hyper-parameter (numerics, LR schedule); the memory plans below keep it "
                               "where a split allows", style="yellow"))
    mem = result.memory
    cap = mem.capacity
    plans = mem.plans
    source = count_words(mem.params_source, mem.assumed)
    console.print(Text(f"\nMemory per GPU (GiB): {mem.params / 1e9:.2f}B parameters ({source}), "
                       f"GPU {fmt_gib(cap)} ({inert(where)})", style="bold"))
    table = Table(show_lines=False, pad_edge=False, box=None)
    # Megatron FSDP's gathered parameters and unsharded gradients in flight: part of the peak, not model state
    buffers = any(p.transient_bytes for p in plans)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("#", "right"), ("strategy", "left"), ("dp/tp/pp/cp", "left"), ("state", "right"),
        *((("bufs", "right"),) if buffers else ()), ("activ.", "right"), ("peak", "right"), ("", "left"),
        ("fits", "left"))
    for col, just in columns:
        table.add_column(col, justify=just, no_wrap=True, min_width=len(col) if col != "fits" else 7)
    for i, p in enumerate(plans):
        frac = (p.peak_bytes or 0) / cap if cap else 0
        bar = "█" * min(5, int(round(frac * 5))) + ("▶" if frac > 1 else "")
        table.add_row(
            "given" if i == 0 else str(i), SHORT.get(p.strategy, p.strategy), f"{p.dp}/{p.tp}/{p.pp}/{p.cp}",
            format_gib_short(p.model_state_bytes),
            *((format_gib_short(p.transient_bytes) if p.transient_bytes else "-",) if buffers else ()),
            format_gib_short(p.activation_bytes),
            format_gib_short(p.peak_bytes), Text(bar, style="red" if frac > 1 else "green"),
            Text("invalid" if p.valid is False else "yes" if p.fits else "NO",
                 style="green" if p.fits and p.valid is not False else "bold red"),
        )
    console.print(table)
    console.print(Text(PEAK_WORDS + (BUFFER_WORDS if buffers else ""), style="dim"))
    if any(p.strategy in SHORT for p in plans):
        console.print(Text(LEGEND, style="dim"))
    for i, p in enumerate(plans):
        if i == 0 or not p.overrides:
            continue
        line = Text(f"{i:>2}  ", style="bold")
        line.append(inert(fix_text(p.overrides, result.mlm)))
        console.print(line, soft_wrap=True)  # one line, so that it can be copied into a shell
        console.print(Text("    " + inert(p.cost or ""), style="dim"))
    for note in mem.notes:
        warn = note.startswith("WARNING")
        console.print(Text(("" if warn else "note: ") + inert(note), style="bold yellow" if warn else "dim"))
    given = plans[0]
    cheapest = next((i for i, p in enumerate(plans) if i and p.fits and p.valid is not False), None)
    if given.valid is False:
        msg = "\nAs given: INVALID (fails validation above), so it cannot run whatever its memory."
        msg += (f" Cheapest valid plan that fits: #{cheapest}.{batch_change_words(plans[cheapest])}" if cheapest
                else " No valid alternative at this GPU count fits.")
        console.print(Text(msg, style="bold red"))
    elif given.fits:
        console.print(Text(f"\nAs given: fits (peak {fmt_gib(given.peak_bytes)} of {usable_words(cap)}).",
                           style="bold green"))
    else:
        msg = f"\nAs given: does NOT fit (peak {fmt_gib(given.peak_bytes)} of {usable_words(cap)})."
        msg += (f" Cheapest working change: #{cheapest}.{batch_change_words(plans[cheapest])}" if cheapest
                else " No alternative at this GPU count fits.")
        console.print(Text(msg, style="bold red"))


def run(args: Any) -> int:
    from diagnose.present.output import output_stream

    if args.gpus is None or int(args.gpus) < 1:
        raise DiagnoseError("--gpus must be at least 1")
    capacity, where = capacity_from_args(args)
    gpu = gpu_by_name(args.gpu).name if getattr(args, "gpu", None) and not getattr(args, "gpu_memory", None) else ""
    result = check(CheckRequest(args.config, int(args.gpus), capacity, list(getattr(args, "sets", None) or []),
                                getattr(args, "bridge_version", None), gpu))
    if result.mlm:
        where += "; changes as Megatron-LM flags"
    dest = getattr(args, "output", None)
    with output_stream(dest) as fh:
        if getattr(args, "format", "text") == "json":
            fh.write(json_text.dumps(result.to_dict(), indent=2, default=str) + "\n")
        else:
            _render_text(result, where, fh if dest else None, getattr(args, "color", "auto"))
    return EXIT_OK if result.ok else EXIT_FAIL


__all__ = ["run", "capacity_from_args"]
