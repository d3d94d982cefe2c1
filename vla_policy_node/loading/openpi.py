# SPDX-License-Identifier: Apache-2.0
r"""
openpi's PyTorch checkpoint layout: ``config.json``, ``model.safetensors``, ``assets/<id>/norm_stats.json``.

openpi configs carry no LeRobot ``type``; they are recognised by their own
fields (``action_horizon``, ``paligemma_variant``) and translated into the
LeRobot-style dict the pi0/pi0.5 families read. Robot feature names are not
part of an openpi checkpoint: the cameras are openpi's standard three.

The prompt follows openpi's ``PaligemmaTokenizer.tokenize`` and ``TokenizePrompt``
(``src/openpi/models/tokenizer.py``, ``src/openpi/transforms.py``), which differ from
LeRobot's pi0/pi0.5 processors:

- the task is cleaned: stripped, ``_`` and newlines turned into spaces;
- pi0.5 with ``discrete_state_input`` (openpi's default for pi0.5) discretizes the robot's
  *own* normalized state (e.g. 8 values for LIBERO), because openpi tokenizes before
  ``PadStatesAndActions``; LeRobot 0.4 discretizes all ``max_state_dim`` values;
- otherwise (pi0, or ``discrete_state_input: false`` as in ``pi05_libero``) the prompt is
  the cleaned task, BOS first, followed by ``"\n"`` tokenized on its own.

openpi's converter writes only ``action_dim``, ``action_horizon`` and the variants to
``config.json``; ``pi05``, ``discrete_state_input``, ``max_token_len`` and ``num_steps``
are read when present (openpi's training config holds them), with openpi's defaults.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from vla_policy_node.loading import checkpoint as ckpt
from vla_policy_node.model.normalization import Normalizer
from vla_policy_node.model.preprocessing import ImageTransform, PromptFn
from vla_policy_node.model.tokenizer import Prompt

OPENPI_CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
STATE_BINS = 256
NORM_EPS = 1e-6     # openpi.transforms.Normalize: (std + 1e-6), (q99 - q01 + 1e-6)


def is_openpi_config(config: dict) -> bool:
    return "type" not in config and "action_horizon" in config and "paligemma_variant" in config


def lerobot_style_config(config: dict, state_dim: int, action_dim: int, image_size: int = 224) -> dict:
    """Translate to the fields of a LeRobot pi0/pi0.5 ``config.json`` that an openpi config implies."""
    pi05 = bool(config.get("pi05", False))
    max_dim = int(config.get("action_dim", 32))
    image = {"type": "VISUAL", "shape": [3, image_size, image_size]}
    return {
        "type": "pi05" if pi05 else "pi0",
        "paligemma_variant": config["paligemma_variant"],
        "action_expert_variant": config.get("action_expert_variant", "gemma_300m"),
        "chunk_size": int(config["action_horizon"]),
        "max_state_dim": max_dim,
        "max_action_dim": max_dim,
        "num_inference_steps": int(config.get("num_steps", 10)),
        "min_period": 4e-3,
        "max_period": 4.0,
        "tokenizer_max_length": int(config.get("max_token_len", 200 if pi05 else 48)),
        "empty_cameras": 0,
        "image_resolution": [image_size, image_size],
        "input_features": {**{f"observation.images.{c}": image for c in OPENPI_CAMERAS},
                           "observation.state": {"type": "STATE", "shape": [state_dim]}},
        "output_features": {"action": {"type": "ACTION", "shape": [action_dim]}},
    }


def discrete_state_input(config: dict) -> bool:
    """Read ``Pi0Config.discrete_state_input`` as openpi does: defaults to ``pi05``; never for pi0."""
    pi05 = ckpt.config_value(config, "pi05", bool, False, "config.json")
    return pi05 and ckpt.config_value(config, "discrete_state_input", bool, pi05, "config.json")


def clean_task(task: str) -> str:
    """Clean the task as openpi does: strip, then ``_`` and newlines become spaces."""
    return task.strip().replace("_", " ").replace("\n", " ")


def state_bins(normalized_state: np.ndarray) -> np.ndarray:
    """(D,) normalized state -> (D,) ints: 256 equal bins over [-1, 1], no padding (``np.digitize`` - 1)."""
    edges = np.linspace(-1.0, 1.0, STATE_BINS + 1)[:-1]
    return np.digitize(np.asarray(normalized_state).reshape(-1), edges) - 1


def openpi_prompt(discrete_state: bool) -> PromptFn:
    """Build the prompt openpi tokenizes: with the state's bins (pi0.5 default), or the task and a lone newline."""
    def with_state(task: str, state: np.ndarray) -> Prompt:
        bins = " ".join(str(int(b)) for b in state_bins(state))
        return f"Task: {clean_task(task)}, State: {bins};\nAction: "

    def plain(task: str, state: np.ndarray) -> Prompt:
        return clean_task(task), "\n"

    return with_state if discrete_state else plain


