# SPDX-License-Identifier: Apache-2.0
"""pi0 against the LeRobot 0.4.4 reference fixture, and the PaliGemma pieces against transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import fixture_model_inputs, max_diff
from pi_reference_checks import check_matches_fixture, check_prefix_once_and_frozen, load_reference_model, pi_config

from vla_policy_node.model.attention import additive_mask, make_att_2d_masks
from vla_policy_node.model.blocks import DecoderLayer
from vla_policy_node.model.families.paligemma import GEMMA_VARIANTS, GemmaDims, PaliGemmaSpec, PiConfig, prepare_image
from vla_policy_node.model.families.pi0 import Pi0, key_rules
from vla_policy_node.model.preprocessing import newline_prompt
from vla_policy_node.model.precision import cast_model
from vla_policy_node.model.prefix_cache import VLAPrefixCache
from vla_policy_node.model.rope import rope_cos_sin
from vla_policy_node.runtime.engine import PolicyRuntime
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.model.vision import SiglipVisionTransformer, VisionSpec
from vla_policy_node.loading.weights import load_weights, prefix_key_map

CPU = torch.device("cpu")


def load_pi0(folder: Path, backend: str = "eager") -> Pi0:
    return load_reference_model(Pi0, key_rules(), folder, backend)


def model_inputs(folder: Path) -> tuple[ModelInputs, dict[str, torch.Tensor]]:
    return fixture_model_inputs(folder, with_state=True)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_matches_lerobot_reference(reference_dir, backend):
    model = load_pi0(reference_dir("pi0"), backend)
    check_matches_fixture(model, reference_dir("pi0"), backend, with_state=True)


def test_prefix_cache_filled_once_and_frozen(reference_dir):
    check_prefix_once_and_frozen(load_pi0(reference_dir("pi0")), reference_dir("pi0"), with_state=True)


def test_preprocessing_matches_reference(reference_dir):
    folder = reference_dir("pi0")
    inp = load_file(folder / "inputs.safetensors")
    with safe_open(str(folder / "inputs.safetensors"), "pt") as f:
        meta = f.metadata()
    size = pi_config(folder).image_size[0]
    for i, cam in enumerate(json.loads(meta["camera_order"])):
        from_batch = prepare_image(inp[f"batch.{cam}"], size)
        from_raw = prepare_image(inp[f"raw.{cam}"].permute(0, 3, 1, 2).float() / 255.0, size)
        assert torch.equal(from_batch, inp[f"model_input.image.{i}"])
        assert torch.equal(from_raw, inp[f"model_input.image.{i}"])
    assert [newline_prompt(t, None) for t in json.loads(meta["tasks"])] == json.loads(meta["prompts"])
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(folder / "tiny_paligemma_tokenizer" / "tokenizer.json"))
    ids = tok.encode(json.loads(meta["prompts"])[0]).ids                  # BOS added by the template, no EOS
    expected = inp["batch.observation.language.tokens"][0]
    assert ids + [0] * (expected.shape[0] - len(ids)) == expected.tolist()


def test_padded_pixels_are_minus_three():
    image = torch.rand(2, 3, 30, 60)
    out = prepare_image(image, 28)
    assert out.shape == (2, 3, 28, 28)
    assert torch.all(out[:, :, :7] == -3.0) and torch.all(out[:, :, -7:] == -3.0)
    assert out[:, :, 7:21].min() >= -1.0


def test_openpi_key_layout_loads_the_same_weights(reference_dir, tmp_path):
    """Load openpi's ``save_model`` layout: no ``model.`` root, embedding stored instead of the tied LM head."""
    folder = reference_dir("pi0")
    lerobot = load_pi0(folder)
    tensors = load_file(folder / "model.safetensors")
    renamed = {k.removeprefix("model."): v for k, v in tensors.items()}
    pg = "paligemma_with_expert.paligemma."
    renamed[pg + "model.language_model.embed_tokens.weight"] = renamed.pop(pg + "lm_head.weight")
    save_file(renamed, tmp_path / "model.safetensors")
    openpi = Pi0(lerobot.config).eval()
    load_weights(openpi, tmp_path / "model.safetensors", prefix_key_map(key_rules()))
    ref = lerobot.state_dict()
    assert all(torch.equal(t, ref[k]) for k, t in openpi.state_dict().items())


def test_config_uses_published_variants_without_tiny_dims(reference_dir):
    config = json.loads((reference_dir("pi0") / "config.json").read_text())
    config["image_resolution"] = [224, 224]
    cfg = PiConfig.from_checkpoint(config)
    assert cfg.backbone.vlm == GEMMA_VARIANTS["gemma_2b"] and cfg.backbone.expert == GEMMA_VARIANTS["gemma_300m"]
    vision = cfg.backbone.vision
    assert (vision.width, vision.num_layers, vision.num_patches) == (1152, 27, 256)
    assert cfg.camera_names == ("observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb")
    with pytest.raises(ValueError, match="depth"):
        PaliGemmaSpec(vision=cfg.backbone.vision, vlm=GemmaDims(64, 2, 128, 8, 1, 16),
                      expert=GemmaDims(32, 3, 64, 8, 1, 16), vocab_size=10)


