# SPDX-License-Identifier: Apache-2.0
"""
Save a trained ``SmolVLA`` in LeRobot's checkpoint layout, the one ``load_policy`` reads.

    config.json                     LeRobot's SmolVLAConfig fields (type "smolvla")
    model.safetensors               LeRobot's parameter names (model.vlm_with_expert....)
    policy_preprocessor.json        tokenizer and normalizer steps
    policy_preprocessor_step_5_normalizer_processor.safetensors
    policy_postprocessor.json       unnormalizer step
    policy_postprocessor_step_0_unnormalizer_processor.safetensors
    vlm/config.json                 the (tiny) SmolVLM backbone's text and vision sizes
    vlm/tokenizer.json              a word-level tokenizer, with special_tokens_map.json

The parameter names are the inverse of ``smolvla.key_rules``; ``save_checkpoint``
checks that the loader's key map sends every saved name back to its module name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
from safetensors.numpy import save_file
from safetensors.torch import save_file as save_torch_file
from torch import nn

from ..core.families import smolvla
from ..core.weights import prefix_key_map

VLM_FOLDER = "vlm"
PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"
PRE_STATS = "policy_preprocessor_step_5_normalizer_processor.safetensors"
POST_STATS = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"


def lerobot_key(module_key: str) -> str:
    """Map a module parameter name to LeRobot's (the first rule whose module prefix matches)."""
    for ckpt_prefix, module_prefix in smolvla.key_rules():
        if module_prefix and module_key.startswith(module_prefix):
            return ckpt_prefix + module_key[len(module_prefix):]
    return "model." + module_key


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


def save_checkpoint(folder: Path, model: nn.Module, config: dict, vlm_config: dict, tokenizer,
                    state_stats: dict[str, np.ndarray], action_stats: dict[str, np.ndarray]) -> None:
    """Write the checkpoint files into ``folder`` (created; existing files are overwritten)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_weights(folder, model)
    _write_json(folder / "config.json", config)
    vlm = folder / VLM_FOLDER
    vlm.mkdir(exist_ok=True)
    _write_json(vlm / "config.json", vlm_config)
    tokenizer.save(str(vlm / "tokenizer.json"))
    _write_json(vlm / "special_tokens_map.json", {"pad_token": PAD_TOKEN, "unk_token": UNK_TOKEN})
    features = {**config["input_features"], **config["output_features"]}
    norm_map = config["normalization_mapping"]
    save_file({f"observation.state.{k}": np.asarray(v, np.float32) for k, v in state_stats.items()}
              | {f"action.{k}": np.asarray(v, np.float32) for k, v in action_stats.items()},
              str(folder / PRE_STATS))
    save_file({f"action.{k}": np.asarray(v, np.float32) for k, v in action_stats.items()}, str(folder / POST_STATS))
    _write_json(folder / "policy_preprocessor.json", {"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "smolvla_new_line_processor", "config": {}},
        {"registry_name": "tokenizer_processor", "config": {
            "max_length": config["tokenizer_max_length"], "task_key": "task", "padding_side": "right",
            "padding": config["pad_language_to"], "truncation": True, "tokenizer_name": VLM_FOLDER}},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8, "features": features, "norm_map": norm_map},
         "state_file": PRE_STATS},
    ]})
    _write_json(folder / "policy_postprocessor.json", {"name": "policy_postprocessor", "steps": [
        {"registry_name": "unnormalizer_processor", "config": {
            "eps": 1e-8, "features": config["output_features"], "norm_map": norm_map}, "state_file": POST_STATS},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
    ]})


def save_weights(folder: Path, model: nn.Module) -> None:
    """``model.safetensors`` under LeRobot's names, float32; each name must load back to its parameter."""
    to_module = prefix_key_map(smolvla.key_rules())
    tensors = {}
    for name, tensor in model.state_dict().items():
        key = lerobot_key(name)
        if to_module(key) != name:
            raise ValueError(f"parameter {name} would be saved as {key}, which loads as {to_module(key)}")
        tensors[key] = tensor.detach().float().contiguous()
    save_torch_file(tensors, str(folder / "model.safetensors"))


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
