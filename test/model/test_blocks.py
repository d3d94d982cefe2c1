# SPDX-License-Identifier: Apache-2.0
"""Shared blocks: attention backends agree; decoder and vision layers match transformers' definitions."""

import pytest
import torch
import torch.nn.functional as F

from vla_policy_node.model import attention as attention_module
from vla_policy_node.model.attention import (additive_mask, attention, fixed_kv_attention, fixed_kv_layout,
                                             make_att_2d_masks)
from vla_policy_node.model.blocks import DecoderLayer, DecoderSpec, RMSNorm, sinusoidal_time_embedding
from vla_policy_node.model.flow import euler_integrate, euler_schedule
from vla_policy_node.model.prefix_cache import VLAPrefixCache
from vla_policy_node.model.rope import rope_cos_sin
from vla_policy_node.model.vision import SiglipVisionTransformer, VisionSpec


def test_att_2d_mask_rule_examples():
    pad = torch.ones(1, 6, dtype=torch.bool)
    prefix_lm = make_att_2d_masks(pad, torch.tensor([[0, 0, 0, 1, 1, 1]]))[0]
    assert prefix_lm[:3, :3].all() and not prefix_lm[:3, 3:].any()
    assert torch.equal(prefix_lm[3:, 3:], torch.ones(3, 3, dtype=torch.bool).tril())
    assert torch.equal(make_att_2d_masks(pad, torch.ones(1, 6))[0], torch.ones(6, 6, dtype=torch.bool).tril())
    padded = make_att_2d_masks(torch.tensor([[True, True, False]]), torch.zeros(1, 3))[0]
    assert not padded[:, 2].any() and not padded[2].any()


def test_attention_backends_agree_with_gqa_and_padding():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=g)
    k, v = torch.randn(2, 2, 7, 8, generator=g), torch.randn(2, 2, 7, 8, generator=g)
    pad = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    mask = additive_mask(pad[:, None, :].expand(2, 5, 7), torch.float32)
    eager = attention(q, k, v, mask, "eager")
    sdpa = attention(q, k, v, mask, "sdpa")
    torch.testing.assert_close(eager, sdpa, atol=1e-6, rtol=0)
    # Fully masked query rows stay finite (they would be NaN with a boolean SDPA mask).
    rows = additive_mask(torch.zeros(2, 5, 7, dtype=torch.bool), torch.float32)
    assert torch.isfinite(attention(q, k, v, rows, "sdpa")).all()
    with pytest.raises(ValueError, match="unknown attention backend"):
        attention(q, k, v, mask, "flash9")


def test_euler_schedule_and_integrator():
    times, dt = euler_schedule(4)
    assert times.dtype == torch.float32 and times.tolist() == [1.0, 0.75, 0.5, 0.25] and dt.item() == -0.25
    x = euler_integrate(lambda x, k: torch.ones_like(x), torch.zeros(2), dt, 4)   # dx/dt = 1 from t=1 to 0
    torch.testing.assert_close(x, torch.full((2,), -1.0))
    with pytest.raises(ValueError):
        euler_schedule(0)


def test_time_embedding_is_float64_sincos():
    emb = sinusoidal_time_embedding(torch.tensor([0.0, 0.5]), 8, 4e-3, 4.0)
    assert emb.shape == (2, 8) and emb.dtype == torch.float32
    torch.testing.assert_close(emb[0], torch.tensor([0.0] * 4 + [1.0] * 4))