def test_bfloat16_keeps_sensitive_parts_float32(reference_dir):
    folder = reference_dir("pi0")
    model = cast_model(load_pi0(folder, "sdpa"), CPU, torch.bfloat16)
    assert model.vlm.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    for p in (model.vlm.layers[0].input_layernorm.weight, model.expert.norm.weight, model.state_proj.weight,
              model.action_in_proj.weight, model.action_out_proj.weight, model.action_time_mlp_in.weight,
              model.vlm.vision_tower.embeddings.patch_embedding.weight):
        assert p.dtype == torch.float32
    inputs, raw = model_inputs(folder)
    actions = PolicyRuntime(model, model.config.num_steps, CPU).sample(inputs.to(CPU, torch.bfloat16), raw["noise"])
    exp = load_file(folder / "expected.safetensors")["action_chunk_normalized"]
    assert actions.dtype == torch.float32
    # bfloat16 keeps 8 mantissa bits: allow a few of its ulps at the largest action (|a| ~ 5 here)
    assert max_diff(actions[..., :model.config.action_dim], exp) < 0.03 * exp.abs().max().item()


# ------------------------------------------------------------------ pieces vs transformers
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_gemma_layer_matches_transformers(backend):
    """
    Match one Gemma layer against transformers'.

    A prefix pass filling the cache, then a suffix reading it frozen, equals
    transformers' layer over [prefix; suffix] with the suffix hidden from the prefix.
    """
    modeling_gemma = pytest.importorskip("transformers.models.gemma.modeling_gemma")
    from transformers import GemmaConfig
    torch.manual_seed(0)
    dims = GemmaDims(width=64, depth=1, mlp_dim=128, num_heads=4, num_kv_heads=2, head_dim=16)
    hf_cfg = GemmaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, num_hidden_layers=1, hidden_activation="gelu_pytorch_tanh",
                         rms_norm_eps=1e-6, rope_theta=10000.0, attn_implementation="eager")
    hf = modeling_gemma.GemmaDecoderLayer(hf_cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    ours = DecoderLayer(dims.spec()).eval()
    ours.load_state_dict(hf.state_dict())
    b, lp, ls = 2, 10, 4
    x = torch.randn(b, lp + ls, 64)
    pad = torch.ones(b, lp + ls, dtype=torch.bool)
    pad[1, 7:lp] = False                                                  # padded prefix tokens
    ar = torch.zeros(b, lp + ls, dtype=torch.long)
    ar[:, lp] = 1
    allowed = make_att_2d_masks(pad, ar)
    positions = torch.cumsum(pad.long(), 1) - 1
    rotary = modeling_gemma.GemmaRotaryEmbedding(hf_cfg)
    with torch.no_grad():
        out = hf(x, attention_mask=additive_mask(allowed, torch.float32), position_ids=positions,
                 position_embeddings=rotary(x, positions))
        out = out[0] if isinstance(out, tuple) else out
        cache = VLAPrefixCache()
        rope_p = rope_cos_sin(positions[:, :lp], 16, 10000.0)
        prefix = ours(x[:, :lp], rope_p, additive_mask(allowed[:, :lp, :lp], torch.float32), cache, 0, backend)
        cache.freeze()
        rope_s = rope_cos_sin(positions[:, lp:], 16, 10000.0)
        suffix = ours(x[:, lp:], rope_s, additive_mask(allowed[:, lp:], torch.float32), cache, 0, backend)
    valid = pad[:, :lp]
    # Outputs reach ~10 with these 0.2-std weights: float32 summation order alone moves the last
    # bits by ~1e-5 depending on the CPU's kernels, so the bound is relative to the magnitude.
    tol = 2e-6 * out.abs().max().item()
    assert max_diff(prefix[valid], out[:, :lp][valid]) < tol
    assert max_diff(suffix, out[:, lp:]) < tol


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_siglip_matches_transformers(backend):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_cfg = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=2, image_size=56, patch_size=14,
                                             layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
                                             vision_use_head=False, attn_implementation="eager")
    hf = transformers.SiglipVisionModel(hf_cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    ours = SiglipVisionTransformer(VisionSpec(image_size=56, patch_size=14, width=32, num_layers=2, num_heads=2,
                                              mlp_width=64)).eval()
    ours.load_state_dict({k.removeprefix("vision_model."): v for k, v in hf.state_dict().items()
                          if not k.endswith("position_ids")})
    pixels = torch.rand(3, 3, 56, 56) * 2 - 1
    with torch.no_grad():
        assert max_diff(ours(pixels, backend=backend), hf(pixel_values=pixels).last_hidden_state) < 1e-5
