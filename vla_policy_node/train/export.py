# SPDX-License-Identifier: Apache-2.0
"""
Save a trained ``SmolVLA`` as a LeRobot checkpoint that LeRobot itself loads, and ``load_policy`` too.

    config.json                     exactly the fields of the target LeRobot's SmolVLAConfig
    model.safetensors               every parameter of LeRobot's SmolVLAPolicy, under its names
    policy_preprocessor.json        rename, batch, new-line, tokenizer, device and normalizer steps
    policy_preprocessor_step_5_normalizer_processor.safetensors
    policy_postprocessor.json       unnormalizer and device steps
    policy_postprocessor_step_0_unnormalizer_processor.safetensors
    vlm/                            the SmolVLM backbone as transformers saves it (config, tokenizer,
                                    image / video processor files), without weights
    vla_policy_node.json            this project's own fields (joint_names, ...) and the target
                                    LeRobot generation; LeRobot never reads it

LeRobot reads ``config.json`` with draccus, which refuses any field its ``SmolVLAConfig`` does
not have, so the project's own fields live in the side file. It builds the backbone with
``AutoConfig`` / ``AutoProcessor.from_pretrained("vlm")``, a name relative to the working
directory: run LeRobot from inside the checkpoint folder (``tools/lerobot/export_check.py``).

One folder cannot serve every LeRobot. LeRobot 0.4.x runs transformers 4.57, whose SmolVLM
vision position ids are ``[0, 0, 1, 2, ...]`` per axis; LeRobot >= 0.5 runs transformers 5,
with ``[0, 1, 2, ...]``. The project trains with the 4.57 ids. ``lerobot_version`` picks the
target generation:

``"0.4"`` (default)  for LeRobot 0.4.x: transformers 4.57 files, weights as trained.
``"0.6"``            for LeRobot 0.6.x: ``"pretrained_revision": null`` in config.json (which is
                     how LeRobot 0.6 writes it, and how ``load_policy`` tells the generation),
                     transformers 5 files, and the vision position embedding re-indexed so the
                     5.x ids pick the rows the 4.57 ids picked: the same actions, exactly.

The conversion the other way (a 5.x-trained embedding for 4.57 ids) is exact only when the
rows the 4.57 ids share are equal; ``save_checkpoint`` refuses it otherwise.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch
from safetensors.numpy import save_file
from safetensors.torch import save_file as save_torch_file
from torch import nn

from vla_policy_node.loading import checkpoint as ckpt
from vla_policy_node.loading import generation as generations
from vla_policy_node.model.families import smolvla
from vla_policy_node.loading.weights import load_weights, prefix_key_map

VLM_FOLDER = "vlm"
SETTINGS_FILE = ckpt.SETTINGS_FILE            # vla_policy_node.json: the project's own fields
PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"
PRE_STATS = "policy_preprocessor_step_5_normalizer_processor.safetensors"
POST_STATS = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
POSITION_KEY = "vision.embeddings.position_embedding.weight"
EMBED_KEY = "embed_tokens.weight"

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


def _tokenizer_files(tokenizer, version: str, eos: str) -> dict[str, dict]:
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
def _vlm_config(cfg: smolvla.SmolVLAConfig, vocab_size: int, ids: Mapping[str, int], version: str) -> dict:
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


def _processor_files(cfg: smolvla.SmolVLAConfig, version: str) -> dict[str, dict]:
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


# ------------------------------------------------------------------ weights
def lerobot_key(module_key: str) -> str:
    """Map a module parameter name to LeRobot's (the first rule whose module prefix matches)."""
    for ckpt_prefix, module_prefix in smolvla.key_rules():
        if module_prefix and module_key.startswith(module_prefix):
            return ckpt_prefix + module_key[len(module_prefix):]
    return "model." + module_key


def reindex_positions(embedding: torch.Tensor, side: int, source: str, target: str) -> torch.Tensor:
    """
    Lay out a vision position embedding (side * side, D) used with ``source`` ids for ``target`` ids.

    Position k of the patch grid gets row ``source_ids[k]`` under the old ids and must get the same
    vector under the new ones. From ``transformers4`` to ``transformers5`` every new id is used once,
    so it is exact (``smolvla.position_table_for``); the other way, positions that the 4.57 ids
    send to one row must have had equal rows, else ValueError. Rows no id uses are kept.
    """
    if source == target:
        return embedding.clone()
    old = smolvla.smolvlm_position_ids(side, source)
    new = smolvla.smolvlm_position_ids(side, target)
    out = embedding.clone()
    out[new] = embedding[old]
    if not torch.equal(out[new], embedding[old]):
        raise ValueError(f"the vision position embedding trained with {source} ids has no exact {target} "
                         "layout (positions that share a row under the new ids had different rows)")
    return out


