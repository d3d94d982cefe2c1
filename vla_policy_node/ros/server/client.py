# SPDX-License-Identifier: Apache-2.0
"""
Remote inference: the control loop's ``Inference`` served by a ``vla_policy_server`` over DDS.

The loop cannot tell it from the local ``InferenceWorker``: ``submit`` sends the observation
and returns at once, the answer comes back as an :class:`InferenceResult` through the bound
receiver, and the loop keeps every safety decision, exactly as with local inference:

* an answer that takes longer than ``deadline`` becomes a ``late`` fault at the deadline: the
  loop holds and its next step asks again, so a robot whose server died holds within one
  deadline and resumes with the first answer after the server is back. The node passes the
  smaller of ``policy_deadline`` and ``max_observation_age`` (``policy_deadline`` alone with
  ``use_sim_time``): an answer later than that would be refused as stale anyway, so a lost
  message costs no longer a hold;
* with no server subscribed to the request topic (not started yet, restarting), nothing is
  sent and the request fails at once as ``late``, with that reason;
* an answer that comes after its deadline, or after an episode reset, or for another request
  (its robot, session, request id, episode and observation time are compared) is dropped here
  (counted as ``remote_late_answers``). The session is drawn when this client is made, so a
  late answer to a request of the robot's previous run never matches a new request;
* ``finished_at`` is this robot's clock when the answer arrives, so the latency the scheduler
  measures from the observation time, and its delay compensation, include the round trip.

The server keeps no state per robot (each batch rebuilds the prefix cache), so an episode
reset only forgets the request in flight: the new episode's first request goes out at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import secrets
import threading
import time
from typing import Any

import numpy as np
from rclpy.node import Node
from std_msgs.msg import UInt8MultiArray

from vla_policy_node.control.chunking import ChunkRequest
from vla_policy_node.control.inference import FAULT_LATE, InferenceResult
from vla_policy_node.ros.qos import REMOTE_FLEET_QOS, REMOTE_REQUEST_QOS
from vla_policy_node.ros.server.protocol import (CHUNKS_TOPIC, decode_chunk, encode_request, ProtocolError, RequestKey,
                                                 REQUESTS_TOPIC, topic)

REMOTE_COUNTERS = ('control_steps', 'prefix_passes', 'cache_resets', 'remote_requests',
                   'remote_answers', 'remote_timeouts', 'remote_faults', 'remote_late_answers',
                   'remote_bad_answers')
WINDOW = 200        # round trips kept for the p50/p95
BAD_ANSWER_LOG_PERIOD = 5.0     # s between warnings about malformed answers (all are counted)


class RemoteInference:
    """Sends chunk requests to the server and turns answers (or their absence) into results."""

    def __init__(self, node: Node, server: str, joints: Sequence[str], clock: Callable[[], float],
                 deadline: float, log: Callable[[str], None]) -> None:
        self._robot = node.get_fully_qualified_name()
        self._session = secrets.token_hex(8)
        self._joints = tuple(joints)
        self._request_topic = topic(server, REQUESTS_TOPIC)
        self._clock = clock
        self._deadline = deadline
        self._log = log
        self._on_result: Callable[[InferenceResult], None] | None = None
        self._condition = threading.Condition()
        self._pending: tuple[ChunkRequest, float, RequestKey] | None = None   # request, wall time sent, key
        self._unsent: str | None = None         # why the pending request was not sent (fails at once)
        self._bad_answer_logged = -BAD_ANSWER_LOG_PERIOD
        self._stopping = False
        self._counters = dict.fromkeys(REMOTE_COUNTERS, 0)
        self._round_trips: list[float] = []
        self._server_compute: list[float] = []
        self._requests = node.create_publisher(UInt8MultiArray, self._request_topic, REMOTE_REQUEST_QOS)
        self._answers = node.create_subscription(
            UInt8MultiArray, topic(server, CHUNKS_TOPIC), self._on_answer, REMOTE_FLEET_QOS)
        self._thread = threading.Thread(target=self._watch_deadlines, name='vla_remote_deadline',
                                        daemon=True)

    # ------------------------------------------------------------------ the Inference protocol
    def bind(self, on_result: Callable[[InferenceResult], None]) -> None:
        """Send results to ``on_result`` (the control loop binds itself)."""
        self._on_result = on_result

    @property
    def busy(self) -> bool:
        """Tell whether a request waits for its answer (and its deadline has not passed)."""
        with self._condition:
            return self._pending is not None

    def submit(self, request: ChunkRequest, observation: dict[str, Any]) -> bool:
        """
        Send one request; False (nothing sent) while another one waits for its answer.

        Without a server on the request topic nothing is sent and the request fails at once
        (from the deadline thread, never from inside the caller's lock) with that reason.
        """
        key = RequestKey(self._robot, self._session, request.request_id, request.episode, request.obs_time)
        unserved = self._requests.get_subscription_count() == 0
        with self._condition:
            if self._pending is not None or self._stopping:
                return False
            self._pending = (request, time.monotonic(), key)
            self._unsent = f'no policy server subscribes to {self._request_topic}' if unserved else None
            self._counters['remote_requests'] += 1
            self._condition.notify()
        if not unserved:
            self._requests.publish(encode_request(key, self._joints, observation, request.rtc))
        return True

    def request_reset(self) -> None:
        """Episode boundary: forget the request in flight (its answer will be dropped)."""
        with self._condition:
            self._pending, self._unsent = None, None
            self._counters['cache_resets'] += 1
            self._condition.notify()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the deadline watcher (after a result receiver is bound)."""
        if self._on_result is None:
            raise RuntimeError('bind a result receiver before starting remote inference')
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Tell whether the deadline watcher runs."""
        return self._thread.is_alive()

    def stop(self, timeout: float) -> bool:
        """Stop watching; an answer arriving later is dropped. True when the watcher ended."""
        with self._condition:
            self._stopping = True
            self._pending, self._unsent = None, None
            self._condition.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def deadline(self) -> float:
        """Return the seconds an answer may take before the loop holds."""
        with self._condition:
            return self._deadline

    @deadline.setter
    def deadline(self, seconds: float) -> None:
        with self._condition:
            self._deadline = seconds
            self._condition.notify()

    @property
    def stats(self) -> dict[str, Any]:
        """
        Return counters and latencies (p50, p95): ``total`` is the round trip, ``server`` its compute.

        ``remote_servers_matched`` is the number of subscribers to the request topic now: 0
        while no server runs, so a robot (or the simulated arm) can wait for one.
        """
        matched = self._requests.get_subscription_count()
        with self._condition:
            return {'counters': {**self._counters, 'remote_servers_matched': matched},
                    'latencies': {'total': _percentiles(self._round_trips),
                                  'server': _percentiles(self._server_compute)}}

    # ------------------------------------------------------------------ answers and deadlines
    def _on_answer(self, msg: UInt8MultiArray) -> None:
        try:
            answer = decode_chunk(msg)
        except ProtocolError as error:
            now = time.monotonic()
            with self._condition:
                self._counters['remote_bad_answers'] += 1
                quiet = now - self._bad_answer_logged < BAD_ANSWER_LOG_PERIOD
                if not quiet:
                    self._bad_answer_logged = now
            if not quiet:
                self._log(f'malformed answer from the policy server: {error}')
            return
        if answer.key.robot != self._robot:
            return
        with self._condition:
            pending = self._pending
            if pending is None or pending[2] != answer.key or self._unsent is not None:
                self._counters['remote_late_answers'] += 1
                return
            request, sent, _ = pending
            self._pending = None
            round_trip = time.monotonic() - sent
            self._round_trips = self._round_trips[1 - WINDOW:] + [round_trip]
            self._server_compute = self._server_compute[1 - WINDOW:] + [answer.compute]
            self._counters['remote_answers'] += 1
            if answer.fault is None:
                self._counters['control_steps'] += 1
                self._counters['prefix_passes'] += 1
            else:
                self._counters['remote_faults'] += 1
            self._condition.notify()
        self._on_result(InferenceResult(
            request=request, chunk=answer.chunk, fault=answer.fault,
            error=f'policy server: {answer.error}' if answer.fault else '',
            duration=round_trip, finished_at=self._clock()))

    def _watch_deadlines(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(lambda: self._stopping or self._pending is not None)
                if self._stopping:
                    return
                request, sent, _ = self._pending
                left = sent + self._deadline - time.monotonic()
                if left > 0 and self._unsent is None:
                    self._condition.wait(left)
                    continue
                error = self._unsent or (f'no answer from the policy server within {self._deadline:.3f} s '
                                         '(the smaller of policy_deadline and max_observation_age)')
                self._pending, self._unsent = None, None
                self._counters['remote_timeouts'] += 1
            self._on_result(InferenceResult(
                request=request, chunk=None, fault=FAULT_LATE, error=error,
                duration=time.monotonic() - sent, finished_at=self._clock()))


def _percentiles(samples: list[float]) -> tuple[float, float]:
    if not samples:
        return float('nan'), float('nan')
    values = np.array(samples)
    return float(np.percentile(values, 50)), float(np.percentile(values, 95))
