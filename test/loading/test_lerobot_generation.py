# SPDX-License-Identifier: Apache-2.0
"""
The LeRobot release that wrote a checkpoint, from its files; every processor step implemented or refused.

The markers are those of LeRobot's own code: ``PreTrainedConfig.pretrained_revision`` is new in
0.6 (``configs/policies.py``), ``PI0Config.use_relative_actions`` / ``relative_exclude_joints`` /
``action_feature_names`` and the ``relative_actions_processor`` / ``absolute_actions_processor``
steps in 0.5 (``processor/relative_action_processor.py``, ``policies/pi0*/processor_pi0*.py``);
transformers 5 writes ``"tokenizer_class": "TokenizersBackend"`` and ``rope_parameters``.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from vla_policy_node.loading import generation as gen
from vla_policy_node.loading.checkpoint import CheckpointError
from vla_policy_node.loading.processors import ProcessorError, read_pipelines
from vla_policy_node.model.relative_actions import RelativeActions, relative_mask
from vla_policy_node.loading import load_policy

PI0_04 = {"type": "pi0"}
PI0_06 = {"type": "pi0", "pretrained_revision": None, "use_relative_actions": False,
          "relative_exclude_joints": ["gripper"], "action_feature_names": None}
REL_STEP = {"registry_name": "relative_actions_processor",
            "config": {"enabled": False, "exclude_joints": ["gripper"], "action_names": None}}
ABS_STEP = {"registry_name": "absolute_actions_processor", "config": {"enabled": False}}


def generation(config, pre=(), post=(), **kw):
    return gen.recognise(gen.markers(config, list(pre), list(post), **kw))


def test_lerobot_0_4_pi0_is_read_from_its_config_alone():
    found = generation(PI0_04, [{"registry_name": "normalizer_processor"}])
    assert found.version == (0, 4) and not found.transformers5
    assert "has no use_relative_actions" in found.describe()


def test_lerobot_0_5_and_0_6_are_told_apart_by_pretrained_revision_and_the_step_name():
    config_05 = {k: v for k, v in PI0_06.items() if k != "pretrained_revision"}
    delta = {**REL_STEP, "registry_name": "delta_actions_processor"}        # LeRobot 0.5's name of the step
    assert generation(config_05, [delta], [ABS_STEP]).version == (0, 5)
    with pytest.raises(gen.GenerationError, match="has a relative_actions_processor step .LeRobot >= 0.6. but "
                                                  "config.json: has no pretrained_revision"):
        generation(config_05, [REL_STEP], [ABS_STEP])
    found = generation(PI0_06, [REL_STEP], [ABS_STEP])
    assert found.version == (0, 6) and found.transformers5
    assert "pretrained_revision" in found.describe()


def test_smolvla_without_markers_is_read_as_0_4_and_the_override_picks():
    assert generation({"type": "smolvla"}).version == (0, 4)
    found = gen.recognise(gen.markers({"type": "smolvla"}, [], []), (0, 5, 1), "0.5.1")
    assert found.version == (0, 5) and found.override == "0.5.1"


@pytest.mark.parametrize("kw", [
    {"tokenizer_config": {"tokenizer_class": "TokenizersBackend"}},
    {"vlm_config": {"text_config": {"rope_parameters": {"rope_theta": 1e5}}}},
])
def test_transformers_5_files_mean_lerobot_0_5_or_newer(kw):
    assert generation({"type": "smolvla"}, **kw).version == (0, 5)


def test_files_that_contradict_each_other_are_named():
    with pytest.raises(gen.GenerationError, match="config.json: has pretrained_revision.*but.*"
                                                  "policy_preprocessor.json: has no delta_actions_processor or "
                                                  "relative_actions_processor step"):
        generation(PI0_06, [{"registry_name": "normalizer_processor"}], [ABS_STEP])


def test_an_override_that_contradicts_the_files_is_refused():
    with pytest.raises(gen.GenerationError, match="lerobot_version 0.4.4 contradicts.*pretrained_revision"):
        gen.recognise(gen.markers(PI0_06, [REL_STEP], [ABS_STEP]), (0, 4, 4), "0.4.4")
    with pytest.raises(gen.GenerationError, match="lerobot_version 0.6 contradicts.*LeRobot < 0.5"):
        gen.recognise(gen.markers(PI0_04, [], []), (0, 6), "0.6")


# ------------------------------------------------------------------ processor steps
def pipelines(pre, post, family="pi0", config=None, action_dim=6, state_dim=6):
    return read_pipelines(family, config or {"type": family}, pre, post, action_dim, state_dim)


def test_an_unknown_step_is_refused_by_name():
    with pytest.raises(ProcessorError, match="policy_preprocessor.json step 1 'image_crop_resize_processor' is not "
                                             "implemented"):
        pipelines([{"registry_name": "to_batch_processor"}, {"registry_name": "image_crop_resize_processor"}], [])
    with pytest.raises(ProcessorError, match="policy_postprocessor.json step 0 'torch2numpy_action_processor'"):
        pipelines([], [{"registry_name": "torch2numpy_action_processor"}])


def test_a_step_of_another_family_is_refused():
    with pytest.raises(ProcessorError, match="belongs to pi05 policies, not smolvla"):
        pipelines([{"registry_name": "pi05_prepare_state_tokenizer_processor_step"}], [], family="smolvla")


@pytest.mark.parametrize("step, message", [
    ({"registry_name": "rename_observations_processor",
      "config": {"rename_map": {"observation.state": "observation.joints"}}}, "only camera features"),
    ({"registry_name": "tokenizer_processor", "config": {"task_key": "instruction"}}, "task_key 'instruction'"),
    ({"registry_name": "normalizer_processor",
      "config": {"norm_map": {"VISUAL": "MEAN_STD"}, "features": {"observation.images.top": {}}}},
     "normalizing images"),
])
def test_a_known_step_configured_beyond_what_is_implemented_is_refused(step, message):
    with pytest.raises(ProcessorError, match=message):
        pipelines([step], [])


def test_camera_renames_and_the_newline_step_are_read():
    found = pipelines([{"registry_name": "rename_observations_processor",
                        "config": {"rename_map": {"observation.images.cam_high": "observation.images.top"}}},
                       {"registry_name": "pi0_new_line_processor"}], [])
    assert found.camera_renames == {"observation.images.cam_high": "observation.images.top"} and found.newline


def test_a_state_file_numbered_for_another_step_is_refused():
    pre = [{"registry_name": "to_batch_processor"},
           {"registry_name": "normalizer_processor",
            "state_file": "policy_preprocessor_step_5_normalizer_processor.safetensors"}]
    with pytest.raises(ProcessorError, match="step 1 but its state file .*step_5.* was written for step 5"):
        pipelines(pre, [])


def relative_steps(enabled=True, post_enabled=None, exclude=("gripper",), names=None):
    pre = [{"registry_name": "relative_actions_processor",
            "config": {"enabled": enabled, "exclude_joints": list(exclude), "action_names": names}},
           {"registry_name": "normalizer_processor"}]
    post = [{"registry_name": "unnormalizer_processor"},
            {"registry_name": "absolute_actions_processor",
             "config": {"enabled": enabled if post_enabled is None else post_enabled}}]
    return pre, post


def test_relative_actions_mask_the_excluded_joints_by_name():
    names = ["shoulder_pan.pos", "elbow.pos", "gripper.pos"]
    found = pipelines(*relative_steps(names=names), action_dim=3, state_dim=4)
    assert found.relative == RelativeActions((True, True, False))
    assert pipelines(*relative_steps(enabled=False)).relative is None


@pytest.mark.parametrize("kw, config, message", [
    ({"post_enabled": False}, None, "absolute_actions_processor is off"),
    ({}, {"type": "pi0", "use_relative_actions": False}, "config.json use_relative_actions is False"),
    ({}, {"type": "pi0", "use_relative_actions": True, "relative_exclude_joints": ["wrist"]},
     "relative_exclude_joints .*wrist.* disagrees"),
])
def test_relative_steps_that_disagree_are_refused(kw, config, message):
    with pytest.raises(ProcessorError, match=message):
        pipelines(*relative_steps(**kw), config=config)


def test_relative_actions_need_the_state_to_cover_the_actions():
    with pytest.raises(ProcessorError, match="the state has only 4"):
        pipelines(*relative_steps(), action_dim=6, state_dim=4)


def test_relative_after_the_normalizer_is_refused():
    pre, post = relative_steps()
    with pytest.raises(ProcessorError, match="would cache the normalized state"):
        pipelines(pre[::-1], post)


def test_lerobot_mask_rule():
    """``RelativeActionsProcessorStep._build_mask``: lower-cased, equal or substring; short lists pad True."""
    assert relative_mask(3, ["Gripper"], ["a", "left_gripper", "b"]) == (True, False, True)
    assert relative_mask(4, ["gripper"], ["gripper"]) == (False, True, True, True)
    assert relative_mask(2, [], ["gripper", "x"]) == (True, True)
    assert relative_mask(2, ["gripper"], None) == (True, True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=8), st.integers(1, 3), st.integers(1, 5), st.integers(0, 3),
       st.randoms(use_true_random=False))
def test_relative_and_absolute_are_inverse_and_touch_only_the_masked_dims(mask, batch, horizon, extra, rnd):
    rng = np.random.default_rng(rnd.randint(0, 2**31))
    rel = RelativeActions(tuple(mask))
    actions = rng.normal(size=(batch, horizon, len(mask))).astype(np.float32)
    state = rng.normal(size=(batch, len(mask) + extra)).astype(np.float32)
    absolute = rel.to_absolute(actions, state)
    assert absolute.dtype == np.float32
    np.testing.assert_allclose(rel.to_relative(absolute, state), actions, atol=1e-5)
    unmasked = ~np.asarray(mask)
    assert np.array_equal(absolute[..., unmasked], actions[..., unmasked])
    np.testing.assert_allclose(absolute[..., ~unmasked], actions[..., ~unmasked] + state[:, None, :len(mask)][
        ..., ~unmasked], atol=1e-6)


# ------------------------------------------------------------------ on the 0.4.4 reference folders
@pytest.fixture
def pi0_copy(reference_dir, tmp_path):
    folder = tmp_path / "pi0"
    shutil.copytree(reference_dir("pi0"), folder)
    return folder


def test_a_lerobot_0_4_folder_with_a_newer_step_is_refused_naming_the_files(pi0_copy):
    path = pi0_copy / "policy_preprocessor.json"
    pipeline = json.loads(path.read_text())
    pipeline["steps"].insert(0, REL_STEP)
    path.write_text(json.dumps(pipeline))
    with pytest.raises(CheckpointError, match="policy_preprocessor.json: has a relative_actions_processor step "
                                              r"\(LeRobot >= 0.6\) but config.json: has no use_relative_actions"):
        load_policy(pi0_copy, device="cpu")


def test_a_0_5_override_of_a_0_4_folder_is_refused(pi0_copy):
    (pi0_copy / "vla_policy_node.json").write_text(json.dumps({"lerobot_version": "0.5.1"}))
    with pytest.raises(CheckpointError, match="lerobot_version 0.5.1 contradicts the checkpoint's files"):
        load_policy(pi0_copy, device="cpu")
    with pytest.raises(CheckpointError, match="lerobot_version 0.6 contradicts"):
        load_policy(pi0_copy, device="cpu", lerobot_version="0.6")


def test_smolvla_expert_layers_lerobot_cannot_run_are_refused():
    """Refuse what LeRobot cannot run: expert k/v shaped by the expert's index, attention by the VLM's."""
    import dataclasses

    from vla_policy_node.loading.load import tiny_smolvla_config

    cfg = tiny_smolvla_config(("top",), 6, 6, 4, 2)           # 4 VLM and 4 expert layers: always consistent
    half = dataclasses.replace(cfg.expert, num_layers=2)
    with pytest.raises(ValueError, match="builds expert layer 1 for cross-attention but runs it as the other"):
        dataclasses.replace(cfg, expert=half, self_attn_every_n_layers=2)
    dataclasses.replace(cfg, expert=half, self_attn_every_n_layers=-1)   # every layer cross: consistent
