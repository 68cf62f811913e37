"""ConfigView: the job's configuration as flat Megatron-Bridge dotted paths, each value with where it came from.

Keys are ConfigContainer paths (``model.tensor_model_parallel_size``, ``ddp.use_megatron_fsdp``,
``checkpoint.ckpt_format``...). A few pseudo-sections hold what is not a ConfigContainer field but decides
validation or memory:

- ``env.<NAME>``: the process environment the job ran with (``env.CUDA_DEVICE_MAX_CONNECTIONS``). Recipe
  ``env_vars`` are applied with ``os.environ.setdefault``, so a value printed by the job or exported by the shell
  wins over the recipe; both end up here.
- ``launch.world_size``, ``launch.nproc_per_node``, ``launch.nnodes``: from torchrun / Slurm / ``using world size``.
- ``launch.gpu``: the GPU model ``check --gpu`` named (``b200``; explain.memory.gpus), absent otherwise.
- ``launch.num_parameters``: from `` > number of parameters on ... rank (...): N`` (per model-parallel rank).
- ``mlm.<arg>``: a Megatron-LM argument with no Bridge equivalent (kept so it is visible, never validated).

Origins: ``log:<line>`` (a line of the log), ``file:<name>``, ``default`` (release defaults), ``override``
(``--set`` or a fix being replayed), ``implied:log:<line>`` (stated by an error message: fills
what the log did not print; replay may say "reproduced (from the settings the error states)").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class ConfigValue:
    value: Any
    origin: str  # "log:123", "file:run_config.yaml", "default", "override"


@dataclass
class ConfigView:
    """Flat dotted-path config with provenance. Values that were never seen are simply absent.

    ``framework``: "megatron-bridge", "megatron-lm" or None; ``version``: the Megatron-Bridge release if known
    (or inferred, see ``version_clues``); ``sources``: what the values were read from, for the report.
    """

    values: dict[str, ConfigValue] = field(default_factory=dict)
    framework: str | None = None
    version: str | None = None
    mcore_version: str | None = None
    sources: list[str] = field(default_factory=list)
    version_clues: list[str] = field(default_factory=list)
    # the model provider class the config names (``model._target_``): a class name, never a value or an import;
    # its defaults are looked up by ``providers.py``
    model_target: str | None = None

    # -- reading
    def get(self, key: str, default: Any = None) -> Any:
        item = self.values.get(key)
        return default if item is None else item.value

    def has(self, key: str) -> bool:
        return key in self.values

    def origin(self, key: str) -> str | None:
        item = self.values.get(key)
        return None if item is None else item.origin

    def known(self) -> bool:
        """True when anything beyond release defaults was recovered from the job."""
        return any(v.origin != "default" for v in self.values.values())

    @property
    def config_known(self) -> bool:
        """True when the job's own settings were recovered (a config dump, arguments or overrides), not just
        the environment, world size or parameter counts: only then can replay say "reproduced"."""
        return any(
            v.origin != "default" and not v.origin.startswith("implied:") and not k.startswith(("launch.", "env."))
            for k, v in self.values.items()
        )

    def section(self, prefix: str) -> dict[str, Any]:
        """Values under ``prefix.`` with the prefix removed (``view.section("env")``)."""
        p = prefix + "."
        return {k[len(p):]: v.value for k, v in self.values.items() if k.startswith(p)}

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __bool__(self) -> bool:  # an empty view is still a view (``view or ConfigView()`` must keep it)
        return True

    # -- writing (used by extraction; replay works on copies)
    def set(self, key: str, value: Any, origin: str) -> None:
        self.values[key] = ConfigValue(value, origin)

    def set_default(self, key: str, value: Any) -> None:
        if key not in self.values:
            self.values[key] = ConfigValue(value, "default")

    def remove(self, key: str) -> None:
        self.values.pop(key, None)

    def copy(self) -> ConfigView:
        return replace(self, values=dict(self.values), sources=list(self.sources),
                       version_clues=list(self.version_clues))

    def merge(self, other: ConfigView) -> None:
        """Take every value of ``other`` (it wins), and its framework/version when ours are unknown."""
        for k, v in other.values.items():
            if v.origin == "default" and k in self.values:
                continue
            self.values[k] = v
        self.framework = self.framework or other.framework
        self.version = self.version or other.version
        self.mcore_version = self.mcore_version or other.mcore_version
        self.model_target = self.model_target or other.model_target
        for mine, theirs in ((self.sources, other.sources), (self.version_clues, other.version_clues)):
            mine.extend(item for item in dict.fromkeys(theirs) if item not in mine)

    def to_dict(self, job_only: bool = False) -> dict[str, Any]:
        """The ``config`` section (schema in issue 3). ``job_only`` (the report's): no values unless something
        was recovered from the job."""
        shown = self.values if self.known() or not job_only else {}
        return {
            "source": list(self.sources),
            "framework": self.framework,
            "version": self.version,
            "values": {k: {"value": _jsonable(v.value), "from": v.origin} for k, v in sorted(shown.items())},
        }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)
