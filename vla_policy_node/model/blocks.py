# SPDX-License-Identifier: Apache-2.0
"""
Transformer building blocks shared by every family: norms, MLP, attention, decoder layer.

Parameter names follow the Hugging Face / LeRobot checkpoints (``self_attn.q_proj``,
``mlp.gate_proj``, ``input_layernorm``) so weights load by name.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vla_policy_node.model import in_place, packed_linear
from vla_policy_node.model.prefix_cache import PrefixKV, VLAPrefixCache
from vla_policy_node.model.rope import apply_rope
from vla_policy_node.model.vision import VisionAttention

ACTIVATIONS = {
    "silu": F.silu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class RMSNorm(nn.Module):
    """RMSNorm computed in float32. ``offset=1`` gives Gemma's ``x_hat * (1 + w)``, 0 gives Llama's ``w * x_hat``."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim) if offset == 0.0 else torch.zeros(dim))
        self.eps = eps
        self.offset = offset

    def forward(self, x: Tensor, cond: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
        xf = x if x.dtype == torch.float32 else x.float()
        if xf.device.type == "cpu" and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            # On the CPU, F.rms_norm is a composite of seven kernels and about fifteen dispatcher calls.
            # x * rsqrt(mean(x^2) + eps) * w == x / hypot(|x|, sqrt(d * eps)) * (w * sqrt(d)):
            # four kernels, within a few float32 ulps of it.
            scale, root_eps = self._cpu_constants(xf.shape[-1])
            out = (xf / torch.hypot(torch.linalg.vector_norm(xf, dim=-1, keepdim=True), root_eps)).mul_(scale)
        elif self.offset == 0.0 and self.weight.dtype == torch.float32:
            out = F.rms_norm(xf, (xf.shape[-1],), self.weight, self.eps)
        else:
            out = F.rms_norm(xf, (xf.shape[-1],), None, self.eps) * (self.offset + self.weight.float())
        return (out if x.dtype == torch.float32 else out.to(x.dtype)), None

    def _cpu_constants(self, dim: int) -> tuple[Tensor, Tensor]:
        """``(offset + w) * sqrt(dim)`` and ``sqrt(dim * eps)``, float32; recomputed when the weight changes."""
        w = self.weight
        version = -1 if w.is_inference() else w._version
        cached = self.__dict__.get("_cpu_cache")
        if cached is None or cached[0] is not w or cached[1] != version or cached[2] != dim:
            with torch.no_grad():
                scale = (self.offset + w.float()) * math.sqrt(dim)
            cached = (w, version, dim, scale, torch.tensor(math.sqrt(dim * self.eps), dtype=torch.float32))
            self.__dict__["_cpu_cache"] = cached
        return cached[3], cached[4]


class AdaRMSNorm(nn.Module):
    """
    Adaptive RMSNorm (pi0.5 expert): scale, shift and a residual gate from a condition vector.

    ``dense`` maps cond (B, C) to (B, 3*dim) = [scale, shift, gate]; the norm
    returns ``x_hat * (1 + scale) + shift`` and the gate for the residual.
    """

    def __init__(self, dim: int, cond_dim: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(cond_dim, 3 * dim, bias=True)
        self.eps = eps

    def forward(self, x: Tensor, cond: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
        if cond is None:
            raise ValueError("AdaRMSNorm needs a condition vector")
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        scale, shift, gate = self.dense(cond)[:, None].chunk(3, dim=-1)   # each (B, 1, dim)
        normed = normed * (1 + scale.float()) + shift.float()
        return normed.to(x.dtype), gate.to(x.dtype)


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``: SwiGLU (Llama) or GeGLU-tanh (Gemma)."""

    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.act = ACTIVATIONS[act]
        self.register_buffer("gate_up_weight", None, persistent=False)   # set by ``fuse``
        self.gate_up_packed: Optional[Tensor] = None                        # set by ``pack_linears``

    def fuse(self) -> None:
        """One (2*hidden, dim) matmul instead of two; gate/up weights become views of it (same state dict)."""
        self.gate_up_weight = packed_linear.fuse_linears(self.gate_proj, self.up_proj)[0]

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up_weight is None:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        gate, up = packed_linear.linear(x, self.gate_up_weight, None, self.gate_up_packed).chunk(2, dim=-1)
        if self.act is F.silu and in_place.allowed():
            return self.down_proj(F.silu(gate, inplace=True).mul_(up))
        return self.down_proj(self.act(gate) * up)


def packing_targets(model: nn.Module) -> list[tuple[nn.Module, str, Tensor]]:
    """
    List ``(module, attribute of the packed copy, weight)`` for every weight the model multiplies by.

    A fused projection replaces the linears it covers: only the fused weight is
    listed, as only it runs (the covered linears stay for the state dict).
    """
    targets: list[tuple[nn.Module, str, Tensor]] = []
    covered: set[int] = set()
    for module in model.modules():
        if isinstance(module, GatedMLP) and module.gate_up_weight is not None:
            targets.append((module, "gate_up_packed", module.gate_up_weight))
            covered |= {id(module.gate_proj), id(module.up_proj)}
        elif isinstance(module, (AttentionProjections, VisionAttention)) and module.qkv_weight is not None:
            targets.append((module, "qkv_packed", module.qkv_weight))
            covered |= {id(module.q_proj), id(module.k_proj), id(module.v_proj)}
    targets += [(m, "packed", m.weight) for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in covered]
    return targets


def packed_bias(module: nn.Module, attr: str) -> Optional[Tensor]:
    """Return the bias added to the product of the weight ``packing_targets`` lists as ``(module, attr)``, or None."""
    return {"packed": getattr(module, "bias", None), "qkv_packed": getattr(module, "qkv_bias", None)}.get(attr)


@contextlib.contextmanager
def copies_hidden(model: nn.Module, which: Callable[[Any], bool] = lambda copy: True) -> Iterator[None]:
    """Hide the packed (or int8) weight copies ``which`` picks while the block runs: the plain matmul path runs."""
    hidden = [(m, a, c) for m, a, _ in packing_targets(model) if (c := getattr(m, a, None)) is not None and which(c)]
    for m, a, _ in hidden:
        setattr(m, a, None)
    try:
        yield
    finally:
        for m, a, c in hidden:
            setattr(m, a, c)


def pack_linears(model: nn.Module) -> nn.Module:
    """oneDNN-packed weights for every CPU matmul the model runs (see ``packed_linear``); call last."""
    for module, attr, weight in packing_targets(model):
        packed = packed_linear.pack(weight)
        if packed is None:
            continue
        if type(module) is nn.Linear:
            module.__class__ = packed_linear.PackedLinear
        setattr(module, attr, packed)
    return model


def fuse_projections(model: nn.Module) -> nn.Module:
    """Fuse q/k/v and gate/up matmuls everywhere in ``model`` (after its weights and dtype are final)."""
    for module in model.modules():
        if isinstance(module, (GatedMLP, AttentionProjections)):
            module.fuse()
    return model


class AttentionProjections(nn.Module):
    """q/k/v/o projections of grouped-query attention; heads split to (B, H, L, D)."""

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 kv_in_dim: Optional[int] = None, bias: bool = False) -> None:
        super().__init__()
        kv_in = dim if kv_in_dim is None else kv_in_dim
        self.cross = kv_in_dim is not None      # k/v project another sequence (the cached prefix)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(dim, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(kv_in, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(kv_in, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, dim, bias=bias)
        self.register_buffer("qkv_weight", None, persistent=False)      # set by ``fuse``
        self.register_buffer("qkv_bias", None, persistent=False)
        self.qkv_packed: Optional[Tensor] = None                            # set by ``pack_linears``

    def fuse(self) -> None:
        """One matmul for q, k and v (self-attention only: cross-attention k/v read another input)."""
        if not self.cross:
            self.qkv_weight, self.qkv_bias = packed_linear.fuse_linears(self.q_proj, self.k_proj, self.v_proj)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, L, dim) -> q (B, H, L, D), k and v (B, H_kv, L, D)."""
        if self.qkv_weight is None:
            return (self.q(x), *self.kv(x))
        b, L, _ = x.shape
        heads = packed_linear.linear(x, self.qkv_weight, self.qkv_bias, self.qkv_packed).view(b, L, -1, self.head_dim)
        q, k, v = heads.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=2)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    @staticmethod
    def split(x: Tensor, heads: int) -> Tensor:
        """(B, L, H*D) -> (B, H, L, D)."""
        b, L, _ = x.shape
        return x.view(b, L, heads, -1).transpose(1, 2)

    def q(self, x: Tensor) -> Tensor:
        return self.split(self.q_proj(x), self.num_heads)

    def kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.split(self.k_proj(x), self.num_kv_heads), self.split(self.v_proj(x), self.num_kv_heads)

    def out(self, o: Tensor) -> Tensor:
        """(B, H, L, D) -> (B, L, dim)."""
        b, h, L, d = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, L, h * d))


