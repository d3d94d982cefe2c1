# SPDX-License-Identifier: Apache-2.0
"""
The bench's measurements: stage timings, memory, matmul FLOPs, bytes read per step, the naive ratio.

``cli.run`` strings these together; each works on a loaded ``Policy`` and knows nothing of
LeRobot or of the report.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from vla_policy_node.model import int8_linear, packed_linear
from vla_policy_node.model.blocks import copies_hidden, packing_targets
from vla_policy_node.runtime.policy import Policy
from vla_policy_node.model.prefix_cache import VLAPrefixCache
from vla_policy_node.model.types import ModelInputs

TASK = "pick up the red cube and put it in the bin"
# Rows of a batch get prompts of different lengths, so that 'longest' padding has something to pad.
BATCH_TASKS = (TASK, "open the drawer", "put the cube in the bin", "stack the blocks")
STAGES = ("preprocess", "prefix", "denoise_step", "denoise", "postprocess", "total")


def summarize(seconds: list[float]) -> dict[str, float]:
    """Milliseconds: median, p95, max, n."""
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {"median_ms": float(np.median(ms)), "p95_ms": float(np.percentile(ms, 95)),
            "max_ms": float(ms.max()), "n": int(ms.size)}


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS counter (VmHWM), so writing the random checkpoint is not counted."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def available_memory_bytes() -> int:
    """MemAvailable: what can be allocated without swapping (page cache included, as the kernel reclaims it)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def unpacked(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """Hide the packed weights (the plain ``F.linear`` path runs): ``FlopCounterMode`` does not count oneDNN's."""
    return copies_hidden(model)


def tensor_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of the parameters and of the packed copies actually held."""
    packed = sum(t.numel() * t.element_size() for m, a, _ in packing_targets(model)
                 if isinstance(t := getattr(m, a, None), torch.Tensor))
    return {"weights": sum(p.numel() * p.element_size() for p in model.parameters()), "packed": packed}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def progress(msg: str) -> None:
    print(f"[vla-policy-bench] {msg}", file=sys.stderr, flush=True)


def publish(result: dict, path: Optional[Path]) -> None:
    """Print a benchmark's figures as JSON, and write them to ``path`` too where one is given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        path.write_text(text)


def make_observation(policy: Policy, frame_hw: tuple[int, int], seed: int, batch: int = 1) -> tuple[dict, np.ndarray]:
    """
    Random uint8 camera frames, state and tasks; noise (B, chunk, max_action_dim).

    At batch 1 the arrays are single-row ((H, W, 3), (D,)) and the task ``TASK``, as a robot
    sends them; larger batches stack rows with the prompts of ``BATCH_TASKS``.
    """
    rng = np.random.default_rng(seed)
    h, w = frame_hw
    lead = () if batch == 1 else (batch,)
    obs = {"images": {name: rng.integers(0, 256, (*lead, h, w, 3), dtype=np.uint8) for name in policy.camera_names},
           "state": rng.normal(size=(*lead, policy.state_dim)).astype(np.float32),
           "task": TASK if batch == 1 else [BATCH_TASKS[i % len(BATCH_TASKS)] for i in range(batch)]}
    noise = rng.standard_normal((batch, policy.chunk_size, policy.model.max_action_dim)).astype(np.float32)
    return obs, noise


class StepTimer:
    """Times each denoising step by wrapping the runtime's velocity function (a device sync per step)."""

    def __init__(self, policy: Policy) -> None:
        self.samples: list[float] = []
        runtime = policy.runtime
        inner = runtime.velocity_fn

        def timed(ctx):
            fn = inner(ctx)

            def velocity(x, k):
                t0 = time.perf_counter()
                v = fn(x, k)
                sync(runtime.device)
                self.samples.append(time.perf_counter() - t0)
                return v
            return velocity
        runtime.velocity_fn = timed


def count_flops(policy: Policy, inputs: ModelInputs, noise: torch.Tensor) -> dict[str, float]:
    """Matmul FLOPs of one prefix pass and one denoising step (attention counted through the eager backend)."""
    from torch.utils.flop_counter import FlopCounterMode

    model, runtime = policy.model, policy.runtime
    backend = getattr(model, "backend", None)
    if backend is not None:
        model.backend = "eager"
    try:
        with torch.inference_mode(), unpacked(model):
            cache = VLAPrefixCache()
            with FlopCounterMode(display=False) as prefix:
                ctx = model.encode_prefix(inputs, cache)
            cache.freeze(model.num_cache_layers)
            with FlopCounterMode(display=False) as step:
                model.velocity(noise, runtime.time_cond[0], ctx)
    finally:
        if backend is not None:
            model.backend = backend
    return {"prefix": float(prefix.get_total_flops()), "step": float(step.get_total_flops())}


def prefix_length(policy: Policy, inputs: ModelInputs) -> int:
    """Count the tokens in the prefix of ``inputs`` (one eager prefix pass)."""
    with torch.inference_mode():
        cache = VLAPrefixCache()
        policy.model.encode_prefix(inputs, cache)
    return cache.seq_length()


class _StateReads(TorchFunctionMode):
    """Record which of the model's weight storages the torch calls run under it read."""

    def __init__(self, owned: dict[int, int]) -> None:
        super().__init__()
        self.owned, self.read = owned, {}

    def __torch_function__(self, func: Callable, types: tuple, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        reads_data = getattr(func, "__name__", "") != "__get__"      # not ``.dtype``, ``.shape``, ...
        for leaf in pytree.tree_leaves((args, kwargs or {})) if reads_data else ():
            if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided:      # packed/sparse: no storage
                key = leaf.untyped_storage().data_ptr()
                if key in self.owned:
                    self.read[key] = self.owned[key]
        return func(*args, **(kwargs or {}))


def step_bytes(policy: Policy, inputs: ModelInputs, noise: torch.Tensor) -> dict[str, int]:
    """
    Bytes one denoising step must read from memory at least: its weights and the prefix K/V.

    The weights are every parameter or buffer storage that one ``velocity`` call passes to
    a torch function, each counted once: fused projections (buffers whose storage the
    covered linears share) included, cross-attention K/V projected once per prefix not.
    The GPU check divides this by the memory bandwidth: the step's floor.
    """
    model, runtime = policy.model, policy.runtime
    owned = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
             for t in [*model.parameters(), *model.buffers()]}
    with torch.inference_mode(), unpacked(model):
        cache = VLAPrefixCache()
        ctx = model.encode_prefix(inputs, cache)
        cache.freeze(model.num_cache_layers)
        with _StateReads(owned) as reads:
            model.velocity(noise.to(policy.device), runtime.time_cond[0], ctx)
        kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in layer)
    return {"weights": sum(reads.read.values()), "kv_cache": kv}