transformers = pytest.importorskip("transformers", reason="transformers is not installed for the tests")


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_decoder_layer_matches_transformers(family):
    torch.manual_seed(0)
    if family == "llama":
        from transformers.models.llama import modeling_llama as hf
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0)
        spec = DecoderSpec(64, 1, 4, 2, 16, 128, act="silu", norm_eps=1e-5)
        ref, rotary = hf.LlamaDecoderLayer(cfg, 0), hf.LlamaRotaryEmbedding(cfg)
    else:
        from transformers.models.gemma import modeling_gemma as hf
        cfg = transformers.GemmaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                       num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6,
                                       hidden_activation="gelu_pytorch_tanh", rope_theta=10000.0)
        spec = DecoderSpec(64, 1, 4, 1, 16, 128, act="gelu_tanh", norm_eps=1e-6, norm_offset=1.0)
        ref, rotary = hf.GemmaDecoderLayer(cfg, 0), hf.GemmaRotaryEmbedding(cfg)
    cfg._attn_implementation = "eager"
    ref.eval()
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.1)
    ours = DecoderLayer(spec).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 9, 64)
    pad = torch.ones(2, 9, dtype=torch.bool)
    allowed = make_att_2d_masks(pad, torch.ones(2, 9))                  # causal
    positions = torch.arange(9)[None].expand(2, 9)
    with torch.no_grad():
        want = ref(x, attention_mask=additive_mask(allowed, torch.float32), position_ids=positions,
                   position_embeddings=rotary(x, positions))
        want = want[0] if isinstance(want, tuple) else want
        got = ours(x, rope_cos_sin(positions, 16, 10000.0), additive_mask(allowed, torch.float32),
                   VLAPrefixCache(), 0, "eager")
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def test_vision_tower_matches_transformers_siglip():
    torch.manual_seed(0)
    cfg = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, image_size=32, patch_size=8)
    ref = transformers.SiglipVisionModel(cfg).eval()
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.1)
    ours = SiglipVisionTransformer(VisionSpec(32, 8, 32, 2, 2, 64)).eval()
    state = {k[len("vision_model."):]: v for k, v in ref.state_dict().items()
             if k.startswith("vision_model.") and ".head." not in k and "position_ids" not in k}
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert not missing
    px = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        want = ref(pixel_values=px).last_hidden_state
        for backend in ("eager", "sdpa"):
            torch.testing.assert_close(ours(px, backend=backend), want, atol=2e-5, rtol=0)


def test_attention_over_a_fixed_kv_layout_equals_sdpa():
    """The eager CPU denoising path for narrow heads: K/V laid out once, then baddbmm, softmax, bmm."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 5, 16, generator=g)
    k, v = torch.randn(2, 2, 7, 16, generator=g), torch.randn(2, 2, 7, 16, generator=g)
    pad = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    for allowed in (pad[:, None, :].expand(2, 5, 7), torch.zeros(2, 5, 7, dtype=torch.bool)):
        mask = additive_mask(allowed, torch.float32)
        fixed = fixed_kv_attention(q, *fixed_kv_layout(k, v, mask, num_heads=4))
        torch.testing.assert_close(fixed, attention(q, k, v, mask, "sdpa"), atol=1e-6, rtol=0)
        assert torch.isfinite(fixed).all()


@pytest.mark.parametrize("batch, heads, n, block_bytes",
                         [(1, 12, 1024, 6 << 20), (2, 3, 50, 1), (1, 4, 37, 1 << 30), (1, 12, 64, 5 * 64 * 64 * 2)])
def test_low_precision_attention_is_sdpa_within_bfloat16_rounding(monkeypatch, batch, heads, n, block_bytes):
    """The int8 vision tower's attention: bfloat16 products, any head blocking, q/k/v as strided views of one qkv."""
    monkeypatch.setattr(attention_module, "LOW_PRECISION_BLOCK_BYTES", block_bytes)
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(batch, n, 3 * heads * 64, generator=g)
    qkv[..., :heads * 64] *= 2                            # q: larger scores
    q, k, v = qkv.view(batch, n, 3, heads, 64).permute(2, 0, 3, 1, 4)
    want = F.scaled_dot_product_attention(q, k, v)
    got = attention_module.low_precision_attention(q, k, v, torch.bfloat16)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert got.transpose(1, 2).is_contiguous()          # the heads merge back into (B, N, C) without a copy
    assert (got - want).abs().max() < 0.02 * want.abs().max()
    # The scores buffer the softmax overwrites gives the bits of new tensors per block (the last one shorter).
    block = max(1, block_bytes // (n * n * 2))
    qs, ks, vs = ((t * (64 ** -0.5 if t is q else 1)).bfloat16().reshape(batch * heads, n, 64) for t in (q, k, v))
    blocks = [torch.bmm(torch.softmax(torch.bmm(qs[s:s + block], ks[s:s + block].transpose(1, 2)), dim=-1),
                        vs[s:s + block]) for s in range(0, batch * heads, block)]
    assert torch.equal(got, torch.cat(blocks).view(batch, heads, n, 64).float())


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_on_the_cpu_equals_the_library_kernel_and_follows_its_weight(offset):
    g = torch.Generator().manual_seed(2)
    norm = RMSNorm(48, 1e-6, offset=offset)
    x = torch.randn(3, 50, 48, generator=g)
    with torch.no_grad():
        for _ in range(2):              # the second time after the weight changed in place
            norm.weight.normal_(generator=g)
            expected = F.rms_norm(x, (48,), None, norm.eps) * (offset + norm.weight)
            torch.testing.assert_close(norm(x)[0], expected, atol=0, rtol=2e-6)
