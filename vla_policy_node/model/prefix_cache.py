# SPDX-License-Identifier: Apache-2.0
"""
The per-layer key/value cache of the VLM prefix.

A control step fills the cache once (one VLM pass over images, language and
state), freezes it, and the action expert then reads it at every denoising
step. Read-only is enforced: a frozen cache refuses every mutating call, so a
denoising step can never grow or alter the prefix (the failure mode of
"append, then crop" caches).

Layout of every cached tensor: ``(B, H_kv, L, D)``; the sequence dim is -2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from vla_policy_node.model.attention import attention, attention_split, FIXED_KV_SDPA, fixed_kv_attention, grouped_mask


class ReadOnlyCacheError(RuntimeError):
    """A mutating call reached a frozen prefix cache."""


class VLAPrefixCache:
    """
    Per-layer K/V of the prefix, with SGLang's VLA ``update`` semantics.

    While filling, ``update(k, v, layer_idx)`` appends a new layer
    (``layer_idx == len(self)``) or concatenates onto an existing one
    (``layer_idx < len(self)``). Once frozen, ``update`` returns
    ``[prefix; suffix]`` for that layer without touching the prefix. The
    concatenation is written into a per-layer scratch buffer that is allocated
    and filled with the prefix once per control step; later denoising steps
    only overwrite the suffix slot, so nothing grows with the step count.
    """

    def __init__(self) -> None:
        self._read_only = False
        self._keys: list[Tensor] | tuple[Tensor, ...] = []
        self._values: list[Tensor] | tuple[Tensor, ...] = []
        self._versions: tuple[int, ...] = ()
        self._scratch_k: list[Optional[Tensor]] = []
        self._scratch_v: list[Optional[Tensor]] = []
        self._scratch_kt: list[Optional[Tensor]] = []          # (B, H_kv, D, Lp + Ls): K transposed, scaled
        self._grouped_mask: Optional[tuple[Tensor, int, Tensor]] = None   # (mask, n_rep, mask per query head)

    # ------------------------------------------------------------------ state
    def __len__(self) -> int:
        return len(self._keys)

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def layers(self) -> tuple[tuple[Tensor, Tensor], ...]:
        """Return the cached ``(key, value)`` pairs, one per layer."""
        return tuple(zip(self._keys, self._values))

    def layer(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        """Return the cached ``(key, value)`` of one layer, each ``(B, H_kv, L, D)``."""
        self._check_index(layer_idx, len(self) - 1)
        return self._keys[layer_idx], self._values[layer_idx]

    def seq_length(self, layer_idx: int = 0) -> int:
        return 0 if not self._keys else self._keys[layer_idx].shape[-2]

    # ---------------------------------------------------------------- filling
    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int) -> tuple[Tensor, Tensor]:
        """Fill the cache, or (read-only) return ``[prefix; new]`` for this layer."""
        if self._read_only:
            return self._read_only_update(key_states, value_states, layer_idx)
        n = len(self._keys)
        if layer_idx > n:
            raise IndexError(
                f"Invalid VLA prefix cache layer: {layer_idx}; {n} layers are cached, "
                f"so the next layer index must be {n} (or < {n} to extend a layer)")
        if layer_idx < 0:
            raise IndexError(f"Invalid VLA prefix cache layer: {layer_idx}; layer indices are >= 0")
        if layer_idx == n:
            self._keys.append(key_states)
            self._values.append(value_states)
        else:
            self._keys[layer_idx] = torch.cat([self._keys[layer_idx], key_states], dim=-2)
            self._values[layer_idx] = torch.cat([self._values[layer_idx], value_states], dim=-2)
        return self._keys[layer_idx], self._values[layer_idx]

    def attend(self, q: Tensor, key_states: Tensor, value_states: Tensor, mask: Tensor, layer_idx: int,
               backend: str) -> Tensor:
        """Attention of q over this layer's keys after ``update``: the one call a decoder layer makes."""
        if backend == FIXED_KV_SDPA and self._read_only and self._fixed_kv_applies(q, key_states, value_states):
            return self._attend_fixed(q, key_states, value_states, mask, layer_idx)
        k, v = self.update(key_states, value_states, layer_idx)
        return attention(q, k, v, mask, backend)

    @staticmethod
    def _fixed_kv_applies(q: Tensor, key_states: Tensor, value_states: Tensor) -> bool:
        return (q.device.type == "cpu" and q.dtype == key_states.dtype == torch.float32
                and not (torch.is_grad_enabled() and (q.requires_grad or key_states.requires_grad
                                                      or value_states.requires_grad)))

    def _attend_fixed(self, q: Tensor, key_states: Tensor, value_states: Tensor, mask: Tensor,
                      layer_idx: int) -> Tensor:
        """
        Attention over [prefix; suffix] with the prefix K laid out once per control step (``fixed_kv_layout``).

        The per-layer buffers hold K transposed and scaled (B, H_kv, D, Lp + Ls) and V
        (B, H_kv, Lp + Ls, D); the prefix part is written when the buffer is made (once
        per freeze), each call writes only the suffix part. The mask, the same tensor at
        every call, is repeated per query head once.
        """
        prefix_k, prefix_v = self._frozen_prefix(key_states, value_states, layer_idx)
        b, groups, lp, d = prefix_k.shape
        total = lp + key_states.shape[-2]
        scale = d ** -0.5
        k_t = self._scratch_kt[layer_idx]
        if k_t is None or k_t.shape[-1] != total:
            k_t = prefix_k.new_empty(b, groups, d, total)
            torch.mul(prefix_k.transpose(-1, -2), scale, out=k_t[..., :lp])
            self._scratch_kt[layer_idx] = k_t
        torch.mul(key_states.transpose(-1, -2), scale, out=k_t[..., lp:])
        v = self._into_scratch(self._scratch_v, prefix_v, value_states, layer_idx)
        n_rep = q.shape[1] // groups
        cached = self._grouped_mask
        if cached is None or cached[0] is not mask or cached[1] != n_rep or cached[2].shape[-1] != total:
            self._grouped_mask = cached = (mask, n_rep, grouped_mask(mask, b, groups, n_rep))
        return fixed_kv_attention(q, k_t, v, cached[2])

    def freeze(self, num_layers: Optional[int] = None) -> None:
        """Make the cache read-only; ``num_layers`` is what the model expects."""
        if num_layers is not None and num_layers != len(self._keys):
            raise ValueError(
                f"VLA prefix cache holds {len(self._keys)} layers but the model has {num_layers}")
        # Tuples: no list method can append to or crop a frozen cache.
        self._keys, self._values = tuple(self._keys), tuple(self._values)
        self._versions = self._tensor_versions()
        self._scratch_k = [None] * len(self._keys)
        self._scratch_v = [None] * len(self._keys)
        self._scratch_kt = [None] * len(self._keys)
        self._grouped_mask = None
        self._read_only = True

    def reset(self) -> None:
        """Empty the cache and make it writable again (a new control step or episode)."""
        self._read_only = False
        self._keys, self._values = [], []
        self._versions = ()
        self._scratch_k, self._scratch_v, self._scratch_kt = [], [], []
        self._grouped_mask = None

    def _tensor_versions(self) -> tuple[int, ...]:
        # Inference-mode tensors carry no version counter; torch itself refuses
        # in-place writes to them outside inference mode.
        return tuple(-1 if t.is_inference() else t._version for t in (*self._keys, *self._values))

    # -------------------------------------------------------------- read-only
    def _frozen_prefix(self, key_states: Tensor, value_states: Tensor, layer_idx: int) -> tuple[Tensor, Tensor]:
        """Return this layer's frozen prefix (K, V), checked unmodified and able to take these suffix states."""
        self._check_index(layer_idx, len(self._keys) - 1)
        prefix_k, prefix_v = self._keys[layer_idx], self._values[layer_idx]
        if not prefix_k.is_inference() and (
                prefix_k._version != self._versions[layer_idx]
                or prefix_v._version != self._versions[len(self._keys) + layer_idx]):
            raise ReadOnlyCacheError(f"frozen prefix cache layer {layer_idx} was modified in place")
        self.check_suffix(key_states, layer_idx)
        self.check_suffix(value_states, layer_idx)
        return prefix_k, prefix_v

    def _read_only_update(self, key_states: Tensor, value_states: Tensor,
                          layer_idx: int) -> tuple[Tensor, Tensor]:
        prefix_k, prefix_v = self._frozen_prefix(key_states, value_states, layer_idx)
        if torch.is_grad_enabled() and (key_states.requires_grad or value_states.requires_grad):
            # Autograd (guided denoising) must not see buffers that later steps overwrite.
            return torch.cat([prefix_k, key_states], -2), torch.cat([prefix_v, value_states], -2)
        return (self._into_scratch(self._scratch_k, prefix_k, key_states, layer_idx),
                self._into_scratch(self._scratch_v, prefix_v, value_states, layer_idx))

    @staticmethod
    def _into_scratch(scratch: list[Optional[Tensor]], prefix: Tensor, new: Tensor,
                      layer_idx: int) -> Tensor:
        lp = prefix.shape[-2]
        total = lp + new.shape[-2]
        buf = scratch[layer_idx]
        if buf is None or buf.shape[-2] != total:
            buf = prefix.new_empty(prefix.shape[:-2] + (total, prefix.shape[-1]))
            buf[..., :lp, :] = prefix
            scratch[layer_idx] = buf
        buf[..., lp:, :] = new
        return buf

    def check_suffix(self, states: Tensor, layer_idx: int) -> None:
        """Raise unless ``states`` can be attended together with this layer's prefix."""
        prefix = self._keys[layer_idx]
        if states.dim() != 4:
            raise ValueError(f"suffix states must be (B, H_kv, L, D), got shape {tuple(states.shape)}")
        for dim, name in ((0, "batch"), (1, "heads"), (3, "head dim")):
            if states.shape[dim] != prefix.shape[dim]:
                raise ValueError(
                    f"suffix {name} {states.shape[dim]} does not match the prefix cache's "
                    f"{prefix.shape[dim]} at layer {layer_idx}")
        if states.dtype != prefix.dtype:
            raise ValueError(f"suffix dtype {states.dtype} does not match the prefix cache's {prefix.dtype}")
        if states.device != prefix.device:
            raise ValueError(f"suffix device {states.device} does not match the prefix cache's {prefix.device}")

    def _check_index(self, layer_idx: int, last: int) -> None:
        if not 0 <= layer_idx <= last:
            raise IndexError(
                f"Invalid VLA prefix cache layer: {layer_idx}; {last + 1} layers are cached "
                f"(valid indices 0..{last})")

    def __setattr__(self, name: str, value: object) -> None:
        if getattr(self, "_read_only", False) and name in ("_keys", "_values", "_versions"):
            raise ReadOnlyCacheError(f"the VLA prefix cache is read-only; cannot replace {name}")
        super().__setattr__(name, value)

    def frozen_view(self) -> "FrozenPrefix":
        """Return the frozen K/V as a ``FrozenPrefix`` (no copy), for compiled denoising."""
        if not self._read_only:
            raise ReadOnlyCacheError("only a frozen VLA prefix cache has a frozen view")
        return FrozenPrefix(self._keys, self._values)


