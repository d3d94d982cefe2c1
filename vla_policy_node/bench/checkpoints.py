"""
Random-weight checkpoints at real dimensions, saved exactly as LeRobot saves them.

The bench builds a model, draws its weights, and writes a LeRobot checkpoint
folder (``config.json`` + ``model.safetensors`` in LeRobot key names + pre/post
processor files with identity statistics + a local SmolVLM config folder), so
both this package (``load_policy``) and LeRobot (``from_pretrained``, offline,
``load_vlm_weights=false``) load the very same bytes.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file

from vla_policy_node.core.families import smolvla
from vla_policy_node.core.loading import init_weights
from vla_policy_node.core.weights import prefix_key_map

VLM_DIR = "vlm"
STATE_DIM = ACTION_DIM = 6

# LeRobot 0.4.4 ``SmolVLAConfig`` defaults (the fields inference reads), with the
# language padded to a fixed length so every control step has the same shapes.
LEROBOT_SMOLVLA_DEFAULTS = {
    "type": "smolvla", "n_obs_steps": 1, "chunk_size": 50, "n_action_steps": 50,
    "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
    "max_state_dim": 32, "max_action_dim": 32, "resize_imgs_with_padding": [512, 512], "empty_cameras": 0,
    "adapt_to_pi_aloha": False, "use_delta_joint_actions_aloha": False, "tokenizer_max_length": 48,
    "num_steps": 10, "use_cache": True, "freeze_vision_encoder": True, "train_expert_only": True,
    "train_state_proj": True, "vlm_model_name": "HuggingFaceTB/SmolVLM2-500M-Video-Instruct",
    "load_vlm_weights": False, "add_image_special_tokens": False, "attention_mode": "cross_attn",
    "prefix_length": -1, "pad_language_to": "max_length", "num_expert_layers": -1, "num_vlm_layers": 16,
    "self_attn_every_n_layers": 2, "expert_width_multiplier": 0.75, "min_period": 4e-3, "max_period": 4.0,
    "compile_model": False, "device": "cpu", "use_amp": False,
}

# The tiny configuration: SmolVLA's structure (chunk 50, 10 steps, 48 language
# tokens, cross/self interleaving) at toy widths, so per-call overhead dominates.
TINY_VLM = {
    "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                    "rms_norm_eps": 1e-5, "vocab_size": 512},
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                      "num_attention_heads": 2, "patch_size": 8, "image_size": 64, "layer_norm_eps": 1e-6},
    "scale_factor": 2,
}
CONFIGS = {
    "tiny": ({"num_vlm_layers": 4, "resize_imgs_with_padding": [64, 64]}, TINY_VLM),
    "smolvla": ({}, smolvla.SMOLVLM2_500M),
}
# What a robot camera delivers (H, W); the policy resizes with padding to its input size.
CAMERA_FRAME = {"tiny": (48, 64), "smolvla": (480, 640)}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<image>",
                  "<global-img>", "<end_of_utterance>"]


def lerobot_config(name: str, cameras: int) -> tuple[dict, dict]:
    """(LeRobot policy config dict, VLM config dict) of a named bench configuration."""
    if name not in CONFIGS:
        raise ValueError(f"unknown bench configuration {name!r}; choose one of {sorted(CONFIGS)}")
    if not 1 <= cameras <= 3:
        raise ValueError(f"cameras must be 1..3, got {cameras}")
    overrides, vlm = CONFIGS[name]
    cfg = {**copy.deepcopy(LEROBOT_SMOLVLA_DEFAULTS), **overrides}
    size = cfg["resize_imgs_with_padding"]
    cfg["input_features"] = {"observation.state": {"type": "STATE", "shape": [STATE_DIM]}}
    for i in range(cameras):
        cfg["input_features"][f"observation.images.cam{i}"] = {"type": "VISUAL", "shape": [3, size[1], size[0]]}
    cfg["output_features"] = {"action": {"type": "ACTION", "shape": [ACTION_DIM]}}
    return cfg, copy.deepcopy(vlm)


def to_lerobot_keys(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map module keys -> LeRobot checkpoint keys (the inverse of ``smolvla.key_rules``), round-trip checked."""
    rules = [(src, dst) for src, dst in smolvla.key_rules() if dst is not None]
    forward = prefix_key_map(smolvla.key_rules())
    out = {}
    for key, tensor in state_dict.items():
        src = next(s + key[len(d):] for s, d in rules if key.startswith(d))
        if forward(src) != key:
            raise AssertionError(f"key {key} -> {src} does not map back")
        out[src] = tensor.contiguous()
    return out


