"""Checks on the keys and values a fix or ``--set`` writes: a misspelt key or an invalid choice must never be
"proven" (QA: ``ddp.use_megatron_fdsp=true`` and ``data_parallel_sharding_strategy=zero3`` used to pass).

Only what the tool can know is flagged: a key that is not a field the validator knows and not in the job's config,
but close to one that is (a typo: Hydra/OmegaConf refuses it with ``Could not override '<key>'`` / ``Key '<leaf>' is
not in struct``), and values outside a field's fixed set of choices.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from diagnose.explain.config.keycheck import META_KEYS, SECTIONS, known_keys
from diagnose.explain.validate.registry import CheckContext, Violation, check, ov

_PSEUDO = ("env.", "env_vars.", "launch.", "mlm.")

# field -> (allowed values, the message the real code raises)
CHOICES: dict[str, tuple[tuple[str | int, ...], str]] = {
    "ddp.data_parallel_sharding_strategy": (
        ("no_shard", "optim", "optim_grads", "optim_grads_params"),
        "Invalid data_parallel_sharding_strategy: {value}"),
    "checkpoint.ckpt_format": (
        ("torch_dist", "fsdp_dtensor", "zarr", "torch", "torch_dcp"),
        "Unsupported checkpoint format: {value}"),
    "ddp.megatron_fsdp_version": ((1, 2), "Unsupported megatron_fsdp_version: {value}"),
}


def _known(ctx: CheckContext) -> set[str]:
    """Every field the config reader knows (megatron-core's and the providers' fields included: ``--set
    model.num_layers=4`` was called a typo of ``model.mtp_num_layers``), plus the job's own keys."""
    keys = known_keys()  # the release defaults and the checks' KNOWN_KEYS among them
    keys.update(k for k, v in ctx.view.values.items() if v.origin != "override")
    return keys


@check("override_unknown_key",
       "Megatron-Bridge utils/omegaconf_utils.py apply_overrides: OmegaConf struct mode refuses a key the "
       "dataclass does not have (Could not override '<key>')")
def override_unknown_key(ctx: CheckContext) -> Iterable[Violation]:
    known = None
    for key, item in ctx.view.values.items():
        if item.origin != "override" or key.startswith(_PSEUDO):
            continue
        known = known if known is not None else _known(ctx)
        if key in known:
            continue
        top = key.split(".", 1)[0]
        if top not in SECTIONS:  # ConfigContainer has a fixed set of sections: any other is refused (a typo or not)
            hint = difflib.get_close_matches(top, sorted(SECTIONS - META_KEYS), n=1, cutoff=0.6)
            yield Violation(
                "override_unknown_key", f"Could not override '{key}': ConfigContainer has no section '{top}'"
                + (f" (did you mean {hint[0]}?)" if hint else ""), [key],
                fixes=[[ov(hint[0] + key[len(top):], item.value)]] if hint else [],
            )
            continue
        section = top + "."
        close = difflib.get_close_matches(key, sorted(k for k in known if k.startswith(section)), n=1, cutoff=0.85)
        if not close:
            continue  # a field the validator does not list: cannot tell
        yield Violation(
            "override_unknown_key", f"Could not override '{key}': no such field (did you mean {close[0]}?)", [key],
            fixes=[[ov(close[0], item.value)]],
        )


@check("invalid_choice", "megatron-core DistributedDataParallelConfig / Megatron-Bridge CheckpointConfig choices")
def invalid_choice(ctx: CheckContext) -> Iterable[Violation]:
    for key, (allowed, message) in CHOICES.items():
        if not ctx.view.has(key):
            continue
        value = ctx.get(key)
        if value is None or value in allowed or str(value) in {str(a) for a in allowed}:
            continue
        if ctx.view.origin(key) != "override":
            continue  # the job's own value: its log says whether it failed
        # no fix is guessed: the user names the choice (the message lists the valid ones)
        yield Violation("invalid_choice", message.format(value=value) + f" (choices: {', '.join(map(str, allowed))})",
                        [key])
