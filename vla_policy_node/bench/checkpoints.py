# SPDX-License-Identifier: Apache-2.0
"""
Random-weight checkpoints at real dimensions, saved exactly as LeRobot saves them.

The bench builds a model, draws its weights, and writes a LeRobot checkpoint
folder (``config.json`` + ``model.safetensors`` in LeRobot key names + pre/post
processor files with identity statistics + a local tokenizer, and for SmolVLA
a local SmolVLM config folder), so both this package (``load_policy``) and
LeRobot (``from_pretrained``, offline, ``load_vlm_weights=false``) load the
very same bytes.

``pi0`` is LeRobot 0.4.4's default pi0 (PaliGemma: SigLIP So400m + Gemma 2B,
a Gemma 300M action expert, 224x224 cameras), about 3.5 B parameters in the
file. It is built directly in the checkpoint dtype (bfloat16 when the bench
runs bfloat16) and streamed to disk one tensor at a time, so writing it holds
one copy of the weights. ``memory_estimate`` says beforehand how much RAM
writing, loading and running a configuration takes
(``memory.py``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Union

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file

from vla_policy_node.model.families import pi0 as pi0_family
from vla_policy_node.model.families import smolvla
from vla_policy_node.model.families.paligemma import PiConfig
from vla_policy_node.loading.load import init_weights
from vla_policy_node.loading.weights import prefix_key_map

VLM_DIR = "vlm"
TOKENIZER_DIR = "tokenizer"
STATE_DIM = ACTION_DIM = 6
KeyRules = list[tuple[str, Optional[str]]]

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

# LeRobot 0.4.4 ``PI0Config`` as ``save_pretrained`` writes it: every field, defaults (Gemma 2B VLM,
# Gemma 300M expert, 224x224 cameras -> 256 SigLIP tokens each, 10 steps, chunk 50, 48 language tokens).
# ``dtype`` is LeRobot's compute dtype (its default); the weights file may be bfloat16 regardless.
LEROBOT_PI0_DEFAULTS = {
    "type": "pi0", "n_obs_steps": 1, "device": "cpu", "use_amp": False, "use_peft": False, "push_to_hub": True,
    "repo_id": None, "private": None, "tags": None, "license": None, "pretrained_path": None,
    "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m", "dtype": "float32",
    "chunk_size": 50, "n_action_steps": 50, "max_state_dim": 32, "max_action_dim": 32, "num_inference_steps": 10,
    "time_sampling_beta_alpha": 1.5, "time_sampling_beta_beta": 1.0, "time_sampling_scale": 0.999,
    "time_sampling_offset": 0.001, "min_period": 4e-3, "max_period": 4.0, "rtc_config": None,
    "image_resolution": [224, 224], "empty_cameras": 0,
    "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
    "gradient_checkpointing": False, "compile_model": False, "compile_mode": "max-autotune",
    "freeze_vision_encoder": False, "train_expert_only": False, "optimizer_lr": 2.5e-5,
    "optimizer_betas": [0.9, 0.95], "optimizer_eps": 1e-8, "optimizer_weight_decay": 0.01,
    "optimizer_grad_clip_norm": 1.0, "scheduler_warmup_steps": 1000, "scheduler_decay_steps": 30000,
    "scheduler_decay_lr": 2.5e-6, "tokenizer_max_length": 48,
}
PI0_CONFIGS = ("pi0",)

CONFIG_NAMES = tuple(sorted([*CONFIGS, *PI0_CONFIGS]))
# What a robot camera delivers (H, W); the policy resizes with padding to its input size.
CAMERA_FRAME = {"tiny": (48, 64), "smolvla": (480, 640), "pi0": (480, 640)}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<image>",
                  "<global-img>", "<end_of_utterance>"]


def _check_cameras(cameras: int) -> None:
    if not 1 <= cameras <= 3:
        raise ValueError(f"cameras must be 1..3, got {cameras}")


def lerobot_config(name: str, cameras: int) -> tuple[dict, dict]:
    """(LeRobot policy config dict, VLM config dict) of a named SmolVLA-family bench configuration."""
    if name not in CONFIGS:
        raise ValueError(f"unknown SmolVLA bench configuration {name!r}; choose one of {sorted(CONFIGS)}")
    _check_cameras(cameras)
    overrides, vlm = CONFIGS[name]
    cfg = {**copy.deepcopy(LEROBOT_SMOLVLA_DEFAULTS), **overrides}
    size = cfg["resize_imgs_with_padding"]
    cfg["input_features"] = {"observation.state": {"type": "STATE", "shape": [STATE_DIM]}}
    for i in range(cameras):
        cfg["input_features"][f"observation.images.cam{i}"] = {"type": "VISUAL", "shape": [3, size[1], size[0]]}
    cfg["output_features"] = {"action": {"type": "ACTION", "shape": [ACTION_DIM]}}
    return cfg, copy.deepcopy(vlm)


def to_lerobot_keys(state_dict: dict[str, torch.Tensor], rules: Optional[KeyRules] = None,
                    saved_as: Optional[KeyRules] = None) -> dict[str, torch.Tensor]:
    """
    Map module keys -> LeRobot checkpoint keys (the inverse of a family's key rules), round-trip checked.

    ``rules`` are the family's loading rules (default ``smolvla.key_rules()``); ``saved_as`` the
    subset to invert where several checkpoint names load into one module key (default ``rules``).
    Every key must map back to itself through ``rules``.
    """
    rules = smolvla.key_rules() if rules is None else rules
    inverse = [(src, dst) for src, dst in (rules if saved_as is None else saved_as) if dst is not None]
    forward = prefix_key_map(rules)
    out = {}
    for key, tensor in state_dict.items():
        src = next(s + key[len(d):] for s, d in inverse if key.startswith(d))
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


def write_processors(folder: Path, tokenizer_name: str, max_length: int, padding: str, features: dict) -> None:
    """
    Write LeRobot 0.4.4's SmolVLA pre/post-processor files as it saves them, with identity statistics.

    ``features`` is the config's input and output features: LeRobot's normalizer steps need
    them to run its whole raw-observation path in the bench's comparison.
    """
    stats = {"mean": np.zeros(STATE_DIM, np.float32), "std": np.ones(STATE_DIM, np.float32)}
    norm_map = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    pre_file = "policy_preprocessor_step_5_normalizer_processor.safetensors"
    post_file = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    save_numpy({f"observation.state.{k}": v for k, v in stats.items()}, str(folder / pre_file))
    save_numpy({f"action.{k}": v for k, v in stats.items()}, str(folder / post_file))
    device = {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}
    (folder / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "smolvla_new_line_processor", "config": {}},
        {"registry_name": "tokenizer_processor",
         "config": {"max_length": max_length, "task_key": "task", "padding_side": "right", "padding": padding,
                    "truncation": True, "tokenizer_name": tokenizer_name}},
        device,
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8, "features": features, "norm_map": norm_map},
         "state_file": pre_file}]}, indent=2))
    (folder / "policy_postprocessor.json").write_text(json.dumps({"name": "policy_postprocessor", "steps": [
        {"registry_name": "unnormalizer_processor",
         "config": {"eps": 1e-8, "features": {"action": features["action"]}, "norm_map": norm_map},
         "state_file": post_file},
        device]}, indent=2))


def save_random_checkpoint(folder: Path, name: str, cameras: int, seed: int = 0, dtype: str = "float32",
                           info: Optional[dict] = None, padding: str = "max_length",
                           pi0_dims: Optional[dict] = None) -> Path:
    """
    Write a random-weight LeRobot checkpoint of configuration ``name``; returns ``folder``.

    ``dtype`` is the weights file's dtype for ``pi0`` (SmolVLA configurations are always saved
    in float32). ``info``, when given, receives build/save seconds, file bytes and parameters.
    ``padding`` is the prompt padding the pre-processor records: ``max_length`` or ``longest``.
    ``pi0_dims`` (``pi0`` only): sizes in the loader's ``tiny_dims.json`` form, instead of the published ones.
    """
    if padding not in ("max_length", "longest"):
        raise ValueError(f"padding must be 'max_length' or 'longest', got {padding!r}")
    if name in PI0_CONFIGS:
        return save_random_pi0_checkpoint(folder, cameras, seed, dtype, pi0_dims, info, padding)
    t0 = time.perf_counter()
    cfg, vlm = lerobot_config(name, cameras)
    cfg["pad_language_to"] = padding
    folder.mkdir(parents=True, exist_ok=True)
    vlm_dir = folder / VLM_DIR
    # Relative: LeRobot resolves it against its working directory (the worker runs in the folder).
    cfg["vlm_model_name"] = VLM_DIR
    model_cfg = smolvla.SmolVLAConfig.from_lerobot(cfg, vlm)
    write_vlm_folder(vlm_dir, vlm, model_cfg.tokens_per_image)
    model = smolvla.SmolVLA(model_cfg)
    init_weights(model, torch.Generator().manual_seed(seed))
    t1 = time.perf_counter()
    save_file(to_lerobot_keys(model.state_dict()), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_processors(folder, VLM_DIR, cfg["tokenizer_max_length"], cfg["pad_language_to"],
                     {**cfg["input_features"], **cfg["output_features"]})
    if info is not None:
        info.update(build_s=t1 - t0, save_s=time.perf_counter() - t1, dtype="float32",
                    file_bytes=(folder / "model.safetensors").stat().st_size,
                    params_in_file=sum(p.numel() for p in model.parameters()))
    return folder


# ---------------------------------------------------------------------------------------------- pi0

PI0_PREFIX = "model.paligemma_with_expert."
PI0_EMBED_KEY = PI0_PREFIX + "paligemma.model.language_model.embed_tokens.weight"
PI0_HEAD_KEY = PI0_PREFIX + "paligemma.lm_head.weight"           # LeRobot stores the tied table under this name
PI0_VLM_NORM_KEY = PI0_PREFIX + "paligemma.model.language_model.norm.weight"
PI0_EXPERT_HEAD_KEY = PI0_PREFIX + "gemma_expert.lm_head.weight"
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PALIGEMMA_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]      # ids 0..3, as in PaliGemma's tokenizer


@dataclass(frozen=True)
class Lazy:
    """A tensor made only when it is written, so it never sits in memory beside the whole model."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def write_safetensors(path: Path, tensors: Mapping[str, Union[torch.Tensor, Lazy]],
                      metadata: Optional[dict[str, str]] = None) -> int:
    """
    Write a safetensors file one tensor at a time; return its size in bytes.

    ``safetensors.torch.save_file`` first serializes every tensor to bytes, a second copy of
    the whole model (7 GB for pi0 in bfloat16); this writes the header, then each tensor's
    own memory. Tensors are stored in name order, contiguous, little-endian.
    """
    names = sorted(tensors)
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in names:
        t = tensors[name]
        nbytes = int(np.prod(t.shape, dtype=np.int64)) * _element_size(t.dtype)
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in names:
            t = tensors[name]
            tensor = t.make() if isinstance(t, Lazy) else t
            if tuple(tensor.shape) != tuple(t.shape) or tensor.dtype != t.dtype:
                raise ValueError(f"{name}: made {tuple(tensor.shape)} {tensor.dtype}, declared {t.shape} {t.dtype}")
            f.write(memoryview(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()))
            del tensor
    return 8 + len(raw) + offset


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules directly in ``dtype`` (no float32 copy first)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def pi0_saved_rules() -> KeyRules:
    """
    Return the pi0 key rules LeRobot's file layout uses, to invert for saving.

    LeRobot-rooted names only (not openpi's); the tied embedding table is stored as
    ``paligemma.lm_head`` (LeRobot's ``save_model`` keeps that name and records the tie).
    """
    return [(src, dst) for src, dst in pi0_family.key_rules()
            if dst is not None and src.startswith("model.") and not PI0_EMBED_KEY.startswith(src)]