def write_vlm_folder(folder: Path, vlm: dict, image_seq_len: int) -> None:
    """Write a SmolVLM config + byte-level tokenizer + processor files: what ``AutoProcessor`` reads offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    text = {"model_type": "llama", "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "max_position_embeddings": 8192, "rope_theta": 100000.0, "pad_token_id": 2,
            "tie_word_embeddings": False, **vlm["text_config"]}
    vision = {"model_type": "smolvlm_vision", "hidden_act": "gelu_pytorch_tanh", "num_channels": 3,
              **vlm["vision_config"]}
    config = {"model_type": "smolvlm", "image_token_id": 4, "scale_factor": vlm["scale_factor"],
              "text_config": text, "vision_config": vision, "vocab_size": text["vocab_size"],
              "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.save(str(folder / "tokenizer.json"))
    special = {"bos_token": "<|im_start|>", "eos_token": "<end_of_utterance>", "pad_token": "<|im_end|>",
               "unk_token": "<|endoftext|>", "image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
               "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        **special, "tokenizer_class": "PreTrainedTokenizerFast", "processor_class": "SmolVLMProcessor",
        "model_max_length": 8192, "clean_up_tokenization_spaces": False,
        "extra_special_tokens": {k: special[k] for k in (
            "image_token", "fake_image_token", "global_image_token", "end_of_utterance_token")}}))
    size = {"longest_edge": vlm["vision_config"]["image_size"]}
    image = {"do_convert_rgb": True, "do_image_splitting": False, "do_normalize": True, "do_pad": True,
             "do_rescale": True, "do_resize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
             "max_image_size": size, "size": size, "resample": 1, "rescale_factor": 1 / 255,
             "processor_class": "SmolVLMProcessor"}
    (folder / "preprocessor_config.json").write_text(json.dumps(
        {**image, "image_processor_type": "SmolVLMImageProcessor"}))
    (folder / "video_preprocessor_config.json").write_text(json.dumps(
        {**image, "video_processor_type": "SmolVLMVideoProcessor", "do_sample_frames": False}))
    (folder / "processor_config.json").write_text(json.dumps(
        {"image_seq_len": image_seq_len, "processor_class": "SmolVLMProcessor"}))


def write_processors(folder: Path, tokenizer_name: str, max_length: int, padding: str) -> None:
    """Write LeRobot pre/post-processor files with identity statistics (mean 0, std 1)."""
    stats = {"mean": np.zeros(STATE_DIM, np.float32), "std": np.ones(STATE_DIM, np.float32)}
    norm_map = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    pre_file = "policy_preprocessor_step_5_normalizer_processor.safetensors"
    post_file = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    save_numpy({f"observation.state.{k}": v for k, v in stats.items()}, str(folder / pre_file))
    save_numpy({f"action.{k}": v for k, v in stats.items()}, str(folder / post_file))
    (folder / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": [
        {"registry_name": "tokenizer_processor",
         "config": {"tokenizer_name": tokenizer_name, "max_length": max_length, "padding": padding}},
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8, "norm_map": norm_map},
         "state_file": pre_file}]}))
    (folder / "policy_postprocessor.json").write_text(json.dumps({"name": "policy_postprocessor", "steps": [
        {"registry_name": "unnormalizer_processor", "config": {"eps": 1e-8, "norm_map": norm_map},
         "state_file": post_file}]}))


def save_random_checkpoint(folder: Path, name: str, cameras: int, seed: int = 0) -> Path:
    """Write a random-weight LeRobot SmolVLA checkpoint of configuration ``name``; returns ``folder``."""
    cfg, vlm = lerobot_config(name, cameras)
    folder.mkdir(parents=True, exist_ok=True)
    vlm_dir = folder / VLM_DIR
    # Relative: LeRobot resolves it against its working directory (the worker runs in the folder).
    cfg["vlm_model_name"] = VLM_DIR
    model_cfg = smolvla.SmolVLAConfig.from_lerobot(cfg, vlm)
    write_vlm_folder(vlm_dir, vlm, model_cfg.tokens_per_image)
    model = smolvla.SmolVLA(model_cfg)
    init_weights(model, torch.Generator().manual_seed(seed))
    save_file(to_lerobot_keys(model.state_dict()), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_processors(folder, VLM_DIR, cfg["tokenizer_max_length"], cfg["pad_language_to"])
    return folder
