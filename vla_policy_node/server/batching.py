# SPDX-License-Identifier: Apache-2.0
"""
Serve chunk requests of several robots from one policy, batching whatever is waiting.

Continuous batching: the moment the server is free it takes every request waiting then (up to
``max_batch``, oldest first) as one batch, so robots whose requests fall at any phase share a
batch whenever they wait at the same time, and a lone request on an idle server starts at once.
``window`` > 0 optionally lets a first request on an idle server wait that long for company. A
batch runs as one ``Policy.predict_action_chunks`` call: one prefix pass over
every robot's observation (the prefix cache is filled once per batch and frozen: denoising
only reads it) and one denoising loop, each robot with its own instruction and its own
real-time chunking guidance. Requests that cannot share a pass (other cameras or frame sizes)
run as batches of their own, so a batch never mixes shapes.

A robot has at most one request queued: a newer one replaces it (the older observation would
only be stale by the time it ran). A request whose wait plus one batch (the last one's time)
passes its robot's ``deadline`` is dropped unserved: its robot measures the deadline from
sending, before the server received it, so it will have given up before the answer comes. An
overloaded server so spends nothing on answers nobody will take. Memory is bounded by bytes:
the requests waiting and those being served (decoded images, state, guidance) hold at most
``max_queued_bytes``; past it the largest waiting request (the oldest of equals) is refused
with a fault naming the budget, so a robot sending huge frames loses its own request first
and a burst's memory is returned once it is served. At most ``max_queued`` requests wait at
once (more are refused the same way). A
batch that raises runs again one request at a time, so a malformed observation faults only
its own robot; an answer that cannot be sent is counted and the others still go out. The
server has no per-robot state between requests: each pass rebuilds the cache from the
observations, so an episode reset on a robot needs nothing here. Every safety decision
(deadline, staleness, episodes) stays on the robot. Plain threading: no ROS.
"""

from __future__ import annotations

from collections.abc import Callable
import ctypes
from dataclasses import dataclass, replace
import threading
import time
from typing import Any

import numpy as np

from vla_policy_node.control.chunking import RTCGuidance
from vla_policy_node.control.inference import FAULT_NON_FINITE, FAULT_RAISED, WorkerThread

SERVER_COUNTERS = ('requests', 'batches', 'superseded_requests', 'batch_faults', 'prefix_passes',
                   'refused_requests', 'answer_errors', 'expired_requests', 'budget_refusals')
MIB = 1 << 20
TRIM_BYTES = 64 * MIB       # after a batch this large, free heap memory goes back to the system


@dataclass(frozen=True)
class ServedRequest:
    """
    One robot's request, as the server received it (and as the wire protocol decodes it).

    client: who queues it (one request per client waits: a newer one replaces it); reply_to:
    what its answer must carry back (returned as it came, never interpreted here; on the wire
    a ``ros.server.protocol.Reply``: the key, digest, joints and horizon). observation:
    images {camera: (H, W, 3) uint8}, state (D,), task. deadline: seconds its robot waits for
    the answer (None: no bound here). received_at: the server's clock on arrival and nbytes:
    the memory it holds (both set by ``submit``).
    """

    client: str
    reply_to: Any
    observation: dict[str, Any]
    rtc: RTCGuidance | None
    deadline: float | None = None
    received_at: float = 0.0
    nbytes: int = 0


@dataclass(frozen=True)
class ServedChunk:
    """
    The answer to one request: chunk (T, A) float32, or None with ``fault`` and ``error``.

    Decoded from the wire (float64), its request carries only its ``reply_to``.

    queue_wait: seconds from arrival to the start of its batch; compute: seconds of the
    batch's policy call; batch_size: requests in that pass.
    """

    request: ServedRequest
    chunk: np.ndarray | None
    fault: str | None
    error: str
    queue_wait: float
    compute: float
    batch_size: int


@dataclass(frozen=True)
class BatchConfig:
    """How long a first request on an idle server waits for company, the largest batch, the most held."""

    window: float = 0.0         # seconds; 0: continuous, an idle server starts at once
    max_batch: int = 16
    max_queued: int = 256
    max_queued_bytes: int = 1024 * MIB   # requests waiting or being served

    def __post_init__(self) -> None:
        if not (0.0 <= self.window <= 1.0):
            raise ValueError(f'window must be in [0, 1] s, got {self.window}')
        if self.max_batch < 1:
            raise ValueError(f'max_batch must be >= 1, got {self.max_batch}')
        if self.max_queued < self.max_batch:
            raise ValueError(f'max_queued must be >= max_batch ({self.max_batch}), got {self.max_queued}')
        if self.max_queued_bytes < MIB:
            raise ValueError(f'max_queued_bytes must be >= 1 MiB, got {self.max_queued_bytes}')


