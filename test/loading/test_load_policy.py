# SPDX-License-Identifier: Apache-2.0
"""``load_policy`` end to end, raw robot inputs to un-normalized actions, for every family."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file as load_np
from safetensors.numpy import save_file
from safetensors.torch import load_file

from vla_policy_node.loading.checkpoint import CheckpointError
from vla_policy_node.loading import load_policy


def raw_observation(inp, task="pick up the red cube"):
    images = {k[len("raw."):]: inp[k][0].numpy() for k in inp if k.startswith("raw.observation.images.")}
    return {"images": images, "state": inp["raw.observation.state"][0].numpy(), "task": task}


@pytest.mark.parametrize("family, tol", [("smolvla", 5e-5), ("pi0", 5e-5), ("pi05", 5e-5)])
def test_raw_observation_to_actions_matches_lerobot(reference_dir, family, tol):
    folder = reference_dir(family)
    inp, exp = load_file(folder / "inputs.safetensors"), load_file(folder / "expected.safetensors")
    policy = load_policy(folder, device="cpu", dtype="float32")
    assert policy.family == family
    obs = raw_observation(inp)
    pre = policy.preprocessor(obs)
    assert (pre.tokens == inp["batch.observation.language.tokens"]).all()
    for i in range(len(pre.images)):
        np.testing.assert_allclose(pre.images[i].numpy(), inp[f"model_input.image.{i}"].numpy(), atol=1e-6)
    chunk = policy.predict_action_chunk(obs, noise=inp["noise"].numpy())
    np.testing.assert_allclose(chunk, exp["action_chunk"].numpy(), atol=tol, rtol=0)
    normalized = policy.action_normalizer.normalize(chunk)
    np.testing.assert_allclose(normalized, exp["action_chunk_normalized"].numpy(), atol=1e-5, rtol=0)
    assert policy.stats.prefix_passes == 1 and policy.stats.denoise_steps == policy.num_steps


@pytest.mark.parametrize("family", ["pi0", "pi05"])
def test_openpi_layout_loads_the_same_policy(reference_dir, family, tmp_path):
    """Load openpi's layout: un-rooted keys, embedding instead of LM head, assets/<id>/norm_stats.json."""
    folder = reference_dir(family)
    lerobot_cfg = json.loads((folder / "config.json").read_text())
    weights = load_np(folder / "model.safetensors")
    renamed = {}
    for key, value in weights.items():
        key = key[len("model."):]
        key = key.replace("paligemma.lm_head.", "paligemma.model.language_model.embed_tokens.")
        renamed[key] = value
    save_file(renamed, tmp_path / "model.safetensors")
    shutil.copy(folder / "tiny_dims.json", tmp_path / "tiny_dims.json")
    shutil.copytree(folder / "tiny_paligemma_tokenizer", tmp_path / "google" / "paligemma-3b-pt-224")
    stats = load_np(next(folder.glob("policy_preprocessor_step_*_normalizer_processor.safetensors")))
    norm = {"state": {}, "actions": {}}
    for key, value in stats.items():
        feature, stat = key.rsplit(".", 1)
        norm["state" if feature == "observation.state" else "actions"][stat] = value.tolist()
    (tmp_path / "assets" / "robot").mkdir(parents=True)
    (tmp_path / "assets" / "robot" / "norm_stats.json").write_text(json.dumps({"norm_stats": norm}))
    (tmp_path / "config.json").write_text(json.dumps({
        "action_dim": lerobot_cfg["max_action_dim"], "action_horizon": lerobot_cfg["chunk_size"],
        "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m", "pi05": family == "pi05",
        "num_steps": lerobot_cfg["num_inference_steps"], "max_token_len": lerobot_cfg["tokenizer_max_length"]}))
    ours = load_policy(tmp_path, device="cpu")
    ref = load_policy(folder, device="cpu")
    assert ours.family == family and ours.chunk_size == ref.chunk_size and ours.action_dim == ref.action_dim
    ref_state = ref.model.state_dict()
    for name, tensor in ours.model.state_dict().items():
        assert (tensor == ref_state[name]).all(), name
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    np.testing.assert_allclose(ours.action_normalizer.unnormalize(x), ref.action_normalizer.unnormalize(x),
                               rtol=1e-5, atol=1e-5)
    obs = {"images": {"base_0_rgb": np.full((224, 224, 3), 100, np.uint8)}, "state": np.zeros(6), "task": "go"}
    assert ours.predict_action_chunk(obs).shape == (1, ref.chunk_size, 6)
    wide = ours.preprocessor({"images": {"base_0_rgb": np.full((20, 40, 3), 255, np.uint8)},
                              "state": np.zeros(6), "task": "go"}).images[0][0]
    size = ours.preprocessor.image_size[0]
    assert wide[:, 0].min() == -1.0 and wide[:, size // 2].max() == 1.0     # openpi pads black, centred


def test_unknown_family_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"type": "act"}))
    with pytest.raises(CheckpointError, match="unknown policy type 'act'"):
        load_policy(tmp_path, device="cpu")


