# SPDX-License-Identifier: Apache-2.0
"""
The inference thread: runs the policy off the control loop, so no tick ever waits for it.

Only this thread calls the policy (``predict_action_chunk``, ``reset``), so a reset that
arrives during inference is applied after the running step, never in the middle of it, and
always before the next one: the prefix cache of one episode never serves another. The
step's chunk is still handed back, and the chunk scheduler discards it because its request
belongs to the previous episode: a chunk of the old episode is never executed in the new one.

A bad step never escapes this thread: an exception, a chunk with non-finite values or a
step slower than the deadline becomes an :class:`InferenceResult` with a ``fault``, the
chunk is dropped here, and the control loop holds and lets the next control step try again.
Plain threading and numpy: no ROS, so the node and the soak run drive the same class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
import threading
import time
from typing import Any, Protocol

import numpy as np

from vla_policy_node.control.chunking import ChunkRequest

POLICY_COUNTERS = ('control_steps', 'prefix_passes', 'denoise_steps', 'cache_resets')
POLICY_STAGES = ('prefix', 'denoise', 'total')
FAULT_RAISED = 'raised'
FAULT_NON_FINITE = 'non_finite'
FAULT_LATE = 'late'
FAULTS = (FAULT_RAISED, FAULT_NON_FINITE, FAULT_LATE)


@dataclass(frozen=True)
class InferenceResult:
    """
    The outcome of one policy step.

    chunk: (T, A) actions of batch item 0, or None when ``fault`` is set.
    fault: None, or one of FAULTS, with ``error`` saying what happened.
    duration: seconds the policy call took; finished_at: ``clock()`` after it.
    """

    request: ChunkRequest
    chunk: np.ndarray | None
    fault: str | None
    error: str
    duration: float
    finished_at: float


class Inference(Protocol):
    """What the control loop needs of the inference thread (``InferenceWorker``, or a test double)."""

    busy: bool

    def bind(self, on_result: Callable[[InferenceResult], None]) -> None: ...
    def submit(self, request: ChunkRequest, observation: dict[str, Any]) -> bool: ...
    def request_reset(self) -> None: ...


class WorkerThread:
    """
    The liveness and stop of a background thread woken through ``_condition`` and ended by ``_stopping``.

    Shared by the inference worker, the batch server and the remote client's watcher.
    """

    _thread: threading.Thread
    _condition: threading.Condition
    _stopping: bool

    @property
    def alive(self) -> bool:
        """Tell whether the thread is running (it only ends when stopped, or on a bug)."""
        return self._thread.is_alive()

    def stop(self, timeout: float) -> bool:
        """Ask the thread to finish and wait at most ``timeout`` s; True if it has finished."""
        with self._condition:
            self._stopping = True
            self._on_stop()
            self._condition.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _on_stop(self) -> None:
        """Drop what must not be delivered after the stop (the condition held)."""


class DeadlineWorker(WorkerThread):
    """A worker thread whose results have a deadline, which the loop may change while it runs."""

    _deadline: float

    @property
    def deadline(self) -> float:
        """Return the seconds a result may take before it is discarded (and the loop holds)."""
        with self._condition:
            return self._deadline

    @deadline.setter
    def deadline(self, seconds: float) -> None:
        with self._condition:
            self._deadline = seconds
            self._condition.notify()        # a thread timing a wait by the deadline re-times it


class InferenceWorker(DeadlineWorker):
    """
    One background thread, one job at a time; each result goes to ``on_result``.

    A step already running when it is stopped cannot be interrupted; it finishes on its own, and the
    thread then lets go of the policy, so a worker outliving its step holds no model.
    """

    def __init__(self, policy: Any, on_result: Callable[[InferenceResult], None] | None,
                 clock: Callable[[], float], deadline: float) -> None:
        self._policy = policy
        self._on_result = on_result
        self._clock = clock
        self._deadline = deadline
        self._condition = threading.Condition()
        self._job: tuple[ChunkRequest, dict[str, Any]] | None = None
        self._reset_pending = False
        self._busy = False
        self._stopping = False
        self._stats = self._snapshot()
        self._thread = threading.Thread(target=self._run, name='vla_inference', daemon=True)

    def bind(self, on_result: Callable[[InferenceResult], None]) -> None:
        """Send results to ``on_result`` (the control loop binds itself before starting)."""
        self._on_result = on_result

    def start(self) -> None:
        """Start the thread (after the policy is warmed up and a result receiver is bound)."""
        if self._on_result is None:
            raise RuntimeError('bind a result receiver before starting the inference thread')
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Tell whether a job is queued or running."""
        with self._condition:
            return self._busy

    @property
    def stats(self) -> dict[str, Any]:
        """
        Return the policy's counters and (p50, p95) latencies after its last step or reset.

        Taken by this thread right after each policy call, so readers never race the policy's
        own bookkeeping and never wait for a running step.
        """
        with self._condition:
            return self._stats

    def submit(self, request: ChunkRequest, observation: dict[str, Any]) -> bool:
        """Queue one inference; False (and nothing queued) while another one is in progress."""
        with self._condition:
            if self._busy or self._stopping:
                return False
            self._job = (request, observation)
            self._busy = True
            self._condition.notify()
            return True

    def request_reset(self) -> None:
        """Reset the policy (prefix cache) before its next inference."""
        with self._condition:
            self._reset_pending = True
            self._condition.notify()

    def _run(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(
                    lambda: self._stopping or self._reset_pending or self._job is not None)
                if self._stopping:
                    self._policy = None
                    return
                reset, self._reset_pending = self._reset_pending, False
                job, self._job = self._job, None
            if reset:
                self._policy.reset()
                self._publish_stats()
            if job is not None:
                self._infer(*job)

    def _infer(self, request: ChunkRequest, observation: dict[str, Any]) -> None:
        started = time.perf_counter()
        chunk, fault, error = None, None, ''
        try:
            chunk = np.asarray(self._policy.predict_action_chunk(observation, rtc=request.rtc),
                               dtype=np.float64)[0]
        except Exception as exc:  # noqa: B902 - a bad step must never kill the node
            fault, error = FAULT_RAISED, f'{type(exc).__name__}: {exc}'
        duration = time.perf_counter() - started
        if fault is None:
            fault, error = self._judge(chunk, duration)
        self._publish_stats()
        with self._condition:
            self._busy = False
        self._on_result(InferenceResult(
            request=request, chunk=None if fault else chunk, fault=fault, error=error,
            duration=duration, finished_at=self._clock()))

    def _judge(self, chunk: np.ndarray, duration: float) -> tuple[str | None, str]:
        """Classify a returned chunk: fine, non-finite or late (in that order)."""
        if not np.all(np.isfinite(chunk)):
            bad = int(np.count_nonzero(~np.isfinite(chunk)))
            return FAULT_NON_FINITE, f'{bad} of {chunk.size} actions are not finite'
        deadline = self.deadline
        if duration > deadline:
            return FAULT_LATE, (f'inference took {duration:.3f} s, more than policy_deadline '
                                f'= {deadline:.3f} s')
        return None, ''

    def _snapshot(self) -> dict[str, Any]:
        stats = self._policy.stats
        counters = {key: int(getattr(stats, key)) for key in POLICY_COUNTERS}
        latencies = {stage: stats.latency(stage) for stage in POLICY_STAGES}
        return {'counters': counters, 'latencies': latencies}

    def _publish_stats(self) -> None:
        snapshot = self._snapshot()
        with self._condition:
            self._stats = snapshot
