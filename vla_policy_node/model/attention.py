# SPDX-License-Identifier: Apache-2.0
"""
Attention kernels and the mask rules of prefix/suffix VLAs.

Two backends compute the same thing: ``eager`` (float32 scores, LeRobot's and
openpi's arithmetic, with the query heads that share a K/V head stacked into one
matmul instead of copying K/V per head) and ``sdpa``
(``torch.nn.functional.scaled_dot_product_attention``, faster, fused on GPU).
Masks are additive float tensors built once per pass: boolean masks through
SDPA turn fully masked rows (padding queries) into NaN, which then leak into
every later layer through the padded keys' values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

BACKENDS = ("eager", "sdpa")
FIXED_KV_MAX_HEAD_DIM = 32   # wider heads: CPU flash attention wins (SmolVLA's 64: 0.37-0.69x at batch 4)
FIXED_KV_SDPA = "sdpa_fixed_kv"
"""A backend a family may pass for attention over a frozen prefix cache: ``VLAPrefixCache``
lays the prefix K/V out once (``fixed_kv_layout``) and attends with ``fixed_kv_attention``
where it can (CPU, float32, no autograd), and runs ``sdpa`` elsewhere."""


def make_att_2d_masks(pad_masks: Tensor, att_masks: Tensor) -> Tensor:
    """
    Big-vision attention rule from a pad mask and a cumulative "ar" mask.

    ``pad_masks`` (B, L) bool: True = real token. ``att_masks`` (B, L) int/bool:
    a token may attend to every token whose cumulative ar-count is <= its own.
    Examples (one row per ar-mask):
      [0 0 0 1 1 1]  prefix-LM: three tokens attend to each other, the last three are causal
      [1 1 1 1 1 1]  purely causal
      [0 0 0 0 0 0]  full bidirectional attention
      [0 0 0 1 0 0]  two blocks: the first three see each other, the last three see everything
    Returns (B, L, L) bool, True = may attend.
    """
    if att_masks.dim() != 2 or pad_masks.dim() != 2 or att_masks.shape != pad_masks.shape:
        raise ValueError(f"masks must both be (B, L), got {tuple(pad_masks.shape)} and {tuple(att_masks.shape)}")
    cumsum = torch.cumsum(att_masks.long(), dim=1)
    att_2d = cumsum[:, None, :] <= cumsum[:, :, None]
    pad_2d = pad_masks[:, None, :] & pad_masks[:, :, None]
    return att_2d & pad_2d


def additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, Lq, Lk) bool -> (B, 1, Lq, Lk) float: 0 where allowed, the dtype's minimum elsewhere."""
    neg = torch.finfo(dtype).min
    return torch.where(allowed, 0.0, neg).to(dtype)[:, None]


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, backend: str = "sdpa",
              scale: float | None = None) -> Tensor:
    """
    Grouped-query attention.

    q (B, H, Lq, D); k, v (B, H_kv, Lk, D); mask (B, 1, Lq, Lk) additive float
    (see ``additive_mask``). Returns (B, H, Lq, D) in v's dtype.
    """
    n_rep = q.shape[1] // k.shape[1]
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if backend in ("sdpa", FIXED_KV_SDPA):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=scale,
                                             enable_gqa=bool(n_rep > 1))
        return out
    if backend != "eager":
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
    b, h, lq, d = q.shape
    groups, lk = k.shape[1], k.shape[2]
    qg = q.float().reshape(b, groups, n_rep * lq, d)               # the heads sharing one K/V head, stacked
    scores = (qg @ k.float().transpose(-1, -2)).view(b, h, lq, lk) * scale + mask.float()
    if _normalize_after(v):
        weights, total = _unnormalized_softmax(scores)
        return (weights.view(b, groups, n_rep * lq, lk) @ v).view(b, h, lq, d) / total      # v is float32 here
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(b, groups, n_rep * lq, lk)
    return (probs @ v).view(b, h, lq, d)


LOW_PRECISION_BLOCK_BYTES = 6 << 20   # scores of the heads one block attends with: a few MiB stay in the cache