def test_rtc_prefix_in_robot_units_is_normalized_for_guidance(reference_dir):
    from vla_policy_node.control.chunking import RTCGuidance
    folder = reference_dir("smolvla")
    inp = load_file(folder / "inputs.safetensors")
    policy = load_policy(folder, device="cpu")
    obs = raw_observation(inp)
    free = policy.predict_action_chunk(obs, noise=inp["noise"].numpy())[0]
    target = free[:4] + 0.5 * policy.action_normalizer.stats["std"]      # robot units, half a std away
    guided = policy.predict_action_chunk(obs, noise=inp["noise"].numpy(),
                                         rtc=RTCGuidance(prefix=target, delay_steps=2, max_guidance_weight=10.0))[0]
    before = np.abs(free[:2] - target[:2]).mean()
    after = np.abs(guided[:2] - target[:2]).mean()
    assert after < 0.25 * before
    with pytest.raises(ValueError, match="RTC prefix"):
        policy.predict_action_chunk(obs, rtc=RTCGuidance(prefix=np.zeros((3, 2)), delay_steps=1,
                                                         max_guidance_weight=1.0))


@pytest.mark.parametrize("family", ["smolvla", "pi0", "pi05"])
def test_frames_are_converted_and_resized_on_the_policy_device(reference_dir, family):
    """A GPU policy uploads uint8 frames and resizes them there (``meta`` stands in for the GPU here)."""
    import torch
    from torch.overrides import TorchFunctionMode

    policy = load_policy(reference_dir(family), device="cpu", dtype="float32")
    assert policy.preprocessor.device == torch.device("cpu")
    policy.preprocessor.device = torch.device("meta")
    camera = policy.camera_names[0]
    moved = []

    class Uploads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.Tensor.to and out.device.type == "meta" and args[0].device.type == "cpu":
                moved.append((args[0].dtype, out.dtype))
            return out
    with Uploads():
        pre = policy.preprocessor({"images": {camera: np.zeros((30, 50, 3), np.uint8)},
                                   "state": np.zeros(policy.state_dim), "task": "go"})
    assert moved == [(torch.uint8, torch.uint8)]    # the frame goes up as it came, converted there
    assert len(pre.images) == len(policy.camera_names) >= 1
    assert all(t.device.type == "meta" for t in [*pre.images, *pre.image_masks])
    assert all(tuple(im.shape[-2:]) == policy.preprocessor.image_size for im in pre.images)


FIXTURES = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures" / "lerobot061"


@pytest.mark.parametrize("field, value", [("use_relative_actions", "false"), ("use_relative_actions", 0),
                                          ("train_expert_only", "true"), ("use_cache", None)])
def test_a_boolean_config_field_given_otherwise_is_refused_by_name(tmp_path, field, value):
    """``"use_relative_actions": "false"`` once loaded as on (a non-empty string is true); LeRobot refuses it."""
    folder = tmp_path / "pi0_relative"
    shutil.copytree(FIXTURES / "pi0_relative", folder)
    config = json.loads((folder / "config.json").read_text())
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=f"{field} must be true or false"):
        load_policy(folder, device="cpu")


@pytest.mark.parametrize("pipeline", ["policy_preprocessor.json", "policy_postprocessor.json"])
def test_a_processor_step_enabled_as_a_string_is_refused(tmp_path, pipeline):
    folder = tmp_path / "pi0_relative"
    shutil.copytree(FIXTURES / "pi0_relative", folder)
    text = (folder / pipeline).read_text()
    assert '"enabled": true' in text
    (folder / pipeline).write_text(text.replace('"enabled": true', '"enabled": "false"'))
    with pytest.raises(CheckpointError, match="enabled must be true or false"):
        load_policy(folder, device="cpu")