def lerobot_state_dict(model: nn.Module, version: str, vocab_size: int) -> dict[str, torch.Tensor]:
    """
    Every tensor LeRobot's SmolVLAPolicy holds, under its names, float32, for the target generation.

    The module's parameters (each name checked to load back through ``smolvla.key_rules``), the
    vision position embedding laid out for the target's ids, the token embedding padded with zero
    rows up to ``vocab_size`` (the image tokens the tokenizer adds), and the two tensors LeRobot
    builds but inference never reads: the VLM's ``lm_head`` (zeros) and final text norm (ones).
    """
    cfg: smolvla.SmolVLAConfig = model.config
    to_module = prefix_key_map(smolvla.key_rules())
    state = {name: t.detach().float().cpu() for name, t in model.state_dict().items()}
    side = cfg.vision.image_size // cfg.vision.patch_size
    state[POSITION_KEY] = reindex_positions(state[POSITION_KEY], side, cfg.vision_positions, position_table(version))
    rows = state[EMBED_KEY].shape[0]
    if vocab_size < rows:
        raise ValueError(f"the tokenizer has {vocab_size} ids, fewer than the {rows} embedding rows")
    state[EMBED_KEY] = torch.cat([state[EMBED_KEY], state[EMBED_KEY].new_zeros(vocab_size - rows, cfg.text.width)])
    tensors = {}
    for name, tensor in state.items():
        key = lerobot_key(name)
        if to_module(key) != name:
            raise ValueError(f"parameter {name} would be saved as {key}, which loads as {to_module(key)}")
        tensors[key] = tensor.contiguous()
    vlm = "model.vlm_with_expert.vlm."
    tensors[vlm + "lm_head.weight"] = torch.zeros(vocab_size, cfg.text.width)
    tensors[vlm + "model.text_model.norm.weight"] = torch.ones(cfg.text.width)
    return dict(sorted(tensors.items()))


def save_weights(folder: Path, model: nn.Module, version: str = DEFAULT_LEROBOT_VERSION,
                 vocab_size: Optional[int] = None) -> None:
    """``model.safetensors`` for the target generation (see ``lerobot_state_dict``)."""
    rows = model.state_dict()[EMBED_KEY].shape[0]
    save_torch_file(lerobot_state_dict(model, version, rows if vocab_size is None else vocab_size),
                    str(folder / "model.safetensors"))


# ------------------------------------------------------------------ config and side file
def split_config(config: Mapping[str, Any], version: str) -> tuple[dict, dict]:
    """
    (config.json for the target, project-only fields): LeRobot's defaults overlaid with ``config``.

    Keys that are another LeRobot generation's fields (``pretrained_revision`` for 0.4) are
    dropped; every other key LeRobot does not know goes to the side file. ``push_to_hub`` is
    false (LeRobot's default true makes its training refuse a config without ``repo_id``).
    """
    out = lerobot_defaults(version)
    out["push_to_hub"] = False
    project = {}
    for key, value in config.items():
        if key in out:
            out[key] = json.loads(json.dumps(value))
        elif key not in ALL_LEROBOT_FIELDS:
            project[key] = json.loads(json.dumps(value))
    if version == "0.6":
        out["pretrained_revision"] = None
    return out, project