def pi0_lerobot_keys(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map pi0 module keys -> LeRobot 0.4.4 checkpoint keys, each checked to load back through ``pi0.key_rules``."""
    return to_lerobot_keys(state_dict, pi0_family.key_rules(), pi0_saved_rules())


def pi0_lerobot_config(cameras: int, dims: Optional[dict] = None) -> dict:
    """Return LeRobot 0.4.4's pi0 ``config.json`` dict with ``cameras`` 224x224 cameras (``dims``: tiny_dims)."""
    _check_cameras(cameras)
    rest = copy.deepcopy(LEROBOT_PI0_DEFAULTS)
    if dims is not None and "image_size" in dims:
        rest["image_resolution"] = [dims["image_size"]] * 2
    size = rest["image_resolution"]
    features = {"observation.state": {"type": "STATE", "shape": [STATE_DIM]}}
    for i in range(cameras):
        features[f"observation.images.cam{i}"] = {"type": "VISUAL", "shape": [3, *size]}
    return {"type": rest.pop("type"), "n_obs_steps": rest.pop("n_obs_steps"), "input_features": features,
            "output_features": {"action": {"type": "ACTION", "shape": [ACTION_DIM]}}, **rest}


def pi0_model_config(cameras: int, dims: Optional[dict] = None) -> PiConfig:
    """Return the ``PiConfig`` that ``load_policy`` reads from the bench's pi0 checkpoint."""
    return PiConfig.from_checkpoint(pi0_lerobot_config(cameras, dims), dims)


def pi0_extra_tensors(config: PiConfig, dtype: torch.dtype, generator: torch.Generator) -> dict[str, Lazy]:
    """
    Return the tensors LeRobot's pi0 file holds that inference never reads.

    The VLM's final norm (Gemma inits it to zeros) and the expert's LM head. ``load_policy``
    skips both; they are written so the file is LeRobot's layout and its published size.
    """
    vocab, width = config.backbone.vocab_size, config.backbone.expert.width
    return {PI0_VLM_NORM_KEY: Lazy((config.backbone.vlm.width,), dtype,
                                   lambda: torch.zeros(config.backbone.vlm.width, dtype=dtype)),
            PI0_EXPERT_HEAD_KEY: Lazy((vocab, width), dtype,
                                      lambda: torch.empty(vocab, width, dtype=dtype).normal_(0.0, 0.02,
                                                                                             generator=generator))}


def write_pi_tokenizer(folder: Path) -> None:
    """
    Write a small PaliGemma-like tokenizer (``tokenizer.json`` + special tokens): what ``TextTokenizer`` reads.

    Ids as PaliGemma's: <pad> 0, <eos> 1, <bos> 2, <unk> 3; ' ' becomes '▁'; one token per
    printable ASCII character, UTF-8 byte fallback for the rest; <bos> prepended, no <eos>.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, processors

    folder.mkdir(parents=True, exist_ok=True)
    pieces = PALIGEMMA_SPECIAL_TOKENS + [f"<0x{b:02X}>" for b in range(256)] + ["▁"]
    pieces += [chr(c) for c in range(33, 127)]
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[], unk_token="<unk>",
                               byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                       special_tokens=[("<bos>", 2)])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(PALIGEMMA_SPECIAL_TOKENS)
    tok.save(str(folder / "tokenizer.json"))
    special = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        **special, "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
        "clean_up_tokenization_spaces": False, "extra_special_tokens": {}}, indent=2))


def write_pi0_processors(folder: Path, config: dict, tokenizer_name: str, padding: str = "max_length") -> None:
    """Write LeRobot 0.4.4's pi0 pre/post-processor pipelines with identity statistics (mean 0, std 1)."""
    stats = {}
    for key, dim in (("observation.state", STATE_DIM), ("action", ACTION_DIM)):
        stats.update({f"{key}.mean": np.zeros(dim, np.float32), f"{key}.std": np.ones(dim, np.float32),
                      f"{key}.min": -np.ones(dim, np.float32), f"{key}.max": np.ones(dim, np.float32)})
    pre_file = "policy_preprocessor_step_5_normalizer_processor.safetensors"
    post_file = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    save_numpy(stats, str(folder / pre_file))
    save_numpy(stats, str(folder / post_file))
    norm_map = config["normalization_mapping"]
    features = {**config["input_features"], **config["output_features"]}
    device = {"registry_name": "device_processor", "config": {"device": config["device"], "float_dtype": None}}
    (folder / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "pi0_new_line_processor", "config": {}},
        {"registry_name": "tokenizer_processor",
         "config": {"max_length": config["tokenizer_max_length"], "task_key": "task", "padding_side": "right",
                    "padding": padding, "truncation": True, "tokenizer_name": tokenizer_name}},
        device,
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8, "features": features, "norm_map": norm_map},
         "state_file": pre_file}]}, indent=2))
    (folder / "policy_postprocessor.json").write_text(json.dumps({"name": "policy_postprocessor", "steps": [
        {"registry_name": "unnormalizer_processor",
         "config": {"eps": 1e-8, "features": config["output_features"], "norm_map": norm_map},
         "state_file": post_file},
        device]}, indent=2))