SETTLE_S = 0.05
"""
Idle time before each side's block of chunks. An OpenMP worker thread spins for about
9 ms after a parallel region (measured here: an idle process burns 8.8 ms of CPU in the
100 ms after one 2-thread matmul); without this pause that spinning takes a core from
the process timed next.
"""


def settle() -> None:
    """Wait until the other process's OpenMP threads have stopped spinning (see ``SETTLE_S``)."""
    time.sleep(SETTLE_S)


def naive_ratio(policy: Policy, inputs: ModelInputs, noise: torch.Tensor, iters: int,
                stages: dict) -> dict:
    """Time cached vs naive (prefix recomputed every step), alternating; measured and theoretical ratios."""
    rt, n = policy.runtime, policy.num_steps
    cached, naive = [], []
    a = b = None
    for i in range(iters):
        t0 = time.perf_counter()
        a = rt.sample(inputs, noise)
        sync(rt.device)
        t1 = time.perf_counter()
        b = rt.sample_naive(inputs, noise)
        sync(rt.device)
        t2 = time.perf_counter()
        cached.append(t1 - t0)
        naive.append(t2 - t1)
        progress(f"naive {i + 1}/{iters}: cached {1e3 * (t1 - t0):.1f} ms, naive {1e3 * (t2 - t1):.1f} ms")
    flops = count_flops(policy, inputs, noise)
    p, s = flops["prefix"], flops["step"]
    tp, ts = stages["prefix"]["median_ms"], stages["denoise_step"]["median_ms"]
    return {
        "iters": iters, "cached": summarize(cached), "naive": summarize(naive),
        "ratio": float(np.median(naive) / np.median(cached)),
        "theoretical_ratio": n * (p + s) / (p + n * s),
        "expected_ratio_from_stage_medians": n * (tp + ts) / (tp + n * ts),
        "gflops": {"prefix": p / 1e9, "step": s / 1e9},
        "max_abs_diff": float((a - b).abs().max()),
    }


