# SPDX-License-Identifier: Apache-2.0
"""Checks shared by the pi0 and pi0.5 reference tests: the same fixture layout, the same runtime contract."""

import json
from pathlib import Path

from cache_checks import assert_frozen_prefix_unchanged
from conftest import fixture_model_inputs, max_diff
from safetensors.torch import load_file
import torch

from vla_policy_node.model.families.paligemma import PiConfig
from vla_policy_node.model.flow import euler_integrate
from vla_policy_node.runtime.engine import PolicyRuntime
from vla_policy_node.loading.weights import load_weights, prefix_key_map

TOL = 1e-4
CPU = torch.device("cpu")


def pi_config(folder: Path) -> PiConfig:
    """Return the PiConfig of a fixture folder: ``config.json``, sized by the ``tiny_dims.json`` beside it."""
    tiny_path = folder / "tiny_dims.json"
    tiny = json.loads(tiny_path.read_text()) if tiny_path.is_file() else None
    return PiConfig.from_checkpoint(json.loads((folder / "config.json").read_text()), tiny)


def load_reference_model(model_cls, rules, folder: Path, backend: str = "eager"):
    """Build a pi0 / pi0.5 network from a fixture's config and load its weights by the family's key rules."""
    model = model_cls(pi_config(folder), attention_backend=backend).eval()
    load_weights(model, folder / "model.safetensors", prefix_key_map(rules))
    return model


def check_matches_fixture(model, folder: Path, backend: str, with_state: bool) -> None:
    """Assert prefix embeddings, first/last K/V, every step's velocity and the chunk match LeRobot."""
    inputs, raw = fixture_model_inputs(folder, with_state)
    exp = load_file(folder / "expected.safetensors")
    runtime = PolicyRuntime(model, model.config.num_steps, CPU)
    assert max_diff(runtime.timesteps, exp["timesteps"]) == 0.0
    with torch.inference_mode():
        embs, pad = model.vlm.embed_prefix(inputs, backend)
        assert max_diff(embs, exp["prefix_embs"]) < TOL
        assert torch.equal(pad, exp["prefix_pad_masks"])
        ctx = runtime.encode(inputs)
        for i in (0, model.num_cache_layers - 1):
            k, v = ctx.cache.layer(i)                                  # (B, H_kv, L, D) vs (B, L, H_kv, D)
            assert max_diff(k.transpose(1, 2), exp[f"prefix_kv.layer{i}.key"]) < TOL
            assert max_diff(v.transpose(1, 2), exp[f"prefix_kv.layer{i}.value"]) < TOL
        for k in range(model.config.num_steps):
            v = model.velocity(exp["x_t_before_step"][k], runtime.time_cond[k], ctx)
            assert max_diff(v, exp["velocities"][k]) < TOL, f"step {k}"
        assert max_diff(model.velocity(raw["noise"], runtime.time_cond[0], ctx), exp["velocity.step0"]) < TOL
    actions = runtime.sample(inputs, raw["noise"])
    assert max_diff(actions, exp["x_final_padded"]) < TOL
    assert max_diff(actions[..., :model.config.action_dim], exp["action_chunk_normalized"]) < TOL


def check_prefix_once_and_frozen(model, folder: Path, with_state: bool) -> None:
    """Assert one VLM pass per sample and unchanged prefix tensors after the denoising steps."""
    inputs, raw = fixture_model_inputs(folder, with_state)
    prefix_calls = []
    model.vlm.register_forward_hook(lambda *_: prefix_calls.append(1))
    runtime = PolicyRuntime(model, model.config.num_steps, CPU)
    with torch.inference_mode():
        ctx = runtime.encode(inputs)
        before = [t.clone() for layer in ctx.cache.layers for t in layer]
        euler_integrate(runtime.velocity_fn(ctx), raw["noise"], runtime.dt, model.config.num_steps)
    assert len(prefix_calls) == 1 and runtime.stats.prefix_passes == 1
    assert runtime.stats.denoise_steps == model.config.num_steps
    assert_frozen_prefix_unchanged(ctx.cache)
    assert all(torch.equal(a, b) for a, b in zip(before, (t for layer in ctx.cache.layers for t in layer)))
    runtime.sample(inputs, raw["noise"])
    assert len(prefix_calls) == 2 and runtime.stats.prefix_passes == 2