class BatchServer(WorkerThread):
    """One thread that batches queued requests and hands each answer to ``on_chunk``."""

    def __init__(self, policy: Any, on_chunk: Callable[[ServedChunk], None], config: BatchConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._policy = policy
        self._on_chunk = on_chunk
        self._config = config
        self._clock = clock
        self._condition = threading.Condition()
        self._queue: dict[str, ServedRequest] = {}     # client -> its newest request, arrival order
        self._held_bytes = 0        # of the requests waiting and being served
        self._stopping = False
        self._counters = dict.fromkeys(SERVER_COUNTERS, 0)
        self._batched_requests = 0
        self._max_batch_seen = 0
        self._queue_waits: list[float] = []
        self._last_compute = 0.0        # seconds the last batch took: the soonest a new answer comes
        self._thread = threading.Thread(target=self._run, name='vla_batch_server', daemon=True)

    def start(self) -> None:
        """Start serving."""
        self._thread.start()

    def submit(self, request: ServedRequest) -> None:
        """Queue a request; it replaces one of the same client still waiting; past a bound the largest is refused."""
        request = replace(request, received_at=self._clock(), nbytes=request_bytes(request))
        with self._condition:
            if self._stopping:
                return
            self._counters['requests'] += 1
            refused = self._admit(request)
            self._condition.notify()
        for victim, why in refused:
            self._deliver(ServedChunk(victim, None, FAULT_RAISED, why, 0.0, 0.0, 0))

    def _admit(self, request: ServedRequest) -> list[tuple[ServedRequest, str]]:
        """Queue ``request``, then refuse requests until the bounds hold (lock held); return the refused."""
        config = self._config
        if request.client not in self._queue and len(self._queue) >= config.max_queued:
            self._counters['refused_requests'] += 1
            return [(request, f'server overloaded: {config.max_queued} robots already wait')]
        superseded = self._queue.pop(request.client, None)
        if superseded is not None:
            self._counters['superseded_requests'] += 1
            self._held_bytes -= superseded.nbytes
        self._queue[request.client] = request
        self._held_bytes += request.nbytes
        refused = []
        while self._held_bytes > config.max_queued_bytes and self._queue:
            victim = max(self._queue.values(), key=lambda r: (r.nbytes, -r.received_at))
            del self._queue[victim.client]
            self._held_bytes -= victim.nbytes
            refused.append((victim, f'server memory budget: this request holds {victim.nbytes / MIB:.1f} MiB and '
                                    f'the requests held would pass max_queued_bytes '
                                    f'({config.max_queued_bytes / MIB:.0f} MiB); the largest is refused first'))
        self._counters['refused_requests'] += len(refused)
        self._counters['budget_refusals'] += len(refused)
        return refused

    @property
    def queued(self) -> int:
        """Return the number of requests waiting."""
        with self._condition:
            return len(self._queue)

    @property
    def held_bytes(self) -> int:
        """Return the bytes the requests waiting and being served hold."""
        with self._condition:
            return self._held_bytes

    @property
    def stats(self) -> dict[str, Any]:
        """Return counters, mean and largest batch size, and queue wait (mean, p95) in seconds."""
        with self._condition:
            batches = self._counters['batches']
            waits = np.array(self._queue_waits[-1000:])
            return {'counters': dict(self._counters),
                    'mean_batch_size': self._batched_requests / batches if batches else 0.0,
                    'max_batch_size': self._max_batch_seen,
                    'queue_wait': (float(waits.mean()), float(np.percentile(waits, 95)))
                    if len(waits) else (float('nan'), float('nan'))}

    def _run(self) -> None:
        # No request may stay bound to a local of this loop while it waits for the next batch:
        # its frames would stay resident after being served (a burst's memory never returned).
        while self._serve_all(self._next_batch()):
            pass

    def _next_batch(self) -> list[ServedRequest] | None:
        """Wait for requests (and the window) and take a batch of them; None when stopping."""
        with self._condition:
            self._condition.wait_for(lambda: self._stopping or self._queue)
            if self._stopping:
                return None
            first = next(iter(self._queue.values()))
            self._condition.wait_for(
                lambda: self._stopping or len(self._queue) >= self._config.max_batch,
                timeout=max(0.0, first.received_at + self._config.window - self._clock()))
            if self._stopping:
                return None
            self._drop_hopeless()
            taken = list(self._queue.values())[:self._config.max_batch]
            for request in taken:
                del self._queue[request.client]
            return taken

    def _serve_all(self, batch: list[ServedRequest] | None) -> bool:
        """Serve a batch, one pass per group that can share one; False when stopping."""
        if batch is None:
            return False
        large = sum(r.nbytes for r in batch) >= TRIM_BYTES
        for group in _compatible_groups(batch):
            self._serve(group)
        del batch, group
        if large:
            _trim_heap()
        return True

    def _drop_hopeless(self) -> None:
        """
        Drop the waiting requests whose answer could not reach their robot in time (lock held).

        A request's answer comes at the earliest one batch from now; the last batch's time
        stands in for it. Under overload this keeps the server on requests it can still serve
        in time instead of computing answers every robot has given up on (which would make every
        answer late: the fleet benchmark's collapse).
        """
        now = self._clock()
        alive = [r for r in self._queue.values() if r.deadline is None or now - r.received_at <= r.deadline]
        hopeful = [r for r in alive if r.deadline is None or now - r.received_at + self._last_compute <= r.deadline]
        if alive and not hopeful:       # never trust one slow batch forever: serve the newest, measure again
            hopeful = [max(alive, key=lambda r: r.received_at)]
        kept = {r.client for r in hopeful}
        hopeless = [client for client in self._queue if client not in kept]
        for client in hopeless:
            self._held_bytes -= self._queue.pop(client).nbytes
        self._counters['expired_requests'] += len(hopeless)

    def _serve(self, batch: list[ServedRequest]) -> None:
        started = self._clock()
        passes_before = self._policy.stats.prefix_passes
        try:
            chunks = self._policy.predict_action_chunks(
                [r.observation for r in batch], [r.rtc for r in batch])
            answers = [(chunk, *_judge(chunk)) for chunk in chunks]
        except Exception as error:  # noqa: B902 - one robot's bad input must not stop the server
            if len(batch) > 1:
                self._count_fault()
                for request in batch:
                    self._serve([request])
                return
            answers = [(None, FAULT_RAISED, f'{type(error).__name__}: {error}')]
        compute = self._clock() - started
        with self._condition:
            self._last_compute = compute
            self._counters['batches'] += 1
            self._counters['prefix_passes'] += self._policy.stats.prefix_passes - passes_before
            self._batched_requests += len(batch)
            self._max_batch_seen = max(self._max_batch_seen, len(batch))
            waits = [started - r.received_at for r in batch]
            self._queue_waits = self._queue_waits[-999:] + waits
        for request, wait, (chunk, fault, text) in zip(batch, waits, answers):
            self._deliver(ServedChunk(request, None if fault else chunk, fault, text, wait, compute,
                                      len(batch)))
        with self._condition:
            self._held_bytes -= sum(r.nbytes for r in batch)

    def _deliver(self, answer: ServedChunk) -> None:
        """Hand one answer on; a failure to send it must not stop serving the others."""
        try:
            self._on_chunk(answer)
        except Exception:  # noqa: B902 - the robot sees a missing answer as late and holds
            with self._condition:
                self._counters['answer_errors'] += 1

    def _count_fault(self) -> None:
        with self._condition:
            self._counters['batch_faults'] += 1


def _trim_heap() -> None:
    """
    Give the C heap's free memory back to the system (glibc's malloc_trim; elsewhere nothing).

    Large frames pass through buffers of the middleware and the preprocessing whose freed
    memory glibc keeps for reuse: without this a burst of large requests stays resident.
    """
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def request_bytes(request: ServedRequest) -> int:
    """Return the memory a request holds: its decoded images, state and guidance, and its task."""
    observation = request.observation
    arrays = [*(observation.get('images') or {}).values(), observation.get('state')]
    if request.rtc is not None:
        arrays.append(request.rtc.prefix)
    task = observation.get('task')
    return sum(np.asarray(a).nbytes for a in arrays if a is not None) + (len(task) if isinstance(task, str) else 0)


def _judge(chunk: np.ndarray) -> tuple[str | None, str]:
    if np.all(np.isfinite(chunk)):
        return None, ''
    bad = int(np.count_nonzero(~np.isfinite(chunk)))
    return FAULT_NON_FINITE, f'{bad} of {chunk.size} actions are not finite'


def _compatible_groups(requests: list[ServedRequest]) -> list[list[ServedRequest]]:
    """Split requests into groups that can share one pass: same cameras, frame shapes, state shape."""
    groups: dict[tuple, list[ServedRequest]] = {}
    for request in requests:
        observation = request.observation
        images = observation.get('images') or {}
        key = (tuple(sorted((name, np.shape(frame)) for name, frame in images.items())),
               np.shape(observation.get('state')))
        groups.setdefault(key, []).append(request)
    return list(groups.values())
