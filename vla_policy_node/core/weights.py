"""Load checkpoint tensors into a model by name, with name and shape asserts.

Only safetensors are read (``safe_open``: no pickle, no code). Tensors are
read one at a time, so weights the runtime never uses (a language-model
head, say) are never materialised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import torch
from safetensors import safe_open
from torch import nn

KeyMap = Callable[[str], Optional[str]]
"""Checkpoint key -> module state-dict key, or None for a tensor the runtime does not use."""


class CheckpointError(ValueError):
    """A checkpoint does not fit the model built from its own config."""


def load_weights(model: nn.Module, path: Path, key_map: KeyMap,
                 aliases: Optional[dict[str, str]] = None) -> dict[str, int]:
    """Copy every tensor of ``path`` that ``key_map`` keeps into ``model``.

    ``aliases`` maps module keys to module keys that share a checkpoint
    tensor (tied embeddings). Raises ``CheckpointError`` on a missing,
    unexpected or mis-shaped tensor; returns counts of loaded and skipped tensors.
    """
    target = model.state_dict()
    loaded: set[str] = set()
    skipped = 0
    unexpected: list[str] = []
    with safe_open(str(path), framework="pt", device="cpu") as f:
        for ckpt_key in f.keys():
            name = key_map(ckpt_key)
            if name is None:
                skipped += 1
                continue
            if name not in target:
                unexpected.append(ckpt_key)
                continue
            shape = tuple(f.get_slice(ckpt_key).get_shape())
            if shape != tuple(target[name].shape):
                raise CheckpointError(
                    f"{path.name}: tensor {ckpt_key} has shape {shape}, the model built from "
                    f"config.json expects {tuple(target[name].shape)} for {name}")
            with torch.no_grad():
                target[name].copy_(f.get_tensor(ckpt_key))
            loaded.add(name)
    for dst, src in (aliases or {}).items():
        if src in loaded and dst in target and dst not in loaded:
            with torch.no_grad():
                target[dst].copy_(target[src])
            loaded.add(dst)
    if unexpected:
        raise CheckpointError(f"{path.name}: unexpected tensors {sorted(unexpected)[:8]}"
                              f"{' ...' if len(unexpected) > 8 else ''}")
    missing = sorted(set(target) - loaded)
    if missing:
        raise CheckpointError(f"{path.name}: missing tensors for {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    return {"loaded": len(loaded), "skipped": skipped}


def prefix_key_map(rules: list[tuple[str, Optional[str]]]) -> KeyMap:
    """Key map from ordered (checkpoint prefix, module prefix or None to skip) rules; first match wins."""
    def key_map(key: str) -> Optional[str]:
        for src, dst in rules:
            if key.startswith(src):
                return None if dst is None else dst + key[len(src):]
        return key
    return key_map