@dataclass(frozen=True)
class DecoderSpec:
    """Sizes and flavour of one decoder stack (VLM text model or action expert)."""

    width: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_width: int
    act: str = "silu"
    norm_eps: float = 1e-5
    norm_offset: float = 0.0        # 1.0 for Gemma's (1 + w) RMSNorm
    adaptive_norm_dim: int = 0      # > 0: adaRMS norms conditioned on a vector of this width (pi0.5)
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("width", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_width"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DecoderSpec.{name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.act!r}; choose one of {sorted(ACTIVATIONS)}")


def make_norm(spec: DecoderSpec, dim: Optional[int] = None) -> nn.Module:
    dim = spec.width if dim is None else dim
    if spec.adaptive_norm_dim:
        return AdaRMSNorm(dim, spec.adaptive_norm_dim, spec.norm_eps)
    return RMSNorm(dim, spec.norm_eps, spec.norm_offset)


class DecoderLayer(nn.Module):
    """
    Pre-norm decoder layer whose self-attention goes through the prefix cache.

    While the cache fills (prefix pass), ``cache.attend`` stores this layer's
    K/V; once frozen (denoising), it attends over [prefix; suffix] K/V, so the
    same code serves the VLM prefix pass and a joint-attention expert.
    """

    def __init__(self, spec: DecoderSpec, kv_in_dim: Optional[int] = None) -> None:
        super().__init__()
        self.input_layernorm = make_norm(spec)
        self.self_attn = AttentionProjections(spec.width, spec.num_heads, spec.num_kv_heads,
                                              spec.head_dim, kv_in_dim)
        self.post_attention_layernorm = make_norm(spec)
        self.mlp = GatedMLP(spec.width, spec.mlp_width, spec.act)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, cache: PrefixKV,
                layer_idx: int, backend: str, cond: Optional[Tensor] = None) -> Tensor:
        x = self.attention_block(x, rope, mask, cache, layer_idx, backend, cond)
        return self.mlp_block(x, cond)

    def attention_block(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, cache: PrefixKV,
                        layer_idx: int, backend: str, cond: Optional[Tensor] = None) -> Tensor:
        """Residual self-attention; the last VLM layer of a prefix pass needs only this half."""
        h, gate = self.input_layernorm(x, cond)
        q, k, v = self.self_attn.qkv(h)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return gated_residual(x, self.self_attn.out(cache.attend(q, k, v, mask, layer_idx, backend)), gate)

    def store_kv(self, x: Tensor, rope: tuple[Tensor, Tensor], cache: VLAPrefixCache, layer_idx: int,
                 cond: Optional[Tensor] = None) -> None:
        """
        Put this layer's K/V into the filling cache and stop: the last layer of a prefix pass.

        Nothing reads that layer's output, only its K/V, so its attention, output
        projection and MLP are skipped (a graph compiler drops them anyway; eager code has to).
        """
        h, _ = self.input_layernorm(x, cond)
        _, k, v = self.self_attn.qkv(h)
        cache.update(apply_rope(k, *rope), v, layer_idx)

    def mlp_block(self, x: Tensor, cond: Optional[Tensor] = None) -> Tensor:
        h, gate = self.post_attention_layernorm(x, cond)
        return gated_residual(x, self.mlp(h), gate)


