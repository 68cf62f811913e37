"""Build megatron-core's real config classes from a ConfigView and report what their ``__post_init__`` raises.

Megatron-Bridge's ``validate()`` calls ``ddp.finalize()``, ``optimizer.finalize()`` and ``model.finalize()``,
which run megatron-core's ``DistributedDataParallelConfig``, ``OptimizerConfig`` and ``TransformerConfig``
``__post_init__``. Where megatron-core is importable we run exactly that code instead of trusting our mirror.
Only fields the class declares are passed; dtype names become torch dtypes; the process environment the checks
read (``PYTORCH_CUDA_ALLOC_CONF``) is set from the view for the duration of the call, under a lock.

Imported lazily (megatron-core takes seconds to import) and never on the ``--help`` path.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import warnings
from typing import Any

from diagnose.configview import ConfigView
from diagnose.explain.megatron_child import PACKAGE_PARENT, JsonCache
from diagnose.explain.megatron_child import megatron_installed as installed
from diagnose.explain.megatron_child import versions as _versions
from diagnose.explain.validate.checks_precision import bridge_precision_overlay
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


def _activation(name: str) -> Any:
    """An activation named in a config dump (``silu``, ``F.silu``, ``torch.nn.functional.gelu``,
    ``megatron.core.activations.squared_relu``) as the callable megatron-core compares against; None if unknown."""
    import torch.nn.functional as F

    leaf = name.strip().rsplit(".", 1)[-1]
    if leaf in ("silu", "gelu", "relu"):
        return getattr(F, leaf)
    if leaf == "quick_gelu":  # the object TransformerConfig compares against (its own import)
        try:
            from megatron.core.fusions.fused_bias_geglu import quick_gelu

            return quick_gelu
        except ImportError:
            pass
    try:
        from megatron.core import activations
    except ImportError:
        activations = None
    fn = getattr(activations, leaf, None) if activations is not None and leaf.isidentifier() else None
    return fn if callable(fn) else None


def _convert(torch: Any, field: dataclasses.Field, value: Any) -> Any:
    if field.name.endswith("activation_func") and isinstance(value, str):
        # a dump names the function; megatron-core's checks compare the callable itself (F.silu == F.silu)
        fn = _activation(value)
        return fn if fn is not None else _UNSET
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
            value = _convert(torch, f, section[f.name])
            if value is not _UNSET:
                out[f.name] = value
    return out


_UNSET = object()  # a value that cannot be given to the real class as the job had it: left at its default


def _sections(view: ConfigView) -> dict[str, Any]:
    """What megatron-core's classes are built from: the view's three sections (Bridge's mixed-precision overlay
    applied to the model's) and the environment they read. Plain data: it is the cache key and the worker's input."""
    model_section = view.section("model")
    if view.framework != "megatron-lm":
        model_section.update(bridge_precision_overlay(view))  # Bridge's mixed-precision setup runs first
    elif int(model_section.get("tensor_model_parallel_size") or 1) <= 1:
        model_section["sequence_parallel"] = False  # Megatron-LM's validate_args turns it off before the classes
    if model_section.get("apply_rope_fusion") and view.get("launch.transformer_engine") is not False:
        # megatron-core checks the fused RoPE kernel against the Transformer Engine of the process that runs the
        # check: that is this machine, not the job's. Only a log saying the job had no TE makes it the job's error.
        model_section["apply_rope_fusion"] = False
    env = {name: view.get(f"env.{name}") for name in _ENV_READ}
    return {"ddp": view.section("ddp"), "optimizer": view.section("optimizer"), "model": model_section,
            "env": {k: None if v is None else str(v) for k, v in env.items()}}


def _kwargs_from(classes: dict[str, Any], sections: dict[str, Any]) -> dict[str, dict[str, Any]]:
    torch = classes["torch"]
    ddp = _kwargs(torch, classes["DistributedDataParallelConfig"], sections["ddp"])
    opt = _kwargs(torch, classes["OptimizerConfig"], sections["optimizer"])
    model = _kwargs(torch, classes["TransformerConfig"], sections["model"])
    if (model.get("pipeline_model_parallel_size") or 1) > 1 and model.get("pipeline_dtype") is None:
        # Bridge's mixed-precision setup fills pipeline_dtype from the training precision before finalize().
        model["pipeline_dtype"] = (torch.bfloat16 if model.get("bf16")
                                   else torch.float16 if model.get("fp16") else torch.float32)
    return {"DistributedDataParallelConfig": ddp, "OptimizerConfig": opt, "TransformerConfig": model}


def _errors(classes: dict[str, Any], sections: dict[str, Any]) -> list[dict[str, Any]]:
    """What each class's ``__post_init__`` raises for these sections: [{cls, message, keys, version}]."""
    all_kwargs = _kwargs_from(classes, sections)
    found: list[dict[str, Any]] = []
    with _LOCK:
        saved = {name: os.environ.get(name) for name in _ENV_READ}
        try:
            for name, value in sections["env"].items():
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
                    found.append({"cls": cls_name, "message": message, "version": str(classes["version"]),
                                  "keys": [f"{section}.{k}" for k in kwargs
                                           if re.search(rf"\b{re.escape(k)}\b", message)]})
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    return found


def _violations(entries: list[dict[str, Any]]) -> list[Violation]:
    return [Violation(check=f"mcore:{e['cls']}", message=e["message"], keys=list(e["keys"]),
                      source=SOURCE.format(cls=e["cls"], version=e["version"])) for e in entries]


def check_with_mcore(view: ConfigView, wait: bool = True) -> list[Violation] | None:
    """Violations raised by megatron-core's own config classes; None when megatron-core cannot be imported.

    TransformerConfig is built only when the model shape (num_layers, hidden_size, num_attention_heads) is known.
    Answers are kept on disk per inputs and torch/megatron-core versions (``mcore_checks.json`` in diagnose's
    cache folder): a config checked once is never imported for again. ``wait=False`` (``analyze``: the report
    never waits seconds for an import): an answer not on disk is left to one background worker process that
    imports megatron-core once for every config this process asked about and fills the cache; None meanwhile.
    """
    if not installed():
        return None
    sections = _sections(view)
    key = _cache_key(sections)
    hit = _cache.read().get(key) if key else None
    if isinstance(hit, list):
        try:
            return _violations(hit)
        except (KeyError, TypeError):
            pass  # damaged entry: computed again below
    if not wait:
        if key is not None and _cache.path() is not None:
            _queue_background(key, sections)
        return None
    classes = _load()
    if classes is None:
        return None
    entries = _errors(classes, sections)
    if key is not None:
        _cache.write(key, entries)
    return _violations(entries)


_CACHE_VERSION = 2  # bump when the classes are built differently (2: activation_func as the callable)


def _cache_key(sections: dict[str, Any]) -> str | None:
    """sha256 of the inputs and versions; None when the inputs are not plain JSON data (then never cached)."""
    try:
        text = json.dumps([_CACHE_VERSION, _versions(), sections], sort_keys=True, allow_nan=False)
        if json.loads(text)[2] != sections:
            return None
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


_cache = JsonCache("mcore_checks.json", max_entries=4096)
_QUEUED: dict[str, dict[str, Any]] = {}


def _queue_background(key: str, sections: dict[str, Any]) -> None:
    """Remember a config for the background worker, started once when this process exits."""
    if not _QUEUED:
        atexit.register(_start_worker)
    _QUEUED[key] = sections


def _start_worker() -> None:
    """One detached ``python -m diagnose.explain.validate.mcore`` for every queued config; never waited for."""
    if not _QUEUED:
        return
    payload = json.dumps([{"key": k, "sections": v} for k, v in _QUEUED.items()])
    _QUEUED.clear()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "diagnose.explain.validate.mcore"], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env=dict(os.environ, PYTHONWARNINGS="ignore"),
            cwd=PACKAGE_PARENT,
        )
        assert proc.stdin is not None
        proc.stdin.write(payload.encode())
        proc.stdin.close()
    except (OSError, ValueError):
        pass  # no worker: the next run that waits computes it


def _worker(requests: list[dict[str, Any]]) -> int:
    """The background worker: one import of megatron-core, every request computed and cached. Workers of one
    cache folder run one at a time (a lock file), and skip what another worker cached meanwhile."""
    import fcntl

    path = _cache.path()
    if path is None:
        return 0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = _cache.read()
        todo = [r for r in requests if isinstance(r, dict) and isinstance(r.get("sections"), dict)
                and r.get("key") not in done and _cache_key(r["sections"]) == r.get("key")]
        if not todo:
            return 0
        classes = _load()
        if classes is None:
            return 1
        for r in todo:
            _cache.write(r["key"], _errors(classes, r["sections"]))
    return 0


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


if __name__ == "__main__":
    try:
        reqs = json.loads(sys.stdin.read() or "[]")
    except ValueError:
        sys.exit(2)
    sys.exit(_worker(reqs if isinstance(reqs, list) else []))
