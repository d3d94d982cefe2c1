# SPDX-License-Identifier: Apache-2.0
"""
vla-policy-train's export for LeRobot 0.4 and 0.6, checked without LeRobot installed.

What LeRobot itself does with these folders (load them, give the same actions to 1e-5) is
checked by tools/lerobot/export_compare.py in LeRobot 0.4.4 and 0.6.1 venvs; here: the files
hold exactly what those releases accept, and ``load_policy`` acts on every export as the
model did before it was exported.
"""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file
import torch

from vla_policy_node.model.families import smolvla
from vla_policy_node.model.families.smolvla import SmolVLA, SmolVLAConfig
from vla_policy_node.loading.load import init_weights
from vla_policy_node.model.normalization import Normalizer
from vla_policy_node.runtime.engine import PolicyRuntime
from vla_policy_node.loading import load_policy
from vla_policy_node.train import export, lerobot_files
from vla_policy_node.train.cli import main as train_main

# Every field of LeRobot's SmolVLAConfig, in the order draccus writes them: the keys of config.json written
# by ``SmolVLAConfig()._save_pretrained(folder)`` with lerobot==0.4.4 (transformers 4.57.6) and with
# lerobot==0.6.1 (transformers 5.5.4), installed from PyPI (tools/lerobot/setup_env.sh 0.4.4 .venv-lerobot044,
# tools/lerobot/setup_env.sh). draccus refuses a config.json with any other key.
SMOLVLA_FIELDS_044 = [
    "type", "n_obs_steps", "input_features", "output_features", "device", "use_amp", "use_peft", "push_to_hub",
    "repo_id", "private", "tags", "license", "pretrained_path", "chunk_size", "n_action_steps",
    "normalization_mapping", "max_state_dim", "max_action_dim", "resize_imgs_with_padding", "empty_cameras",
    "adapt_to_pi_aloha", "use_delta_joint_actions_aloha", "tokenizer_max_length", "num_steps", "use_cache",
    "freeze_vision_encoder", "train_expert_only", "train_state_proj", "optimizer_lr", "optimizer_betas",
    "optimizer_eps", "optimizer_weight_decay", "optimizer_grad_clip_norm", "scheduler_warmup_steps",
    "scheduler_decay_steps", "scheduler_decay_lr", "vlm_model_name", "load_vlm_weights", "add_image_special_tokens",
    "attention_mode", "prefix_length", "pad_language_to", "num_expert_layers", "num_vlm_layers",
    "self_attn_every_n_layers", "expert_width_multiplier", "min_period", "max_period", "rtc_config", "compile_model",
    "compile_mode",
]
SMOLVLA_FIELDS_061 = SMOLVLA_FIELDS_044[:13] + ["pretrained_revision"] + SMOLVLA_FIELDS_044[13:]
FIELDS = {"0.4": SMOLVLA_FIELDS_044, "0.6": SMOLVLA_FIELDS_061}

# What ``AutoConfig`` / ``AutoProcessor`` / ``AutoTokenizer.from_pretrained`` read from the backbone folder:
# the files transformers 4.57.6 and 5.5.4 write when saving a SmolVLM config and SmolVLMProcessor (as in
# the reference tiny_smolvlm); transformers 5 folds the image and video processor configs into
# processor_config.json and writes no special_tokens_map.json.
VLM_FILES = {
    "0.4": {"config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
            "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json"},
    "0.6": {"config.json", "tokenizer.json", "tokenizer_config.json", "processor_config.json"},
}
POSITIONS = "model.vlm_with_expert.vlm.model.vision_model.embeddings.position_embedding.weight"
EMBED = "model.vlm_with_expert.vlm.model.text_model.embed_tokens.weight"
JOINTS = ["a", "b", "c"]