def save_checkpoint(folder: Path, model: nn.Module, config: dict, vlm_config: Optional[dict], tokenizer,
                    state_stats: Mapping[str, np.ndarray], action_stats: Mapping[str, np.ndarray],
                    lerobot_version: str = DEFAULT_LEROBOT_VERSION, settings: Optional[Mapping] = None) -> None:
    """
    Write the checkpoint files for LeRobot ``lerobot_version`` into ``folder`` (created; files overwritten).

    ``model`` is the ``SmolVLA`` module (its ``config.vision_positions`` says which ids its
    position embedding was trained with); ``config`` the LeRobot-style policy config plus any
    project fields (``joint_names``), which go to ``vla_policy_node.json`` with ``settings``
    and the target version; ``vlm_config`` (optional) the backbone sizes, checked against the
    model, from which the backbone's files are written; ``tokenizer`` a ``tokenizers.Tokenizer``.
    """
    check_version(lerobot_version)
    cfg: smolvla.SmolVLAConfig = model.config
    if vlm_config is not None:
        _check_vlm_sizes(cfg, vlm_config)
    lerobot_config, project = split_config(config, lerobot_version)
    if lerobot_config["vlm_model_name"] != VLM_FOLDER:
        raise ValueError(f"config vlm_model_name must be {VLM_FOLDER!r} (the backbone folder the export writes), "
                         f"got {lerobot_config['vlm_model_name']!r}")
    tok = smolvlm_tokenizer(tokenizer, lerobot_version)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    ids = {"pad": tok.token_to_id(PAD_TOKEN), "image": tok.token_to_id(IMAGE_TOKENS["image_token"]),
           "eos": tok.token_to_id(IMAGE_TOKENS["end_of_utterance_token"])}

    folder.mkdir(parents=True, exist_ok=True)
    save_weights(folder, model, lerobot_version, vocab_size)
    _write_json(folder / "config.json", lerobot_config)
    _write_settings(folder, {**(settings or {}), **project}, lerobot_version)

    vlm = folder / VLM_FOLDER
    vlm.mkdir(exist_ok=True)
    files = {"config.json": _vlm_config(cfg, vocab_size, ids, lerobot_version),
             **_tokenizer_files(tok, lerobot_version, IMAGE_TOKENS["end_of_utterance_token"]),
             **_processor_files(cfg, lerobot_version)}
    for name in VLM_FILES:
        if name not in files and name != "tokenizer.json" and (vlm / name).is_file():
            (vlm / name).unlink()
    for name, data in files.items():
        _write_json(vlm / name, data)
    tok.save(str(vlm / "tokenizer.json"))

    features = {**lerobot_config["input_features"], **lerobot_config["output_features"]}
    norm_map = lerobot_config["normalization_mapping"]
    save_file({f"observation.state.{k}": np.asarray(v, np.float32) for k, v in state_stats.items()}
              | {f"action.{k}": np.asarray(v, np.float32) for k, v in action_stats.items()},
              str(folder / PRE_STATS))
    save_file({f"action.{k}": np.asarray(v, np.float32) for k, v in action_stats.items()}, str(folder / POST_STATS))
    _write_json(folder / "policy_preprocessor.json", {"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "smolvla_new_line_processor", "config": {}},
        {"registry_name": "tokenizer_processor", "config": {
            "max_length": lerobot_config["tokenizer_max_length"], "task_key": "task", "padding_side": "right",
            "padding": lerobot_config["pad_language_to"], "truncation": True, "tokenizer_name": VLM_FOLDER}},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8, "features": features, "norm_map": norm_map},
         "state_file": PRE_STATS},
    ]})
    _write_json(folder / "policy_postprocessor.json", {"name": "policy_postprocessor", "steps": [
        {"registry_name": "unnormalizer_processor", "config": {
            "eps": 1e-8, "features": lerobot_config["output_features"], "norm_map": norm_map},
         "state_file": POST_STATS},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
    ]})


def _check_vlm_sizes(cfg: smolvla.SmolVLAConfig, vlm_config: Mapping) -> None:
    text, vision = vlm_config.get("text_config", {}), vlm_config.get("vision_config", {})
    expected = {("text_config", "hidden_size"): cfg.text.width,
                ("text_config", "intermediate_size"): cfg.text.mlp_width,
                ("text_config", "num_attention_heads"): cfg.text.num_heads,
                ("vision_config", "hidden_size"): cfg.vision.width,
                ("vision_config", "patch_size"): cfg.vision.patch_size,
                ("vision_config", "image_size"): cfg.vision.image_size}
    for (part, key), want in expected.items():
        have = (text if part == "text_config" else vision).get(key, want)
        if have != want:
            raise ValueError(f"vlm_config {part}.{key} = {have}, but the model has {want}")


def _write_settings(folder: Path, fields: Mapping[str, Any], version: str) -> None:
    """``vla_policy_node.json``: kept keys of an existing file, the project fields, and the target generation."""
    path = folder / SETTINGS_FILE
    current = ckpt.read_json(path) if path.is_file() else {}
    _write_json(path, {**current, **fields, "lerobot_version": version})


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


# ------------------------------------------------------------------ reading an exported checkpoint back
@dataclasses.dataclass
class SavedCheckpoint:
    """What ``save_checkpoint`` needs, read back from a checkpoint folder this project wrote."""

    model: nn.Module               # SmolVLA with the folder's weights, in the folder's position-id layout
    config: dict                   # config.json with the side file's project fields merged in
    vlm_config: dict
    tokenizer: Any                 # tokenizers.Tokenizer
    state_stats: dict[str, np.ndarray]
    action_stats: dict[str, np.ndarray]
    settings: dict                 # vla_policy_node.json without lerobot_version
    generation: generations.Generation


