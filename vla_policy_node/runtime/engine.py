# SPDX-License-Identifier: Apache-2.0
"""
PolicyRuntime: observation -> one prefix pass -> read-only denoising -> action chunk.

The runtime owns the prefix cache and the counters the node reports. A
family model provides three methods (see ``model/vla.py``); the runtime
never looks inside them, so every family gets the same prefix-once guarantee.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch
from torch import Tensor

from vla_policy_node.runtime import traced
from vla_policy_node.runtime.compiled import CompiledSample, input_signature
from vla_policy_node.model.flow import VelocityFn, euler_integrate, euler_schedule
from vla_policy_node.model.prefix_cache import PrefixContext, VLAPrefixCache
from vla_policy_node.runtime.program_cache import (compiler_settings, device_kind, ProgramCache, source_digest,
                                                   tensors_digest)
from vla_policy_node.runtime.shape_buckets import (smallest_holding, with_batch_size, with_prompt_length,
                                                   without_shared_padding)
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.model.vla import FlowMatchingVLA

# Config fields only the preprocessor reads: the prompt and image shapes they lead to are in each
# program's input signature, so they stay out of the program key, and a checkpoint saved with
# `longest` prompt padding shares its programs with the same weights saved with `max_length`.
INPUT_ONLY_CONFIG_FIELDS = frozenset({"tokenizer_max_length", "pad_language_to", "image_size", "camera_names"})


# How an unguided chunk runs (``PolicyRuntime.path``).
EAGER, COMPILED, GRAPHS = "eager", "compiled", "graphs"


@dataclass(frozen=True)
class RuntimeConfig:
    """
    How a policy runs, chosen once before its warm-up (from the node's or server's parameters).

    The warm-up builds what this asks for and may only step back from it (compiled code
    slower than eager, a batch size that fails to build); guided (RTC) chunks always run eager.
    """

    cuda_graphs: bool = False                  # capture the prefix pass and the loop; acts on CUDA only
    torch_compile: bool = False                # compile them (CUDA graphs win where both are asked)
    batch_sizes: tuple[int, ...] = ()          # batch buckets to build (a server's); empty: each call's own
    trace: bool = False                        # CPU eager chunks replayed from traces built in the warm-up (``traced``)
    compile_cache_dir: Optional[Path] = None   # compiled programs' cache (None: the user's cache folder)

    def path(self, device: torch.device) -> str:
        """Return how unguided chunks run on ``device``: EAGER, COMPILED or GRAPHS."""
        if self.cuda_graphs and device.type == "cuda":
            return GRAPHS
        return COMPILED if self.torch_compile else EAGER


@dataclass
class RuntimeStats:
    """Counters and recent stage latencies (seconds) of one policy."""

    control_steps: int = 0
    prefix_passes: int = 0
    denoise_steps: int = 0
    cache_resets: int = 0
    window: int = 1000
    timings: dict[str, deque] = field(default_factory=dict)

    def clear(self) -> None:
        """Zero the counters and forget the latencies (after warm-up)."""
        self.control_steps = self.prefix_passes = self.denoise_steps = self.cache_resets = 0
        self.timings.clear()

    def record(self, stage: str, seconds: float) -> None:
        self.timings.setdefault(stage, deque(maxlen=self.window)).append(seconds)

    def latency(self, stage: str) -> tuple[float, float]:
        """(p50, p95) in seconds of a stage over the recent window; (nan, nan) before any."""
        samples = self.timings.get(stage)
        if not samples:
            return float("nan"), float("nan")
        arr = np.fromiter(samples, dtype=np.float64)
        return float(np.percentile(arr, 50)), float(np.percentile(arr, 95))


class PolicyRuntime:
    """Runs a ``FlowMatchingVLA`` with a prefix cache built once per control step."""

    def __init__(self, model: FlowMatchingVLA, num_steps: int, device: torch.device,
                 config: RuntimeConfig = RuntimeConfig(), prompt_lengths: tuple[int, ...] = (),
                 trace_prompt_lengths: tuple[int, ...] = ()) -> None:
        self.model = model
        self.num_steps = num_steps
        self.device = device
        self.timesteps, self.dt = euler_schedule(num_steps)
        with torch.no_grad():   # not inference_mode: guided (autograd) sampling reads these too
            self.time_cond = model.time_conditioning(self.timesteps.to(device))
        self.cache = VLAPrefixCache()
        self.stats = RuntimeStats()
        self._graphs: dict[tuple, CudaGraphSample] = {}
        self._compiled: dict[tuple, CompiledSample] = {}
        self.build_new_signatures = True        # False after the warm-up: a new input shape runs eager
        # Shapes the graphs and programs are built for (see ``shape_buckets``); empty: each call's own.
        self.prompt_lengths = tuple(prompt_lengths)   # 'longest' padding pads a prompt up to one of these
        self.traces = traced.Traces(trace_prompt_lengths)   # eager chunks replayed without Python (the warm-up's)
        self._program_key: Optional[dict] = None
        self.configure(config)

    def configure(self, config: RuntimeConfig) -> None:
        """Choose how chunks run, before the warm-up (which builds it); drops whatever was built before."""
        self.config = config
        self.path = config.path(self.device)       # the warm-up's verdict may turn COMPILED into EAGER
        self.batch_sizes = tuple(config.batch_sizes)   # a server pads a batch up to one of these
        self.program_cache: Optional[ProgramCache] = None   # opened at the first compile
        self._graphs.clear()
        self._compiled.clear()
        self.traces.clear()

    def choose_path(self, path: str) -> None:
        """Run unguided chunks on ``path`` from now on: the warm-up's verdict (COMPILED may step back to EAGER)."""
        self.path = path

    @contextmanager
    def building(self) -> Iterator[None]:
        """Build graphs or programs for new input shapes inside the block (the warm-up); never after it."""
        self.build_new_signatures = True
        try:
            yield
        finally:
            self.build_new_signatures = False

    @property
    def torch_compile(self) -> bool:
        """Whether unguided chunks run compiled code now."""
        return self.path == COMPILED

    @property
    def cuda_graphs_active(self) -> bool:
        """Whether unguided chunks replay CUDA graphs."""
        return self.path == GRAPHS

    @property
    def compiled_signatures(self) -> tuple[tuple, ...]:
        """Input signatures (shapes, dtypes) the compiled path has compiled for, in order."""
        return tuple(self._compiled)

    def keep_batch_sizes(self, sizes: tuple[int, ...]) -> None:
        """Build only ``sizes`` from now on and free what was built for other batch sizes (those run eager)."""
        self.batch_sizes = tuple(sizes)
        for built in (self._compiled, self._graphs):
            for key in [k for k in built if k[-1][0][0] not in sizes]:   # k[-1]: the noise's (shape, dtype, device)
                del built[key]

    @property
    def tracing(self) -> bool:
        """Whether the warm-up traces eager chunks (``config.trace`` on a CPU, with a torch that traces)."""
        return self.config.trace and self.device.type == "cpu" and traced.available()

    @property
    def graphed_signatures(self) -> tuple[tuple, ...]:
        """Input signatures (shapes, dtypes) CUDA graphs were captured for, in order."""
        return tuple(self._graphs)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def encode(self, inputs: ModelInputs) -> PrefixContext:
        """Fill the cache from scratch and freeze it: the one prefix pass of a control step."""
        t0 = time.perf_counter()
        self.cache.reset()
        ctx = self.model.encode_prefix(inputs, self.cache)
        self.cache.freeze(self.model.num_cache_layers)
        self.stats.prefix_passes += 1
        self._sync()
        self.stats.record("prefix", time.perf_counter() - t0)
        return ctx

    def velocity_fn(self, ctx: PrefixContext) -> VelocityFn:
        def velocity(x_t: Tensor, k: int) -> Tensor:
            self.stats.denoise_steps += 1
            return self.model.velocity(x_t, self.time_cond[k], ctx)
        return velocity

    def sample(self, inputs: ModelInputs, noise: Tensor,
               guide: Optional[Callable[[VelocityFn], VelocityFn]] = None, path: Optional[str] = None) -> Tensor:
        """
        Sample normalized actions (B, chunk, max_action_dim), float32.

        ``guide`` wraps the velocity function (real-time chunking); guided
        sampling needs autograd, so it runs under ``no_grad`` with local
        ``enable_grad`` instead of ``inference_mode``, and always eager. Unguided
        calls with CUDA graphs or compiled code run padded up to a built bucket
        (``bucketed``) and return only their own rows. ``path`` (the warm-up's races)
        overrides ``self.path`` for this call.
        """
        self._check_noise(noise, inputs.batch_size)
        path = self.path if path is None else path
        if guide is None and path != EAGER:
            rows = inputs.batch_size
            built_inputs, built_noise = self.bucketed(inputs, noise.to(self.device, torch.float32))
            key = input_signature(built_inputs, built_noise)
            built = self._graphs if path == GRAPHS else self._compiled
            if key in built or self.build_new_signatures:
                sample = self._sample_graphed if path == GRAPHS else self._sample_compiled
                return sample(built_inputs, built_noise, key)[:rows]
        if guide is None and path == EAGER and self.traces.by_signature:
            actions = self._sample_traced(inputs, noise)
            if actions is not None:
                return actions
        return self._sample_eager(without_shared_padding(inputs), noise, guide)

    def _sample_eager(self, inputs: ModelInputs, noise: Tensor,
                      guide: Optional[Callable[[VelocityFn], VelocityFn]] = None) -> Tensor:
        """``sample`` in Python, op by op, on ``inputs`` as they are."""
        mode = torch.no_grad() if guide is not None else torch.inference_mode()
        with mode:
            ctx = self.encode(inputs)
            t0 = time.perf_counter()
            velocity = self.velocity_fn(ctx)
            if guide is not None:
                velocity = guide(velocity)
            actions = euler_integrate(velocity, noise.to(self.device, torch.float32), self.dt, self.num_steps)
            self._sync()
            self.stats.record("denoise", time.perf_counter() - t0)
        self.stats.control_steps += 1
        return actions

    def build_traces(self, inputs: ModelInputs, noise: Tensor) -> None:
        """Trace eager chunks of these inputs' batch size, one per prompt length bucket, each checked (the warm-up)."""
        self.traces.build(self.model, self.time_cond, self.dt, self.num_steps, inputs,
                          noise.to(self.device, torch.float32), self._sample_eager, self.cache)

    def _sample_traced(self, inputs: ModelInputs, noise: Tensor) -> Optional[Tensor]:
        """``sample`` replayed from the trace of these inputs' shapes; None where there is none."""
        inputs = self.traces.shaped(inputs)
        noise = noise.to(self.device, torch.float32)
        built = self.traces.find(inputs, noise)
        if built is None:
            return None
        with torch.inference_mode():
            t0 = time.perf_counter()
            prefix = built.encode(inputs, self.cache)
            t1 = time.perf_counter()
            actions = built.denoise(noise, *prefix)
        self._count_whole_loop(t1 - t0, time.perf_counter() - t1)
        return actions

    def bucketed(self, inputs: ModelInputs, noise: Tensor) -> tuple[ModelInputs, Tensor]:
        """
        Pad the prompt and the batch up to the smallest built length and size that hold them.

        A dimension no bucket holds (or with no buckets) stays as it is: a shape the
        warm-up did not build, which then runs eager.
        """
        length = smallest_holding(self.prompt_lengths, inputs.tokens.shape[1])
        if length is not None and length != inputs.tokens.shape[1]:
            inputs = with_prompt_length(inputs, length)
        size = smallest_holding(self.batch_sizes, inputs.batch_size)
        if size is not None and size != inputs.batch_size:
            inputs, noise = with_batch_size(inputs, noise, size)
        return inputs, noise

    def program_key(self) -> dict:
        """Return what every compiled program of this runtime is built from, but its inputs (computed once)."""
        if self._program_key is None:
            model = self.model
            self._program_key = {
                "torch": torch.__version__, "device": device_kind(self.device), "source": source_digest(),
                "model": type(model).__qualname__,
                "structure": _text_digest(repr(model)),
                "config": _config_digest(getattr(model, "config", None)),
                "backend": str(getattr(model, "backend", None)),
                "weights": tensors_digest([*model.named_parameters(), *model.named_buffers()]),
                "schedule": tensors_digest([("dt", self.dt), *((f"t{i}", t) for i, t in enumerate(self.time_cond))]),
                "num_steps": self.num_steps, "build_env": compiler_settings()}
        return self._program_key

    def sample_naive(self, inputs: ModelInputs, noise: Tensor) -> Tensor:
        """Sample by the reference path that recomputes the prefix at every denoising step (benchmarks, tests)."""
        self._check_noise(noise, inputs.batch_size)
        inputs = without_shared_padding(inputs)
        with torch.inference_mode():
            def velocity(x_t: Tensor, k: int) -> Tensor:
                ctx = self.encode(inputs)
                self.stats.denoise_steps += 1
                return self.model.velocity(x_t, self.time_cond[k], ctx)
            return euler_integrate(velocity, noise.to(self.device, torch.float32), self.dt, self.num_steps)

    def _sample_graphed(self, inputs: ModelInputs, noise: Tensor, key: tuple) -> Tensor:
        """``sample`` replayed from the CUDA graphs of this input signature (captured in the warm-up)."""
        # Capture and replay on the policy's GPU: capture streams are made on the current device.
        with torch.inference_mode(), torch.cuda.device(self.device):
            if key not in self._graphs:
                self._graphs[key] = CudaGraphSample(self, inputs, noise)
            graphs = self._graphs[key]
            t0 = time.perf_counter()
            graphs.replay_prefix(inputs)
            self._sync()
            t1 = time.perf_counter()
            actions = graphs.replay_denoise(noise)
            self._sync()
        self._count_whole_loop(t1 - t0, time.perf_counter() - t1)
        return actions

    def _sample_compiled(self, inputs: ModelInputs, noise: Tensor, key: tuple) -> Tensor:
        """``sample`` through the compiled prefix pass and loop of this input signature (compiled at its first call)."""
        noise = noise.to(self.device, torch.float32).contiguous()
        with torch.no_grad():
            if key not in self._compiled:
                if self.program_cache is None:
                    self.program_cache = ProgramCache(self.config.compile_cache_dir)
                # The generated kernels fix their OpenMP thread count at compile time.
                program_key = {**self.program_key(), "threads": torch.get_num_threads()}
                self._compiled[key] = CompiledSample(self.model, self.time_cond, self.dt, self.num_steps,
                                                     inputs, noise, self.device, self.program_cache, program_key)
            compiled = self._compiled[key]
            t0 = time.perf_counter()
            self.cache.reset()
            keys, values, pad, extras = compiled.prefix(*compiled.prefix_args(inputs))
            for i, (k, v) in enumerate(zip(keys, values)):
                self.cache.update(k, v, i)
            self.cache.freeze(self.model.num_cache_layers)
            self._sync()
            t1 = time.perf_counter()
            prefix = self.cache.frozen_view()
            actions = compiled.denoise(noise, prefix.keys, prefix.values, pad, extras)
            self._sync()
        self._count_whole_loop(t1 - t0, time.perf_counter() - t1)
        return actions

    def _count_whole_loop(self, prefix_s: float, denoise_s: float) -> None:
        """Record a control step whose denoising loop ran as one piece (a graph replay or compiled code)."""
        self.stats.record("prefix", prefix_s)
        self.stats.record("denoise", denoise_s)
        self.stats.prefix_passes += 1
        self.stats.denoise_steps += self.num_steps
        self.stats.control_steps += 1

    def reset(self) -> None:
        """Episode boundary: no prefix may outlive its episode."""
        self.cache.reset()
        self.stats.cache_resets += 1

    def _check_noise(self, noise: Tensor, batch: int) -> None:
        want = (batch, self.model.chunk_size, self.model.max_action_dim)
        if tuple(noise.shape) != want:
            raise ValueError(f"noise must have shape {want}, got {tuple(noise.shape)}")


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _config_digest(config: object) -> str:
    """Digest of what a model config sets for the model itself (``INPUT_ONLY_CONFIG_FIELDS`` left out)."""
    if not dataclasses.is_dataclass(config):
        return _text_digest(repr(config))
    kept = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if f.name not in INPUT_ONLY_CONFIG_FIELDS}
    return _text_digest(f"{type(config).__qualname__} {kept!r}")


