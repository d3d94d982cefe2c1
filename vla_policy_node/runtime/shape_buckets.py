# SPDX-License-Identifier: Apache-2.0
"""
The few input shapes that compiled programs and CUDA graphs are built for, and padding up to them.

Both are specialised to their input shapes, and building one takes seconds (a graph
capture) to minutes (a compile), far longer than a control step. So the warm-up builds
every bucket, and a call is padded to the smallest bucket that holds it:

- prompts (``longest`` padding, where the length follows the instruction) with padding
  tokens whose mask is false, which attention never reads;
- batches (the policy server, where the batch is however many robots asked) with copies
  of the last row, whose outputs are cut off; rows never mix (attention and every other
  op act per row), so the real rows come out as they would alone, up to float rounding
  (a matmul kernel may block a different number of rows differently).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from vla_policy_node.model.types import ModelInputs


def prompt_buckets(max_length: int, count: int = 3) -> tuple[int, ...]:
    """
    Return the prompt lengths built for ``longest`` padding: ``max_length`` and halvings, rounded up to 8.

    A prompt is padded (mask false) to the smallest bucket that holds it, so a
    few programs, all built in the warm-up, serve every prompt: 48 -> (16, 24, 48).
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    sizes = {max_length}
    for i in range(1, count):
        sizes.add(min(max_length, -(-max_length // (2 ** i) // 8) * 8 or 8))
    return tuple(sorted(sizes))


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """
    Return the batch sizes built for a server of at most ``max_batch`` rows: powers of two, and the maximum.

    16 -> (1, 2, 4, 8, 16); 6 -> (1, 2, 4, 6). A batch pays at most twice its rows of compute.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    return tuple(sorted({max_batch, *(2 ** k for k in range(max_batch.bit_length()) if 2 ** k < max_batch)}))


def smallest_holding(sizes: Sequence[int], n: int) -> Optional[int]:
    """Return the smallest of ``sizes`` that is >= n, or None (no bucket holds it)."""
    fits = [s for s in sizes if s >= n]
    return min(fits) if fits else None


def without_shared_padding(inputs: ModelInputs) -> ModelInputs:
    """
    Drop the prompt positions that are padding in every row: eager code then never computes them.

    No real token reads a padding token (its key is masked out, and positions count real
    tokens only), so the results are the same up to float rounding: a softmax sums fewer
    exact zeros. With ``max_length`` padding (48 tokens for SmolVLA and pi0, 200 for pi0.5)
    a short instruction otherwise runs every layer over the padding. Masks already on a GPU
    are left as they are: reading them would wait for the device.
    """
    mask = inputs.token_mask
    if mask.device.type != "cpu":
        return inputs
    keep = mask.bool().any(0)                                      # (L,) a real token in some row
    kept = int(keep.sum())
    if kept in (0, mask.shape[1]):
        return inputs
    return ModelInputs(inputs.images, inputs.image_masks, inputs.tokens[:, keep], mask[:, keep], inputs.state)


def with_prompt_length(inputs: ModelInputs, length: int) -> ModelInputs:
    """Pad the prompt to ``length`` tokens (pad id 0, mask false), or cut it there (warm-up shapes only)."""
    tokens, mask = inputs.tokens, inputs.token_mask
    extra = length - tokens.shape[1]
    if extra > 0:
        tokens = torch.cat([tokens, tokens.new_zeros(tokens.shape[0], extra)], dim=1)
        mask = torch.cat([mask, mask.new_zeros(mask.shape[0], extra)], dim=1)
    elif extra < 0:
        tokens, mask = tokens[:, :length], mask[:, :length]
    return ModelInputs(inputs.images, inputs.image_masks, tokens, mask, inputs.state)


def with_batch_size(inputs: ModelInputs, noise: Tensor, size: int) -> tuple[ModelInputs, Tensor]:
    """
    Pad a batch to ``size`` rows with copies of its last row, or cut it there (warm-up shapes only).

    noise (B, T, A) is padded the same way; the caller keeps the first B rows of the result.
    """
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")

    def rows(t: Optional[Tensor]) -> Optional[Tensor]:
        if t is None:
            return None
        extra = size - t.shape[0]
        if extra <= 0:
            return t[:size]
        return torch.cat([t, t[-1:].expand(extra, *t.shape[1:])], dim=0)

    padded = ModelInputs([rows(im) for im in inputs.images], [rows(m) for m in inputs.image_masks],
                         rows(inputs.tokens), rows(inputs.token_mask), rows(inputs.state))
    return padded, rows(noise)
