# SPDX-License-Identifier: Apache-2.0
"""pi0.5 against the LeRobot 0.4.4 reference fixture: adaRMS expert, state in the prompt."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import fixture_model_inputs, max_diff
from pi_reference_checks import check_matches_fixture, check_prefix_once_and_frozen, load_reference_model, pi_config

from vla_policy_node.model.blocks import AdaRMSNorm
from vla_policy_node.model.families.paligemma import prepare_image
from vla_policy_node.model.families.pi05 import Pi05, discretize_state, key_rules, pi05_prompt
from vla_policy_node.model.precision import cast_model
from vla_policy_node.runtime.engine import PolicyRuntime
from vla_policy_node.model.types import ModelInputs

TOL = 1e-4
CPU = torch.device("cpu")


def load_pi05(folder: Path, backend: str = "eager") -> Pi05:
    return load_reference_model(Pi05, key_rules(), folder, backend)


def model_inputs(folder: Path) -> tuple[ModelInputs, dict[str, torch.Tensor]]:
    return fixture_model_inputs(folder, with_state=False)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_matches_lerobot_reference(reference_dir, backend):
    model = load_pi05(reference_dir("pi05"), backend)
    assert isinstance(model.expert.layers[0].input_layernorm, AdaRMSNorm)
    check_matches_fixture(model, reference_dir("pi05"), backend, with_state=False)


def test_prefix_cache_filled_once_and_frozen(reference_dir):
    check_prefix_once_and_frozen(load_pi05(reference_dir("pi05")), reference_dir("pi05"), with_state=False)


def test_prompt_and_images_match_reference(reference_dir):
    folder = reference_dir("pi05")
    inp = load_file(folder / "inputs.safetensors")
    with safe_open(str(folder / "inputs.safetensors"), "pt") as f:
        meta = f.metadata()
    config = pi_config(folder)
    state = inp["batch.observation.state"].numpy()                       # normalized (QUANTILES), (B, 6)
    bins = np.stack([discretize_state(s, config.max_state_dim) for s in state])
    assert np.array_equal(bins, inp["model_input.state_bins"].numpy())
    prompts = [pi05_prompt(t, s, config.max_state_dim) for t, s in zip(json.loads(meta["tasks"]), state)]
    assert prompts == json.loads(meta["prompts"])
    for i, cam in enumerate(json.loads(meta["camera_order"])):
        assert torch.equal(prepare_image(inp[f"batch.{cam}"], config.image_size[0]), inp[f"model_input.image.{i}"])
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(folder / "tiny_paligemma_tokenizer" / "tokenizer.json"))
    ids = tok.encode(prompts[0]).ids
    expected = inp["batch.observation.language.tokens"][0]
    assert ids + [0] * (expected.shape[0] - len(ids)) == expected.tolist()


def test_prompt_cleaning_and_bin_edges():
    bins = discretize_state(np.array([-1.5, -1.0, 0.0, 0.999, 1.0, 2.0]), 8)
    assert bins.tolist() == [-1, 0, 128, 255, 255, 255, 128, 128]
    assert pi05_prompt(" open_the drawer\n", np.zeros(2), 2) == "Task: open the drawer, State: 128 128;\nAction: "
    with pytest.raises(ValueError, match="max_state_dim"):
        discretize_state(np.zeros(9), 8)


def test_bfloat16_keeps_sensitive_parts_float32(reference_dir):
    folder = reference_dir("pi05")
    model = cast_model(load_pi05(folder, "sdpa"), CPU, torch.bfloat16)
    assert model.expert.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    for p in (model.expert.layers[0].input_layernorm.dense.weight, model.expert.norm.dense.weight,
              model.time_mlp_in.weight, model.time_mlp_out.weight, model.action_in_proj.weight,
              model.action_out_proj.weight, model.vlm.layers[0].post_attention_layernorm.weight):
        assert p.dtype == torch.float32
    inputs, raw = model_inputs(folder)
    runtime = PolicyRuntime(model, model.config.num_steps, CPU)
    assert all(c.dtype == torch.float32 for c in runtime.time_cond)
    actions = runtime.sample(inputs.to(CPU, torch.bfloat16), raw["noise"])
    exp = load_file(folder / "expected.safetensors")["action_chunk_normalized"]
    # bfloat16 keeps 8 mantissa bits: allow a few of its ulps at the largest action (|a| ~ 5 here)
    assert max_diff(actions[..., :model.config.action_dim], exp) < 0.03 * exp.abs().max().item()


def test_batch_rows_are_independent(reference_dir):
    """A batch mixing prompt lengths and a missing camera gives each row its single-sample answer."""
    folder = reference_dir("pi05")
    model = load_pi05(folder, "sdpa")
    one, raw = model_inputs(folder)
    tokens, mask = one.tokens.clone(), one.token_mask.clone()
    mask[:, 40:] = False
    tokens[:, 40:] = 0
    other = ModelInputs(images=[torch.flip(im, dims=[-1]) for im in one.images],
                        image_masks=[torch.zeros_like(m) for m in one.image_masks], tokens=tokens, token_mask=mask)
    both = ModelInputs(images=[torch.cat([a, b]) for a, b in zip(one.images, other.images)],
                       image_masks=[torch.cat([a, b]) for a, b in zip(one.image_masks, other.image_masks)],
                       tokens=torch.cat([one.tokens, tokens]), token_mask=torch.cat([one.token_mask, mask]))
    runtime = PolicyRuntime(model, model.config.num_steps, CPU)
    noise = torch.cat([raw["noise"], raw["noise"].flip(1)])
    batched = runtime.sample(both, noise)
    assert max_diff(batched[:1], runtime.sample(one, noise[:1])) < 1e-5
    assert max_diff(batched[1:], runtime.sample(other, noise[1:])) < 1e-5
    exp = load_file(folder / "expected.safetensors")["action_chunk_normalized"]
    assert max_diff(batched[:1, :, :model.config.action_dim], exp) < TOL
