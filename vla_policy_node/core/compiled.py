"""
Ahead-of-time compiled sampling: the prefix pass and the denoising loop as two shared libraries.

Used by ``PolicyRuntime`` when ``torch_compile`` is set (the node's ``compile``
parameter), on any device; on CUDA the captured graphs of ``runtime`` win.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import Tensor, nn

from .flow import euler_integrate
from .prefix_cache import FrozenPrefix, PrefixContext, VLAPrefixCache
from .types import ModelInputs

if TYPE_CHECKING:
    from .runtime import FlowMatchingVLA, PolicyRuntime


def input_signature(inputs: ModelInputs, noise: Tensor) -> tuple:
    """Shapes and dtypes of everything a captured or compiled sample was specialised to."""
    tensors = [*inputs.images, *inputs.image_masks, inputs.tokens, inputs.token_mask, inputs.state, noise]
    return tuple(None if t is None else (tuple(t.shape), t.dtype) for t in tensors)


class PrefixPass(nn.Module):
    """The prefix pass as a pure function of the inputs: returns the per-layer K/V instead of filling a cache."""

    def __init__(self, model: FlowMatchingVLA) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: list[Tensor], image_masks: list[Tensor], tokens: Tensor, token_mask: Tensor,
                state: Optional[Tensor]) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], Tensor, dict]:
        cache = VLAPrefixCache()
        ctx = self.model.encode_prefix(ModelInputs(images, image_masks, tokens, token_mask, state), cache)
        keys, values = zip(*cache.layers)
        return keys, values, ctx.pad_mask, ctx.extras


class DenoisingLoop(nn.Module):
    """All Euler steps against a ``FrozenPrefix``: attends to the prefix without copying or writing it."""

    def __init__(self, runtime: PolicyRuntime) -> None:
        super().__init__()
        self.model = runtime.model
        self.time_cond, self.dt, self.num_steps = runtime.time_cond, runtime.dt, runtime.num_steps

    def forward(self, noise: Tensor, keys: tuple[Tensor, ...], values: tuple[Tensor, ...], pad: Tensor,
                extras: dict) -> Tensor:
        ctx = PrefixContext(FrozenPrefix(keys, values), pad, extras)
        return euler_integrate(lambda x_t, k: self.model.velocity(x_t, self.time_cond[k], ctx), noise, self.dt,
                               self.num_steps)


class CompiledSample:
    """
    The prefix pass and the whole denoising loop of one input signature, compiled ahead of time.

    On a CPU, where there are no CUDA graphs, this removes what dominates small
    models: one dispatch and one Python call per op. Each piece is exported
    (``torch.export``) and compiled by AOTInductor into a shared library: the
    elementwise chains (norms, RoPE, gating, softmax) become fused C++ loops,
    the matmuls direct library calls, the fixed number of steps one unrolled
    program, and a call costs no Python and no guard checks. The runtime still
    freezes the returned K/V in its ``VLAPrefixCache`` and checks them after the
    loop. A compiled library checks nothing about its inputs, so the runtime
    keys each one by ``input_signature``. Needs a C++ compiler at run time.
    """

    def __init__(self, runtime: PolicyRuntime, inputs: ModelInputs, noise: Tensor, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.prefix = aot_compile(PrefixPass(runtime.model), self.prefix_args(inputs), folder / "prefix.pt2")
        keys, values, pad, extras = self.prefix(*self.prefix_args(inputs))
        self.denoise = aot_compile(DenoisingLoop(runtime), (noise, keys, values, pad, extras),
                                   folder / "denoise.pt2")

    @staticmethod
    def prefix_args(inputs: ModelInputs) -> tuple:
        return list(inputs.images), list(inputs.image_masks), inputs.tokens, inputs.token_mask, inputs.state


def aot_compile(module: nn.Module, args: tuple, package: Path) -> Callable:
    """Export ``module`` for ``args`` (static shapes) and compile it with AOTInductor; returns the loaded program."""
    program = torch.export.export(module, args, strict=False)
    path = torch._inductor.aoti_compile_and_package(program, package_path=str(package))
    return torch._inductor.aoti_load_package(path)