def gated_residual(x: Tensor, y: Tensor, gate: Optional[Tensor]) -> Tensor:
    """Return ``x + y`` (``x + y * gate`` with a gate); y is the block's own output, so it may be overwritten."""
    return in_place.add(x, y) if gate is None else x + y * gate


def sinusoidal_time_embedding(t: Tensor, dim: int, min_period: float, max_period: float) -> Tensor:
    """
    Sin/cos embedding of flow time t (N,) -> (N, dim), float32.

    Computed in float64 from the float32 t, as LeRobot does; float32 angles
    cost up to 1e-4 in the actions for small ``min_period``.
    """
    if dim % 2:
        raise ValueError(f"time embedding width must be even, got {dim}")
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (2 * torch.pi / period)[None, :] * t.to(torch.float64)[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).to(torch.float32)


def time_half(mlp_in: nn.Linear, emb: Tensor) -> Tensor:
    """
    ``mlp_in`` applied to the time half of ``[action; time]``, bias included: (N, W) for embeddings (N, W).

    The action-time MLP's first layer reads the concatenation of each action token and
    the step's time embedding. The time part is the same for every token and every
    control step, so it is computed once per schedule step; each denoising step then
    multiplies only the action half (``action_half``): half the matmul, and no
    (B, T, 2W) concatenation.
    """
    width = emb.shape[-1]
    return F.linear(emb.to(mlp_in.weight.dtype), mlp_in.weight[:, width:], mlp_in.bias)


def action_half(mlp_in: nn.Linear, action: Tensor) -> Tensor:
    """``mlp_in`` applied to the action half of ``[action; time]``, without the bias (``time_half`` holds it)."""
    return F.linear(action, mlp_in.weight[:, :action.shape[-1]])


def check_flow_config(config: object) -> None:
    """
    Raise ValueError on sizes or time-embedding periods no flow-matching family can run with.

    Sizes must be > 0 and ``0 < min_period < max_period`` (else the time embedding is NaN or
    divides by zero). Values of the wrong type are left to ``checkpoint.check_config_types``,
    which names them.
    """
    for name in ("chunk_size", "max_state_dim", "max_action_dim", "num_steps", "tokenizer_max_length"):
        value = getattr(config, name)
        if isinstance(value, int) and value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    low, high = getattr(config, "min_period"), getattr(config, "max_period")
    if all(isinstance(p, (int, float)) for p in (low, high)) and not 0 < low < high:
        raise ValueError(f"need 0 < min_period < max_period, got {low}, {high}")
