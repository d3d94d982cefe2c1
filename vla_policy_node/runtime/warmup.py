# SPDX-License-Identifier: Apache-2.0
"""
The warm-up: what a policy builds and measures before the node reports ready.

The first calls pay for allocator growth, kernel selection and (on CUDA) graph capture; they are
not control steps, so the counters and latencies start afresh. With CUDA graphs or compilation on,
every bucket (``runtime.prompt_lengths`` times ``runtime.batch_sizes``) is captured or compiled (or
loaded from the cache) here, and nothing is built after: a shape outside the buckets runs eager. On
the CPU, eager chunks are traced where the runtime is configured to (``runtime.build_traces``: each
prompt length bucket, checked against Python), then race over thread counts (``threads_report``);
with compilation on, compiled chunks (at the configured thread count, which they were built for)
then race the eager ones at the thread count that won, alternating ``race_rounds`` times: where
compiled code is slower it is switched off, and ``compile_report`` says why. So compiled code is
kept only where it beats the best eager setting. Larger batch sizes are built only after that, one
at a time (``_grow_batch_buckets``), so a model whose compiled code loses compiles one batch size,
not all of them.

The runtime's path and buckets change only through its own methods (``choose_path``,
``keep_batch_sizes``, ``building``); the verdicts come back as a :class:`WarmUpReport`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np
import torch

from vla_policy_node.model.preprocessing import stack_observations
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.runtime.engine import COMPILED, EAGER
from vla_policy_node.runtime.shape_buckets import with_batch_size, with_prompt_length


def error_summary(error: BaseException, limit: int = 300) -> str:
    """Return ``Type: first line of the message`` (at most ``limit`` characters): compiler errors run to pages."""
    first = (str(error).strip().splitlines() or [""])[0][:limit]
    return f"{type(error).__name__}: {first}"


@dataclass
class WarmUpReport:
    """What the warm-up decided: the CPU threads kept (None: torch's setting) and why, and what it built."""

    threads: Optional[int] = None
    threads_report: str = ""
    build_report: str = ""               # shapes the warm-up could not build, and why
    compile_report: str = ""             # what it decided about compiled code


def warm_up(policy: Any, observation: Mapping, iterations: int = 2, race_rounds: int = 3) -> WarmUpReport:
    """Warm ``policy`` (a ``runtime.policy.Policy``) up on a representative observation; return the verdicts."""
    return _WarmUp(policy, WarmUpReport()).run(observation, iterations, race_rounds)


class _WarmUp:
    """One warm-up of one policy: its runtime, and the report it fills in."""

    def __init__(self, policy: Any, report: WarmUpReport) -> None:
        self.policy, self.runtime, self.report = policy, policy.runtime, report

    def run(self, observation: Mapping, iterations: int, race_rounds: int) -> WarmUpReport:
        policy, runtime = self.policy, self.runtime
        building = runtime.path != EAGER
        with runtime.building():
            if building or runtime.tracing:
                inputs = policy.preprocessor(observation).to(policy.device, policy.dtype)
                noise = torch.randn((inputs.batch_size, policy.model.chunk_size, policy.model.max_action_dim),
                                    generator=policy.generator)
            if runtime.tracing:
                runtime.build_traces(inputs, noise)
            if building:
                self._build_batch_size(inputs, noise, (runtime.batch_sizes or (inputs.batch_size,))[0])
            for _ in range(iterations):
                policy.predict_action_chunk(observation)
        if policy.device.type == "cpu" and race_rounds > 0:
            self._race_threads(observation, race_rounds)
        if runtime.path == COMPILED and race_rounds > 0:
            self._race(observation, race_rounds)
        if building and runtime.path != EAGER:
            self._grow_batch_buckets(observation, inputs, noise, race_rounds if runtime.torch_compile else 0)
        runtime.cache.reset()
        policy.stats.clear()
        return self.report

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
            try:
                with runtime.building():
                    self._build_batch_size(inputs, noise, size)
            except Exception as error:  # noqa: B902 - the compiler and the allocator fail in many ways
                reason = error_summary(error, 200)
                if runtime.cuda_graphs_active:
                    raise RuntimeError(f"capturing CUDA graphs for batch size {size} failed ({reason}); "
                                       "lower batch.max_size") from error
                runtime.keep_batch_sizes(sizes[:index])
                self.report.build_report = (f"batches of {size} or more rows run eager: building batch size "
                                            f"{size} failed: {reason}")
                break
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
            self.report.compile_report += ("; batch buckets, compiled (padded) vs eager: " + ", ".join(verdicts)
                                           + ("" if runtime.batch_sizes == sizes else "; larger batches run eager"))

    def _race(self, observation: Mapping, rounds: int) -> None:
        """
        Time compiled against eager chunks, alternating; keep compiled code only where it is not slower.

        Eager runs at the thread count its own race kept (``report.threads``), compiled code at
        the configured one; the winner's thread count is what the policy keeps.
        """
        runtime = self.runtime
        eager_threads = self.report.threads
        fast, slow = self._time_compiled_against_eager(observation, rounds, eager_threads)
        runtime.choose_path(COMPILED if fast <= slow else EAGER)
        self.report.threads = None if runtime.torch_compile else eager_threads
        if runtime.torch_compile and eager_threads is not None:
            self.report.threads_report += f"; compiled code won, running with {torch.get_num_threads()}"
        eager = "eager" if eager_threads is None else f"eager with {eager_threads} thread(s)"
        verdict = "compiled code kept" if runtime.torch_compile else "compiled code refused, running eager"
        self.report.compile_report = (f"compiled {fast:.2f} ms vs {eager} {slow:.2f} ms per chunk (median of {rounds}, "
                                      f"measured in the warm-up): {verdict}")

    def _time_compiled_against_eager(self, observation: Mapping, rounds: int,
                                     eager_threads: Optional[int]) -> tuple[float, float]:
        """Return the median compiled and eager chunk times (ms), alternating ``rounds`` times."""
        times: dict[str, list[float]] = {COMPILED: [], EAGER: []}
        for _ in range(rounds):
            for path, threads in ((COMPILED, None), (EAGER, eager_threads)):
                if eager_threads is not None:
                    # the first chunk after a thread switch pays for it
                    self.policy.timed_chunk(observation, path, threads)
                times[path].append(self.policy.timed_chunk(observation, path, threads))
        fast, slow = (float(np.median(times[p])) * 1e3 for p in (COMPILED, EAGER))
        return fast, slow

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
        if self.policy.timed_chunk(observation, EAGER, None) > 0.5:
            return
        counts = sorted({budget, *(2 ** k for k in range(budget.bit_length()) if 2 ** k < budget)})
        times: dict[int, list[float]] = {n: [] for n in counts}
        for _ in range(rounds):
            for n in counts:
                self.policy.timed_chunk(observation, EAGER, n)          # the first chunk after a switch pays for it
                times[n].append(self.policy.timed_chunk(observation, EAGER, n))
        ms = {n: float(np.median(t)) * 1e3 for n, t in times.items()}
        best = min(counts, key=ms.__getitem__)
        if ms[best] > 0.95 * ms[budget]:
            best = budget
        self.report.threads = best
        self.report.threads_report = (f"CPU threads: {best} of {budget} kept; eager chunk "
                                      + ", ".join(f"{ms[n]:.2f} ms with {n}" for n in counts)
                                      + f" (median of {rounds}, measured in the warm-up)")
