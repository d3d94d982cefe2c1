# SPDX-License-Identifier: Apache-2.0
"""Policy: raw observation -> preprocessing -> PolicyRuntime -> un-normalized action chunk."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import nn

from vla_policy_node.control.chunking import RTCGuidance
from vla_policy_node.model import int8_linear
from vla_policy_node.model.flow import VelocityFn
from vla_policy_node.model.normalization import Normalizer
from vla_policy_node.model.preprocessing import Preprocessor, stack_observations
from vla_policy_node.model.relative_actions import RelativeActions
from vla_policy_node.model.rtc import batch_rtc_guide, rtc_guided_velocity
from vla_policy_node.runtime.devices import DEVICES, FLOAT_DTYPES, is_device_name
from vla_policy_node.runtime.engine import PolicyRuntime
from vla_policy_node.runtime.shape_buckets import prompt_buckets
from vla_policy_node.runtime.warmup import warm_up

TORCH_DTYPES = {name: getattr(torch, name) for name in FLOAT_DTYPES}


def resolve_device(name: str | torch.device) -> tuple[torch.device, Optional[str]]:
    """One of DEVICES -> device, plus a message when falling back to the CPU (a device: itself)."""
    if isinstance(name, torch.device):
        return name, None
    if not is_device_name(name):
        raise ValueError(f"device must be {DEVICES}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu"), None
    if name == "cpu":
        return torch.device("cpu"), None
    index = int(name.split(":", 1)[1]) if ":" in name else 0
    if torch.cuda.is_available() and index < torch.cuda.device_count():
        return torch.device(name), None
    return torch.device("cpu"), f"device {name!r} is not available (no CUDA GPU); running on the CPU"


def resolve_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(FLOAT_DTYPES)}, got {name!r}")
    return TORCH_DTYPES[name]


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
                 relative_actions: Optional[RelativeActions] = None, provenance: str = "") -> None:
        """
        Wrap a final model (``loading.load.ready_model``: cast, fused, packed) and its preprocessor.

        The preprocessor converts frames on ``device`` (they go up as uint8, resized where the model runs).
        """
        self.family = family
        self.relative_actions = relative_actions             # None: the model predicts absolute actions
        self.provenance = provenance                         # which framework release wrote the checkpoint, and why
        self.model = model
        self.preprocessor = preprocessor
        self.action_normalizer = action_normalizer
        self.action_dim = action_dim
        self.device = device
        self.dtype = next(model.parameters()).dtype
        # built code serves a few prompt lengths where prompts are padded to the longest
        self.runtime = PolicyRuntime(model, num_steps, device, prompt_lengths=prompt_buckets(preprocessor.max_length)
                                     if preprocessor.padding == "longest" else (),
                                     trace_prompt_lengths=prompt_buckets(preprocessor.max_length))
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
        Run inference on a representative observation before the node reports ready (``runtime/warmup.py``).

        Builds what the runtime's configuration asks for, races thread counts and compiled
        against eager code, and keeps the verdicts here (``threads`` and the reports).
        """
        self.threads, self.threads_report, self.build_report, self.compile_report = None, "", "", ""
        report = warm_up(self, observation, iterations, race_rounds)
        self.threads, self.threads_report = report.threads, report.threads_report
        self.build_report, self.compile_report = report.build_report, report.compile_report

    def timed_chunk(self, observation: Mapping, path: str, threads: Optional[int]) -> float:
        """Return the seconds one unguided chunk takes on ``path`` with ``threads`` CPU threads (None: as set)."""
        with cpu_threads(threads):
            t0 = time.perf_counter()
            self._predict_with(observation, None, None, path)
            return time.perf_counter() - t0

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
                f"{str(getattr(self.model, 'dtype', self.dtype))[6:]}"
                + (f" with {quantized} int8 linear layers" if (quantized := int8_linear.count(self.model)) else ""))