def norm_stats_file(folder: Path) -> Path:
    """Find the single ``assets/<id>/norm_stats.json`` of the checkpoint."""
    assets = ckpt.inside(folder, "assets")
    found = sorted(assets.glob("*/norm_stats.json")) if assets.is_dir() else []
    if len(found) != 1:
        raise ckpt.CheckpointError(f"{folder}: expected exactly one assets/<id>/norm_stats.json, found {len(found)}")
    return ckpt.inside(folder, str(found[0].relative_to(folder)))


def openpi_normalizers(folder: Path, pi05: bool) -> tuple[Normalizer, Normalizer]:
    """
    (state normalizer, action un-normalizer): z-score for pi0, q01/q99 quantiles for pi0.5, as openpi.

    openpi reads ``norm_stats.json`` as float64 and computes in float64 with the epsilon
    always added (``normalization`` module, ``openpi`` convention).
    """
    raw = ckpt.read_json(norm_stats_file(folder)).get("norm_stats", {})
    mode = "QUANTILES" if pi05 else "MEAN_STD"
    out = []
    for key in ("state", "actions"):
        entry = raw.get(key)
        if not isinstance(entry, dict):
            raise ckpt.CheckpointError(f"{folder}: norm_stats.json has no {key!r} statistics")
        try:
            stats = {k: np.asarray(v, dtype=np.float64) for k, v in entry.items() if isinstance(v, list)}
            out.append(Normalizer(mode, stats, eps=NORM_EPS, convention="openpi"))
        except (TypeError, ValueError) as exc:
            raise ckpt.CheckpointError(f"{folder}: norm_stats.json {key}: {exc}") from exc
    return out[0], out[1]


def openpi_image(size: int) -> ImageTransform:
    """
    Build openpi's image preprocessing: resize keeping the aspect ratio, centre-pad with black.

    openpi resizes uint8 frames with PIL (bilinear, antialiased when shrinking) and pads
    with 0 before mapping to [-1, 1], so padding ends at -1 (LeRobot's pi0 ends at -3).
    The antialiased bilinear resize here matches PIL's to about one uint8 step.
    """
    def transform(img: Tensor) -> Tensor:          # (B, 3, H, W) in [0, 1]
        h, w = img.shape[-2:]
        if (h, w) != (size, size):
            ratio = max(w / size, h / size)
            rh, rw = max(1, int(h / ratio)), max(1, int(w / ratio))
            img = F.interpolate(img, size=(rh, rw), mode="bilinear", align_corners=False, antialias=True)
            img = (img * 255.0).round() / 255.0        # openpi resizes uint8 images
            top, left = (size - rh) // 2, (size - rw) // 2
            img = F.pad(img, (left, size - rw - left, top, size - rh - top), value=0.0)
        return img * 2.0 - 1.0
    return transform
