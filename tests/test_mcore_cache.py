"""megatron-core's own config checks are imported for at most once per config (issue 15): answers are cached on
disk per inputs and versions, and ``analyze`` never waits for the import: a background worker fills the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.explain.config import ConfigView, apply_defaults
from diagnose.explain.validate import BACKGROUND, run_checks

pytestmark = pytest.mark.megatron

mcore = pytest.importorskip("diagnose.explain.validate.mcore")
if not mcore.installed():  # pragma: no cover - CI installs megatron-core
    pytest.skip("megatron-core is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
BAD_TP = {"model.num_layers": 4, "model.hidden_size": 256, "model.num_attention_heads": 7,
          "model.tensor_model_parallel_size": 2}


def _view(settings: dict) -> ConfigView:
    view = ConfigView(framework="megatron-bridge", version="0.6.2")
    for key, value in settings.items():
        view.set(key, value, "log:1")
    return apply_defaults(view)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DIAGNOSE_NO_CACHE", raising=False)
    monkeypatch.setattr(mcore, "_QUEUED", {})
    return tmp_path


def test_background_mode_queues_then_answers_from_the_cache_what_waiting_answers(cache):
    view = _view(BAD_TP)
    assert mcore.check_with_mcore(view, wait=False) is None  # nothing cached: not waited for, queued
    (queued,) = mcore._QUEUED.items()
    assert mcore._worker([{"key": k, "sections": v} for k, v in [queued]]) == 0
    cached = mcore.check_with_mcore(view, wait=False)
    assert cached and any(v.check == "mcore:TransformerConfig" for v in cached)
    assert [(v.check, v.message, v.keys, v.source) for v in cached] == [
        (v.check, v.message, v.keys, v.source) for v in mcore._violations(mcore._errors(mcore._load(),
                                                                                          mcore._sections(view)))]
    assert run_checks(view, real_mcore=BACKGROUND).mcore_checked


def test_the_cache_key_follows_every_input(cache):
    base = mcore._cache_key(mcore._sections(_view(BAD_TP)))
    assert base == mcore._cache_key(mcore._sections(_view(BAD_TP)))
    assert base != mcore._cache_key(mcore._sections(_view({**BAD_TP, "model.tensor_model_parallel_size": 1})))
    assert base != mcore._cache_key(mcore._sections(_view({**BAD_TP, "env.CUDA_DEVICE_MAX_CONNECTIONS": "1"})))


def test_a_worker_ignores_a_request_whose_key_does_not_match_its_inputs(cache):
    sections = mcore._sections(_view(BAD_TP))
    assert mcore._worker([{"key": "0" * 64, "sections": sections}, {"key": 3}, "junk"]) == 0
    assert "0" * 64 not in mcore._cache.read()


def test_analyze_of_a_config_failure_does_not_import_megatron_core_and_the_next_run_uses_its_answer(cache):
    log = ROOT / "sample_logs" / "mlm_tp_max_connections.log"
    code = ("import json,sys\nfrom diagnose.pipeline import AnalyzeOptions, analyze\n"
            f"r = analyze([{str(log)!r}], AnalyzeOptions())\n"
            "print(json.dumps({'imported': 'megatron.core' in sys.modules, 'replay': r.to_dict()['replay']}, default=str))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    out = json.loads(first.stdout.splitlines()[-1])
    assert out["imported"] is False
    # the worker started at exit fills the cache (detached; wait for it here)
    for _ in range(600):
        if mcore._cache.read():
            break
        import time

        time.sleep(0.1)
    assert mcore._cache.read(), "the background worker cached megatron-core's answer"
    second = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                       check=True).stdout.splitlines()[-1])
    assert second["imported"] is False
    assert second["replay"] == out["replay"]  # the mirror already agrees with megatron-core on this config
