# SPDX-License-Identifier: Apache-2.0
"""
The LeRobot generations an export targets, and the files each needs besides the weights.

For each generation (``LEROBOT_VERSIONS``): every ``SmolVLAConfig`` field with LeRobot's
defaults, the SmolVLM vision position ids its transformers computes, and the ``vlm/`` folder
transformers writes (``config.json``, tokenizer and processor files), in the 4.57 or the 5.x
layout. ``export.py`` writes them beside the weights.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from vla_policy_node.loading import checkpoint as ckpt
from vla_policy_node.model.families import smolvla

VLM_FOLDER = "vlm"
SETTINGS_FILE = ckpt.SETTINGS_FILE            # vla_policy_node.json: the project's own fields
PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"

LEROBOT_VERSIONS = ("0.4", "0.6")             # the generations an export can target
DEFAULT_LEROBOT_VERSION = "0.4"               # the generation the project trains with (4.57 position ids)
CHECKED_WITH = {"0.4": "LeRobot 0.4.4, transformers 4.57.6", "0.6": "LeRobot 0.6.1, transformers 5.5.4"}
TRANSFORMERS_VERSION = {"0.4": "4.57.6", "0.6": "5.5.4"}

# SmolVLAConfig as LeRobot 0.4.4 writes it (``SmolVLAConfig()._save_pretrained``, a draccus dump of every
# field with its default), in LeRobot's order. LeRobot 0.6.1 writes the same fields plus
# ``pretrained_revision`` after ``pretrained_path`` (checked with both releases installed).
LEROBOT_044_DEFAULTS: dict[str, Any] = {
    "type": "smolvla", "n_obs_steps": 1, "input_features": {}, "output_features": {}, "device": "cpu",
    "use_amp": False, "use_peft": False, "push_to_hub": True, "repo_id": None, "private": None, "tags": None,
    "license": None, "pretrained_path": None, "chunk_size": 50, "n_action_steps": 50,
    "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
    "max_state_dim": 32, "max_action_dim": 32, "resize_imgs_with_padding": [512, 512], "empty_cameras": 0,
    "adapt_to_pi_aloha": False, "use_delta_joint_actions_aloha": False, "tokenizer_max_length": 48,
    "num_steps": 10, "use_cache": True, "freeze_vision_encoder": True, "train_expert_only": True,
    "train_state_proj": True, "optimizer_lr": 0.0001, "optimizer_betas": [0.9, 0.95], "optimizer_eps": 1e-08,
    "optimizer_weight_decay": 1e-10, "optimizer_grad_clip_norm": 10, "scheduler_warmup_steps": 1000,
    "scheduler_decay_steps": 30000, "scheduler_decay_lr": 2.5e-06,
    "vlm_model_name": "HuggingFaceTB/SmolVLM2-500M-Video-Instruct", "load_vlm_weights": False,
    "add_image_special_tokens": False, "attention_mode": "cross_attn", "prefix_length": -1,
    "pad_language_to": "longest", "num_expert_layers": -1, "num_vlm_layers": 16, "self_attn_every_n_layers": 2,
    "expert_width_multiplier": 0.75, "min_period": 0.004, "max_period": 4.0, "rtc_config": None,
    "compile_model": False, "compile_mode": "max-autotune",
}


def check_version(version: str) -> None:
    """Refuse a target generation the export does not know."""
    if version not in LEROBOT_VERSIONS:
        raise ValueError(f"LeRobot target must be one of {LEROBOT_VERSIONS}, got {version!r}")


def lerobot_defaults(version: str) -> dict[str, Any]:
    """Every SmolVLAConfig field of the target LeRobot generation, with LeRobot's defaults, in its order."""
    check_version(version)
    if version == "0.4":
        return json.loads(json.dumps(LEROBOT_044_DEFAULTS))
    out: dict[str, Any] = {}
    for key, value in LEROBOT_044_DEFAULTS.items():
        out[key] = json.loads(json.dumps(value))
        if key == "pretrained_path":
            out["pretrained_revision"] = None
    return out


LEROBOT_FIELDS = {v: tuple(lerobot_defaults(v)) for v in LEROBOT_VERSIONS}
ALL_LEROBOT_FIELDS = frozenset().union(*LEROBOT_FIELDS.values())


def position_table(version: str) -> str:
    """Name the SmolVLM vision position ids the target LeRobot's transformers computes."""
    check_version(version)
    return "transformers4" if version == "0.4" else "transformers5"


# ------------------------------------------------------------------ tokenizer
# SmolVLM's own special tokens. SmolVLMProcessor and LeRobot's SmolVLA look them up
# (``tokenizer.fake_image_token_id``, ``global_image_token_id``) although SmolVLA with
# ``add_image_special_tokens: false`` never feeds them to the model.
IMAGE_TOKENS = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>"}


