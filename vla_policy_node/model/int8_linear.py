# SPDX-License-Identifier: Apache-2.0
"""
Opt-in int8 linear layers on the CPU (``dtype: int8``): int8 weights, float32 activations.

Each weight the model multiplies by (``blocks.packing_targets``) is quantized once,
symmetric per output channel, and prepacked for fbgemm's dynamic int8 matmul
(``torch.ops.quantized.linear_dynamic``: the activations are quantized per call,
per tensor). fbgemm runs on AVX2 and on AVX-512 (VNNI where present). The packed
int8 copy takes the slot of the oneDNN-packed float copy, so the float weights stay
for the state dict, autograd (guided sampling) and compiled code, which take the
plain path (``packed_linear.linear`` dispatches). Everything else (norms, attention, the vision tower's small weights)
stays float32. The action error against float32 is bounded in
``test/model/test_int8_linear.py`` (``INT8_ACTION_ATOL``) and published in BENCHMARKS.md.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Optional

import torch
from torch import Tensor, nn

from vla_policy_node.model import packed_linear
from vla_policy_node.model.blocks import copies_hidden, packed_bias, packing_targets
from vla_policy_node.model.vision import VisionAttention

ENGINE = "x86"     # fbgemm for linear layers on every x86 CPU with AVX2


def available() -> bool:
    """Whether this torch build has the dynamic int8 matmul and an x86 engine for it."""
    return ENGINE in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic")


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX); elsewhere oneDNN emulates it, slower."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def prepack(weight: Tensor, bias: Optional[Tensor] = None) -> Any:
    """
    Quantize a float (out, in) weight per output channel (symmetric) and prepack it for fbgemm, with its bias.

    fbgemm adds the bias as it writes the (float) output: one pass less over the output than
    adding it after the product (2.3 ms of a SigLIP MLP's (1024, 3072) output on the CPU of BENCHMARKS.md).
    """
    w = weight.detach().float().contiguous()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():           # torch 2.13 marks quantized tensors deprecated; the ops remain
        warnings.simplefilter("ignore", UserWarning)
        q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, None if bias is None else bias.detach().float().contiguous())


def quantize_linears(model: nn.Module) -> int:
    """
    Give every large float32 CPU matmul of ``model`` an int8 prepacked weight; return how many.

    Call after ``fuse_projections`` and instead of ``pack_linears``. The vision tower's q/k/v
    products are fused here too (int8 products are exact integer sums scaled per output channel,
    so one fused product gives the bits of three), and its attention multiplies in bfloat16
    where the CPU does so natively (``vision.VisionAttention.products_dtype``); a family's denoising
    attention at a batch of one takes its fixed-K/V kernel where it has one (``fixed_kv_at_batch_one``).
    Raises ValueError off the CPU or where this torch has no int8 matmul.
    """
    if not available():
        raise ValueError(f"dtype int8 needs torch's quantized engine {ENGINE!r} (fbgemm); "
                         f"this torch offers {torch.backends.quantized.supported_engines}")
    torch.backends.quantized.engine = ENGINE
    for module in model.modules():
        if isinstance(module, VisionAttention) and module.qkv_weight is None \
                and module.q_proj.weight.dtype == torch.float32 and module.q_proj.weight.device.type == "cpu":
            module.fuse()
            if native_bfloat16():
                module.products_dtype = torch.bfloat16
        if hasattr(module, "fixed_kv_at_batch_one"):
            module.fixed_kv_at_batch_one = True
    count = 0
    for module, attr, weight in packing_targets(model):
        if weight.device.type != "cpu":
            raise ValueError("dtype int8 runs on the CPU only; use float32 or bfloat16 on a GPU")
        if weight.dtype != torch.float32:
            continue
        if type(module) is nn.Linear:
            module.__class__ = packed_linear.PackedLinear
        setattr(module, attr, prepack(weight, packed_bias(module, attr)))
        count += 1
    return count


def count(model: nn.Module) -> int:
    """How many of ``model``'s matmuls run on int8 prepacked weights (0: a float model)."""
    return sum(not isinstance(getattr(m, a, None), (Tensor, type(None))) for m, a, _ in packing_targets(model))


def hidden(model: nn.Module) -> contextlib.AbstractContextManager:
    """
    Hide the int8 prepacked weights (the float path runs) while ``torch.export`` traces ``model``.

    Export cannot carry fbgemm's packed objects; compiled programs take the float32 weights.
    A model without int8 weights is left as it is.
    """
    return copies_hidden(model, lambda copy: not isinstance(copy, Tensor))
