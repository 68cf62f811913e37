"""Build megatron-core's real config classes from a ConfigView and report what their ``__post_init__`` raises.

Megatron-Bridge's ``validate()`` calls ``ddp.finalize()``, ``optimizer.finalize()`` and ``model.finalize()``,
which run megatron-core's ``DistributedDataParallelConfig``, ``OptimizerConfig`` and ``TransformerConfig``
``__post_init__``. Where megatron-core is importable we run exactly that code instead of trusting our mirror.
Only fields the class declares are passed; dtype names become torch dtypes; the process environment the checks
read (``PYTORCH_CUDA_ALLOC_CONF``) is set from the view for the duration of the call, under a lock.

Imported lazily (megatron-core takes seconds to import) and never on the ``--help`` path.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import warnings
from typing import Any

from diagnose.explain.config.view import ConfigView
from diagnose.explain.validate.registry import Violation

_LOCK = threading.Lock()
_SECTION = {"DistributedDataParallelConfig": "ddp", "OptimizerConfig": "optimizer", "TransformerConfig": "model"}
_CLASSES: dict[str, Any] | None = None
_IMPORT_FAILED = False
_ENV_READ = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUDA_DEVICE_MAX_CONNECTIONS")
SOURCE = "megatron-core {cls}.__post_init__ (installed {version})"


def available() -> bool:
    return _load() is not None


def _load() -> dict[str, Any] | None:
    global _CLASSES, _IMPORT_FAILED
    if _CLASSES is not None or _IMPORT_FAILED:
        return _CLASSES
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            from megatron.core import package_info
            from megatron.core.distributed import DistributedDataParallelConfig
            from megatron.core.optimizer import OptimizerConfig
            from megatron.core.transformer import TransformerConfig
    except Exception:  # noqa: BLE001 - any import problem means "not available"
        _IMPORT_FAILED = True
        return None
    _CLASSES = {
        "torch": torch,
        "version": getattr(package_info, "__version__", "?"),
        "DistributedDataParallelConfig": DistributedDataParallelConfig,
        "OptimizerConfig": OptimizerConfig,
        "TransformerConfig": TransformerConfig,
    }
    return _CLASSES


def mcore_version() -> str | None:
    classes = _load()
    return None if classes is None else str(classes["version"])


def _convert(torch: Any, field: dataclasses.Field, value: Any) -> Any:
    default = field.default
    wants_dtype = isinstance(default, torch.dtype) or field.name.endswith("dtype")
    if wants_dtype and isinstance(value, str):
        dtype = getattr(torch, value.replace("torch.", ""), None)
        return dtype if isinstance(dtype, torch.dtype) else value
    return value


def _kwargs(torch: Any, cls: Any, section: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.init and f.name in section:
            out[f.name] = _convert(torch, f, section[f.name])
    return out


def build_kwargs(view: ConfigView) -> dict[str, dict[str, Any]] | None:
    """The keyword arguments each real class gets from ``view`` (None when megatron-core is absent)."""
    classes = _load()
    if classes is None:
        return None
    torch = classes["torch"]
    ddp = _kwargs(torch, classes["DistributedDataParallelConfig"], view.section("ddp"))
    opt = _kwargs(torch, classes["OptimizerConfig"], view.section("optimizer"))
    model_section = view.section("model")
    if view.framework != "megatron-lm":
        from diagnose.explain.validate.checks_precision import bridge_precision_overlay

        model_section.update(bridge_precision_overlay(view))  # Bridge's mixed-precision setup runs first
    model = _kwargs(torch, classes["TransformerConfig"], model_section)
    if (model.get("pipeline_model_parallel_size") or 1) > 1 and model.get("pipeline_dtype") is None:
        # Bridge's mixed-precision setup fills pipeline_dtype from the training precision before finalize().
        model["pipeline_dtype"] = torch.bfloat16 if model.get("bf16") else (torch.float16 if model.get("fp16") else torch.float32)
    return {"DistributedDataParallelConfig": ddp, "OptimizerConfig": opt, "TransformerConfig": model}


def check_with_mcore(view: ConfigView) -> list[Violation] | None:
    """Violations raised by megatron-core's own config classes; None when megatron-core cannot be imported.

    TransformerConfig is built only when the model shape (num_layers, hidden_size, num_attention_heads) is known.
    """
    classes = _load()
    if classes is None:
        return None
    all_kwargs = build_kwargs(view) or {}
    env = {name: view.get(f"env.{name}") for name in _ENV_READ}
    found: list[Violation] = []
    with _LOCK:
        saved = {name: os.environ.get(name) for name in _ENV_READ}
        try:
            for name, value in env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = str(value)
            for cls_name, kwargs in all_kwargs.items():
                if cls_name == "TransformerConfig" and not all(
                    kwargs.get(k) for k in ("num_layers", "hidden_size", "num_attention_heads")
                ):
                    continue
                message = _post_init_error(classes[cls_name], kwargs)
                if message:
                    section = _SECTION[cls_name]
                    found.append(
                        Violation(
                            check=f"mcore:{cls_name}",
                            message=message,
                            keys=[f"{section}.{k}" for k in kwargs if re.search(rf"\b{re.escape(k)}\b", message)],
                            source=SOURCE.format(cls=cls_name, version=classes["version"]),
                        )
                    )
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    return found


def _post_init_error(cls: Any, kwargs: dict[str, Any]) -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls(**kwargs)
    except (ValueError, AssertionError, NotImplementedError) as e:
        return " ".join(str(e).split()) or type(e).__name__
    except Exception:  # noqa: BLE001 - a value we could not convert: not the job's failure
        return None
    return None