def tiny(seed=0):
    """Build a small random SmolVLA (two cameras, padded state/actions) with its config, sizes, tokenizer, stats."""
    tokenizer = export.word_tokenizer(["touch", "the", "red", "blue", "block"])
    vocab = tokenizer.get_vocab_size()
    vlm = {"model_type": "smolvlm", "scale_factor": 2, "vocab_size": vocab,
           "text_config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "rms_norm_eps": 1e-5,
                           "vocab_size": vocab},
           "vision_config": {"model_type": "smolvlm_vision", "hidden_size": 16, "intermediate_size": 32,
                             "num_hidden_layers": 1, "num_attention_heads": 2, "patch_size": 4, "image_size": 24,
                             "layer_norm_eps": 1e-6}}
    config = {
        "type": "smolvla", "n_obs_steps": 1,
        "input_features": {"observation.state": {"type": "STATE", "shape": [3]},
                           "observation.images.top": {"type": "VISUAL", "shape": [3, 24, 32]},
                           "observation.images.side": {"type": "VISUAL", "shape": [3, 20, 16]}},
        "output_features": {"action": {"type": "ACTION", "shape": [3]}},
        "device": "cpu", "chunk_size": 4, "n_action_steps": 4,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
        "max_state_dim": 5, "max_action_dim": 4, "resize_imgs_with_padding": [24, 24], "tokenizer_max_length": 6,
        "num_steps": 3, "vlm_model_name": export.VLM_FOLDER, "pad_language_to": "max_length", "num_vlm_layers": 2,
        "self_attn_every_n_layers": 2, "joint_names": JOINTS,
    }
    model = SmolVLA(SmolVLAConfig.from_lerobot(config, vlm))
    generator = torch.Generator().manual_seed(seed)
    init_weights(model, generator)
    with torch.no_grad():
        for tensor in model.parameters():       # no norm left at one, no position row left small
            tensor.add_(0.1 * torch.randn(tensor.shape, generator=generator))
    model.eval()
    state = {"mean": np.array([0.5, -1.0, 0.2], np.float32), "std": np.array([0.7, 1.3, 0.4], np.float32)}
    action = {"mean": np.array([-0.3, 0.1, 0.9], np.float32), "std": np.array([1.5, 0.6, 0.8], np.float32)}
    return model, config, vlm, tokenizer, state, action


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Export the tiny model for each generation; keep what it gave before the export."""
    model, config, vlm, tokenizer, state, action = tiny(seed=1)
    obs = export.sample_observation(config, seed=2, task="Touch the red block")
    noise = np.random.default_rng(3).standard_normal((1, 4, 4)).astype(np.float32)
    folders = {}
    for version in export.LEROBOT_VERSIONS:
        folders[version] = tmp_path_factory.mktemp(f"export{version}")
        export.save_checkpoint(folders[version], model, config, vlm, tokenizer, state, action, version)
    pre = load_policy(folders["0.4"], device="cpu").preprocessor
    with torch.no_grad():
        direct = PolicyRuntime(model, 3, torch.device("cpu")).sample(pre(obs), torch.from_numpy(noise))
    before = Normalizer("MEAN_STD", action).unnormalize(direct[..., :3].numpy())
    return {"folders": folders, "model": model, "obs": obs, "noise": noise, "before": before}


@pytest.mark.parametrize("version", export.LEROBOT_VERSIONS)
def test_config_holds_exactly_the_fields_of_that_lerobots_smolvlaconfig(exports, version):
    config = json.loads((exports["folders"][version] / "config.json").read_text())
    assert list(config) == FIELDS[version]
    assert config["type"] == "smolvla" and config["vlm_model_name"] == "vlm" and config["max_state_dim"] == 5
    assert config["push_to_hub"] is False
    if version == "0.6":
        assert config["pretrained_revision"] is None       # how load_policy tells a LeRobot >= 0.6 checkpoint


@pytest.mark.parametrize("version", export.LEROBOT_VERSIONS)
def test_project_fields_are_in_the_side_file(exports, version):
    settings = json.loads((exports["folders"][version] / "vla_policy_node.json").read_text())
    assert settings == {"joint_names": JOINTS, "lerobot_version": version}


@pytest.mark.parametrize("version", export.LEROBOT_VERSIONS)
def test_backbone_folder_holds_what_transformers_reads(exports, version):
    vlm = exports["folders"][version] / "vlm"
    assert {p.name for p in vlm.iterdir()} == VLM_FILES[version]
    config = json.loads((vlm / "config.json").read_text())
    tokenizer = json.loads((vlm / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert config["model_type"] == "smolvlm" and config["text_config"]["model_type"] == "llama"
    assert config["vision_config"]["model_type"] == "smolvlm_vision"
    assert config["vocab_size"] == config["text_config"]["vocab_size"] == max(added.values()) + 1
    assert config["image_token_id"] == added["<image>"] and config["text_config"]["pad_token_id"] == added["<pad>"]
    assert {"<fake_token_around_image>", "<global-img>", "<image>", "<end_of_utterance>"} <= set(added)
    tok_config = json.loads((vlm / "tokenizer_config.json").read_text())
    assert tok_config["pad_token"] == "<pad>" and tok_config["fake_image_token"] == "<fake_token_around_image>"
    processor = json.loads((vlm / "processor_config.json").read_text())
    assert processor["processor_class"] == "SmolVLMProcessor" and processor["image_seq_len"] == (24 // 4 // 2) ** 2
    if version == "0.4":      # transformers 4.57
        assert config["transformers_version"].startswith("4.") and "rope_theta" in config["text_config"]
        assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
        assert set(tok_config["extra_special_tokens"]) == set(export.IMAGE_TOKENS)
        image = json.loads((vlm / "preprocessor_config.json").read_text())
        video = json.loads((vlm / "video_preprocessor_config.json").read_text())
    else:                     # transformers 5
        assert config["transformers_version"].startswith("5.") and "rope_parameters" in config["text_config"]
        assert tok_config["tokenizer_class"] == "TokenizersBackend"
        image, video = processor["image_processor"], processor["video_processor"]
    assert image["image_processor_type"] == "SmolVLMImageProcessor" and image["size"] == {"longest_edge": 24}
    assert video["video_processor_type"] == "SmolVLMVideoProcessor"


@pytest.mark.parametrize("version", export.LEROBOT_VERSIONS)
def test_weights_hold_every_tensor_lerobot_builds(exports, version):
    weights = load_file(str(exports["folders"][version] / "model.safetensors"))
    vocab = json.loads((exports["folders"][version] / "vlm" / "config.json").read_text())["vocab_size"]
    assert weights[EMBED].shape == (vocab, 32) and not weights[EMBED][7:].any()     # image tokens: zero rows
    assert not weights["model.vlm_with_expert.vlm.lm_head.weight"].any()
    assert (weights["model.vlm_with_expert.vlm.model.text_model.norm.weight"] == 1).all()
    assert all(w.dtype == np.float32 for w in weights.values())


@pytest.mark.parametrize("version", export.LEROBOT_VERSIONS)
def test_load_policy_acts_on_each_export_as_the_model_did(exports, version):
    policy = load_policy(exports["folders"][version], device="cpu")
    np.testing.assert_allclose(policy.predict_action_chunk(exports["obs"], noise=exports["noise"]),
                               exports["before"], atol=1e-5, rtol=0)


def test_the_06_export_lays_the_position_embedding_out_for_transformers_5_ids(exports):
    trained = exports["model"].vision.embeddings.position_embedding.weight.detach()
    old = load_file(str(exports["folders"]["0.4"] / "model.safetensors"))[POSITIONS]
    new = load_file(str(exports["folders"]["0.6"] / "model.safetensors"))[POSITIONS]
    np.testing.assert_array_equal(old, trained.numpy())
    np.testing.assert_array_equal(new, smolvla.position_table_for("transformers5", trained, 6).numpy())
    assert not np.array_equal(new, old)
    # Position k of the grid gets the same vector under 5.x ids from the new table as under 4.57 ids from the old.
    ids4, ids5 = smolvla.smolvlm_position_ids(6, "transformers4"), smolvla.smolvlm_position_ids(6, "transformers5")
    np.testing.assert_array_equal(new[ids5.numpy()], old[ids4.numpy()])


def test_reexports_between_generations_keep_the_weights_and_clear_stale_files(exports, tmp_path):
    """0.4 -> 0.6 in place (files 0.6 does not have go), and back to 0.4: the same network."""
    folder = tmp_path / "policy"
    export.export_checkpoint(exports["folders"]["0.4"], folder, "0.4")
    export.export_checkpoint(folder, folder, "0.6")
    assert {p.name for p in (folder / "vlm").iterdir()} == VLM_FILES["0.6"]
    assert list(json.loads((folder / "config.json").read_text())) == SMOLVLA_FIELDS_061
    six = load_file(str(folder / "model.safetensors"))
    reference = load_file(str(exports["folders"]["0.6"] / "model.safetensors"))
    assert six.keys() == reference.keys() and all(np.array_equal(six[k], reference[k]) for k in six)
    saved = export.export_checkpoint(folder, folder, "0.4")
    assert saved.generation.version == (0, 6) and saved.settings == {"joint_names": JOINTS}
    assert {p.name for p in (folder / "vlm").iterdir()} == VLM_FILES["0.4"]
    four = load_file(str(folder / "model.safetensors"))
    original = load_file(str(exports["folders"]["0.4"] / "model.safetensors"))
    assert four.keys() == original.keys() and all(np.array_equal(four[k], original[k]) for k in four if k != POSITIONS)
    # The rows 4.57 ids use are the same; the ones they never use (last row / column of the grid) are not kept by
    # the 0.6 layout, which uses every row.
    used = smolvla.smolvlm_position_ids(6, "transformers4").numpy()
    np.testing.assert_array_equal(four[POSITIONS][used], original[POSITIONS][used])
    assert np.allclose(load_policy(folder, device="cpu").predict_action_chunk(exports["obs"], noise=exports["noise"]),
                       exports["before"], atol=1e-5, rtol=0)
    assert json.loads((folder / "vla_policy_node.json").read_text())["lerobot_version"] == "0.4"
    for name in ("tokenizer.json", "config.json", "tokenizer_config.json"):
        assert (folder / "vlm" / name).read_text() == (exports["folders"]["0.4"] / "vlm" / name).read_text(), name


def test_a_transformers_5_trained_embedding_without_a_457_layout_is_refused():
    embedding = torch.randn(36, 8)          # every row distinct: 4.57 ids cannot pick them all
    with pytest.raises(ValueError, match="no exact transformers4 layout"):
        export.reindex_positions(embedding, 6, "transformers5", "transformers4")
    there = export.reindex_positions(embedding, 6, "transformers4", "transformers5")
    back = export.reindex_positions(there, 6, "transformers5", "transformers4")
    ids = smolvla.smolvlm_position_ids(6, "transformers4")
    torch.testing.assert_close(back[ids], embedding[ids], rtol=0, atol=0)


def test_training_continues_from_an_export_of_either_generation(exports):
    model, *_ = tiny(seed=5)
    saved = export.read_checkpoint(exports["folders"]["0.6"])
    export.copy_trained_weights(saved, model)
    used = smolvla.smolvlm_position_ids(6, "transformers4")
    for name, tensor in exports["model"].state_dict().items():
        mine = model.state_dict()[name]
        if name == "vision.embeddings.position_embedding.weight":    # the rows 4.57 ids read
            mine, tensor = mine[used], tensor[used]
        torch.testing.assert_close(mine, tensor, rtol=0, atol=0, msg=name)


def test_unknown_target_is_refused(tmp_path):
    model, config, vlm, tokenizer, state, action = tiny()
    with pytest.raises(ValueError, match="LeRobot target must be one of"):
        export.save_checkpoint(tmp_path, model, config, vlm, tokenizer, state, action, "0.5")


def test_export_from_command_converts_without_training(exports, tmp_path, capsys):
    assert train_main(["--export-from", str(exports["folders"]["0.4"]), "--output", str(tmp_path / "six"),
                       "--lerobot-version", "0.6"]) == 0
    assert "max |action difference| through load_policy: 0.00e+00" in capsys.readouterr().out
    assert json.loads((tmp_path / "six" / "config.json").read_text())["pretrained_revision"] is None
    with pytest.raises(SystemExit):
        train_main(["--export-from", str(tmp_path / "six"), "--output", str(tmp_path / "x"), "--lerobot-version", "1"])


def test_the_recorded_field_lists_are_the_ones_the_export_writes():
    assert {v: list(f) for v, f in lerobot_files.LEROBOT_FIELDS.items()} == FIELDS
    with pytest.raises(ValueError):
        lerobot_files.check_version("0.5")
