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

The per-generation config and ``vlm/`` files are built in ``lerobot_files.py``; this module
converts the weights and writes the folder.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import torch
from safetensors.numpy import save_file
from safetensors.torch import save_file as save_torch_file
from torch import nn

from vla_policy_node.loading import checkpoint as ckpt
from vla_policy_node.loading import generation as generations
from vla_policy_node.model.families import smolvla
from vla_policy_node.loading.weights import load_weights, prefix_key_map
# The generations and their files live in lerobot_files; callers keep importing these names from here.
from vla_policy_node.train.lerobot_files import (  # noqa: F401
    ALL_LEROBOT_FIELDS, CHECKED_WITH, DEFAULT_LEROBOT_VERSION, IMAGE_TOKENS, LEROBOT_VERSIONS, PAD_TOKEN, SETTINGS_FILE,
    VLM_FILES, VLM_FOLDER, check_version, lerobot_defaults, position_table, processor_files, smolvlm_config,
    smolvlm_tokenizer, tokenizer_files, word_tokenizer)

PRE_STATS = "policy_preprocessor_step_5_normalizer_processor.safetensors"
POST_STATS = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
POSITION_KEY = "vision.embeddings.position_embedding.weight"
EMBED_KEY = "embed_tokens.weight"


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
    # A checkpoint's embedding may have more rows than its tokenizer ids (SmolVLM2's 49,280 rows with a
    # small tokenizer, as the bench's SmolVLA-size checkpoint): the rows are kept, the ids index into them.
    vocab_size = max(tok.get_vocab_size(with_added_tokens=True), model.state_dict()[EMBED_KEY].shape[0])
    ids = {"pad": tok.token_to_id(PAD_TOKEN), "image": tok.token_to_id(IMAGE_TOKENS["image_token"]),
           "eos": tok.token_to_id(IMAGE_TOKENS["end_of_utterance_token"])}

    folder.mkdir(parents=True, exist_ok=True)
    save_weights(folder, model, lerobot_version, vocab_size)
    _write_json(folder / "config.json", lerobot_config)
    _write_settings(folder, {**(settings or {}), **project}, lerobot_version)

    vlm = folder / VLM_FOLDER
    vlm.mkdir(exist_ok=True)
    files = {"config.json": smolvlm_config(cfg, vocab_size, ids, lerobot_version),
             **tokenizer_files(tok, lerobot_version, IMAGE_TOKENS["end_of_utterance_token"]),
             **processor_files(cfg, lerobot_version)}
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
    merged["vlm_model_name"] = VLM_FOLDER      # a LeRobot-saved backbone folder may have another name: written to vlm/
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