def chunk_flops(policy: Policy, inputs: ModelInputs, noise: torch.Tensor) -> dict[str, float]:
    """Matmul FLOPs of one chunk: one prefix pass and ``num_steps`` denoising steps (``count_flops``)."""
    flops = count_flops(policy, inputs, noise)
    return {**flops, "chunk": flops["prefix"] + policy.num_steps * flops["step"]}


def peak_float32_flops(size: int = 2048, iters: int = 10) -> dict[str, float]:
    """
    Measure the float32 matmul rate at torch's thread count: best of ``iters`` (n, 4n) x (4n, n) products.

    Both kernels the policy may use are timed, MKL's ``torch.mm`` and oneDNN with a packed
    weight (``packed_linear``); the faster is the peak the bench's fractions are against.
    """
    x = torch.randn(size, 4 * size)
    w = torch.randn(size, 4 * size)
    runs = {"mkl": lambda: torch.mm(x, w.t())}
    packed = packed_linear.pack(w)
    if packed is not None:
        runs["onednn_packed"] = lambda: packed_linear.linear(x, w, None, packed)
    rates = {}
    for name, fn in runs.items():
        fn()
        best = min(_timed(fn) for _ in range(iters))
        rates[name] = 2.0 * size * size * 4 * size / best
    return {**rates, "peak": max(rates.values()), "threads": torch.get_num_threads(), "size": size}


def peak_int8_ops(size: int = 2048, iters: int = 10) -> dict[str, float]:
    """
    Measure the rates a ``dtype: int8`` chunk could reach at torch's thread count: the int8 linears' and bfloat16's.

    The same (n, 4n) x (4n, n) product as ``peak_float32_flops`` through the dynamic int8 matmul
    the model runs (``int8_linear``: fbgemm, activations quantized per call) and through
    oneDNN's, whichever is faster, in ops per second; and the bfloat16 product (the vision
    attention's) where the CPU multiplies bfloat16 natively.
    """
    x = torch.randn(size, 4 * size)
    w = torch.randn(size, 4 * size)
    engine, rates = torch.backends.quantized.engine, {}
    try:
        for name in ("x86", "onednn"):
            if name in torch.backends.quantized.supported_engines:
                torch.backends.quantized.engine = name
                packed = int8_linear.prepack(w)
                fn = functools.partial(torch.ops.quantized.linear_dynamic, x, packed)
                fn()
                rates[name] = 2.0 * size * size * 4 * size / min(_timed(fn) for _ in range(iters))
    finally:
        torch.backends.quantized.engine = engine
    result = {**rates, "peak": max(rates.values(), default=0.0), "threads": torch.get_num_threads()}
    if int8_linear.native_bfloat16():
        xb, wb = x.bfloat16(), w.bfloat16()
        torch.mm(xb, wb.t())
        result["bfloat16"] = 2.0 * size * size * 4 * size / min(_timed(lambda: torch.mm(xb, wb.t()))
                                                                for _ in range(iters))
    return result


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
