# SPDX-License-Identifier: Apache-2.0
"""
Eager CPU sampling replayed from TorchScript traces: the same ops in the same order, no Python between them.

A full-size SmolVLA chunk is ~7,500 ops, each dispatched from Python with the GIL held
between them; in the node the executor thread wants the same GIL for every callback.
A trace records the ops of one eager chunk (int8's fbgemm weights included, which
``torch.export`` cannot carry) and replays them from C++ with the GIL released, so the
arithmetic, and the bits, are eager's. What a trace records is fixed in it: the input
shapes (the runtime keys each trace by ``input_signature``), every Python branch and
number the model computed. So a built trace is checked on other inputs of the same
shapes against eager Python before it is used (``Traces.build``), and refused where it
differs. The ``torch.jit`` tracer is deprecated in favour of ``torch.export``, which
cannot carry prepacked int8 weights; where a torch has no tracer the runtime stays eager.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from vla_policy_node.model.prefix_cache import VLAPrefixCache
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.model.vla import FlowMatchingVLA
from vla_policy_node.runtime.compiled import DenoisingLoop, input_signature, PrefixPass
from vla_policy_node.runtime.shape_buckets import smallest_holding, with_prompt_length, without_shared_padding

Layout = tuple[pytree.TreeSpec, tuple[bool, ...]]     # a pytree's structure, and which of its leaves are None


def available() -> bool:
    """Whether this torch can trace (``torch.jit.trace``)."""
    return hasattr(torch, "jit") and hasattr(torch.jit, "trace")


def tensors_of(tree: Any) -> tuple[list[Tensor], Layout]:
    """Split a pytree into its tensor leaves and a layout that ``rebuild`` reassembles it from."""
    leaves, spec = pytree.tree_flatten(tree)
    return [leaf for leaf in leaves if leaf is not None], (spec, tuple(leaf is None for leaf in leaves))


def rebuild(tensors: Sequence[Tensor], layout: Layout) -> Any:
    """Inverse of ``tensors_of``."""
    spec, nones = layout
    it = iter(tensors)
    return pytree.tree_unflatten([None if none else next(it) for none in nones], spec)


class _OnTensors(nn.Module):
    """``inner`` called on a flat tuple of tensors, returning one: all that TorchScript traces (no None, no dicts)."""

    def __init__(self, inner: nn.Module, layout: Layout) -> None:
        super().__init__()
        self.inner = inner
        self.in_layout = layout
        self.out_layout: Layout | None = None          # recorded while tracing

    def forward(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        out, self.out_layout = tensors_of(self.inner(*rebuild(tensors, self.in_layout)))
        return tuple(out)


class EagerLoop(DenoisingLoop):
    """
    The denoising loop over a frozen ``VLAPrefixCache`` refilled from the prefix K/V.

    Unlike ``compiled.DenoisingLoop`` (``FrozenPrefix``'s split attention, for graph compilers)
    this is eager's arithmetic: the cache's scratch buffers and kernels, bit for bit.
    """

    def frozen(self, keys: tuple[Tensor, ...], values: tuple[Tensor, ...]) -> VLAPrefixCache:
        """Return a frozen cache holding ``keys`` and ``values``, as ``PolicyRuntime.encode`` leaves its own."""
        cache = VLAPrefixCache()
        for i, (k, v) in enumerate(zip(keys, values)):
            cache.update(k, v, i)
        cache.freeze(len(keys))
        return cache


def trace(module: nn.Module, args: tuple) -> Callable[..., Any]:
    """Trace ``module`` on ``args`` (any pytree of tensors and None); return a callable taking and giving the same."""
    tensors, layout = tensors_of(args)
    flat = _OnTensors(module, layout)
    with warnings.catch_warnings():
        # The tracer warns at every shape it turns into a Python number: shapes are what a trace is keyed by.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)          # torch.tensor of a traced size: a constant, as wanted
        traced = torch.jit.trace(flat, tuple(tensors), check_trace=False, strict=False)
    out_layout = flat.out_layout

    def call(*call_args: Any) -> Any:
        # optimized_execution off: the recorded ops as they are, with no profiling runs or re-specialisation
        with torch.jit.optimized_execution(False):
            return rebuild(traced(*tensors_of(call_args)[0]), out_layout)
    return call


class TracedSample:
    """The prefix pass and the eager denoising loop of one input signature, traced; call under inference mode."""

    def __init__(self, model: FlowMatchingVLA, time_cond: list[Tensor], dt: Tensor, num_steps: int,
                 inputs: ModelInputs, noise: Tensor) -> None:
        args = self.prefix_args(inputs)
        self.prefix = trace(PrefixPass(model), args)
        keys, values, pad, extras = self.prefix(*args)
        self.denoise = trace(EagerLoop(model, time_cond, dt, num_steps), (noise, keys, values, pad, extras))
        self.num_layers = len(keys)

    @staticmethod
    def prefix_args(inputs: ModelInputs) -> tuple:
        return inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask, inputs.state

    def encode(self, inputs: ModelInputs, cache: VLAPrefixCache) -> tuple:
        """Run the traced prefix pass into ``cache`` (filled, frozen, as eager leaves it); return the loop's inputs."""
        cache.reset()
        keys, values, pad, extras = self.prefix(*self.prefix_args(inputs))
        for i, (k, v) in enumerate(zip(keys, values)):
            cache.update(k, v, i)
        cache.freeze(self.num_layers)
        return keys, values, pad, extras

    def __call__(self, inputs: ModelInputs, noise: Tensor, cache: VLAPrefixCache) -> Tensor:
        return self.denoise(noise, *self.encode(inputs, cache))


EagerSample = Callable[[ModelInputs, Tensor], Tensor]


class Traces:
    """
    A runtime's traced chunks, by input signature, and why any shape was refused.

    A traced chunk's prompt is stripped of the padding (as eager's is) and then padded up to
    one of ``prompt_lengths`` (empty: kept at its own length), so that a few traces, all built
    in the warm-up, serve every instruction; its actions are eager's on that padded prompt.
    """

    def __init__(self, prompt_lengths: Sequence[int] = ()) -> None:
        self.prompt_lengths = tuple(prompt_lengths)
        self.by_signature: dict[tuple, TracedSample] = {}
        self.report = ""                    # why a shape was refused (empty: none was)

    @property
    def signatures(self) -> tuple[tuple, ...]:
        """Return the input shapes and dtypes traced (``compiled.input_signature``), in order."""
        return tuple(self.by_signature)

    def clear(self) -> None:
        self.by_signature.clear()
        self.report = ""

    def shaped(self, inputs: ModelInputs) -> ModelInputs:
        """Return the inputs a traced chunk runs on: the prompt stripped of its padding, padded up to its bucket."""
        inputs = without_shared_padding(inputs)
        length = smallest_holding(self.prompt_lengths, inputs.tokens.shape[1])
        return inputs if length is None else with_prompt_length(inputs, length)

    def find(self, inputs: ModelInputs, noise: Tensor) -> Optional[TracedSample]:
        """Return the trace of ``inputs`` (already ``shaped``) and float32 ``noise``; None where there is none."""
        return self.by_signature.get(input_signature(inputs, noise))

    def build(self, model: FlowMatchingVLA, time_cond: list[Tensor], dt: Tensor, num_steps: int,
              inputs: ModelInputs, noise: Tensor, eager: EagerSample, cache: VLAPrefixCache) -> None:
        """
        Trace the chunk of ``inputs``' batch size at every prompt length, each checked against ``eager``.

        A trace is kept only where it gives eager's bits on other inputs of its shapes
        (``probe_inputs``); otherwise those shapes run in Python and ``report`` says why.
        """
        base = without_shared_padding(inputs)
        for length in self.prompt_lengths or (base.tokens.shape[1],):
            shaped = with_prompt_length(base, length)
            key = input_signature(shaped, noise)
            if key in self.by_signature:
                continue
            with torch.inference_mode():
                try:
                    built = TracedSample(model, time_cond, dt, num_steps, shaped, noise)
                    probe, probe_noise = probe_inputs(shaped, noise)
                    same = torch.equal(built(probe, probe_noise, cache), eager(probe, probe_noise))
                    reason = "" if same else "its actions differ from eager Python's on other inputs"
                except Exception as error:  # noqa: B902 - the tracer fails in many ways
                    first_line = (str(error).strip().splitlines() or [""])[0][:200]
                    reason = f"tracing failed: {type(error).__name__}: {first_line}"
            if reason:
                self.report = f"prompts of {length} tokens run in Python, not traced: {reason}"
            else:
                self.by_signature[key] = built
        # The tracer leaves garbage in a reference cycle that holds the traced model (torch.jit's
        # ``trace_module``, a recursive closure): collected here, a released policy is freed at once.
        gc.collect()


def probe_inputs(inputs: ModelInputs, noise: Tensor) -> tuple[ModelInputs, Tensor]:
    """
    Other inputs of the same shapes, to check a trace on: mirrored images, shifted state, new noise.

    A trace that baked a value of its example into a constant gives other actions on these.
    """
    generator = torch.Generator().manual_seed(1)
    state = None if inputs.state is None else inputs.state + 0.25
    return (ModelInputs([im.flip(-1) for im in inputs.images], list(inputs.image_masks), inputs.tokens,
                        inputs.token_mask, state),
            torch.randn(noise.shape, generator=generator, dtype=noise.dtype).to(noise.device))
