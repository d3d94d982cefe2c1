# SPDX-License-Identifier: Apache-2.0
"""
``dtype: int8``: int8 linear weights stay within a documented bound of float32 on every reference fixture.

The bound (``INT8_ACTION_ATOL``, published in BENCHMARKS.md) is on the final actions at equal
noise, relative to the largest float32 action of the chunk: the fixtures' actions span
different scales (normalization stats), and int8's error scales with them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vla_policy_node.loading import load_policy
from vla_policy_node.model import int8_linear
from vla_policy_node.model.blocks import packing_targets
from vla_policy_node.model.vision import SiglipVisionTransformer, VisionAttention, VisionSpec

LEROBOT061 = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot061"
INT8_ACTION_ATOL = 0.05          # max |int8 - float32| / max |float32| over a chunk
FAMILIES = ("smolvla", "pi0", "pi05")
FOLDERS_061 = ("smolvla", "pi0", "pi05", "pi0_relative", "pi05_relative")


def relative_error(int8: np.ndarray, f32: np.ndarray) -> float:
    return float(np.abs(int8 - f32).max() / np.abs(f32).max())


def shared_observation(folder: Path) -> tuple[dict, np.ndarray]:
    """Return the shared fixture's raw observation (batch row 0) and noise."""
    inp = load_file(folder / "inputs.safetensors")
    prefix = "raw.observation.images."
    images = {k[len(prefix):]: inp[k][0].numpy() for k in inp if k.startswith(prefix)}
    return {"images": images, "state": inp["raw.observation.state"][0].numpy(), "task": "pick up the red cube"}, \
        inp["noise"].numpy()


def observation_061(folder: Path) -> tuple[dict, np.ndarray]:
    with safe_open(str(folder / "inputs.safetensors"), "pt") as f:
        meta = f.metadata()
    inp = load_file(folder / "inputs.safetensors")
    prefix = "raw."
    images = {k[len(prefix):]: inp[k].numpy() for k in inp if k.startswith("raw.observation.images.")}
    return ({"images": images, "state": inp["raw.observation.state"].numpy(), "task": json.loads(meta["tasks"])},
            inp["noise"].numpy())


def int8_against_float32(folder: Path, obs: dict, noise: np.ndarray) -> float:
    f32 = load_policy(folder, device="cpu").predict_action_chunk(obs, noise=noise)
    policy = load_policy(folder, device="cpu", dtype="int8")
    slots = [getattr(m, a, None) for m, a, _ in packing_targets(policy.model)]
    quantized = [t for t in slots if t is not None and not isinstance(t, torch.Tensor)]
    assert quantized, "no linear layer was quantized"
    assert int8_linear.count(policy.model) == len(quantized)
    assert policy.describe().endswith(f"with {len(quantized)} int8 linear layers")
    out = policy.predict_action_chunk(obs, noise=noise)
    assert out.shape == f32.shape and np.isfinite(out).all()
    return relative_error(out, f32)


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_within_bound_on_the_shared_reference_fixtures(family, reference_dir):
    folder = reference_dir(family)
    obs, noise = shared_observation(folder)
    error = int8_against_float32(folder, obs, noise)
    assert 0.0 < error < INT8_ACTION_ATOL, error


@pytest.mark.parametrize("name", FOLDERS_061)
def test_int8_within_bound_on_the_lerobot_061_fixtures(name):
    folder = LEROBOT061 / name
    obs, noise = observation_061(folder)
    error = int8_against_float32(folder, obs, noise)
    assert 0.0 < error < INT8_ACTION_ATOL, error


def test_float32_is_untouched_by_the_int8_option():
    folder = LEROBOT061 / "smolvla"
    obs, noise = observation_061(folder)
    policy = load_policy(folder, device="cpu")
    assert all(isinstance(getattr(m, a, None), (torch.Tensor, type(None))) for m, a, _ in packing_targets(policy.model))
    expected = load_file(folder / "expected.safetensors")["action_chunk"].numpy()
    np.testing.assert_allclose(policy.predict_action_chunk(obs, noise=noise), expected, atol=1e-5, rtol=0)


def test_int8_is_refused_off_the_cpu():
    with pytest.raises(ValueError, match="CPU only"):
        load_policy(LEROBOT061 / "smolvla", device=torch.device("meta"), dtype="int8")


def test_int8_engine_is_available_here():
    assert int8_linear.available()


def test_the_tiny_random_policy_takes_int8_too():
    """The node's random-weight tiny policy (no checkpoint) honours dtype int8 like a checkpoint does."""
    from vla_policy_node.loading.load import build_tiny_policy

    f32 = build_tiny_policy(("front",), chunk_size=8, num_steps=3)
    int8 = build_tiny_policy(("front",), chunk_size=8, num_steps=3, dtype="int8")
    obs = {"images": {"front": np.full((48, 64, 3), 100, np.uint8)}, "state": np.zeros(6, np.float32), "task": "go"}
    noise = np.random.default_rng(0).standard_normal((1, 8, f32.model.max_action_dim)).astype(np.float32)
    a, b = f32.predict_action_chunk(obs, noise=noise), int8.predict_action_chunk(obs, noise=noise)
    assert 0.0 < relative_error(b, a) < INT8_ACTION_ATOL


