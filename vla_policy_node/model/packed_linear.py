# SPDX-License-Identifier: Apache-2.0
"""
CPU matmuls through oneDNN with weights packed once, instead of MKL's sgemm per call.

On the AVX-512 CPU of BENCHMARKS.md, torch's float32 ``F.linear`` (MKL) reaches
about 190 GFLOP/s on two cores; oneDNN with pre-packed (reordered) weights
reaches 420-490, at the same float32 accuracy (errors against float64 of the
same order). For bfloat16, packing saves the per-call weight reorder (5-15%).
This is what inductor's CPU weight prepacking does, without compiling anything.

Packing keeps the module tree and the state dict as they are: an ``nn.Linear``
becomes a ``PackedLinear`` (same parameters) that also holds the packed copy,
so the CPU holds the weights twice. Autograd (guided sampling) takes the plain
path: the packed kernel has no backward.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PACKED_DTYPES = (torch.float32, torch.bfloat16)
BATCH_HINT = 64          # rows per call the packing is tuned for; any row count works
MIN_ELEMENTS = 1 << 16   # smaller weights: oneDNN's per-call cost exceeds the gain (the tiny model got 25% slower)


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def dtype_supported(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs ``dtype`` on this CPU: bfloat16 needs AVX-512 (BF16) or AVX-NE-CONVERT."""
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype in PACKED_DTYPES


def worth_packing(weight: Tensor) -> bool:
    """Whether ``pack`` packs this weight on the CPU: a dtype oneDNN takes here, and large enough to pay."""
    return weight.numel() >= MIN_ELEMENTS and available() and dtype_supported(weight.dtype)


def pack(weight: Tensor) -> Optional[Tensor]:
    """oneDNN-packed copy of a (out, in) CPU weight, or None where packing does not apply or pay."""
    if weight.device.type != "cpu" or not worth_packing(weight):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), BATCH_HINT)


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], packed: Optional[Tensor]) -> Tensor:
    """
    Compute ``F.linear``, through the packed weight when there is one and no autograd is needed.

    Exported (compiled) code takes the plain weight: the compiler picks its own kernels.
    ``packed`` may also be an int8 prepacked weight (``int8_linear``, ``dtype: int8``), which
    carries ``bias`` itself: fbgemm adds it as it writes the output.
    """
    if (packed is None or x.dtype != weight.dtype or (x.requires_grad and torch.is_grad_enabled())
            or torch.compiler.is_compiling()):
        return F.linear(x, weight, bias)
    if not isinstance(packed, Tensor):                  # int8 prepacked weight and bias (``int8_linear``)
        return torch.ops.quantized.linear_dynamic(x, packed)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def fuse_linears(*linears: nn.Linear) -> tuple[Tensor, Optional[Tensor]]:
    """Concatenate the weights (and biases) of linears on the same input; their parameters become views."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    bias = None if linears[0].bias is None else torch.cat([lin.bias.detach() for lin in linears])
    start = 0
    for lin in linears:
        n = lin.out_features
        lin.weight = nn.Parameter(weight[start:start + n], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start:start + n], requires_grad=False)
        start += n
    return weight, bias


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose forward uses its packed weight (see ``blocks.pack_linears``)."""

    packed: Optional[Tensor] = None

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, self.packed)
