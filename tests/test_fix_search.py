"""The fix search: the smallest set of suggested fixes that passes, proven by replay (and by memory when asked)."""

from __future__ import annotations

from diagnose.explain.config.extract import load_config
from diagnose.explain.fix_search import search_fix
from diagnose.explain.replay import replay
from diagnose.explain.validate import ValidationResult, Violation
from diagnose.model import Override

FSDP_BOTH = """\
model:
  num_layers: 4
  hidden_size: 256
  num_attention_heads: 4
ddp:
  use_megatron_fsdp: true
  data_parallel_sharding_strategy: optim_grads_params
dist:
  use_megatron_fsdp: true
  use_torch_fsdp2: true
checkpoint:
  save: /ckpt/run
  ckpt_format: fsdp_dtensor
"""


def test_megatron_fsdp_and_fsdp2_with_fsdp_dtensor_is_one_key(tmp_path):
    """Both FSDPs on with fsdp_dtensor: turning FSDP2 off is the whole fix (the greedy merge also switched the
    checkpoint format to torch_dist, which Megatron FSDP then refuses: 'no complete fix')."""
    path = tmp_path / "run_config.yaml"
    path.write_text(FSDP_BOTH)
    out = replay(load_config(str(path)), [], real_mcore=False)
    assert {v.check for v in out.before.violations} >= {"fsdp_exclusive"}
    assert [(o.key, o.value) for o in out.fix] == [("dist.use_torch_fsdp2", False)]
    assert out.passes


def _v(check: str, *fixes: list[Override]) -> Violation:
    return Violation(check, check, [o.key for f in fixes for o in f], fixes=list(fixes))


def _checks(config: dict) -> ValidationResult:
    """A toy validator: a needs b off or c on; b on needs d on; c on needs e on."""
    out = []
    if config.get("a") and config.get("b") and not config.get("c"):
        out.append(_v("ab", [Override("c", True)], [Override("b", False)]))
    if config.get("c") and not config.get("e"):
        out.append(_v("ce", [Override("e", True)]))
    if config.get("b") and not config.get("d"):
        out.append(_v("bd", [Override("d", True)], [Override("b", False)]))
    return ValidationResult(out)


def _run(base: dict, requested: list[Override], accept=None):
    def check(fix):
        return _checks({**base, **{o.key: o.value for o in fix}})

    return search_fix(requested, check(requested), check, accept)


def test_fewest_keys_first_not_the_first_suggestion_of_each():
    # greedy: c=True (ab), d=True (bd), then e=True (ce): three keys; b=False alone passes
    found = _run({"a": True, "b": True}, [])
    assert found.accepted and [(o.key, o.value) for o in found.fix] == [("b", False)]


def test_requested_keys_are_never_undone():
    found = _run({"a": True, "b": True}, [Override("b", True)])
    assert found.accepted
    assert {(o.key, o.value) for o in found.fix} == {("b", True), ("c", True), ("d", True), ("e", True)}
    assert found.fix[0] == Override("b", True)


def test_memory_check_rejects_a_passing_set_that_does_not_fit():
    """An OOM fix must also fit: the smallest valid set is skipped when the memory model says it does not."""
    fits = lambda fix: any(o.key == "d" for o in fix)  # noqa: E731 - a stand-in for the memory model
    found = _run({"a": True, "b": True}, [], accept=fits)
    # b=False alone passes but "does not fit"; the smallest set that passes and fits adds d
    assert found.accepted and {(o.key, o.value) for o in found.fix} == {("d", True), ("b", False)}


def test_nothing_passes_returns_the_closest_unaccepted():
    found = _run({"a": True, "b": True}, [], accept=lambda fix: False)
    assert not found.accepted and found.tried > 0


DSV3_PP16 = """\
model:
  _target_: megatron.bridge.models.deepseek.deepseek_provider.DeepSeekV3ModelProvider
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 16
  expert_model_parallel_size: 8
  sequence_parallel: true
ddp:
  use_distributed_optimizer: true
optimizer:
  use_distributed_optimizer: true
mixed_precision: bf16_mixed
train:
  micro_batch_size: 1
  global_batch_size: 2048
"""


def test_a_layout_fix_never_ignores_memory(tmp_path):
    """DeepSeek-V3's 61 layers do not divide over PP 16. The one-key fix (PP 1: the only smaller divisor) puts
    671B parameters on each pipeline rank; the memory check rejects it and the search keeps PP 16 with an uneven
    first/last stage instead."""
    from diagnose.checking import memory_accept
    from diagnose.explain.config import apply_defaults

    path = tmp_path / "dsv3.yaml"
    path.write_text(DSV3_PP16)
    view = load_config(str(path))
    view.set("launch.world_size", 256, "override")
    apply_defaults(view)
    capacity = 141 * 10**9
    accept, fits_of = memory_accept(view, 256, capacity)
    assert fits_of([]) is True
    assert fits_of([Override("model.pipeline_model_parallel_size", 1)]) is False

    blind = replay(view, [], real_mcore=False)
    assert [(o.key, o.value) for o in blind.fix] == [("model.pipeline_model_parallel_size", 1)]
    out = replay(view, [], real_mcore=False, accept=accept)
    assert out.passes
    assert {(o.key, o.value) for o in out.fix} == {("model.num_layers_in_first_pipeline_stage", 3),
                                                   ("model.num_layers_in_last_pipeline_stage", 2)}
    assert fits_of(out.fix) is True
