# SPDX-License-Identifier: Apache-2.0
"""load_policy / build_tiny_policy: a checkpoint folder (or the tiny config) -> a ready ``Policy``."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import nn

from vla_policy_node.loading import checkpoint as ckpt
from vla_policy_node.model.blocks import DecoderSpec, fuse_projections, pack_linears
from vla_policy_node.loading import generation as generations
from vla_policy_node.loading import processors
from vla_policy_node.loading import sizes
from vla_policy_node.loading import openpi
from vla_policy_node.model.families import FAMILIES, SMOLVLA, Family, pi05, smolvla
from vla_policy_node.model.families.paligemma import PiConfig, lerobot_image_pad_value, prepare_image
from vla_policy_node.model.normalization import Normalizer
from vla_policy_node.runtime.policy import Policy, resolve_device, resolve_dtype
from vla_policy_node.model.int8_linear import quantize_linears
from vla_policy_node.model.precision import cast_model, INT8, load_dtype_name
from vla_policy_node.model.preprocessing import (camera_key, ImageTransform, newline_prompt, Preprocessor, PromptFn,
                                                 smolvla_image)
from vla_policy_node.model.tokenizer import PADDING_SIDES, ByteTokenizer, TextTokenizer
from vla_policy_node.model.vision import VisionSpec
from vla_policy_node.loading.weights import build_model, prefix_key_map

log = logging.getLogger(__name__)

PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"   # LeRobot's default for pi0 / pi0.5


def load_policy(checkpoint_dir: str | Path, device: str | torch.device = "auto", dtype: str = "float32",
                allowed_roots: Sequence[str | Path] = (), attention_backend: str = "sdpa",
                seed: int = 0, pack_weights: bool = True, lerobot_version: Optional[str] = None) -> Policy:
    """
    Load a LeRobot (or openpi) checkpoint folder; the family is read from its config.

    ``pack_weights=False`` skips the oneDNN-packed copies of the CPU weights that run
    (nearly as large as the weights): less memory, slower matmuls (see ``packed_linear``).
    The LeRobot release that wrote a LeRobot checkpoint is recognised from its files
    (``lerobot_generation``); ``lerobot_version`` ("0.4.4", "0.5"), else ``vla_policy_node.json``
    in the folder, picks where the files allow several, and must agree with them.
    """
    folder = ckpt.checkpoint_dir(checkpoint_dir, allowed_roots)
    config = ckpt.read_json(ckpt.inside(folder, "config.json"))
    if openpi.is_openpi_config(config):
        backbone = "paligemma"
    else:
        kind = config.get("type")
        if not isinstance(kind, str) or kind not in FAMILIES:
            raise ckpt.CheckpointError(f"{folder}/config.json: unknown policy type {kind!r:.40}; "
                                       f"supported: {sorted(FAMILIES)} and openpi checkpoints")
        backbone = FAMILIES[kind].backbone
        ckpt.check_bool_fields(config, ckpt.LEROBOT_BOOL_FIELDS, f"{folder}/config.json")
    torch_device, note = resolve_device(device)
    if note:
        log.warning(note)
    torch_dtype, int8 = _precision(dtype, torch_device)
    policy = LOADERS[backbone](folder, config, torch_device, torch_dtype, attention_backend, seed,
                               pack_weights and not int8, lerobot_version)
    if int8:
        quantize_linears(policy.model)          # int8 weights take the packed copies' place
    log.info("loaded %s", policy.describe())
    return policy


def _precision(dtype: str, device: torch.device) -> tuple[torch.dtype, bool]:
    """Return the dtype a ``dtype`` setting loads the model in, and whether its linears then go int8."""
    int8 = dtype == INT8
    if int8 and device.type != "cpu":
        raise ValueError(f"dtype int8 runs on the CPU only, not on {device}; use float32 or bfloat16 there")
    return resolve_dtype(load_dtype_name(dtype)), int8


def _smolvla(folder: Path, config: dict, device: torch.device, dtype: torch.dtype, backend: str,
             seed: int, pack_weights: bool, lerobot_version: Optional[str]) -> Policy:
    vlm_name = ckpt.config_value(config, "vlm_model_name", str, "", "config.json")
    vlm_dir = ckpt.inside(folder, vlm_name)
    vlm_in_checkpoint = (vlm_dir / "config.json").is_file()
    if vlm_in_checkpoint:
        vlm_cfg = ckpt.read_json(vlm_dir / "config.json")
    elif vlm_name in smolvla.KNOWN_VLMS:
        vlm_cfg = smolvla.KNOWN_VLMS[vlm_name]
    else:
        raise ckpt.CheckpointError(f"SmolVLA backbone config {vlm_name!r} not found at {vlm_dir}/config.json")
    tok_cfg = ckpt.processor_step_config(folder, "policy_preprocessor.json", "tokenizer_processor") or {}
    source = "policy_preprocessor.json tokenizer_processor"
    tok_name = ckpt.config_value(tok_cfg, "tokenizer_name", str, vlm_name, source)
    generation = _generation(folder, config, lerobot_version, tok_name,
                             vlm_cfg if vlm_in_checkpoint else None, f"{vlm_name}/config.json")
    try:
        cfg = smolvla.SmolVLAConfig.from_lerobot(
            config, vlm_cfg, "transformers5" if generation.transformers5 else "transformers4")
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ckpt.CheckpointError(f"{folder}/config.json: invalid SmolVLA configuration: {exc!r}") from exc
    steps = _pipelines(folder, config, cfg.action_dim, cfg.state_dim)
    _check_sizes(folder, cfg, len(cfg.camera_names), device, pack_weights)
    model = build_model(lambda: SMOLVLA.network(cfg, backend), cfg, ckpt.weights_file(folder),
                        prefix_key_map(SMOLVLA.key_rules()))
    tokenizer = TextTokenizer(ckpt.tokenizer_file(folder, tok_name))
    state_norm, action_norm = ckpt.lerobot_normalizers(folder)
    pre = Preprocessor(
        camera_names=cfg.camera_names, image_size=cfg.image_size, image_transform=smolvla_image(*cfg.image_size),
        tokenizer=tokenizer, prompt=newline_prompt if steps.newline else _task_prompt,
        **_prompt_settings(tok_cfg, cfg.tokenizer_max_length, cfg.pad_language_to, source),
        padding_side=_padding_side(tok_cfg, source), camera_renames=steps.camera_renames,
        state_normalizer=state_norm, state_dim=cfg.state_dim, max_state_dim=cfg.max_state_dim, device=device)
    return Policy(SMOLVLA.name, ready_model(model, device, dtype, pack_weights), pre, action_norm, cfg.action_dim,
                  cfg.num_steps, device, seed, relative_actions=steps.relative, provenance=generation.describe())


def _task_prompt(task: str, state: np.ndarray) -> str:
    """Build the prompt of a pipeline without a new-line step: the task as given."""
    return task


def _generation(folder: Path, config: dict, override: Optional[str], tokenizer_name: str,
                vlm_config: Optional[dict] = None, vlm_where: str = "") -> generations.Generation:
    """Recognise the LeRobot that wrote ``folder`` from its files (and the user's override)."""
    tok_config, tok_where = None, ""
    tok_dir = folder / tokenizer_name
    if not Path(tokenizer_name).is_absolute() and tok_dir.is_dir():
        tok_path = ckpt.inside(folder, f"{tokenizer_name}/tokenizer_config.json")
        if tok_path.is_file():
            tok_config, tok_where = ckpt.read_json(tok_path), f"{tokenizer_name}/tokenizer_config.json"
    found = generations.markers(
        config, ckpt.pipeline_steps(folder, processors.PRE), ckpt.pipeline_steps(folder, processors.POST),
        tok_config, vlm_config, tok_where, vlm_where)
    if override is not None:
        text, source = override, "lerobot_version"
    else:
        recorded = ckpt.lerobot_version(folder)
        text = None if recorded is None else ".".join(map(str, recorded))
        source = ckpt.SETTINGS_FILE
    version = None if text is None else ckpt.parse_version(text, source)
    try:
        generation = generations.recognise(found, version, text, folder)
    except generations.GenerationError as exc:
        raise ckpt.CheckpointError(str(exc)) from exc
    log.info("%s: read as written by %s", folder, generation.describe())
    return generation


def _pipelines(folder: Path, config: dict, action_dim: int, state_dim: int) -> processors.Pipelines:
    """Every step of the saved pre/post-processors, implemented or refused by name."""
    try:
        return processors.read_pipelines(
            config.get("type", ""), config, ckpt.pipeline_steps(folder, processors.PRE),
            ckpt.pipeline_steps(folder, processors.POST), action_dim, state_dim)
    except processors.ProcessorError as exc:
        raise ckpt.CheckpointError(f"{folder}: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class PiCheckpoint:
    """
    A pi0 / pi0.5 checkpoint as its layout's reader found it (``_read_openpi``, ``_read_lerobot``).

    ``config``: LeRobot's config.json form; ``tokenizer``: the tokenizer step's settings;
    ``pipelines``, ``prompt`` and ``image``: what depends on the model's config, built once it is known.
    """

    config: dict
    state_norm: Normalizer
    action_norm: Normalizer
    tokenizer: dict
    tokenizer_name: str
    pipelines: Callable[[PiConfig], Optional[processors.Pipelines]]
    prompt: Callable[[PiConfig, Optional[processors.Pipelines]], PromptFn]
    image: Callable[[int], ImageTransform]
    provenance: str


TOKENIZER_SOURCE = "policy_preprocessor.json tokenizer_processor"


def _read_openpi(folder: Path, config: dict, tiny: Optional[dict]) -> PiCheckpoint:
    """Read openpi's layout: its converter's config.json and ``assets/<id>/norm_stats.json``."""
    openpi_prompt = openpi.openpi_prompt(openpi.discrete_state_input(config))
    is_pi05 = ckpt.config_value(config, "pi05", bool, False, "config.json")
    state_norm, action_norm = openpi.openpi_normalizers(folder, is_pi05)
    image_size = (tiny or {}).get("image_size", 224)
    config = openpi.lerobot_style_config(config, state_norm.dim or 0, action_norm.dim or 0, image_size)
    tok_cfg = {"tokenizer_name": PALIGEMMA_TOKENIZER, "max_length": config["tokenizer_max_length"],
               "padding": "max_length"}
    return PiCheckpoint(
        config, state_norm, action_norm, tok_cfg, _tokenizer_name(tok_cfg), pipelines=lambda cfg: None,
        prompt=lambda cfg, steps: openpi_prompt, image=openpi.openpi_image, provenance="openpi")


def _read_lerobot(folder: Path, config: dict, lerobot_version: Optional[str]) -> PiCheckpoint:
    """Read LeRobot's layout: config.json, the saved pre/post-processors and their statistics."""
    state_norm, action_norm = ckpt.lerobot_normalizers(folder)
    tok_cfg = ckpt.processor_step_config(folder, "policy_preprocessor.json", "tokenizer_processor") or {}
    tok_name = _tokenizer_name(tok_cfg)
    generation = _generation(folder, config, lerobot_version, tok_name)
    family: Family = FAMILIES[config["type"]]
    pad_value = lerobot_image_pad_value(generation.version)

    def prompt(cfg: PiConfig, steps: Optional[processors.Pipelines]) -> PromptFn:
        if family.state_in_prompt:
            pad_bins = not generation.transformers5     # LeRobot >= 0.5 bins only the robot's own state dims
            return lambda task, state: pi05.pi05_prompt(task, state, cfg.max_state_dim, pad_bins)
        return newline_prompt if steps.newline else _task_prompt

    def image(size: int) -> ImageTransform:
        return lambda img: prepare_image(img, size, pad_value)
    return PiCheckpoint(
        config, state_norm, action_norm, tok_cfg, tok_name,
        pipelines=lambda cfg: _pipelines(folder, config, cfg.action_dim, cfg.state_dim),
        prompt=prompt, image=image, provenance=generation.describe())


def _tokenizer_name(tok_cfg: dict) -> str:
    return ckpt.config_value(tok_cfg, "tokenizer_name", str, PALIGEMMA_TOKENIZER, TOKENIZER_SOURCE)


def _pi(folder: Path, config: dict, device: torch.device, dtype: torch.dtype, backend: str, seed: int,
        pack_weights: bool, lerobot_version: Optional[str] = None) -> Policy:
    """pi0 / pi0.5 from LeRobot's layout, or from openpi's (``assets/<id>/norm_stats.json``)."""
    tiny = ckpt.tiny_sizes(folder)      # a test checkpoint's sizes (see tiny_sizes)
    if tiny is not None:
        log.info("%s: sized by its %s (a test checkpoint)", folder, ckpt.TINY_SIZES)
    read = (_read_openpi(folder, config, tiny) if openpi.is_openpi_config(config)
            else _read_lerobot(folder, config, lerobot_version))
    config = read.config
    family: Family = FAMILIES[config["type"]]
    try:
        cfg = PiConfig.from_checkpoint(config, tiny)
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ckpt.CheckpointError(f"{folder}/config.json: invalid {config['type']} configuration: {exc!r}") from exc
    steps = read.pipelines(cfg)
    _check_sizes(folder, cfg, len(cfg.camera_names) + cfg.empty_cameras, device, pack_weights)
    model = build_model(lambda: family.network(cfg, backend), cfg, ckpt.weights_file(folder),
                        prefix_key_map(family.key_rules()))
    pre = Preprocessor(
        camera_names=cfg.camera_names, image_size=cfg.image_size, image_transform=read.image(cfg.image_size[0]),
        tokenizer=TextTokenizer(ckpt.tokenizer_file(folder, read.tokenizer_name)), prompt=read.prompt(cfg, steps),
        **_prompt_settings(read.tokenizer, cfg.tokenizer_max_length, "max_length", TOKENIZER_SOURCE),
        padding_side=_padding_side(read.tokenizer, TOKENIZER_SOURCE),
        camera_renames={} if steps is None else steps.camera_renames,
        state_normalizer=read.state_norm, state_dim=cfg.state_dim, max_state_dim=cfg.max_state_dim,
        state_in_prefix=not family.state_in_prompt, empty_cameras=cfg.empty_cameras, device=device)
    return Policy(family.name, ready_model(model, device, dtype, pack_weights), pre, read.action_norm,
                  cfg.action_dim, cfg.num_steps, device, seed,
                  relative_actions=None if steps is None else steps.relative, provenance=read.provenance)


def ready_model(model: nn.Module, device: torch.device, dtype: torch.dtype, pack_weights: bool) -> nn.Module:
    """
    Make a built model final before a Policy wraps it: cast, q/k/v and gate/up matmuls fused, CPU weights packed.

    ``pack_weights`` adds oneDNN-packed copies of the CPU weights (faster matmuls, nearly their size again).
    """
    model = fuse_projections(cast_model(model, device, dtype))
    if pack_weights:
        pack_linears(model)
    return model


def _check_sizes(folder: Path, cfg: Any, cameras: int, device: torch.device, pack_weights: bool) -> None:
    """Refuse declared sizes beyond their bounds, and a model whose weights and inference do not fit."""
    ckpt.check_config_types(cfg, "config.json")
    beyond = sizes.bounded_fields(cfg, f"{folder}/config.json")
    if beyond is not None:
        raise ckpt.CheckpointError(beyond)
    weights = ckpt.weights_file(folder).stat().st_size * (2 if pack_weights and device.type == "cpu" else 1)
    need = weights + sizes.working_bytes(cfg, cameras)
    free = sizes.available_bytes(device)
    if need > free:
        gib = 2**30
        raise ckpt.CheckpointError(
            f"{folder}: needs about {need / gib:.1f} GiB on {device} ({weights / gib:.1f} GiB of weights"
            f"{' and their packed copies' if weights and pack_weights and device.type == 'cpu' else ''}, "
            f"{(need - weights) / gib:.1f} GiB to run the sizes config.json declares); {free / gib:.1f} GiB is free")


# backbone -> the reader of its checkpoint layout
LOADERS: dict[str, Callable[..., Policy]] = {"smolvlm": _smolvla, "paligemma": _pi}


def _prompt_settings(tok_cfg: dict, max_length: int, padding: str, source: str) -> dict[str, Any]:
    """Read ``max_length`` (>= 1) and ``padding`` (``max_length`` or ``longest``) of LeRobot's tokenizer step."""
    length = ckpt.config_value(tok_cfg, "max_length", int, max_length, source)
    mode = ckpt.config_value(tok_cfg, "padding", str, padding, source)
    if not 1 <= length <= sizes.LIMITS["tokenizer_max_length"]:
        raise ckpt.CheckpointError(f"{source}: max_length must be in 1..{sizes.LIMITS['tokenizer_max_length']}, "
                                   f"got {length}")
    if mode not in ("max_length", "longest"):
        raise ckpt.CheckpointError(f"{source}: padding must be 'max_length' or 'longest', got {mode!r:.40}")
    return {"max_length": length, "padding": mode}


def _padding_side(tok_cfg: dict, source: str) -> str:
    """Read ``padding_side`` of LeRobot's tokenizer step (left or right; right when not recorded)."""
    side = ckpt.config_value(tok_cfg, "padding_side", str, "right", source)
    if side not in PADDING_SIDES:
        raise ckpt.CheckpointError(f"{source}: padding_side must be one of {PADDING_SIDES}, got {side!r:.40}")
    return side


def tiny_smolvla_config(camera_names: Sequence[str], state_dim: int, action_dim: int, chunk_size: int,
                        num_steps: int) -> smolvla.SmolVLAConfig:
    """Configure a SmolVLA small enough for CPU tests: 4 tokens per camera, 4 VLM and 4 expert layers."""
    text = DecoderSpec(width=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, mlp_width=128)
    return smolvla.SmolVLAConfig(
        text=text,
        expert=DecoderSpec(width=48, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, mlp_width=128),
        vision=VisionSpec(image_size=32, patch_size=8, width=32, num_layers=2, num_heads=2, mlp_width=64),
        vocab_size=ByteTokenizer.vocab_size, scale_factor=2, chunk_size=chunk_size, max_state_dim=32,
        max_action_dim=32, num_steps=num_steps, self_attn_every_n_layers=2, image_size=(32, 32),
        tokenizer_max_length=32, pad_language_to="max_length",
        camera_names=tuple(camera_key(c) for c in camera_names), state_dim=state_dim, action_dim=action_dim)


def init_weights(model: nn.Module, generator: torch.Generator) -> None:
    """N(0, 0.02) for linear, conv and embedding weights, zero biases; norms keep their ones."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv2d)):
            with torch.no_grad():
                module.weight.normal_(0.0, 0.02, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()


def build_tiny_policy(camera_names: Sequence[str] = ("front",), state_dim: int = 6, action_dim: int = 6,
                      chunk_size: int = 16, num_steps: int = 5, device: str | torch.device = "cpu",
                      dtype: str = "float32", seed: int = 0, attention_backend: str = "sdpa",
                      padding: str = "max_length") -> Policy:
    """Build the random-weight ``tiny`` policy: real SmolVLA code paths, honest random actions."""
    if not camera_names:
        raise ValueError("the tiny policy needs at least one camera")
    cfg = dataclasses.replace(tiny_smolvla_config(camera_names, state_dim, action_dim, chunk_size, num_steps),
                              pad_language_to=padding)
    model = smolvla.SmolVLA(cfg, attention_backend)
    init_weights(model, torch.Generator().manual_seed(seed))
    identity = {"mean": np.zeros(state_dim, np.float32), "std": np.ones(state_dim, np.float32)}
    torch_device, note = resolve_device(device)
    if note:
        log.warning(note)
    pre = Preprocessor(
        camera_names=cfg.camera_names, image_size=cfg.image_size, image_transform=smolvla_image(*cfg.image_size),
        tokenizer=ByteTokenizer(), max_length=cfg.tokenizer_max_length, padding=cfg.pad_language_to,
        prompt=newline_prompt, state_normalizer=Normalizer("MEAN_STD", identity),
        state_dim=state_dim, max_state_dim=cfg.max_state_dim, device=torch_device)
    action_norm = Normalizer("MEAN_STD", {"mean": np.zeros(action_dim, np.float32),
                                          "std": np.ones(action_dim, np.float32)})
    torch_dtype, int8 = _precision(dtype, torch_device)
    policy = Policy("tiny", ready_model(model, torch_device, torch_dtype, not int8), pre, action_norm, action_dim,
                    num_steps, torch_device, seed)
    if int8:
        quantize_linears(policy.model)          # int8 weights take the packed copies' place
    return policy
