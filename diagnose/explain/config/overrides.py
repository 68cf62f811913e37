"""Overrides: parsing ``key=value`` (Hydra style, as on a Bridge launch line or ``--set``) and applying them.

``apply_overrides(view, overrides)`` returns a new ConfigView; the input is not changed. Keys are Megatron-Bridge
dotted paths (``ddp.use_megatron_fsdp``) or ``env.<NAME>`` for the process environment. Hydra's ``+key=value``
(append) and ``++key=value`` (force) are accepted as plain sets; ``~key`` removes a value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from diagnose.configview import ConfigView
from diagnose.explain.config.values import parse_scalar
from diagnose.model import DELETE, DiagnoseError, Override, is_delete

KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+")
ENV_NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]*")  # ``--set CUDA_DEVICE_MAX_CONNECTIONS=32`` means env.<NAME>


def parse_set(text: str) -> Override:
    """``"ddp.use_megatron_fsdp=true"`` -> Override("ddp.use_megatron_fsdp", True). Bad input: DiagnoseError."""
    raw = text.strip()
    if raw.startswith("~"):
        key = raw[1:].split("=", 1)[0].strip()
        if not KEY_RE.fullmatch(key):
            raise DiagnoseError(f"bad override {_short(text)!r}: expected KEY=VALUE with a dotted key")
        return Override(key=key, value=DELETE)
    if "=" not in raw:
        raise DiagnoseError(f"bad override {_short(text)!r}: expected KEY=VALUE (e.g. ddp.use_megatron_fsdp=true)")
    key, value = raw.split("=", 1)
    key = key.strip().lstrip("+")
    if ENV_NAME_RE.fullmatch(key):
        return Override(key=f"env.{key}", value=value.strip().strip("'\""))
    if not KEY_RE.fullmatch(key):
        raise DiagnoseError(f"bad override key {_short(key)!r}: expected a dotted path like model.num_layers")
    quoted = hydra_quoted(value.strip())
    return Override(key=key, value=quoted if quoted is not None else parse_scalar(value))


_BACKSLASH_RUN = re.compile(r"(\\*)(\$\{)?")


def hydra_quoted(text: str) -> str | None:
    """The string a Hydra quoted value stands for (``"a \\"b\\""`` -> ``a "b"``), or None when ``text`` is not
    one quoted string. The reverse of ``diagnose.explain.render.hydra_value``, so a fix line copied from a report or
    the TUI reads back as the same value: in Hydra's quoted strings a backslash run before a quote is halved (an odd
    run escapes the quote), other backslashes are literal; then OmegaConf reads an odd run before ``${`` as a
    literal ``${`` (halved too). A live interpolation (even run) is kept as text: nothing is resolved.
    """
    if len(text) < 2 or text[0] not in "'\"" or text[-1] != text[0]:
        return None
    quote, body = text[0], text[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            j = i
            while j < len(body) and body[j] == "\\":
                j += 1
            run = j - i
            if j == len(body):  # before the closing quote: halved
                out.append("\\" * (run // 2))
            elif body[j] == quote:
                if run % 2 == 0:
                    return None  # an unescaped quote inside: not one quoted string
                out.append("\\" * (run // 2) + quote)
                j += 1
            else:
                out.append("\\" * run)
            i = j
            continue
        if ch == quote:
            return None  # "a" "b": two strings, not one
        out.append(ch)
        i += 1
    return _BACKSLASH_RUN.sub(_omegaconf_escape, "".join(out)) if "${" in "".join(out) else "".join(out)


def _omegaconf_escape(m: re.Match[str]) -> str:
    run, interpolation = m.group(1), m.group(2)
    if not interpolation:
        return m.group(0)
    return "\\" * (len(run) // 2) + "${"


def normalize_overrides(overrides: Iterable[Override | str] | Mapping[str, Any] | None) -> list[Override]:
    """Accept Override objects, ``"k=v"`` strings or a {key: value} mapping; later entries win."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [Override(key=str(k), value=v) for k, v in overrides.items()]
    out: list[Override] = []
    for item in overrides:
        if isinstance(item, Override):
            out.append(item)
        elif isinstance(item, str):
            out.append(parse_set(item))
        else:
            raise DiagnoseError(f"bad override {_short(repr(item))}: expected KEY=VALUE")
    return out


def apply_overrides(view: ConfigView, overrides: Iterable[Override | str] | Mapping[str, Any] | None) -> ConfigView:
    """A copy of ``view`` with the overrides applied (origin "override"). ``view`` itself is left unchanged."""
    out = view.copy()
    for o in normalize_overrides(overrides):
        if is_delete(o):
            out.remove(o.key)
            continue
        out.set(o.key, _env_text(o.value) if o.key.startswith("env.") else o.value, "override")
        if o.key.startswith("env_vars."):
            # the recipe's cfg.env_vars: Bridge applies them with os.environ.setdefault, so an exported value wins
            name = "env." + o.key[len("env_vars."):]
            if not out.has(name) or out.origin(name) == "default":
                out.set(name, _env_text(o.value), "override")
    return out


def _env_text(value: Any) -> Any:
    return value if value is None or isinstance(value, str) else str(value)


def _short(s: str, limit: int = 80) -> str:
    s = "".join(ch if ch.isprintable() else "?" for ch in s)
    return s if len(s) <= limit else s[: limit - 1] + "…"
