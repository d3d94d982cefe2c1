"""Reading a checkpoint folder safely: JSON configs, safetensors weights, normalization statistics.

Only safetensors and JSON are ever read: a pickle-based file (``.bin``,
``.pt``, ``.ckpt``, ``.pkl``) is refused with the reason, because unpickling
runs arbitrary code. Every path a checkpoint names is resolved and must stay
inside the checkpoint folder, and the folder inside the allowed roots.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from safetensors.numpy import load_file

from .normalization import Normalizer

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_JSON_BYTES = 16 * 2**20


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded, with the reason."""


def checkpoint_dir(path: str | Path, allowed_roots: Sequence[str | Path] = ()) -> Path:
    """Resolve the folder and check it lies under one of ``allowed_roots`` (when any are given)."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist")
    roots = [Path(r).expanduser().resolve() for r in allowed_roots]
    if roots and not any(folder == r or r in folder.parents for r in roots):
        raise CheckpointError(f"checkpoint folder {folder} is outside the allowed roots {[str(r) for r in roots]}")
    return folder


def inside(folder: Path, name: str) -> Path:
    """``folder / name`` resolved (symlinks too); refuses anything that escapes ``folder``."""
    path = (folder / name).resolve()
    if path != folder and folder not in path.parents:
        raise CheckpointError(f"{name!r} resolves to {path}, outside the checkpoint folder {folder}")
    return path


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"missing {path.name} in {path.parent}")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise CheckpointError(f"{path} is larger than {MAX_JSON_BYTES} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def weights_file(folder: Path) -> Path:
    """``model.safetensors``; a pickle-only checkpoint is refused, saying why."""
    path = inside(folder, "model.safetensors")
    if path.is_file():
        return path
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f"{folder} holds only pickle-based weights {pickles}; they are refused because loading a pickle "
            "can run arbitrary code. Convert them to model.safetensors with the training framework.")
    raise CheckpointError(f"missing model.safetensors in {folder}")


def load_stats(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Flat ``feature.stat`` safetensors (LeRobot processor state) -> {feature: {stat: array}}."""
    try:
        flat = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"cannot read normalization statistics {path}: {exc}") from exc
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, value in flat.items():
        feature, _, stat = key.rpartition(".")
        stats.setdefault(feature, {})[stat] = value.astype(np.float32)
    return stats


def lerobot_processor_stats(folder: Path, config_name: str, step: str) -> tuple[dict, dict, float]:
    """Statistics, norm map and eps of the ``step`` of a LeRobot processor pipeline file."""
    pipeline = read_json(inside(folder, config_name))
    for entry in pipeline.get("steps", []):
        if entry.get("registry_name") == step:
            cfg = entry.get("config", {})
            state_file = entry.get("state_file")
            if not state_file:
                raise CheckpointError(f"{config_name}: step {step} names no state_file")
            return load_stats(inside(folder, state_file)), cfg.get("norm_map", {}), float(cfg.get("eps", 1e-8))
    raise CheckpointError(f"{config_name} has no {step} step")


def processor_step_config(folder: Path, config_name: str, step: str) -> Optional[dict]:
    """The ``config`` of one step of a LeRobot processor pipeline, or None if absent."""
    path = inside(folder, config_name)
    if not path.is_file():
        return None
    for entry in read_json(path).get("steps", []):
        if entry.get("registry_name") == step:
            return entry.get("config", {})
    return None


def lerobot_normalizers(folder: Path, state_key: str = "observation.state") -> tuple[Normalizer, Normalizer]:
    """(state normalizer, action un-normalizer) from LeRobot's pre/post-processor files."""
    pre, pre_map, eps = lerobot_processor_stats(folder, "policy_preprocessor.json", "normalizer_processor")
    post, post_map, post_eps = lerobot_processor_stats(folder, "policy_postprocessor.json", "unnormalizer_processor")
    state = Normalizer(pre_map.get("STATE", "IDENTITY"), pre.get(state_key, {}), eps)
    action = Normalizer(post_map.get("ACTION", "IDENTITY"), post.get("action", {}), post_eps)
    return state, action
