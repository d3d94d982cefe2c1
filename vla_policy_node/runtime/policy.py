# SPDX-License-Identifier: Apache-2.0
"""Policy: raw observation -> preprocessing -> PolicyRuntime -> un-normalized action chunk."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import nn

from vla_policy_node.model.blocks import fuse_projections, pack_linears
from vla_policy_node.control.chunking import RTCGuidance
from vla_policy_node.model.flow import VelocityFn
from vla_policy_node.model.normalization import Normalizer
from vla_policy_node.model.preprocessing import Preprocessor
from vla_policy_node.model.relative_actions import RelativeActions
from vla_policy_node.model.rtc import batch_rtc_guide, rtc_guided_velocity
from vla_policy_node.runtime.engine import COMPILED, EAGER, PolicyRuntime
from vla_policy_node.runtime.shape_buckets import prompt_buckets, with_batch_size, with_prompt_length
from vla_policy_node.model.types import ModelInputs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str | torch.device) -> tuple[torch.device, Optional[str]]:
    """'auto' | 'cpu' | 'cuda' | 'cuda:N' -> device, plus a message when falling back to the CPU (a device: itself)."""
    if isinstance(name, torch.device):
        return name, None
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu"), None
    if name == "cpu":
        return torch.device("cpu"), None
    if name == "cuda" or name.startswith("cuda:"):
        index = int(name.split(":", 1)[1]) if ":" in name else 0
        if torch.cuda.is_available() and index < torch.cuda.device_count():
            return torch.device(name), None
        return torch.device("cpu"), f"device {name!r} is not available (no CUDA GPU); running on the CPU"
    raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")


def error_summary(error: BaseException, limit: int = 300) -> str:
    """Return ``Type: first line of the message`` (at most ``limit`` characters): compiler errors run to pages."""
    first = (str(error).strip().splitlines() or [""])[0][:limit]
    return f"{type(error).__name__}: {first}"


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def stack_observations(observations: Sequence[Mapping]) -> dict:
    """
    Stack single observations into one batch: images (B, H, W, 3) per camera, state (B, D), tasks.

    Raises ValueError when they do not give the same cameras with frames of one size.
    """
    cameras = set(observations[0].get("images") or {})
    for index, observation in enumerate(observations):
        if set(observation.get("images") or {}) != cameras:
            raise ValueError(f"observation {index} has cameras {sorted(observation.get('images') or {})}, "
                             f"the first {sorted(cameras)}: a batch needs the same cameras")
    images = {}
    for name in sorted(cameras):
        frames = [np.asarray(observation["images"][name]) for observation in observations]
        if len({frame.shape for frame in frames}) != 1:
            raise ValueError(f"camera {name!r}: frames of different shapes {sorted({f.shape for f in frames})} "
                             "cannot share a batch")
        images[name] = np.stack(frames)
    states = [np.asarray(observation.get("state"), dtype=np.float32) for observation in observations]
    if len({state.shape for state in states}) != 1:
        raise ValueError(f"states of different shapes {sorted({s.shape for s in states})} cannot share a batch")
    tasks = [observation.get("task") for observation in observations]
    return {"images": images, "state": np.stack(states), "task": tasks}


@contextlib.contextmanager
def cpu_threads(count: Optional[int]) -> Iterator[None]:
    """Run the block with ``count`` torch CPU threads (None: as set), then restore the setting."""
    before = torch.get_num_threads()
    if count is None or count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Policy:
    """A loaded VLA policy: what the node, the benchmark and the tests drive."""

    def __init__(self, family: str, model: nn.Module, preprocessor: Preprocessor, action_normalizer: Normalizer,
                 action_dim: int, num_steps: int, device: torch.device, seed: int = 0,
                 pack_weights: bool = True, relative_actions: Optional[RelativeActions] = None,
                 provenance: str = "") -> None:
        self.family = family
        self.relative_actions = relative_actions             # None: the model predicts absolute actions
        self.provenance = provenance                         # which framework release wrote the checkpoint, and why
        self.model = fuse_projections(model)                 # fewer matmuls; the weights are final here
        if pack_weights:                                     # faster CPU matmuls, for a second copy of the weights
            pack_linears(self.model)
        self.preprocessor = preprocessor
        preprocessor.device = device                         # frames go up as uint8, resized where the model runs
        self.action_normalizer = action_normalizer
        self.action_dim = action_dim
        self.device = device
        self.dtype = next(model.parameters()).dtype
        self.runtime = PolicyRuntime(model, num_steps, device)
        if preprocessor.padding == "longest":             # built code serves a few prompt lengths
            self.runtime.prompt_lengths = prompt_buckets(preprocessor.max_length)
        self.compile_report = ""                          # what the warm-up decided about compiled code
        self.build_report = ""                            # shapes the warm-up could not build, and why
        self.threads: Optional[int] = None                # CPU threads the warm-up chose (None: torch's setting)
        self.threads_report = ""                          # why
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    camera_names = property(lambda self: self.preprocessor.camera_names)
    state_dim = property(lambda self: self.preprocessor.state_dim)
    chunk_size = property(lambda self: self.model.chunk_size)
    num_steps = property(lambda self: self.runtime.num_steps)
    stats = property(lambda self: self.runtime.stats)

    def predict_action_chunk(self, observation: Mapping, noise: Optional[np.ndarray] = None,
                             rtc: Optional[RTCGuidance] = None) -> np.ndarray:
        """
        Observation -> un-normalized actions (B, chunk_size, action_dim), float32.

        ``noise`` (B, chunk_size, max_action_dim) makes the result deterministic.
        ``rtc`` (real-time chunking) guides the first actions toward the committed
        ones, given in robot units like the output; the prefix is still encoded once.
        """
        return self._predict(observation, noise, None if rtc is None else self._rtc_guide(rtc, observation))

    def _predict(self, observation: Mapping, noise: Optional[np.ndarray],
                 guide: Optional[Callable[[VelocityFn], VelocityFn]]) -> np.ndarray:
        with cpu_threads(self.threads):
            return self._predict_with(observation, noise, guide)

    def _predict_with(self, observation: Mapping, noise: Optional[np.ndarray],
                      guide: Optional[Callable[[VelocityFn], VelocityFn]], path: Optional[str] = None) -> np.ndarray:
        t0 = time.perf_counter()
        inputs = self.preprocessor(observation).to(self.device, self.dtype)
        b = inputs.batch_size
        shape = (b, self.model.chunk_size, self.model.max_action_dim)
        if noise is None:
            x1 = torch.randn(shape, generator=self.generator)
        else:
            x1 = torch.as_tensor(np.asarray(noise, dtype=np.float32))
            if tuple(x1.shape) != shape:
                raise ValueError(f"noise must have shape {shape}, got {tuple(x1.shape)}")
        t1 = time.perf_counter()
        self.stats.record("preprocess", t1 - t0)
        actions = self.runtime.sample(inputs, x1, guide, path)
        t2 = time.perf_counter()
        out = self.action_normalizer.unnormalize(actions[..., :self.action_dim].float().cpu().numpy())
        if self.relative_actions is not None:
            out = self.relative_actions.to_absolute(out, self._raw_state(observation, b))
        t3 = time.perf_counter()
        self.stats.record("postprocess", t3 - t2)
        self.stats.record("total", t3 - t0)
        return out

    def predict_action_chunks(self, observations: Sequence[Mapping], rtcs: Sequence[Optional[RTCGuidance]],
                              noise: Optional[np.ndarray] = None) -> np.ndarray:
        """
        Several robots' observations -> their chunks (B, chunk_size, action_dim) in one pass.

        One prefix pass over all B observations, one denoising loop; each may have its own
        instruction and its own real-time chunking guidance (or none). Item ``b`` equals
        ``predict_action_chunk(observations[b], noise[b:b+1], rtcs[b])[0]`` up to float rounding.
        Every observation must give the same cameras with frames of one size (ValueError otherwise).
        """
        if len(observations) == 0 or len(rtcs) != len(observations):
            raise ValueError(f"need one rtc entry (or None) per observation, got {len(rtcs)} for "
                             f"{len(observations)} observations")
        stacked = stack_observations(observations)
        if all(rtc is None for rtc in rtcs):
            return self.predict_action_chunk(stacked, noise)
        prefixes = [None if rtc is None else self._normalized_prefix(rtc, observation)[0]
                    for rtc, observation in zip(rtcs, observations)]
        model = self.model

        def guide(velocity: VelocityFn) -> VelocityFn:
            return batch_rtc_guide(
                velocity, prefixes, [0 if r is None else r.delay_steps for r in rtcs],
                [1.0 if r is None else r.max_guidance_weight for r in rtcs],
                ["paper" if r is None else r.guidance for r in rtcs],
                model.chunk_size, model.max_action_dim, self.num_steps,
                [None if r is None else r.execution_horizon for r in rtcs])
        return self._predict(stacked, noise, guide)

    def _raw_state(self, observation: Mapping, batch: int) -> np.ndarray:
        """(B, state_dim) raw state of an observation the preprocessor has accepted."""
        return np.asarray(observation["state"], dtype=np.float32).reshape(batch, -1)

    def _normalized_prefix(self, rtc: RTCGuidance, observation: Mapping) -> np.ndarray:
        """
        Check the committed actions (K, action_dim) and map them to the model's action space: (B, K', A).

        Relative actions are re-anchored at each item's current raw state first (LeRobot's
        ``reanchor_relative_rtc_prefix``).
        """
        prefix = np.asarray(rtc.prefix, dtype=np.float32)
        if prefix.ndim != 2 or prefix.shape[1] != self.action_dim or prefix.shape[0] > self.chunk_size:
            raise ValueError(f"RTC prefix must be (K <= {self.chunk_size}, {self.action_dim}), got {prefix.shape}")
        if self.relative_actions is None:
            return self.action_normalizer.normalize(prefix)[None]
        state = np.asarray(observation["state"], dtype=np.float32)
        state = state[None] if state.ndim == 1 else state
        return self.action_normalizer.normalize(self.relative_actions.to_relative(prefix[None], state))

    def _rtc_guide(self, rtc: RTCGuidance, observation: Mapping) -> Callable[[VelocityFn], VelocityFn]:
        normalized = self._normalized_prefix(rtc, observation)
        normalized = normalized[0] if len(normalized) == 1 else normalized
        return lambda velocity: rtc_guided_velocity(velocity, normalized, rtc.delay_steps, self.num_steps,
                                                    rtc.max_guidance_weight, rtc.guidance, rtc.execution_horizon)

    def reset(self) -> None:
        """Episode boundary: drop the prefix cache."""
        self.runtime.reset()

    def warmup(self, observation: Mapping, iterations: int = 2, race_rounds: int = 3) -> None:
        """
        Run inference on a representative observation before the node reports ready.

        The first calls pay for allocator growth, kernel selection and (on CUDA) graph
        capture; they are not control steps, so the counters and latencies start afresh.
        With CUDA graphs or compilation on, every bucket (``runtime.prompt_lengths`` times
        ``runtime.batch_sizes``) is captured or compiled (or loaded from the cache) here, and
        nothing is built after: a shape outside the buckets runs eager. On the CPU, eager
        chunks race over thread counts (``threads_report``); with compilation on, compiled
        chunks (at the configured thread count, which they were built for) then race the
        eager ones at the thread count that won, alternating ``race_rounds`` times: where
        compiled code is slower it is switched off, and ``compile_report`` says why. So
        compiled code is kept only where it beats the best eager setting. Larger batch
        sizes are built only after that, one at a time (``_grow_batch_buckets``), so a
        model whose compiled code loses compiles one batch size, not all of them.
        """
        runtime = self.runtime
        self.threads, self.threads_report, self.build_report, self.compile_report = None, "", "", ""
        building = runtime.path != EAGER
        runtime.build_new_signatures = True
        try:
            if building:
                inputs = self.preprocessor(observation).to(self.device, self.dtype)
                noise = torch.randn((inputs.batch_size, self.model.chunk_size, self.model.max_action_dim),
                                    generator=self.generator)
                self._build_batch_size(inputs, noise, (runtime.batch_sizes or (inputs.batch_size,))[0])
            for _ in range(iterations):
                self.predict_action_chunk(observation)
        finally:
            runtime.build_new_signatures = False     # never build mid-control: a new shape runs eager
        if self.device.type == "cpu" and race_rounds > 0:
            self._race_threads(observation, race_rounds)
        if runtime.path == COMPILED and race_rounds > 0:
            self._race(observation, race_rounds)
        if building and runtime.path != EAGER:
            self._grow_batch_buckets(observation, inputs, noise, race_rounds if runtime.torch_compile else 0)
        runtime.cache.reset()
        self.stats.clear()

    def _build_batch_size(self, inputs: ModelInputs, noise: torch.Tensor, size: int) -> None:
        """Capture or compile (or load) the programs of one batch size, one per prompt length."""
        rows, rows_noise = with_batch_size(inputs, noise, size)
        for length in self.runtime.prompt_lengths or (inputs.tokens.shape[1],):
            self.runtime.sample(with_prompt_length(rows, length), rows_noise)

    def _grow_batch_buckets(self, observation: Mapping, inputs: ModelInputs, noise: torch.Tensor,
                            rounds: int) -> None:
        """
        Build the batch sizes above the first, one at a time, each raced against eager before the next.

        On the CPU a compiled batch costs about its rows, so a bucket of 8 serving 5 robots
        pays for 8: where that loses to eager at the fewest rows the bucket serves (5), the
        bucket is dropped and no larger one is built; those batches run eager (``rounds`` 0:
        no race, as for CUDA graphs). A compiled batch size whose build fails (out of memory,
        say) is dropped the same way, and ``build_report`` says why. A failed CUDA graph
        capture is raised, naming the batch size: torch does not promise a usable device
        after one. The race needs a single warm-up observation, which it copies.
        """
        runtime = self.runtime
        sizes = runtime.batch_sizes
        verdicts = []
        for index in range(1, len(sizes)):
            size = sizes[index]
            runtime.build_new_signatures = True
            try:
                self._build_batch_size(inputs, noise, size)
            except Exception as error:  # noqa: B902 - the compiler and the allocator fail in many ways
                reason = error_summary(error, 200)
                if runtime.cuda_graphs_active:
                    raise RuntimeError(f"capturing CUDA graphs for batch size {size} failed ({reason}); "
                                       "lower batch.max_size") from error
                runtime.keep_batch_sizes(sizes[:index])
                self.build_report = (f"batches of {size} or more rows run eager: building batch size {size} "
                                     f"failed: {reason}")
                break
            finally:
                runtime.build_new_signatures = False
            if rounds == 0 or inputs.batch_size != 1:
                continue
            rows = sizes[index - 1] + 1
            # eager as it would run these rows: at the configured thread count, as compiled code won
            fast, slow = self._time_compiled_against_eager(stack_observations([observation] * rows), rounds, None)
            verdicts.append(f"{size} {'kept' if fast <= slow else 'dropped'} "
                            f"({fast:.1f} vs {slow:.1f} ms at {rows} rows)")
            if fast > slow:
                runtime.keep_batch_sizes(sizes[:index])
                break
        if verdicts:
            self.compile_report += ("; batch buckets, compiled (padded) vs eager: " + ", ".join(verdicts)
                                    + ("" if runtime.batch_sizes == sizes else "; larger batches run eager"))

    def _race(self, observation: Mapping, rounds: int) -> None:
        """
        Time compiled against eager chunks, alternating; keep compiled code only where it is not slower.

        Eager runs at the thread count its own race kept (``self.threads``), compiled code at
        the configured one; the winner's thread count is what the policy keeps.
        """
        runtime = self.runtime
        eager_threads = self.threads
        fast, slow = self._time_compiled_against_eager(observation, rounds, eager_threads)
        runtime.path = COMPILED if fast <= slow else EAGER
        self.threads = None if runtime.torch_compile else eager_threads
        if runtime.torch_compile and eager_threads is not None:
            self.threads_report += f"; compiled code won, running with {torch.get_num_threads()}"
        eager = "eager" if eager_threads is None else f"eager with {eager_threads} thread(s)"
        self.compile_report = (f"compiled {fast:.2f} ms vs {eager} {slow:.2f} ms per chunk (median of {rounds}, "
                               f"measured in the warm-up): " + ("compiled code kept" if runtime.torch_compile
                                                                else "compiled code refused, running eager"))

    def _time_compiled_against_eager(self, observation: Mapping, rounds: int,
                                     eager_threads: Optional[int]) -> tuple[float, float]:
        """Return the median compiled and eager chunk times (ms), alternating ``rounds`` times."""
        times: dict[str, list[float]] = {COMPILED: [], EAGER: []}
        for _ in range(rounds):
            for path, threads in ((COMPILED, None), (EAGER, eager_threads)):
                if eager_threads is not None:
                    self._timed_chunk(observation, path, threads)   # the first chunk after a thread switch pays for it
                times[path].append(self._timed_chunk(observation, path, threads))
        fast, slow = (float(np.median(times[p])) * 1e3 for p in (COMPILED, EAGER))
        return fast, slow

    def _timed_chunk(self, observation: Mapping, path: str, threads: Optional[int]) -> float:
        """Return the seconds one unguided chunk takes on ``path`` with ``threads`` CPU threads (None: as set)."""
        with cpu_threads(threads):
            t0 = time.perf_counter()
            self._predict_with(observation, None, None, path)
            return time.perf_counter() - t0

    def _race_threads(self, observation: Mapping, rounds: int) -> None:
        """
        Time eager chunks at 1, 2, 4, ... threads up to torch's setting, alternating; keep the fastest.

        A small model's kernels can be too short to split, so that each OpenMP fork and
        join costs more than the second core gives: the tiny SmolVLA with 3 cameras takes
        17.2 ms per chunk with 1 thread, 21.6 ms with 2, yet at batch 4 41.2 and 33.7 ms.
        Fewer threads are kept only when at least 5% faster. Compiled programs are built for
        the configured thread count and race the winner afterwards (``_race``). Chunks over
        0.5 s are compute-bound, where every thread pays: no race.
        """
        budget = torch.get_num_threads()
        if budget == 1:
            return
        if self._timed_chunk(observation, EAGER, None) > 0.5:
            return
        counts = sorted({budget, *(2 ** k for k in range(budget.bit_length()) if 2 ** k < budget)})
        times: dict[int, list[float]] = {n: [] for n in counts}
        for _ in range(rounds):
            for n in counts:
                self._timed_chunk(observation, EAGER, n)          # the first chunk after a switch pays for it
                times[n].append(self._timed_chunk(observation, EAGER, n))
        ms = {n: float(np.median(t)) * 1e3 for n, t in times.items()}
        best = min(counts, key=ms.__getitem__)
        if ms[best] > 0.95 * ms[budget]:
            best = budget
        self.threads = best
        self.threads_report = (f"CPU threads: {best} of {budget} kept; eager chunk "
                               + ", ".join(f"{ms[n]:.2f} ms with {n}" for n in counts)
                               + f" (median of {rounds}, measured in the warm-up)")

    def dummy_observation(self) -> dict:
        """Build a valid observation of this policy's shapes (grey frames, zero state)."""
        h, w = self.preprocessor.image_size
        return {"images": {n: np.full((h, w, 3), 127, np.uint8) for n in self.camera_names},
                "state": np.zeros(self.state_dim, np.float32), "task": "warm up"}

    def describe(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        nbytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return (f"{self.family} policy: {n / 1e6:.2f} M parameters, {nbytes / 2**20:.1f} MiB of weights, "
                f"{len(self.camera_names)} cameras, state {self.state_dim}, action {self.action_dim}, "
                f"chunk {self.chunk_size}, {self.num_steps} steps, {self.device} "
                f"{str(getattr(self.model, 'dtype', self.dtype))[6:]}")
