"""The on-disk cache and the background prefetch of the meta-device parameter count.

Most tests replace ``exact_counts`` (the child process that imports megatron-core) with a counter: what is under
test is when the cache answers and when it must not. The last test runs the real child when torch and
megatron-core are installed.
"""

from __future__ import annotations

import json

import pytest

from diagnose.explain.memory import meta_count
from diagnose.explain.memory.shape import ModelShape, count_params

SHAPE = ModelShape(num_layers=3, hidden_size=256, num_attention_heads=4, vocab_size=1000, seq_length=128)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(meta_count, "_PENDING", {})
    monkeypatch.setattr(meta_count, "_DONE", {})
    return tmp_path


@pytest.fixture
def builds(monkeypatch):
    calls: list[int] = []

    def fake_counts(shapes, timeout=300.0):
        calls.append(len(shapes))
        return [123_456 for _ in shapes]

    monkeypatch.setattr(meta_count, "exact_counts", fake_counts)
    return calls


def test_second_count_of_a_shape_comes_from_the_cache(cache_dir, builds):
    assert meta_count.exact_count(SHAPE) == 123_456
    assert meta_count.exact_count(SHAPE) == 123_456
    assert builds == [1]  # built once
    assert list(json.loads((cache_dir / "meta_counts.json").read_text()).values()) == [123_456]


def test_cache_false_always_builds(cache_dir, builds):
    meta_count.exact_count(SHAPE)
    meta_count.exact_count(SHAPE, cache=False)
    assert builds == [1, 1]


def test_another_shape_or_another_megatron_version_is_a_miss(cache_dir, builds, monkeypatch):
    meta_count.exact_count(SHAPE)
    meta_count.exact_count(ModelShape(num_layers=4, hidden_size=256, num_attention_heads=4, vocab_size=1000))
    monkeypatch.setattr(meta_count, "_versions", lambda: "torch=9,megatron-core=9")
    meta_count.exact_count(SHAPE)
    assert builds == [1, 1, 1]


def test_a_damaged_cache_file_is_a_miss_and_is_rewritten(cache_dir, builds):
    (cache_dir / "meta_counts.json").write_text("{not json")
    assert meta_count.exact_count(SHAPE) == 123_456
    assert builds == [1]
    assert json.loads((cache_dir / "meta_counts.json").read_text())  # valid JSON again


def test_empty_cache_dir_setting_turns_the_cache_off(tmp_path, builds, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    meta_count.exact_count(SHAPE)
    meta_count.exact_count(SHAPE)
    assert builds == [1, 1] and not list(tmp_path.iterdir())


def test_no_cache_setting_turns_the_cache_off_too(cache_dir, builds, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_NO_CACHE", "1")
    meta_count.exact_count(SHAPE)
    meta_count.exact_count(SHAPE)
    assert builds == [1, 1] and not (cache_dir / "meta_counts.json").exists()


def test_unbuildable_shapes_never_start_a_child(cache_dir, builds):
    mla = ModelShape(num_layers=2, hidden_size=256, num_attention_heads=4, vocab_size=1000, multi_latent_attention=True, kv_lora_rank=64)
    assert not meta_count.buildable(mla)
    assert meta_count.exact_count(mla) is None
    meta_count.prefetch(mla)
    assert builds == [] and meta_count._PENDING == {}


@pytest.mark.skipif(not meta_count.available(), reason="torch and megatron-core are not installed")
def test_prefetch_runs_the_real_build_in_the_background(cache_dir):
    meta_count.prefetch(SHAPE)
    assert len(meta_count._PENDING) == 1
    assert meta_count.exact_count(SHAPE) == count_params(SHAPE).total  # waits for the prefetched build
    assert meta_count._PENDING == {}
    assert list(json.loads((cache_dir / "meta_counts.json").read_text()).values()) == [count_params(SHAPE).total]
