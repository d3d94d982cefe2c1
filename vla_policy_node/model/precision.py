# SPDX-License-Identifier: Apache-2.0
"""
Mixed precision: which parts of a model stay float32 when the rest runs in bfloat16/float16.

Norms, time embeddings/MLPs and the action/state projections are numerically
sensitive (the reference implementations keep them in float32); each family
names its own in ``FLOAT32_MODULES`` as fragments of qualified module names.
"""

from __future__ import annotations

import torch
from torch import nn

from vla_policy_node.model.blocks import AdaRMSNorm, RMSNorm


def keep_float32(model: nn.Module, fragments: tuple[str, ...]) -> nn.Module:
    """Cast every norm, and every submodule whose qualified name contains a fragment, back to float32."""
    for name, module in model.named_modules():
        if isinstance(module, (RMSNorm, AdaRMSNorm)) or any(f in name for f in fragments):
            module.float()
    return model


def cast_model(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Move to device and dtype, keeping the family's ``FLOAT32_MODULES`` in float32; eval mode."""
    model.to(device=device, dtype=dtype)
    if dtype != torch.float32:
        keep_float32(model, getattr(model, "FLOAT32_MODULES", ()))
    return model.eval()


INT8 = "int8"    # a ``dtype`` name: float32 model, int8 weights in its large CPU matmuls (``int8_linear``)


def load_dtype_name(name: str) -> str:
    """Return the float dtype name a ``dtype`` setting loads the model in (``int8`` loads float32, then quantizes)."""
    return "float32" if name == INT8 else name