def low_precision_attention(q: Tensor, k: Tensor, v: Tensor, dtype: torch.dtype) -> Tensor:
    """
    Unmasked attention with both products in ``dtype`` (bfloat16), a block of heads at a time.

    q, k, v (B, H, N, D), any strides; returns (B, H, N, D) in q's dtype (a view of a (B, N, H, D)
    tensor, so merging the heads back is free). For the float32 activations of ``dtype: int8``
    on CPUs with native bfloat16: SDPA's flash kernel multiplies in float32 (and in bfloat16 it is
    no faster), while oneDNN's bfloat16 products run at twice the float32 rate. The softmax reads
    bfloat16 scores and sums in float32 (ATen); the heads go in blocks whose scores stay in the
    cache, in one buffer that the softmax overwrites (the same bits as a new one, 1.04x). Rounding
    q, k, v, scores and probabilities to bfloat16 costs about 1% of the largest output, less than
    the int8 activations around it (BENCHMARKS.md).
    """
    b, h, n, d = q.shape
    lk = k.shape[2]
    qs = torch.mul(q, d ** -0.5, out=torch.empty(b, h, n, d, dtype=dtype)).view(b * h, n, d)
    ks = torch.empty(b, h, lk, d, dtype=dtype).copy_(k).view(b * h, lk, d).transpose(1, 2)
    vs = torch.empty(b, h, lk, d, dtype=dtype).copy_(v).view(b * h, lk, d)
    out = torch.empty(b * h, n, d, dtype=dtype)
    block = max(1, LOW_PRECISION_BLOCK_BYTES // (n * lk * out.element_size()))
    scores = torch.empty(min(block, b * h), n, lk, dtype=dtype)      # one buffer, the softmax in place
    for s in range(0, b * h, block):
        e = min(s + block, b * h)
        block_scores = torch.bmm(qs[s:e], ks[s:e], out=scores[:e - s])
        torch.bmm(torch.softmax(block_scores, dim=-1, out=block_scores), vs[s:e], out=out[s:e])
    result = torch.empty(b, n, h, d, dtype=q.dtype)
    result.transpose(1, 2).copy_(out.view(b, h, n, d))
    return result.transpose(1, 2)


def _normalize_after(v: Tensor) -> bool:
    """
    Whether to divide the softmax's sum out of the (B, H, Lq, D) output instead of the (B, H, Lq, Lk) scores.

    Only in float32 CPU code being compiled: a compiled softmax evaluates ``exp`` and writes
    the probabilities in full, and normalising after the value product saved 6-8% of the
    compiled denoising loop (tiny SmolVLA, batch 4; the git history of BENCHMARKS.md). Eager code keeps
    ATen's softmax kernel, bfloat16 keeps LeRobot's order (probabilities rounded to
    bfloat16 before the value product), and GPUs keep the arithmetic they were measured with.
    """
    return v.dtype == torch.float32 and v.device.type == "cpu" and torch.compiler.is_compiling()


def _unnormalized_softmax(scores: Tensor) -> tuple[Tensor, Tensor]:
    """``exp(scores - max)`` and its sum over the last dim: softmax = weights / total."""
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    return weights, weights.sum(-1, keepdim=True)


def attention_split(q: Tensor, prefix_kv: tuple[Tensor, Tensor], suffix_kv: tuple[Tensor, Tensor], mask: Tensor,
                    scale: float | None = None) -> Tensor:
    """
    Grouped-query attention of q over [prefix; suffix] K/V without concatenating them.

    The prefix stays untouched and uncopied: scores against each part are joined
    (B, H, Lq, Lp + Ls), one softmax runs over both, and the two value products are
    summed. This is the ``eager`` backend's arithmetic (float32 scores), written
    so that a graph compiler sees a pure function with no K/V copy per step.
    q (B, H, Lq, D); prefix and suffix k, v (B, H_kv, Lp | Ls, D); mask (B, 1, Lq, Lp + Ls).
    """
    (kp, vp), (ks, vs) = prefix_kv, suffix_kv
    b, h, lq, d = q.shape
    groups, lp = kp.shape[1], kp.shape[2]
    if scale is None:
        scale = d ** -0.5
    qg = q.float().reshape(b, groups, h // groups * lq, d)          # the heads sharing one K/V head, stacked
    scores = torch.cat([qg @ kp.float().transpose(-1, -2), qg @ ks.float().transpose(-1, -2)], -1)
    scores = scores.view(b, h, lq, -1) * scale + mask.float()        # (B, H, Lq, Lp + Ls)
    if _normalize_after(vp):
        weights, total = _unnormalized_softmax(scores)
        weights = weights.view(b, groups, h // groups * lq, -1)
        out = (weights[..., :lp] @ vp + weights[..., lp:] @ vs).view(b, h, lq, d)
        return out / total
    probs = torch.softmax(scores, dim=-1).to(vp.dtype).view(b, groups, h // groups * lq, -1)
    out = probs[..., :lp] @ vp + probs[..., lp:] @ vs
    return out.view(b, h, lq, d)


def fixed_kv_layout(k: Tensor, v: Tensor, mask: Tensor, num_heads: int,
                    scale: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """
    K/V that stay fixed over many queries (attention to a frozen prefix), laid out once for ``fixed_kv_attention``.

    k, v (B, H_kv, Lk, D); mask (B, 1, Lq, Lk) additive float. Returns, all contiguous:
    k transposed and multiplied by the scale (B, H_kv, D, Lk), v (B, H_kv, Lk, D), and the
    mask repeated for the query heads that share a K/V head (B, H_kv, n_rep * Lq, Lk). The
    batch stays on dim 0, so a batch slice of them is still valid.
    """
    b, groups, lk, d = k.shape
    n_rep = num_heads // groups
    if scale is None:
        scale = d ** -0.5
    k_t = (k.transpose(-1, -2) * scale).contiguous()
    return k_t, v.contiguous(), grouped_mask(mask, b, groups, n_rep)


def grouped_mask(mask: Tensor, b: int, groups: int, n_rep: int) -> Tensor:
    """(B or 1, 1, Lq, Lk) additive mask -> (B, groups, n_rep * Lq, Lk), contiguous: one per stacked query head."""
    lq, lk = mask.shape[-2:]
    return mask.expand(b, groups * n_rep, lq, lk).reshape(b, groups, n_rep * lq, lk).contiguous()


def fixed_kv_attention(q: Tensor, k_t: Tensor, v: Tensor, grouped_mask: Tensor) -> Tensor:
    """
    Grouped-query attention over K/V laid out by ``fixed_kv_layout``: three kernels.

    ``baddbmm`` adds the mask to the (pre-scaled) scores of the query heads that share a
    K/V head, stacked; then softmax and ``bmm``. On the CPU with 50 queries and 16-wide
    heads this is faster than the flash kernel, because the transpose, scale and mask
    expansion are done once per prefix instead of at every call. q (B, H, Lq, D) -> (B, H, Lq, D).
    """
    b, h, lq, d = q.shape
    groups, lk = k_t.shape[1], k_t.shape[-1]
    qg = q.reshape(b * groups, h // groups * lq, d)
    scores = torch.baddbmm(grouped_mask.view(b * groups, -1, lk), qg, k_t.view(b * groups, d, lk))
    out = torch.bmm(torch.softmax(scores, dim=-1), v.view(b * groups, lk, d))
    return out.view(b, h, lq, d)
