# SPDX-License-Identifier: Apache-2.0
"""
Load checkpoint tensors into a model by name, with name, shape and dtype checks first.

Only safetensors are read (``safe_open``: no pickle, no code). The whole
header is checked against the model before any tensor is read: every name
mapped, every shape and dtype right, nothing missing. ``build_model`` goes one
step further and checks the header against a model built on the meta device,
so a config that describes a model the checkpoint cannot fill (or an absurdly
large one) fails before a byte of weights is allocated. Tensors are read one
at a time; those the runtime never uses (a language-model head) are skipped.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Mapping, Optional

import torch
from safetensors import safe_open
from torch import nn
from torch.overrides import TorchFunctionMode

from vla_policy_node.loading.checkpoint import (FLOAT_DTYPES, CheckpointError, TensorInfo, check_config_types,
                                                read_safetensors_header)

__all__ = ["CheckpointError", "KeyMap", "build_model", "check_weights", "load_weights", "prefix_key_map"]

KeyMap = Callable[[str], Optional[str]]
"""Checkpoint key -> module state-dict key, or None for a tensor the runtime does not use."""

TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
                "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                "U8": torch.uint8, "BOOL": torch.bool}


def _listing(names: list[str]) -> str:
    return f"{sorted(names)[:8]}{' ...' if len(names) > 8 else ''} ({len(names)} in all)"


def check_weights(target: Mapping[str, torch.Tensor], header: Mapping[str, TensorInfo], key_map: KeyMap,
                  aliases: Optional[dict[str, str]] = None, file: str = "model.safetensors") -> list[tuple[str, str]]:
    """
    Return the (checkpoint key, module key) copy plan, or raise ``CheckpointError`` naming what does not fit.

    Floating-point parameters accept float32, bfloat16 and float16 tensors (cast on copy);
    float64 is refused (no VLA ships it, it doubles the read) and so is an integer tensor
    where a float belongs. Other parameters need their exact dtype.
    """
    plan: list[tuple[str, str]] = []
    unexpected: list[str] = []
    for ckpt_key, info in header.items():
        name = key_map(ckpt_key)
        if name is None:
            continue
        if name not in target:
            unexpected.append(ckpt_key)
            continue
        want = target[name]
        if info.shape != tuple(want.shape):
            raise CheckpointError(f"{file}: tensor {ckpt_key} has shape {list(info.shape)}, the model built from "
                                  f"config.json expects {list(want.shape)} for {name}")
        ok = info.dtype in FLOAT_DTYPES if want.is_floating_point() else TORCH_DTYPES.get(info.dtype) == want.dtype
        if not ok:
            accepted = "float32, bfloat16 or float16" if want.is_floating_point() else str(want.dtype)[6:]
            raise CheckpointError(f"{file}: tensor {ckpt_key} has dtype {info.dtype}; {name} needs {accepted}")
        plan.append((ckpt_key, name))
    if unexpected:
        raise CheckpointError(f"{file}: unexpected tensors (no such parameter in the model built from config.json) "
                              f"{_listing(unexpected)}")
    loaded = {name for _, name in plan}
    loaded |= {dst for dst, src in (aliases or {}).items() if src in loaded and dst in target}
    missing = sorted(set(target) - loaded)
    if missing:
        raise CheckpointError(f"{file}: missing tensors for {_listing(missing)}")
    return plan


def load_weights(model: nn.Module, path: Path, key_map: KeyMap,
                 aliases: Optional[dict[str, str]] = None) -> dict[str, int]:
    """
    Copy every tensor of ``path`` that ``key_map`` keeps into ``model``.

    ``aliases`` maps module keys to module keys that share a checkpoint
    tensor (tied embeddings). Raises ``CheckpointError`` on a corrupt file or a
    missing, unexpected, mis-shaped or wrongly typed tensor, before anything
    is copied; returns counts of loaded and skipped tensors.
    """
    header = read_safetensors_header(path)
    target = model.state_dict()
    plan = check_weights(target, header, key_map, aliases, path.name)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f, torch.no_grad():
            for ckpt_key, name in plan:
                target[name].copy_(f.get_tensor(ckpt_key))
    except (OSError, RuntimeError) as exc:   # the file changed under us, or the mmap failed
        raise CheckpointError(f"{path.name}: cannot read tensors: {exc}") from exc
    loaded = {name for _, name in plan}
    with torch.no_grad():
        for dst, src in (aliases or {}).items():
            if src in loaded and dst in target and dst not in loaded:
                target[dst].copy_(target[src])
    return {"loaded": len(plan), "skipped": len(header) - len(plan)}


def build_model(factory: Callable[[], nn.Module], config: object, path: Path, key_map: KeyMap,
                aliases: Optional[dict[str, str]] = None) -> nn.Module:
    """
    Build ``factory()`` and load ``path`` into it, checking the header before allocating anything.

    ``config`` is the family config dataclass the factory builds from: its field types are
    checked, and no stack may have more layers than the checkpoint has tensors (each layer
    has several), which bounds the meta-device build itself.
    """
    header = read_safetensors_header(path)
    check_config_types(config, "config.json")
    _check_layer_counts(config, len(header))
    try:
        with torch.device("meta"), _NoInit():
            meta = factory()
    except (ArithmeticError, RuntimeError, TypeError, ValueError) as exc:
        raise CheckpointError(f"config.json describes a model that cannot be built: {exc}") from exc
    check_weights(meta.state_dict(), header, key_map, aliases, path.name)
    del meta
    model = factory()
    load_weights(model, path, key_map, aliases)
    return model


class _NoInit(TorchFunctionMode):
    """
    Skip ``torch.nn.init`` during the meta-device build: meta tensors hold no values to fill.

    On meta, the init functions run torch's reference kernels, whose first call imports
    ``torch._dynamo``, and that import creates inductor's cache folder in the system temp
    folder: a trace a load must not leave.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def _check_layer_counts(config: object, num_tensors: int) -> None:
    for field in dataclasses.fields(config):
        layers = getattr(getattr(config, field.name), "num_layers", None)
        if isinstance(layers, int) and layers > num_tensors:
            raise CheckpointError(f"config.json: {field.name}.num_layers = {layers}, but the checkpoint holds "
                                  f"only {num_tensors} tensors")


def prefix_key_map(rules: list[tuple[str, Optional[str]]]) -> KeyMap:
    """Key map from ordered (checkpoint prefix, module prefix or None to skip) rules; first match wins."""
    def key_map(key: str) -> Optional[str]:
        for src, dst in rules:
            if key.startswith(src):
                return None if dst is None else dst + key[len(src):]
        return key
    return key_map
