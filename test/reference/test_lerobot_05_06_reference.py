# SPDX-License-Identifier: Apache-2.0
"""
Checkpoints saved by LeRobot 0.6.1 and 0.5.1 themselves give their actions, recognised from their files alone.

The folders under ``test/fixtures/lerobot061/`` and ``lerobot051/`` are tiny seeded SmolVLA, pi0 and pi0.5
policies (relative actions on and off) that LeRobot 0.6.1 (transformers 5.5.4) and 0.5.1 (transformers
5.3.0) saved with ``save_pretrained`` and their own pre- and post-processors; ``expected.safetensors``
holds what that LeRobot computed from ``inputs.safetensors`` with the stored noise: batch 2, two tasks,
three cameras of different sizes. They were written by ``tools/lerobot/make_fixtures.py`` and reload
bit-exactly in LeRobot (``tools/lerobot/check_fixtures.py``); their README says how. No folder holds
an override file.

One test per cause of the differences LeRobot 0.6.1 brought (each also shows that reading the
folder as LeRobot 0.4.x would give other actions): SmolVLM's vision position ids, pi0.5's state
bins, relative actions, and pi0/pi0.5 image padding.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vla_policy_node.loading.checkpoint import CheckpointError
from vla_policy_node.model.families.smolvla import smolvlm_position_ids
from vla_policy_node.loading import load_policy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot061"
SETS = {"0.6": FIXTURES, "0.5": FIXTURES.parent / "lerobot051"}
FOLDERS = ("smolvla", "pi0", "pi05", "pi0_relative", "pi05_relative")
TOL = 1e-5


def read(name: str, release: str = "0.6"):
    folder = SETS[release] / name
    with safe_open(str(folder / "inputs.safetensors"), "pt") as f:
        meta = f.metadata()
    return folder, load_file(folder / "inputs.safetensors"), load_file(folder / "expected.safetensors"), meta


def observation(inp, meta):
    images = {k[len("raw."):]: inp[k].numpy() for k in inp if k.startswith("raw.observation.images.")}
    return {"images": images, "state": inp["raw.observation.state"].numpy(), "task": json.loads(meta["tasks"])}


@pytest.mark.parametrize("release", sorted(SETS))
@pytest.mark.parametrize("name", FOLDERS)
def test_actions_and_tokens_match_lerobot_without_an_override(name, release):
    folder, inp, exp, meta = read(name, release)
    assert not (folder / "vla_policy_node.json").exists()
    policy = load_policy(folder, device="cpu")
    assert policy.provenance.startswith(f"LeRobot {release}.x")
    assert ("pretrained_revision" in policy.provenance) == (release == "0.6")
    obs = observation(inp, meta)
    pre = policy.preprocessor(obs)
    assert torch.equal(pre.tokens, inp["batch.observation.language.tokens"])
    assert torch.equal(pre.token_mask, inp["batch.observation.language.attention_mask"].bool())
    chunk = policy.predict_action_chunk(obs, noise=inp["noise"].numpy())
    assert chunk.shape == exp["action_chunk"].shape
    np.testing.assert_allclose(chunk, exp["action_chunk"].numpy(), atol=TOL, rtol=0)


def test_smolvla_uses_transformers_5_vision_position_ids():
    folder, inp, exp, meta = read("smolvla")
    policy = load_policy(folder, device="cpu")
    ids = policy.model.vision_position_ids
    assert torch.equal(ids, exp["vision_position_ids"][0]) and torch.equal(ids, torch.arange(ids.numel()))
    assert not torch.equal(smolvlm_position_ids(8, "transformers4"), ids)    # [0, 0, 1, ...]: LeRobot 0.4.x
    as_0_4 = load_policy(folder, device="cpu")
    as_0_4.model.vision_position_ids.copy_(smolvlm_position_ids(8, "transformers4"))
    obs = observation(inp, meta)
    wrong = as_0_4.predict_action_chunk(obs, noise=inp["noise"].numpy())
    assert np.abs(wrong - exp["action_chunk"].numpy()).max() > 100 * TOL


@pytest.mark.parametrize("name", ["pi05", "pi05_relative"])
def test_pi05_bins_only_the_robots_own_state(name):
    folder, inp, exp, meta = read(name)
    policy = load_policy(folder, device="cpu")
    obs = observation(inp, meta)
    normalized = policy.preprocessor.state_normalizer.normalize(obs["state"])   # relative actions keep the state
    prompts = [policy.preprocessor.prompt(task, normalized[i]) for i, task in enumerate(obs["task"])]
    assert prompts == json.loads(meta["prompts"])
    bins = [p.split("State: ")[1].split(";")[0].split() for p in prompts]
    assert [[int(b) for b in row] for row in bins] == inp["model_input.state_bins"].tolist()
    assert all(len(row) == 6 for row in bins)                      # not max_state_dim (32) as in 0.4.x


@pytest.mark.parametrize("name", ["pi0_relative", "pi05_relative"])
def test_relative_actions_add_the_raw_state_back_on_the_joints_not_excluded(name):
    folder, inp, exp, meta = read(name)
    policy = load_policy(folder, device="cpu")
    config = json.loads((folder / "config.json").read_text())
    assert config["use_relative_actions"] and config["relative_exclude_joints"] == ["gripper"]
    assert policy.relative_actions.mask == tuple(bool(m) for m in exp["relative_action_mask"].tolist())
    assert policy.relative_actions.mask[-1] is False                # "gripper.pos" stays absolute
    obs = observation(inp, meta)
    chunk = policy.predict_action_chunk(obs, noise=inp["noise"].numpy())
    np.testing.assert_allclose(chunk, exp["action_chunk"].numpy(), atol=TOL, rtol=0)
    policy.relative_actions = None                                  # what ignoring the steps gave
    before = policy.predict_action_chunk(obs, noise=inp["noise"].numpy())
    np.testing.assert_allclose(before, exp["action_chunk_before_absolute"].numpy(), atol=TOL, rtol=0)
    assert np.abs(before - exp["action_chunk"].numpy()).max() > 0.1


@pytest.mark.parametrize("name", ["pi0", "pi05"])
def test_pi_images_are_padded_with_zero_in_unit_range(name):
    folder, inp, exp, meta = read(name)
    policy = load_policy(folder, device="cpu")
    pre = policy.preprocessor(observation(inp, meta))
    padded = 0
    for i, image in enumerate(pre.images):
        expected = inp[f"model_input.image.{i}"]
        assert (image - expected).abs().max().item() <= 1e-6
        padded += int((expected == -1.0).sum())
    assert padded > 0 and not any(bool((im == -3.0).any()) for im in pre.images)


def test_an_unknown_processor_step_in_a_0_6_1_folder_is_refused_by_name(tmp_path):
    folder = tmp_path / "pi0"
    shutil.copytree(FIXTURES / "pi0", folder)
    path = folder / "policy_postprocessor.json"
    pipeline = json.loads(path.read_text())
    pipeline["steps"].append({"registry_name": "torch2numpy_action_processor", "config": {}})
    path.write_text(json.dumps(pipeline))
    with pytest.raises(CheckpointError, match="policy_postprocessor.json step 3 'torch2numpy_action_processor' "
                                              "is not implemented"):
        load_policy(folder, device="cpu")


def test_an_override_older_than_the_files_is_refused(tmp_path):
    folder = tmp_path / "smolvla"
    shutil.copytree(FIXTURES / "smolvla", folder)
    (folder / "vla_policy_node.json").write_text(json.dumps({"lerobot_version": "0.4.4"}))
    with pytest.raises(CheckpointError, match="lerobot_version 0.4.4 contradicts .*config.json: has "
                                              "pretrained_revision"):
        load_policy(folder, device="cpu")


def test_rtc_in_lerobots_mode_reproduces_lerobots_guided_chunks():
    """
    Guide as LeRobot 0.6.1's SmolVLA does, with its ``execution_horizon``.

    ``rtc.safetensors``: ``RTCConfig(enabled=True)`` (LINEAR, beta 10), ``inference_delay=2`` and 7
    committed actions, for ``execution_horizon`` 4 and 10 (``tools/lerobot/make_rtc_fixture.py``):
    LeRobot guides only the first ``execution_horizon`` of them.
    """
    from vla_policy_node.control.chunking import RTCGuidance

    folder, inp, exp, meta = read("smolvla")
    rtc = load_file(folder / "rtc.safetensors")
    policy = load_policy(folder, device="cpu")
    obs = observation(inp, meta)
    singles = [{"images": {k: v[b] for k, v in obs["images"].items()}, "state": obs["state"][b],
                "task": obs["task"][b]} for b in range(2)]
    committed = policy.action_normalizer.unnormalize(rtc["prev_chunk_left_over"].numpy())   # robot units
    chunks = {}
    for horizon in (4, 10):
        guidance = [RTCGuidance(committed[b], 2, 10.0, "lerobot", horizon) for b in range(2)]
        chunks[horizon] = policy.predict_action_chunks(singles, guidance, noise=inp["noise"].numpy())
        np.testing.assert_allclose(chunks[horizon], rtc[f"action_chunk.h{horizon}"].numpy(), atol=TOL, rtol=0)
    assert np.abs(chunks[4] - chunks[10]).max() > 10 * TOL          # the horizon matters
    one = policy.predict_action_chunk(singles[1], noise=inp["noise"].numpy()[1:],
                                      rtc=RTCGuidance(committed[1], 2, 10.0, "lerobot", 4))
    np.testing.assert_allclose(one[0], rtc["action_chunk.h4"].numpy()[1], atol=TOL, rtol=0)