class FrozenPrefix:
    """
    A frozen prefix in the form a graph compiler traces: per-layer K/V and ``attend``.

    ``attend`` runs attention over [prefix; suffix] without concatenating them
    (``attention_split``): no scratch buffer, no write, no per-step copy of the
    prefix, and no version-counter checks, which compilers cannot trace. The
    ``VLAPrefixCache`` it comes from still does those checks around the loop.
    """

    def __init__(self, keys: Sequence[Tensor], values: Sequence[Tensor]) -> None:
        self.keys, self.values = tuple(keys), tuple(values)

    def __len__(self) -> int:
        return len(self.keys)

    def layer(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        return self.keys[layer_idx], self.values[layer_idx]

    def attend(self, q: Tensor, key_states: Tensor, value_states: Tensor, mask: Tensor, layer_idx: int,
               backend: str) -> Tensor:
        """Attention of q over [prefix_i; suffix]; ``backend`` is unused: the split form is its own kernel."""
        return attention_split(q, self.layer(layer_idx), (key_states, value_states), mask)


PrefixKV = Union[VLAPrefixCache, FrozenPrefix]
"""What a decoder layer attends through: the cache itself, or its frozen view in compiled code."""


@dataclass
class PrefixContext:
    """
    Everything the denoising steps of one control step read, batch-first.

    ``extras`` holds family-specific per-step constants (for example the
    cross-attention K/V projected once from the cache); each value is a
    tensor or a list of tensors with the batch on dim 0.
    """

    cache: PrefixKV
    pad_mask: Tensor                      # (B, Lp) bool, True = valid prefix token
    extras: dict[str, object] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.pad_mask.shape[0]
