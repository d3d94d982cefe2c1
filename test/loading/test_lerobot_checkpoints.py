# SPDX-License-Identifier: Apache-2.0
"""
LeRobot checkpoint settings that change the inputs: prompt padding side, the LeRobot version, bad tasks.

Expected values are derived from LeRobot's own outputs in the shared pi0 fixture (LeRobot
0.4.4) and from what LeRobot's code does differently:

- ``TokenizerProcessorStep(padding_side=...)`` (``lerobot/processor/tokenizer_processor.py``)
  hands ``padding_side`` to the Hugging Face tokenizer: with ``left`` the same ids end at the
  last column and the pads come first. pi0 positions are ``cumsum(mask) - 1`` and pads are
  masked out, so LeRobot's actions do not change.
- ``resize_with_pad_torch`` (``lerobot/policies/pi0/modeling_pi0.py``): LeRobot 0.4.4 pads
  float images with -1.0 *before* ``x * 2 - 1`` (padded pixels reach the model at -3); from
  0.5 it clamps to [0, 1] and pads 0.0 (-1 at the model). The resized pixels are the same.
  Which LeRobot wrote a folder is read from its files (``test_lerobot_generation.py``).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.torch import load_file

from vla_policy_node.loading.checkpoint import CheckpointError
from vla_policy_node.loading import build_tiny_policy, load_policy


def raw_observation(inp, task="pick up the red cube"):
    images = {k[len("raw."):]: inp[k][0].numpy() for k in inp if k.startswith("raw.observation.images.")}
    return {"images": images, "state": inp["raw.observation.state"][0].numpy(), "task": task}


@pytest.fixture
def pi0_copy(reference_dir, tmp_path):
    """Copy the shared pi0 fixture to a writable folder (the shared folder itself is read-only input)."""
    folder = tmp_path / "pi0"
    shutil.copytree(reference_dir("pi0"), folder)
    return folder


def set_tokenizer_step(folder, **changes):
    path = folder / "policy_preprocessor.json"
    pipeline = json.loads(path.read_text())
    for step in pipeline["steps"]:
        if step["registry_name"] == "tokenizer_processor":
            step["config"].update(changes)
    path.write_text(json.dumps(pipeline))


def test_left_padding_side_is_honoured(pi0_copy):
    inp, exp = load_file(pi0_copy / "inputs.safetensors"), load_file(pi0_copy / "expected.safetensors")
    right_ids = inp["batch.observation.language.tokens"][0]
    right_mask = inp["batch.observation.language.attention_mask"][0]
    n = int(right_mask.sum())
    left_ids = [0] * (len(right_ids) - n) + right_ids[:n].tolist()
    left_mask = [False] * (len(right_ids) - n) + [True] * n
    set_tokenizer_step(pi0_copy, padding_side="left")
    policy = load_policy(pi0_copy, device="cpu")
    obs = raw_observation(inp)
    pre = policy.preprocessor(obs)
    assert pre.tokens[0].tolist() == left_ids and pre.token_mask[0].tolist() == left_mask
    chunk = policy.predict_action_chunk(obs, noise=inp["noise"].numpy())
    np.testing.assert_allclose(policy.action_normalizer.normalize(chunk), exp["action_chunk_normalized"].numpy(),
                               atol=1e-5, rtol=0)


def test_unknown_padding_side_is_refused(pi0_copy):
    set_tokenizer_step(pi0_copy, padding_side="middle")
    with pytest.raises(CheckpointError, match="padding_side must be one of"):
        load_policy(pi0_copy, device="cpu")


@pytest.mark.parametrize("task", [5, 2.5, None, b"pick", ["pick", 3]])
def test_a_task_that_is_not_a_string_names_the_field(task):
    policy = build_tiny_policy(("front",), chunk_size=4, num_steps=2)
    obs = {"images": {"front": np.zeros((32, 32, 3), np.uint8)}, "state": np.zeros(6), "task": task}
    with pytest.raises(ValueError, match=r"observation\['task'\] must be a str"):
        policy.predict_action_chunk(obs)


def lerobot_0_5_images(inp):
    """Return the images LeRobot >= 0.5 feeds: LeRobot 0.4.4's, padded pixels at -1 instead of -3."""
    images = [inp[k] for k in sorted(k for k in inp if k.startswith("model_input.image.")
                                     and not k.startswith("model_input.image_mask"))]
    return [im.where(im != -3.0, -1.0) for im in images]


def as_lerobot_0_5(folder):
    """Rewrite a LeRobot 0.4.4 pi0 folder as LeRobot 0.5.1 saves it: the relative-action keys and steps (off)."""
    config = json.loads((folder / "config.json").read_text())
    config.update(use_relative_actions=False, relative_exclude_joints=["gripper"], action_feature_names=None)
    (folder / "config.json").write_text(json.dumps(config))
    pre = json.loads((folder / "policy_preprocessor.json").read_text())
    at = next(i for i, s in enumerate(pre["steps"]) if s["registry_name"] == "normalizer_processor")
    pre["steps"].insert(at, {"registry_name": "delta_actions_processor",
                             "config": {"enabled": False, "exclude_joints": ["gripper"], "action_names": None}})
    old = pre["steps"][at + 1]["state_file"]
    new = old.replace(f"_step_{at}_", f"_step_{at + 1}_")
    (folder / old).rename(folder / new)
    pre["steps"][at + 1]["state_file"] = new
    (folder / "policy_preprocessor.json").write_text(json.dumps(pre))
    post = json.loads((folder / "policy_postprocessor.json").read_text())
    post["steps"].insert(1, {"registry_name": "absolute_actions_processor", "config": {"enabled": False}})
    (folder / "policy_postprocessor.json").write_text(json.dumps(post))


def test_lerobot_0_5_pads_images_with_minus_one(pi0_copy):
    inp = load_file(pi0_copy / "inputs.safetensors")
    assert (inp["model_input.image.0"] == -3.0).any()     # the 48x64 camera is padded at 56x56
    as_lerobot_0_5(pi0_copy)
    policy = load_policy(pi0_copy, device="cpu")
    assert policy.provenance.startswith("LeRobot 0.5.x") and "use_relative_actions" in policy.provenance
    pre = policy.preprocessor(raw_observation(inp))
    for ours, expected in zip(pre.images, lerobot_0_5_images(inp)):
        assert (ours - expected).abs().max().item() <= 1e-6
    assert not (pre.images[0] == -3.0).any()


@pytest.mark.parametrize("version", [None, "0.4.4", "0.4"])
def test_lerobot_0_4_pads_images_with_minus_three(pi0_copy, version):
    inp = load_file(pi0_copy / "inputs.safetensors")
    if version is not None:
        (pi0_copy / "vla_policy_node.json").write_text(json.dumps({"lerobot_version": version}))
    policy = load_policy(pi0_copy, device="cpu")
    assert policy.provenance.startswith("LeRobot 0.4.x")
    pre = policy.preprocessor(raw_observation(inp))
    for i, ours in enumerate(pre.images):
        assert (ours - inp[f"model_input.image.{i}"]).abs().max().item() <= 1e-6


@pytest.mark.parametrize("settings, message", [
    ({"lerobot_version": "latest"}, "lerobot_version must be a version"),
    ({"lerobot_version": 5}, "lerobot_version must be str"),
])
def test_bad_lerobot_version_is_refused(pi0_copy, settings, message):
    (pi0_copy / "vla_policy_node.json").write_text(json.dumps(settings))
    with pytest.raises(CheckpointError, match=message):
        load_policy(pi0_copy, device="cpu")