def test_export_takes_the_float_weights_and_the_int8_ones_come_back():
    """Compiled programs are exported with the int8 weights hidden (export cannot carry them), then restored."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)).eval()
    x = torch.randn(3, 64)
    expected = model(x)
    assert int8_linear.quantize_linears(model) == 2
    packed = [m.packed for m in model if isinstance(m, torch.nn.Linear)]
    assert not any(isinstance(p, torch.Tensor) for p in packed)
    with int8_linear.hidden(model):
        program = torch.export.export(model, (x,), strict=False)
        assert all(m.packed is None for m in model if isinstance(m, torch.nn.Linear))
    assert [m.packed for m in model if isinstance(m, torch.nn.Linear)] == packed
    torch.testing.assert_close(program.module()(x), expected)            # the float32 weights
    assert (model(x) - expected).abs().max() < 0.05 * expected.abs().max()     # the int8 ones again


def test_an_int8_linear_carries_its_bias_in_the_prepacked_weight():
    """The bias rides in the prepacked weight: fbgemm adds it as it writes (one pass less), to float rounding."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 160).eval()
    x = torch.randn(2, 7, 96)
    assert int8_linear.quantize_linears(lin) == 1
    assert torch.equal(lin.packed.unpack()[1], lin.bias.detach())
    after = torch.ops.quantized.linear_dynamic(x, int8_linear.prepack(lin.weight)) + lin.bias
    with torch.no_grad():
        torch.testing.assert_close(lin(x), after, rtol=1e-6, atol=1e-6)


def small_vision_tower() -> SiglipVisionTransformer:
    torch.manual_seed(0)
    tower = SiglipVisionTransformer(VisionSpec(32, 8, 64, 2, 4, 128)).eval()
    for p in tower.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return tower


def test_the_fused_int8_vision_qkv_gives_the_bits_of_three_products():
    """int8 products are exact integer sums scaled per output channel: fusing q/k/v changes no bit."""
    attn = small_vision_tower().encoder.layers[0].self_attn
    state = {k: v.clone() for k, v in attn.state_dict().items()}
    separate = [int8_linear.prepack(p.weight, p.bias) for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
    int8_linear.quantize_linears(attn)
    assert attn.qkv_packed is not None and all(getattr(p, "packed", None) is None
                                               for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    after = attn.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], v) for k, v in state.items())
    x = torch.randn(2, 16, 64)
    fused = torch.ops.quantized.linear_dynamic(x, attn.qkv_packed)
    assert torch.equal(fused, torch.cat([torch.ops.quantized.linear_dynamic(x, p) for p in separate], -1))


@pytest.mark.parametrize("native", [True, False])
def test_the_int8_vision_attention_multiplies_in_bfloat16_only_where_the_cpu_does(monkeypatch, native):
    monkeypatch.setattr(int8_linear, "native_bfloat16", lambda: native)
    tower = small_vision_tower()
    px = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        f32 = tower(px)
        int8_linear.quantize_linears(tower)
        int8 = tower(px)
    attns = [m for m in tower.modules() if isinstance(m, VisionAttention)]
    assert attns and all(a.products_dtype == (torch.bfloat16 if native else None) for a in attns)
    assert (int8 - f32).abs().max() < INT8_ACTION_ATOL * f32.abs().max()
    with int8_linear.hidden(tower):                # export: the float32 weights and SDPA
        assert all(a.qkv_packed is None for a in attns)
        program = torch.export.export(tower, (px,), strict=False)
    assert all(a.qkv_packed is not None for a in attns)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(px), f32, atol=1e-5, rtol=0)


def test_int8_smolvla_denoises_through_the_fixed_kv_kernel_at_a_batch_of_one():
    """64-wide heads: int8 takes ``fixed_kv_attention`` at batch 1 only (same numbers as SDPA); float32 never."""
    import dataclasses

    from vla_policy_node.loading.load import init_weights, tiny_smolvla_config
    from vla_policy_node.model.families.smolvla import SmolVLA
    from vla_policy_node.model.prefix_cache import VLAPrefixCache
    from vla_policy_node.model.types import ModelInputs

    tiny = tiny_smolvla_config(("front",), 6, 6, chunk_size=8, num_steps=2)
    wide = dataclasses.replace(tiny, text=dataclasses.replace(tiny.text, head_dim=64),
                               expert=dataclasses.replace(tiny.expert, head_dim=64))
    model = SmolVLA(wide).eval()
    init_weights(model, torch.Generator().manual_seed(0))
    cpu = torch.device("cpu")
    assert not model._fixed_kv_attention(cpu, 1)
    int8_linear.quantize_linears(model)
    assert model._fixed_kv_attention(cpu, 1) and not model._fixed_kv_attention(cpu, 2)

    g = torch.Generator().manual_seed(1)
    inputs = ModelInputs(images=[torch.rand(1, 3, 32, 32, generator=g) * 2 - 1],
                         image_masks=[torch.ones(1, dtype=torch.bool)],
                         tokens=torch.randint(0, 200, (1, 5), generator=g),
                         token_mask=torch.ones(1, 5, dtype=torch.bool), state=torch.randn(1, 32, generator=g))
    x_t = torch.randn(1, 8, 32, generator=g)
    velocities = []
    with torch.no_grad():
        for fixed in (True, False):
            model.fixed_kv_at_batch_one = fixed
            cache = VLAPrefixCache()
            ctx = model.encode_prefix(inputs, cache)
            cache.freeze(model.num_cache_layers)
            assert ("cross_fixed" in ctx.extras) is fixed
            velocities.append(model.velocity(x_t, model.time_conditioning(torch.tensor([1.0]))[0], ctx))
    torch.testing.assert_close(velocities[0], velocities[1], rtol=1e-4, atol=1e-5)