def word_tokenizer(words: Sequence[str]):
    """Build a lower-casing word-level ``tokenizers.Tokenizer``: id 0 pads, id 1 is any unknown word."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel

    vocab = {PAD_TOKEN: 0, UNK_TOKEN: 1}
    for word in words:
        vocab.setdefault(word.lower(), len(vocab))
    tokenizer = Tokenizer(WordLevel(vocab, unk_token=UNK_TOKEN))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


# The post-processor transformers 5 writes into a tokenizer that had none: it adds no token.
EMPTY_TEMPLATE = {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                  "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                  "special_tokens": {}}


def smolvlm_tokenizer(tokenizer, version: str):
    """
    Copy ``tokenizer`` with SmolVLM's special tokens (and pad / unk) registered, as transformers saves it.

    Tokens already in the vocabulary keep their ids; the image tokens are appended after it.
    The ids of ordinary text do not change. For the transformers 5 target the post-processor
    is the empty template transformers 5 writes (it adds nothing, like no post-processor).
    """
    from tokenizers import AddedToken, Tokenizer

    data = json.loads(tokenizer.to_str())
    if version == "0.6" and data.get("post_processor") is None:
        data["post_processor"] = EMPTY_TEMPLATE
    elif version == "0.4" and data.get("post_processor") == EMPTY_TEMPLATE:
        data["post_processor"] = None
    out = Tokenizer.from_str(json.dumps(data))
    out.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in (PAD_TOKEN, UNK_TOKEN, *IMAGE_TOKENS.values())])
    return out


def tokenizer_files(tokenizer, version: str, eos: str) -> dict[str, dict]:
    """``tokenizer_config.json`` (and for 4.57 ``special_tokens_map.json``) as each transformers writes them."""
    common = {"clean_up_tokenization_spaces": False, "model_max_length": 8192, "pad_token": PAD_TOKEN,
              "processor_class": "SmolVLMProcessor", "unk_token": UNK_TOKEN, "eos_token": eos, **IMAGE_TOKENS}
    if version == "0.6":
        return {"tokenizer_config.json": dict(sorted({
            "backend": "tokenizers", **common, "model_specific_special_tokens": dict(sorted(IMAGE_TOKENS.items())),
            "tokenizer_class": "TokenizersBackend"}.items()))}
    added = {str(tokenizer.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                             "single_word": False, "special": True}
             for t in (PAD_TOKEN, UNK_TOKEN, *IMAGE_TOKENS.values())}
    config = dict(sorted({**common, "added_tokens_decoder": dict(sorted(added.items(), key=lambda kv: int(kv[0]))),
                          "extra_special_tokens": dict(sorted(IMAGE_TOKENS.items())),
                          "tokenizer_class": "PreTrainedTokenizerFast"}.items()))
    special = dict(sorted({"eos_token": eos, "pad_token": PAD_TOKEN, "unk_token": UNK_TOKEN,
                           **IMAGE_TOKENS}.items()))
    return {"tokenizer_config.json": config, "special_tokens_map.json": special}


# ------------------------------------------------------------------ backbone folder
def smolvlm_config(cfg: smolvla.SmolVLAConfig, vocab_size: int, ids: Mapping[str, int], version: str) -> dict:
    """Build the SmolVLM ``config.json`` transformers writes for this backbone (4.57 or 5.x layout)."""
    text, vision = cfg.text, cfg.vision
    text_config: dict[str, Any] = {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": ids["eos"],
        "head_dim": text.head_dim, "hidden_act": text.act, "hidden_size": text.width, "initializer_range": 0.02,
        "intermediate_size": text.mlp_width, "max_position_embeddings": 8192, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": text.num_heads, "num_hidden_layers": text.num_layers,
        "num_key_value_heads": text.num_kv_heads, "pad_token_id": ids["pad"], "pretraining_tp": 1,
        "rms_norm_eps": text.norm_eps, "use_cache": True, "vocab_size": vocab_size,
    }
    if version == "0.6":
        text_config["rope_parameters"] = {"rope_theta": text.rope_base, "rope_type": "default"}
        text_config["tie_word_embeddings"] = False
    else:
        text_config["rope_scaling"] = None
        text_config["rope_theta"] = text.rope_base
    return {
        "image_token_id": ids["image"], "model_type": "smolvlm", "pad_token_id": ids["pad"],
        "scale_factor": cfg.scale_factor, "text_config": dict(sorted(text_config.items())),
        "tie_word_embeddings": False, "transformers_version": TRANSFORMERS_VERSION[version], "use_cache": True,
        "vision_config": {
            "attention_dropout": 0.0, "hidden_act": "gelu_pytorch_tanh", "hidden_size": vision.width,
            "image_size": vision.image_size, "initializer_range": 0.02, "intermediate_size": vision.mlp_width,
            "layer_norm_eps": vision.norm_eps, "model_type": "smolvlm_vision", "num_attention_heads": vision.num_heads,
            "num_channels": 3, "num_hidden_layers": vision.num_layers, "patch_size": vision.patch_size},
        "vocab_size": vocab_size,
    }


def processor_files(cfg: smolvla.SmolVLAConfig, version: str) -> dict[str, dict]:
    """Build the processor files ``AutoProcessor.from_pretrained`` needs, as each transformers writes them."""
    side = {"longest_edge": cfg.vision.image_size}
    shared = {"do_convert_rgb": True, "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True,
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "max_image_size": dict(side),
              "resample": 1, "rescale_factor": 1 / 255, "size": dict(side)}
    image = dict(sorted({**shared, "do_image_splitting": True,
                         "image_processor_type": "SmolVLMImageProcessor"}.items()))
    video = dict(sorted({**shared, "data_format": "channels_first", "default_to_square": True,
                         "do_sample_frames": False, "return_metadata": False,
                         "video_processor_type": "SmolVLMVideoProcessor"}.items()))
    if version == "0.6":
        return {"processor_config.json": {"image_processor": image, "image_seq_len": cfg.tokens_per_image,
                                          "processor_class": "SmolVLMProcessor", "video_processor": video}}
    video_457 = dict(sorted({**video, "crop_size": None, "device": None, "do_center_crop": None, "fps": None,
                             "input_data_format": None, "num_frames": None, "pad_size": None,
                             "processor_class": "SmolVLMProcessor", "video_metadata": None}.items()))
    return {"preprocessor_config.json": {**image, "processor_class": "SmolVLMProcessor"},
            "processor_config.json": {"image_seq_len": cfg.tokens_per_image, "processor_class": "SmolVLMProcessor"},
            "video_preprocessor_config.json": video_457}


# Files an earlier export may have left in vlm/ that the current target does not write.
VLM_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
