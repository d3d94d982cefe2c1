# SPDX-License-Identifier: Apache-2.0
"""
Ahead-of-time compiled sampling: the prefix pass and the denoising loop as two shared libraries.

Used by ``PolicyRuntime`` when ``torch_compile`` is set (the node's ``compile``
parameter), on any device; on CUDA the captured graphs of ``runtime`` win. Programs
are stored in a ``ProgramCache`` on disk, so a restart loads them instead of compiling.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from vla_policy_node.model import int8_linear
from vla_policy_node.model.flow import euler_integrate
from vla_policy_node.model.prefix_cache import FrozenPrefix, PrefixContext, PrefixKV, VLAPrefixCache
from vla_policy_node.runtime.program_cache import ProgramCache
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.model.vla import FlowMatchingVLA


def input_signature(inputs: ModelInputs, noise: Tensor) -> tuple:
    """Shape, dtype and device of every input a captured or compiled sample was specialised to."""
    tensors = [*inputs.images, *inputs.image_masks, inputs.tokens, inputs.token_mask, inputs.state, noise]
    return tuple(None if t is None else (tuple(t.shape), t.dtype, t.device) for t in tensors)


def describe_args(args: tuple) -> dict:
    """Structure and shape/dtype/device of every tensor of a call: the input part of a cache key."""
    leaves, spec = pytree.tree_flatten(args)
    return {"structure": str(spec),
            "tensors": [[list(t.shape), str(t.dtype), str(t.device), list(t.stride())] if isinstance(t, Tensor)
                        else repr(t) for t in leaves]}


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

    def __init__(self, model: FlowMatchingVLA, time_cond: list[Tensor], dt: Tensor, num_steps: int) -> None:
        super().__init__()
        self.model = model
        self.time_cond, self.dt, self.num_steps = time_cond, dt, num_steps

    def frozen(self, keys: tuple[Tensor, ...], values: tuple[Tensor, ...]) -> PrefixKV:
        """Return what the steps attend through: ``FrozenPrefix``'s split attention, which compilers trace."""
        return FrozenPrefix(keys, values)

    def forward(self, noise: Tensor, keys: tuple[Tensor, ...], values: tuple[Tensor, ...], pad: Tensor,
                extras: dict) -> Tensor:
        ctx = PrefixContext(self.frozen(keys, values), pad, extras)
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
    program; a call costs one thin Python wrapper (about 50 µs) and no guard
    checks. What the libraries were built from is fixed in them: the weights,
    the time schedule and number of steps, the attention backend. Export
    proves the programs write none of their inputs (``aot_compile`` refuses
    one that would), so the prefix K/V the loop reads stay as the prefix pass
    left them. A library does not check its inputs, so the runtime keys each
    one by ``input_signature``. Needs a C++ compiler and Python headers.
    """

    def __init__(self, model: FlowMatchingVLA, time_cond: list[Tensor], dt: Tensor, num_steps: int,
                 inputs: ModelInputs, noise: Tensor, device: torch.device, cache: ProgramCache, key: dict) -> None:
        args = self.prefix_args(inputs)
        self.prefix: Callable = cache.load_or_build(
            {**key, "program": "prefix", "inputs": describe_args(args)},
            lambda path: aot_compile(PrefixPass(model), args, path), device)
        keys, values, pad, extras = self.prefix(*args)
        loop_args = (noise, keys, values, pad, extras)
        loop_backend = "eager" if device.type == "cpu" else getattr(model, "backend", None)

        def build_loop(path: Path) -> None:
            with attention_backend(model, loop_backend):
                aot_compile(DenoisingLoop(model, time_cond, dt, num_steps), loop_args, path)
        self.denoise: Callable = cache.load_or_build(
            {**key, "program": "denoise", "loop_backend": loop_backend, "inputs": describe_args(loop_args)},
            build_loop, device)

    @staticmethod
    def prefix_args(inputs: ModelInputs) -> tuple:
        """
        Return the ``PrefixPass`` arguments in fixed layouts (a library assumes the strides it was built for).

        Images are channels-last, as the pre-processor makes them from (H, W, 3) frames and as
        the patch convolution reads them: contiguous NCHW copies were turned back to NHWC
        inside the program (a 0.4 ms transpose at 12 images of 64 x 64).
        """
        def dense(t: Optional[Tensor]) -> Optional[Tensor]:
            return None if t is None else t.contiguous()
        return ([im.contiguous(memory_format=torch.channels_last) for im in inputs.images],
                [dense(m) for m in inputs.image_masks], dense(inputs.tokens), dense(inputs.token_mask),
                dense(inputs.state))


@contextmanager
def attention_backend(model: nn.Module, backend: Optional[str]) -> Iterator[None]:
    """
    Trace ``model`` with another attention backend (restored after).

    The CPU denoising loop is traced with ``eager`` arithmetic: its queries are one
    chunk (50 rows), so the scores are small, inductor fuses the softmax chain
    around two matmuls, and the step ran 7-14% faster than through CPU flash
    attention (tiny SmolVLA, batch 1-4, paired in one process). Self-attention
    layers already use this arithmetic (``attention_split``); this covers the
    cross-attention layers.
    """
    previous = getattr(model, "backend", None)
    if backend is None or previous is None:
        yield
        return
    model.backend = backend
    try:
        yield
    finally:
        model.backend = previous


def aot_compile(module: nn.Module, args: tuple, package_path: Path) -> None:
    """
    Export ``module`` for ``args`` (static shapes) and compile it with AOTInductor into ``package_path``.

    Refuses a program that writes any of its inputs or buffers: the prefix it
    reads must stay read-only.
    """
    with int8_linear.hidden(module):            # dtype int8: the compiled program takes the float32 weights
        program = torch.export.export(module, args, strict=False).run_decompositions()   # functional: writes listed
    signature = program.graph_signature
    if signature.user_inputs_to_mutate or signature.buffers_to_mutate:
        raise RuntimeError(f"{type(module).__name__} writes its inputs or buffers; refusing to compile it")
    torch._inductor.aoti_compile_and_package(program, package_path=str(package_path))
