"""Multi-latent attention and multi-token prediction: parameter counts against hand computations and the
published DeepSeek-V3 sizes, their effect on activations, and reading them from a config."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import config_view

from diagnose.explain.config import ConfigView
from diagnose.explain.memory.activations import Workload, activation_bytes
from diagnose.explain.memory.from_config import shape_from_config
from diagnose.explain.memory.shape import ModelShape, count_params, layer_params, mtp_params, stage_counts

H, V = 7168, 129280
# DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3): 61 layers, the first 3 dense, 256 routed experts + 1 shared
DSV3 = ModelShape(
    num_layers=61, hidden_size=H, num_attention_heads=128, ffn_hidden_size=18432, vocab_size=V,
    gated_linear_unit=True, untie_embeddings=True, add_bias_linear=False, layernorm=False, position_embedding="rope",
    num_moe_experts=256, moe_ffn_hidden_size=2048, moe_shared_expert_intermediate_size=2048, moe_router_topk=8,
    moe_layer_freq=tuple([0] * 3 + [1] * 58), multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512,
    qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
)
# per layer, by hand (RMSNorm, no bias; q_head = 128 + 64 = 192):
#   q_down 7168*1536 = 11,010,048   q norm 1,536            q_up 1536*128*192 = 37,748,736
#   kv_down 7168*(512+64) = 4,128,768   kv norm 512        kv_up 512*128*(128+128) = 16,777,216
#   proj 128*128*7168 = 117,440,512                         total 187,107,328
MLA_LAYER = 187_107_328
DENSE_MLP = 3 * H * 18432  # SwiGLU fc1 (2f x h) + fc2 (h x f)
NORMS = 2 * H


def test_mla_attention_parameters_match_the_hand_count():
    dense, expert = layer_params(DSV3, moe=False)
    assert expert == 0
    assert dense == MLA_LAYER + DENSE_MLP + NORMS


def test_mla_under_tp_splits_the_up_projections_and_keeps_the_down_projections_whole():
    dense, _ = layer_params(DSV3, moe=False, tp=8)
    # q_down, kv_down and both norms whole; q_up, kv_up, proj (and the MLP) divided by 8
    by_hand = 11_010_048 + 1_536 + 4_128_768 + 512 + (37_748_736 + 16_777_216 + 117_440_512) // 8
    assert dense == by_hand + DENSE_MLP // 8 + NORMS


def test_mla_without_query_compression():
    # DeepSeek-V2-Lite: q_lora_rank null -> one linear_q_proj of heads x (qk + rope) dims
    lite = ModelShape(num_layers=1, hidden_size=2048, num_attention_heads=16, ffn_hidden_size=10944,
                      gated_linear_unit=True, add_bias_linear=False, layernorm=False, position_embedding="rope",
                      multi_latent_attention=True, q_lora_rank=None, kv_lora_rank=512)
    dense, _ = layer_params(lite, moe=False)
    attention = 2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048  # 13,763,072
    assert dense == attention + 3 * 2048 * 10944 + 2 * 2048


def test_deepseek_v3_total_and_active_parameters_match_the_published_sizes():
    count = count_params(DSV3)
    assert count.total == pytest.approx(671e9, rel=0.01)
    # active: everything but the routed experts, plus 8 of the 256 routed experts of each MoE layer
    active = count.dense + count.expert * 8 / 256
    assert active == pytest.approx(37e9, rel=0.03)
    # without MLA the same heads would be plain MHA (d = h / a = 56: QKV 3h x h, proj h x h) in every layer
    mha = count_params(replace(DSV3, multi_latent_attention=False))
    assert count.dense - mha.dense == 61 * (MLA_LAYER - 4 * H * H)


def test_mtp_adds_one_moe_layer_eh_proj_and_norms_on_the_last_stage():
    mtp = replace(DSV3, mtp_num_layers=1)
    moe_dense, moe_expert = layer_params(DSV3, moe=True)
    dense, expert = mtp_params(mtp)
    assert dense == moe_dense + 2 * H * H + 3 * H  # eh_proj (2h -> h), enorm, hnorm, final norm
    assert expert == moe_expert
    total = count_params(mtp).total
    # HF checkpoint: 685B = 671B + 14B MTP module, whose embedding and head (2 x V x h) are copies that
    # Megatron shares with the main model
    assert total == pytest.approx(685e9 - 2 * V * H, rel=0.01)
    assert total - count_params(DSV3).total == dense + expert


def test_mtp_with_pp_lives_on_the_last_stage_with_its_own_word_embedding():
    mtp = replace(DSV3, mtp_num_layers=1)
    base = stage_counts(DSV3, tp=1, pp=4, ep=8)
    with_mtp = stage_counts(mtp, tp=1, pp=4, ep=8)
    assert [c.total for c in with_mtp[:3]] == [c.total for c in base[:3]]
    dense, expert = mtp_params(mtp, tp=1, ep=8)
    extra = with_mtp[3].total - base[3].total
    assert extra == dense + expert + V * H  # the MTP block + its word embedding (untied model, PP > 1)
    assert with_mtp[3].details["mtp_layers"] == 1


def test_mla_keeps_more_activations_per_layer_than_gqa_attention_of_the_same_hidden_size():
    work = Workload(micro_batch_size=1, seq_length=4096)
    one = replace(DSV3, num_layers=1, num_moe_experts=None, moe_layer_freq=1, vocab_size=128)
    mla = activation_bytes(one, work, tp=1)
    plain = activation_bytes(replace(one, multi_latent_attention=False), work, tp=1)
    # per token, by hand: MLA keeps 3h + 4*1536 + 2*576 + 2*512 + 4*128*192 + 4*128*128 = 193,664 bytes (its
    # norm output 2h and mask h are counted with every layer's), where flash attention of 128 heads of d = 56
    # keeps Q 2ad, K 2gd, the QKV output 2(ad + 2gd), the output 2ad and the softmax statistics 4a
    a, d = 128, H // 128
    flash = 2 * a * d + 2 * a * d + 2 * (a * d + 2 * a * d) + 2 * a * d + 4 * a
    assert mla - plain == pytest.approx((193_664 - 3 * H - flash) * 4096, rel=1e-6)


def test_mtp_adds_a_layer_and_logits_to_the_last_stage_activations():
    work = Workload(micro_batch_size=1, seq_length=4096, num_microbatches=64)
    dense = ModelShape(num_layers=32, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=14336,
                       vocab_size=128256, gated_linear_unit=True, position_embedding="rope")
    mtp = replace(dense, mtp_num_layers=1)
    last = activation_bytes(mtp, work, tp=1, pp=4, stage=3) - activation_bytes(dense, work, tp=1, pp=4, stage=3)
    tokens, h = 4096, 4096
    # one more layer (TE norms 2 x 2h, QKV and fc1 inputs 2 x 2h, flash attention of MHA 12h + 4a, fused
    # SwiGLU 6f), its concatenated input 4h, and its own logits: fp32 softmax 4V + bf16 logits 2V per token
    layer = tokens * (8 * h + 12 * h + 4 * 32 + 6 * 14336)
    logits = 6 * tokens * 128256
    assert last == pytest.approx(layer + 4 * tokens * h + logits, rel=1e-6)
    # the other stages do not change
    assert activation_bytes(mtp, work, tp=1, pp=4, stage=0) == activation_bytes(dense, work, tp=1, pp=4, stage=0)


def _view(values: dict) -> ConfigView:
    return config_view({"model.num_layers": 4, "model.hidden_size": 1024, "model.num_attention_heads": 16, **values})


def test_config_reads_mla_and_mtp():
    shape = shape_from_config(_view({"model.multi_latent_attention": True, "model.q_lora_rank": 768,
                                     "model.kv_lora_rank": 256, "model.qk_head_dim": 64,
                                     "model.qk_pos_emb_head_dim": 32, "model.v_head_dim": 64,
                                     "model.mtp_num_layers": 2}))
    assert shape.multi_latent_attention
    assert (shape.q_lora_rank, shape.kv_lora_rank, shape.qk_head_dim, shape.qk_pos_emb_head_dim,
            shape.v_head_dim, shape.mtp_num_layers) == (768, 256, 64, 32, 64, 2)


def test_config_mla_defaults_and_null_query_rank():
    implied = shape_from_config(_view({"model.kv_lora_rank": 512}))  # a DeepSeek provider: flag not shown
    assert implied.multi_latent_attention and implied.q_lora_rank == 512  # MLATransformerConfig default
    lite = shape_from_config(_view({"model.multi_latent_attention": True, "model.q_lora_rank": None}))
    assert lite.q_lora_rank is None
    off = shape_from_config(_view({"model.multi_latent_attention": False, "model.kv_lora_rank": 512}))
    assert not off.multi_latent_attention


def test_config_reads_megatron_lm_argument_names():
    shape = shape_from_config(_view({"mlm.multi_latent_attention": True, "mlm.kv_lora_rank": 128,
                                     "mlm.mtp_num_layers": 1, "mlm.decoder_first_pipeline_num_layers": 1}))
    assert shape.multi_latent_attention and shape.kv_lora_rank == 128 and shape.mtp_num_layers == 1
    assert shape.num_layers_in_first_pipeline_stage == 1


def test_moe_activations_count_top_k_and_shared_experts_and_dense_layers_apart():
    shape = ModelShape(num_layers=2, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096, vocab_size=128,
                       gated_linear_unit=True, position_embedding="rope", num_moe_experts=64,
                       moe_ffn_hidden_size=512, moe_shared_expert_intermediate_size=1024, moe_router_topk=6,
                       moe_layer_freq=(0, 1))
    work = Workload(micro_batch_size=1, seq_length=1024)
    tokens, h = 1024, 1024
    common = 8 * h + 12 * h + 4 * 8  # norms, GEMM inputs, flash attention (MHA of 8 heads)
    dense = tokens * (common + 6 * 4096)  # fused SwiGLU inner 6f per token
    # six routed experts (inner 6f and their permuted input and output 4h each), the shared expert, the router
    moe = tokens * (common + 6 * (6 * 512 + 4 * h) + 6 * 1024 + 16 * 64)
    head = tokens * (2 * h + 2 * h + 6 * 128)  # final norm, output layer input, fp32 softmax + bf16 logits
    assert activation_bytes(shape, work) == int(dense + moe + head)
