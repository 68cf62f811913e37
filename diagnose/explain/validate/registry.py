"""The check registry: every validation check is a small named function with its source reference.

A check takes a ``CheckContext`` and returns ``Violation``s (hard failures the real code raises) or notes (the
real code auto-fixes and prints). Each ``Violation`` carries alternative fixes, most preferred first, so replay
can pick one that does not undo an override the user asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from diagnose.configview import ConfigView
from diagnose.explain.config.defaults import VersionRange, family_of, version_range, version_tuple
from diagnose.explain.config.releases import release_family
from diagnose.explain.config.values import as_bool, as_int
from diagnose.explained import Violation
from diagnose.model import Override

__all__ = ["CHECKS", "CheckContext", "Violation", "make_context"]


@dataclass
class CheckContext:
    view: ConfigView
    version: VersionRange | None  # (lowest, highest) release the job can be
    family: str  # message wording: "old" (<= 0.4.x) | "new" (>= 0.5.0)
    framework: str  # "megatron-bridge" | "megatron-lm"
    release: str = "new"  # fields: "old" | "new" | "latest" (>= 0.7.0, no dist.use_megatron_fsdp); releases.py
    version_text: str | None = None  # the release as given (--bridge-version or the log), None when unknown

    def get(self, key: str, default: Any = None) -> Any:
        return self.view.get(key, default)

    def flag(self, key: str) -> bool:
        return as_bool(self.view.get(key, False))

    def number(self, key: str, default: int | None = None) -> int | None:
        """An integer setting (None or ``default`` when absent or not a whole number)."""
        return as_int(self.view.get(key), default)

    def size(self, key: str) -> int:
        """A parallel size: 1 when absent, zero or not a whole number."""
        return self.number(key, 1) or 1

    @property
    def tp(self) -> int:
        return self.size("model.tensor_model_parallel_size")

    @property
    def pp(self) -> int:
        return self.size("model.pipeline_model_parallel_size")

    @property
    def cp(self) -> int:
        return self.size("model.context_parallel_size")

    def env(self, name: str) -> str | None:
        value = self.view.get(f"env.{name}")
        return None if value is None else str(value)

    @property
    def megatron_fsdp(self) -> bool:
        """Either flag turns Megatron FSDP on (Bridge then forces both True); on the ``latest`` family only
        ``ddp.use_megatron_fsdp`` exists (a stale ``dist.use_megatron_fsdp`` is refused or ignored there)."""
        if self.release == "latest":
            return self.flag("ddp.use_megatron_fsdp")
        return self.flag("ddp.use_megatron_fsdp") or self.flag("dist.use_megatron_fsdp")

    @property
    def saves_or_loads(self) -> bool:
        return self.get("checkpoint.save") not in (None, "") or self.get("checkpoint.load") not in (None, "")

    @property
    def mlm(self) -> bool:
        return self.framework == "megatron-lm"

    def version_between(self, low: tuple[int, int, int], high: tuple[int, int, int]) -> bool:
        """The job's release is surely in [low, high]; False when unknown (no version-specific claim)."""
        return self.version is not None and low <= self.version[0] and self.version[1] <= high

    def surely_before(self, v: tuple[int, int, int]) -> bool:
        """The job's release is known to be older than ``v``."""
        return self.version is not None and self.version[1] < v

    @property
    def core(self) -> tuple[int, int, int] | None:
        """The job's megatron-core version, when the log shows it."""
        return version_tuple(self.view.mcore_version)

    def core_before(self, v: tuple[int, int, int]) -> bool:
        """The job's megatron-core is known to be older than ``v`` (unknown: the latest behaviour)."""
        return self.core is not None and self.core < v


CheckFn = Callable[[CheckContext], Iterable[Violation]]


@dataclass(frozen=True)
class CheckSpec:
    name: str
    fn: CheckFn
    source: str
    frameworks: tuple[str, ...]


CHECKS: list[CheckSpec] = []
# config fields the checks read or their fixes write, beyond the release defaults: an override of one of them is no
# typo (checks_keys.override_unknown_key)
KNOWN_KEYS: set[str] = set()


def check(name: str, source: str, frameworks: tuple[str, ...] = ("megatron-bridge", "megatron-lm")):
    """Register a check function under ``name`` with its upstream source reference."""

    def wrap(fn: CheckFn) -> CheckFn:
        CHECKS.append(CheckSpec(name, fn, source, frameworks))
        return fn

    return wrap


Fixes = list[list[tuple[str, Any]]]  # alternatives, each a list of (key, value) pairs


def simple_check(name: str, source: str, when: Callable[[CheckContext], bool],
                 message: str | Callable[[CheckContext], str], keys: list[str],
                 fixes: Fixes | Callable[[CheckContext], Fixes] | None = None,
                 frameworks: tuple[str, ...] = ("megatron-bridge", "megatron-lm"), kind: str = "error") -> None:
    """Register a check that is one condition and one message; the message and the fixes are fixed, or functions
    of the context (worded per release, sized from the config)."""

    def run(ctx: CheckContext) -> Iterable[Violation]:
        if when(ctx):
            text = message(ctx) if callable(message) else message
            alternatives = fixes(ctx) if callable(fixes) else fixes or []
            yield Violation(name, text, list(keys), fixes=[[ov(k, v) for k, v in alt] for alt in alternatives],
                            kind=kind)

    check(name, source, frameworks)(run)


def make_context(view: ConfigView, bridge_version: str | None = None) -> CheckContext:
    """Bridge jobs: family from the Bridge release. Megatron-LM jobs: from megatron-core (<= 0.17 wrote the
    old messages, like Bridge <= 0.4.x that shipped with it); unknown means the latest wording."""
    framework = view.framework or "megatron-bridge"
    version = bridge_version or view.version
    if framework == "megatron-lm" and not bridge_version:
        core = version_tuple(view.mcore_version)
        family = "old" if core is not None and core < (0, 18, 0) else "new"
        return CheckContext(view=view, version=None, family=family, framework=framework)
    return CheckContext(
        view=view,
        version=version_range(version),
        family=family_of(version),
        framework=framework,
        release=release_family(version),
        version_text=version or None,
    )


def ov(key: str, value: Any) -> Override:
    return Override(key=key, value=value)
