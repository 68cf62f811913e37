"""Import-time stand-ins for heavy optional packages that Megatron-Bridge imports but a plain GPT pretrain never uses.

Megatron-Bridge imports Transformer Engine (PEFT layers), ModelOpt (distillation hooks), datasets, energon and
more at module level. None of them is on the capture machine and none of them does anything for a GPT model built
with the local (non-TE) layer spec, so each is replaced by a module whose every attribute is an inert class.

Two details matter for the logs to be genuine:
- megatron-core decides once, at import, whether Transformer Engine is installed. Its TE-aware modules are imported
  here while TE is *blocked* (ModuleNotFoundError), so megatron-core takes its real "no TE" path; only the later
  importers (Bridge's PEFT layers) see the placeholder.
- A few stubbed functions are called on the training path; they get the value the real package returns for a model
  that does not use it (``KNOWN``), e.g. ModelOpt's distillation shape hook returns None for a plain model. A
  placeholder there would change the behaviour (megatron-core would assert that the hook is unsupported).

``STUB_BLOCK="name ..."`` in the environment blocks a package outright instead (to capture real import errors).
"""

from __future__ import annotations

import abc
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types

STUBBED = (
    "transformer_engine",
    "transformer_engine_torch",
    "nvidia_resiliency_ext",
    "modelopt",
    "datasets",
    "megatron.energon",
    "diffusers",
    "webdataset",
)
# nvidia_resiliency_ext.checkpointing must stay missing: megatron-core asserts a minimum NVRx version when it exists.
ALWAYS_MISSING = ("nvidia_resiliency_ext.checkpointing",)
BLOCKED = set(os.environ.get("STUB_BLOCK", "").split())

KNOWN: dict[str, dict[str, object]] = {
    "modelopt.torch.distill.plugins.megatron": {
        "get_tensor_shapes_adjust_fn_for_distillation": lambda *args, **kwargs: None,
    },
}


def _under(name: str, roots) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


class _PlaceholderMeta(abc.ABCMeta):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(name)


def _placeholder(name: str) -> type:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        # Used as a decorator (@stub.fn) it must hand the function back.
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else self

    return _PlaceholderMeta(
        name,
        (object,),
        {"__init__": __init__, "__call__": __call__, "__class_getitem__": classmethod(lambda cls, item: cls)},
    )


class _PlaceholderModule(types.ModuleType):
    __path__: list[str] = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = KNOWN.get(self.__name__, {}).get(name) or _placeholder(name)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if _under(name, ALWAYS_MISSING) or _under(name, BLOCKED):
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        if _under(name, STUBBED):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _PlaceholderModule(spec.name)
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module):
        pass


def install() -> None:
    sys.meta_path.insert(0, _Finder())
    te = {"transformer_engine", "transformer_engine_torch"}
    added = te - BLOCKED
    BLOCKED.update(te)
    for module in (
        "megatron.core.extensions.transformer_engine",
        "megatron.core.transformer.transformer_block",
        "megatron.core.transformer.transformer_layer",
        "megatron.core.models.gpt.gpt_layer_specs",
        "megatron.core.tensor_parallel.layers",
        "megatron.core.optimizer",
        "megatron.core.distributed",
    ):
        try:
            importlib.import_module(module)
        except Exception as exc:  # keep going: the run itself shows what matters
            print(f"stubs: pre-import of {module} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    BLOCKED.difference_update(added)
    for name in [k for k in sys.modules if k.split(".")[0] in added]:
        del sys.modules[name]


install()