def read_checkpoint(folder: Path) -> SavedCheckpoint:
    """
    Read a SmolVLA checkpoint folder (an export of any generation, or the layout before exports had one).

    The generation, and so the position ids the weights are laid out for, is recognised from
    the files as ``load_policy`` does (``lerobot_generation``), with ``vla_policy_node.json``'s
    ``lerobot_version`` as the override.
    """
    from tokenizers import Tokenizer

    folder = ckpt.checkpoint_dir(folder)
    config = ckpt.read_json(ckpt.inside(folder, "config.json"))
    if config.get("type") != "smolvla":
        raise ckpt.CheckpointError(f"{folder}: only SmolVLA checkpoints can be exported, "
                                   f"got type {config.get('type')!r}")
    vlm_name = ckpt.config_value(config, "vlm_model_name", str, VLM_FOLDER, "config.json")
    vlm_config = ckpt.read_json(ckpt.inside(folder, f"{vlm_name}/config.json"))
    settings_path = ckpt.inside(folder, SETTINGS_FILE)
    settings = ckpt.read_json(settings_path) if settings_path.is_file() else {}
    recorded = settings.pop("lerobot_version", None)
    tok_config_path = ckpt.inside(folder, f"{vlm_name}/tokenizer_config.json")
    found = generations.markers(
        config, ckpt.pipeline_steps(folder, "policy_preprocessor.json"),
        ckpt.pipeline_steps(folder, "policy_postprocessor.json"),
        ckpt.read_json(tok_config_path) if tok_config_path.is_file() else None, vlm_config)
    version = None if recorded is None else ckpt.parse_version(str(recorded), f"{SETTINGS_FILE}: lerobot_version")
    generation = generations.recognise(found, version, None if recorded is None else str(recorded), folder)
    table = "transformers5" if generation.transformers5 else "transformers4"
    cfg = smolvla.SmolVLAConfig.from_lerobot(config, vlm_config, table)
    model = smolvla.SmolVLA(cfg)
    load_weights(model, ckpt.weights_file(folder), prefix_key_map(smolvla.key_rules()))
    model.eval()
    pre, _, _ = ckpt.lerobot_processor_stats(folder, "policy_preprocessor.json", "normalizer_processor")
    post, _, _ = ckpt.lerobot_processor_stats(folder, "policy_postprocessor.json", "unnormalizer_processor")
    tokenizer = Tokenizer.from_file(str(ckpt.tokenizer_file(folder, vlm_name)))
    merged = {**config, **{k: v for k, v in settings.items() if k not in ALL_LEROBOT_FIELDS}}
    return SavedCheckpoint(model, merged, vlm_config, tokenizer, dict(pre["observation.state"]),
                           dict(post["action"]), settings, generation)


def export_checkpoint(source: Path, output: Path, lerobot_version: str = DEFAULT_LEROBOT_VERSION) -> SavedCheckpoint:
    """Re-export ``source`` for LeRobot ``lerobot_version`` into ``output`` (may be ``source`` itself); no training."""
    saved = read_checkpoint(source)
    save_checkpoint(output, saved.model, saved.config, saved.vlm_config, saved.tokenizer, saved.state_stats,
                    saved.action_stats, lerobot_version, saved.settings)
    return saved


def sample_observation(config: Mapping[str, Any], seed: int = 0, task: str = "touch the red block") -> dict:
    """Make a random observation in ``load_policy``'s format for a policy config (uint8 HWC frames, raw state)."""
    rng = np.random.default_rng(seed)
    images = {}
    for name, feature in config["input_features"].items():
        if feature["type"] == "VISUAL":
            _, height, width = feature["shape"]
            images[name] = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    state = rng.standard_normal(config["input_features"]["observation.state"]["shape"]).astype(np.float32)
    return {"images": images, "state": state, "task": task}


def copy_trained_weights(saved: SavedCheckpoint, model: nn.Module) -> None:
    """
    Fill a freshly built training ``model`` (4.57 position ids) from a read-back checkpoint.

    The export's extra token-embedding rows (the image tokens, never trained) are dropped and
    the position embedding is laid out for the training model's ids again.
    """
    cfg: smolvla.SmolVLAConfig = model.config
    side = cfg.vision.image_size // cfg.vision.patch_size
    source = saved.model.state_dict()
    with torch.no_grad():
        for name, target in model.state_dict().items():
            tensor = source[name]
            if name == EMBED_KEY:
                tensor = tensor[:target.shape[0]]
            elif name == POSITION_KEY:
                tensor = reindex_positions(tensor, side, saved.model.config.vision_positions, cfg.vision_positions)
            if tensor.shape != target.shape:
                raise ValueError(f"{name}: the checkpoint has shape {list(tensor.shape)}, "
                                 f"the model {list(target.shape)}")
            target.copy_(tensor)