def save_random_pi0_checkpoint(folder: Path, cameras: int, seed: int = 0, dtype: str = "bfloat16",
                               dims: Optional[dict] = None, info: Optional[dict] = None,
                               padding: str = "max_length") -> Path:
    """
    Write a random-weight LeRobot 0.4.4 pi0 checkpoint (published sizes unless ``dims``); returns ``folder``.

    The model is built directly in ``dtype`` and streamed to ``model.safetensors``, so the peak is
    one copy of the weights (about 6.5 GB in bfloat16, 13 GB in float32) plus the largest tensor.
    ``dims`` (tests) is written as ``tiny_dims.json``, the loader's own size override: the files
    and key names are otherwise those of the real-size checkpoint.
    """
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
    torch_dtype = TORCH_DTYPES[dtype]
    t0 = time.perf_counter()
    config = pi0_lerobot_config(cameras, dims)
    model_cfg = PiConfig.from_checkpoint(config, dims)
    folder.mkdir(parents=True, exist_ok=True)
    if dims is not None:
        (folder / "tiny_dims.json").write_text(json.dumps(dims, indent=2))
    write_pi_tokenizer(folder / TOKENIZER_DIR)
    (folder / "config.json").write_text(json.dumps(config, indent=4))
    write_pi0_processors(folder, config, TOKENIZER_DIR, padding)
    generator = torch.Generator().manual_seed(seed)
    with default_dtype(torch_dtype):
        model = pi0_family.Pi0(model_cfg)
    init_weights(model, generator)
    params = sum(p.numel() for p in model.parameters())
    t1 = time.perf_counter()
    tensors: dict[str, Union[torch.Tensor, Lazy]] = dict(pi0_lerobot_keys(model.state_dict()))
    extra = pi0_extra_tensors(model_cfg, torch_dtype, generator)
    tensors.update(extra)
    nbytes = write_safetensors(folder / "model.safetensors", tensors, metadata={PI0_EMBED_KEY: PI0_HEAD_KEY})
    del tensors, model
    if info is not None:
        info.update(build_s=t1 - t0, save_s=time.perf_counter() - t1, dtype=dtype, file_bytes=nbytes,
                    params_in_file=params + sum(int(np.prod(t.shape)) for t in extra.values()))
    return folder