class CudaGraphSample:
    """
    The prefix pass and the denoising loop of one input shape, captured as two CUDA graphs.

    Inputs and noise are copied into static tensors and the graphs replayed; the
    denoising graph reads the cache the prefix graph wrote (one shared memory
    pool, replayed in capture order). Two eager passes on a side stream come
    first, as capture requires. Guided (RTC) sampling never comes here.
    """

    def __init__(self, runtime: PolicyRuntime, inputs: ModelInputs, noise: Tensor) -> None:
        device, model = runtime.device, runtime.model
        self.inputs = ModelInputs(
            images=[im.clone() for im in inputs.images], image_masks=[m.clone() for m in inputs.image_masks],
            tokens=inputs.tokens.clone(), token_mask=inputs.token_mask.clone(),
            state=None if inputs.state is None else inputs.state.clone())
        self.noise = noise.to(device, torch.float32).clone()
        self.cache = VLAPrefixCache()
        dt = runtime.dt.to(device)            # no host-to-device copy inside the capture

        def prefix() -> PrefixContext:
            self.cache.reset()
            ctx = model.encode_prefix(self.inputs, self.cache)
            self.cache.freeze(model.num_cache_layers)
            return ctx

        def denoise(ctx: PrefixContext) -> Tensor:
            def velocity(x_t: Tensor, k: int) -> Tensor:
                return model.velocity(x_t, runtime.time_cond[k], ctx)
            return euler_integrate(velocity, self.noise, dt, runtime.num_steps)

        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                denoise(prefix())
        torch.cuda.current_stream(device).wait_stream(side)
        self.prefix_graph = torch.cuda.CUDAGraph()
        # Captured on ``side``, made on this device: graph()'s default capture stream is made
        # once per process, on whichever device was current at the first capture.
        with torch.cuda.graph(self.prefix_graph, stream=side):
            self.ctx = prefix()
        self.denoise_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.denoise_graph, pool=self.prefix_graph.pool(), stream=side):
            self.actions = denoise(self.ctx)

    def replay_prefix(self, inputs: ModelInputs) -> None:
        for dst, src in zip(self.inputs.images, inputs.images):
            dst.copy_(src)
        for dst, src in zip(self.inputs.image_masks, inputs.image_masks):
            dst.copy_(src)
        self.inputs.tokens.copy_(inputs.tokens)
        self.inputs.token_mask.copy_(inputs.token_mask)
        if inputs.state is not None:
            self.inputs.state.copy_(inputs.state)
        self.prefix_graph.replay()

    def replay_denoise(self, noise: Tensor) -> Tensor:
        """Actions (B, chunk, max_action_dim), float32; a copy, as the next replay overwrites the graph's output."""
        self.noise.copy_(noise)
        self.denoise_graph.replay()
        return self.actions.clone()
