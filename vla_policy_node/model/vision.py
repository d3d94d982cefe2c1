# SPDX-License-Identifier: Apache-2.0
"""SigLIP vision transformer (the image encoder of SmolVLM and PaliGemma)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vla_policy_node.model import in_place, packed_linear
from vla_policy_node.model.attention import low_precision_attention


@dataclass(frozen=True)
class VisionSpec:
    image_size: int
    patch_size: int
    width: int
    num_layers: int
    num_heads: int
    mlp_width: int
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.width % self.num_heads:
            raise ValueError(f"vision width {self.width} is not a multiple of {self.num_heads} heads")

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


class VisionEmbeddings(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, spec.width, spec.patch_size, stride=spec.patch_size)
        self.position_embedding = nn.Embedding(spec.num_patches, spec.width)

    def forward(self, pixels: Tensor, position_ids: Tensor) -> Tensor:
        """Embed pixels (B, 3, H, W) -> (B, N, width); position_ids (N,) or (B, N)."""
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))
        x = x.flatten(2).transpose(1, 2)
        return x + self.position_embedding(position_ids)


class VisionAttention(nn.Module):
    products_dtype: Optional[torch.dtype] = None
    """Set by ``int8_linear.quantize_linears`` where the CPU multiplies bfloat16 natively: the dtype of the
    attention's two products (``attention.low_precision_attention``); None: SDPA in the activations' dtype."""

    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.num_heads = spec.num_heads
        self.q_proj = nn.Linear(spec.width, spec.width)
        self.k_proj = nn.Linear(spec.width, spec.width)
        self.v_proj = nn.Linear(spec.width, spec.width)
        self.out_proj = nn.Linear(spec.width, spec.width)
        self.register_buffer("qkv_weight", None, persistent=False)      # set by ``fuse``
        self.register_buffer("qkv_bias", None, persistent=False)
        self.qkv_packed: Optional[Any] = None                              # set by ``int8_linear``

    def fuse(self) -> None:
        """One matmul for q, k and v (``dtype: int8`` only: float32 keeps the three products it was measured with)."""
        self.qkv_weight, self.qkv_bias = packed_linear.fuse_linears(self.q_proj, self.k_proj, self.v_proj)

    def forward(self, x: Tensor, backend: str) -> Tensor:
        b, n, c = x.shape
        if self.qkv_weight is None:
            q, k, v = (p(x).view(b, n, self.num_heads, -1).transpose(1, 2)          # (B, H, N, C/H)
                       for p in (self.q_proj, self.k_proj, self.v_proj))
        else:
            qkv = packed_linear.linear(x, self.qkv_weight, self.qkv_bias, self.qkv_packed)
            q, k, v = qkv.view(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        if backend == "sdpa" and self.products_dtype is not None and not torch.is_grad_enabled() \
                and not torch.compiler.is_compiling():
            o = low_precision_attention(q, k, v, self.products_dtype)
        elif backend == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            o = torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v)
        return self.out_proj(o.transpose(1, 2).reshape(b, n, c))


class VisionMLP(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.fc1 = nn.Linear(spec.width, spec.mlp_width)
        self.fc2 = nn.Linear(spec.mlp_width, spec.width)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(in_place.gelu_tanh(self.fc1(x)))


class VisionLayer(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(spec.width, eps=spec.norm_eps)
        self.self_attn = VisionAttention(spec)
        self.layer_norm2 = nn.LayerNorm(spec.width, eps=spec.norm_eps)
        self.mlp = VisionMLP(spec)

    def forward(self, x: Tensor, backend: str) -> Tensor:
        x = in_place.add(x, self.self_attn(self.layer_norm1(x), backend))
        return in_place.add(x, self.mlp(self.layer_norm2(x)))


class VisionEncoder(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionLayer(spec) for _ in range(spec.num_layers))


class SiglipVisionTransformer(nn.Module):
    """Patch embedding + pre-norm ViT + final LayerNorm; no pooling head."""

    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embeddings = VisionEmbeddings(spec)
        self.encoder = VisionEncoder(spec)
        self.post_layernorm = nn.LayerNorm(spec.width, eps=spec.norm_eps)
        self.register_buffer("default_position_ids", torch.arange(spec.num_patches), persistent=False)

    def forward(self, pixels: Tensor, position_ids: Optional[Tensor] = None, backend: str = "sdpa") -> Tensor:
        """Encode pixels (B, 3, S, S) at the model resolution -> patch features (B, N, width)."""
        ids = self.default_position_ids if position_ids is None else position_ids
        x = self.embeddings(pixels, ids)
        for layer in self.encoder.layers:
            x = layer(x, backend)
        return self.post_layernorm(x)
