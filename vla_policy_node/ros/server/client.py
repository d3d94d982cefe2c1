# SPDX-License-Identifier: Apache-2.0
"""
Remote inference: the control loop's ``Inference`` served by ``vla_policy_server`` nodes over DDS.

The loop cannot tell it from the local ``InferenceWorker``: ``submit`` sends the observation
and returns at once, the answer comes back as an :class:`InferenceResult` through the bound
receiver, and the loop keeps every safety decision, exactly as with local inference:

* a robot has a pool of servers (``remote.server`` and ``remote.servers``). Each server sends
  heartbeats; one silent for ``server_timeout`` is lost. Every request goes to the live server
  ranking highest for this robot (``server.pool``: the fleet splits evenly, a lost server's
  robots move to the next live one and come back when it returns);
* when the server of the request in flight is lost, the request fails at once as ``late``
  ("policy server ... lost"), within ``server_timeout`` of its last heartbeat instead of a
  whole deadline: the loop holds and its next step asks another live server;
* an answer that takes longer than ``deadline`` becomes a ``late`` fault at the deadline: the
  loop holds and its next step asks again. The node passes the
  smaller of ``policy_deadline`` and ``max_observation_age`` (``policy_deadline`` alone with
  ``use_sim_time``): an answer later than that would be refused as stale anyway, so a lost
  message costs no longer a hold. The deadline travels with the request, so a server drops a
  request that waited longer than it;
* with no live server (none started, all restarting), nothing is sent and the request fails
  at once as ``late``, with that reason;
* an answer that comes after its deadline, or after an episode reset, or for another request
  (its robot, session, request id, episode and observation time are compared), or from a
  server other than the one asked, is dropped here (counted as ``remote_late_answers``).
  The session is drawn when this client is made, so a
  late answer to a request of the robot's previous run never matches a new request;
* ``finished_at`` is this robot's clock when the answer arrives, so the latency the scheduler
  measures from the observation time, and its delay compensation, include the round trip.

Servers keep no state per robot (each batch rebuilds the prefix cache), so an episode
reset only forgets the request in flight: the new episode's first request goes out at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
import secrets
import threading
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus
import numpy as np
from rclpy.node import Node
from rclpy.publisher import Publisher

from vla_policy_node.control.chunking import ChunkRequest
from vla_policy_node.control.inference import FAULT_LATE, InferenceResult
from vla_policy_node.ros.qos import HEARTBEAT_QOS, REMOTE_FLEET_QOS, REMOTE_REQUEST_QOS
from vla_policy_node.ros.server.protocol import (ANSWER_TYPE, CHUNKS_TOPIC, decode_chunk, decode_heartbeat,
                                                 encode_request, HEARTBEAT_TOPIC, ProtocolError, REQUEST_TYPE,
                                                 RequestKey, REQUESTS_TOPIC, topic)
from vla_policy_node.server.pool import rendezvous, ServerPool

REMOTE_COUNTERS = ('control_steps', 'prefix_passes', 'cache_resets', 'remote_requests',
                   'remote_answers', 'remote_timeouts', 'remote_faults', 'remote_late_answers',
                   'remote_bad_answers', 'remote_server_losses', 'remote_server_switches')
WINDOW = 200        # round trips kept for the p50/p95
BAD_ANSWER_LOG_PERIOD = 5.0     # s between warnings about malformed answers (all are counted)


@dataclass(frozen=True)
class _Pending:
    request: ChunkRequest
    sent: float             # monotonic
    key: RequestKey
    server: str | None      # None: not sent, ``unsent`` says why


class RemoteInference:
    """Sends chunk requests to the live server of a pool and turns answers (or their absence) into results."""

    def __init__(self, node: Node, servers: Sequence[str], joints: Sequence[str], clock: Callable[[], float],
                 deadline: float, log: Callable[[str], None], server_timeout: float = 0.5,
                 inform: Callable[[str], None] = lambda text: None) -> None:
        """``log`` takes warnings (a lost server, a malformed answer), ``inform`` news (a server found, a move)."""
        self._robot = node.get_fully_qualified_name()
        self._session = secrets.token_hex(8)
        self._joints = tuple(joints)
        self._pool = ServerPool(tuple(servers), server_timeout)
        self._clock = clock
        self._deadline = deadline
        self._log = log
        self._inform = inform
        self._on_result: Callable[[InferenceResult], None] | None = None
        self._condition = threading.Condition()
        self._pending: _Pending | None = None
        self._unsent: str | None = None         # why the pending request was not sent (fails at once)
        self._server: str | None = None         # the server the last request went to
        self._bad_answer_logged = -BAD_ANSWER_LOG_PERIOD
        self._stopping = False
        self._counters = dict.fromkeys(REMOTE_COUNTERS, 0)
        self._round_trips: list[float] = []
        self._server_compute: list[float] = []
        self._requests: dict[str, Publisher] = {}
        for server in self._pool.servers:
            self._requests[server] = node.create_publisher(
                REQUEST_TYPE, topic(server, REQUESTS_TOPIC), REMOTE_REQUEST_QOS)
            # Raw: the answer is deserialized by decode_chunk, so bytes that are not one are refused there.
            node.create_subscription(ANSWER_TYPE, topic(server, CHUNKS_TOPIC),
                                     partial(self._on_answer, server), REMOTE_FLEET_QOS, raw=True)
            node.create_subscription(DiagnosticStatus, topic(server, HEARTBEAT_TOPIC),
                                     partial(self._on_heartbeat, server), HEARTBEAT_QOS)
        self._thread = threading.Thread(target=self._watch, name='vla_remote_deadline', daemon=True)

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
        Send one request to the chosen live server; False (nothing sent) while another one waits.

        Without a live server nothing is sent and the request fails at once (from the deadline
        thread, never from inside the caller's lock) with the reason.
        """
        key = RequestKey(self._robot, self._session, request.request_id, request.episode, request.obs_time)
        matched = {server: publisher.get_subscription_count() > 0 for server, publisher in self._requests.items()}
        with self._condition:
            if self._pending is not None or self._stopping:
                return False
            now = time.monotonic()
            server = rendezvous(self._robot, self._usable(now, matched))
            moved = server is not None and self._server is not None and server != self._server
            self._pending = _Pending(request, now, key, server)
            self._unsent = self._why_none_serves(now, matched) if server is None else None
            self._counters['remote_requests'] += 1
            self._counters['remote_server_switches'] += moved
            if server is not None:
                self._server = server
            deadline = self._deadline
            self._condition.notify()
        if moved:
            self._inform(f'asking policy server {server} now')
        if server is not None:
            self._requests[server].publish(encode_request(key, self._joints, observation, request.rtc, deadline))
        return True

    def _usable(self, now: float, matched: dict[str, bool]) -> list[str]:
        """
        Return the servers a request may go to: subscribed, and live by their heartbeats.

        A subscribed server never heard from (a version without heartbeats, during a rolling
        upgrade) is used too; its loss is then seen at the deadline, as before heartbeats.
        """
        return [s for s in self._pool.servers
                if matched[s] and (self._pool.is_live(s, now) or self._pool.instance(s) is None)]

    def _why_none_serves(self, now: float, matched: dict[str, bool]) -> str:
        """Say per server why none can take a request now."""
        reasons = []
        for server in self._pool.servers:
            silence = self._pool.silence(server, now)
            if silence is None:
                reasons.append(f'{server}: no heartbeat yet')
            elif silence > self._pool.timeout:
                reasons.append(f'{server}: lost, no heartbeat for {silence:.2f} s')
            elif not matched[server]:
                reasons.append(f'{server}: does not subscribe to {topic(server, REQUESTS_TOPIC)}')
        return 'no live policy server (' + '; '.join(reasons) + ')'

    def request_reset(self) -> None:
        """Episode boundary: forget the request in flight (its answer will be dropped)."""
        with self._condition:
            self._pending, self._unsent = None, None
            self._counters['cache_resets'] += 1
            self._condition.notify()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the deadline and heartbeat watcher (after a result receiver is bound)."""
        if self._on_result is None:
            raise RuntimeError('bind a result receiver before starting remote inference')
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Tell whether the watcher runs."""
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

        ``remote_servers_matched`` is the number of servers that take requests now: 0
        while none runs, so a robot (or the simulated arm) can wait for one;
        ``remote_servers_live`` those whose heartbeats come; ``server`` is the
        server the last request went to (None before any).
        """
        matched = {server: publisher.get_subscription_count() > 0 for server, publisher in self._requests.items()}
        with self._condition:
            now = time.monotonic()
            usable = self._usable(now, matched)
            heard = sum(self._pool.is_live(server, now) for server in self._pool.servers)
            return {'counters': {**self._counters, 'remote_servers_matched': len(usable),
                                 'remote_servers_live': heard},
                    'latencies': {'total': _percentiles(self._round_trips),
                                  'server': _percentiles(self._server_compute)},
                    'server': self._server}

    # ------------------------------------------------------------------ heartbeats, answers, deadlines
    def _on_heartbeat(self, server: str, msg: DiagnosticStatus) -> None:
        try:
            instance = decode_heartbeat(msg)
        except ProtocolError:
            return
        with self._condition:
            found = self._pool.heartbeat(server, instance, time.monotonic())
        if found:
            self._inform(f'policy server {server} is live (run {instance})')

    def _on_answer(self, server: str, msg: bytes) -> None:
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
                self._log(f'malformed answer from the policy server {server}: {error}')
            return
        if answer.key.robot != self._robot:
            return
        with self._condition:
            pending = self._pending
            if (pending is None or pending.key != answer.key or pending.server != server
                    or self._unsent is not None):
                self._counters['remote_late_answers'] += 1
                return
            self._pending = None
            round_trip = time.monotonic() - pending.sent
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
            request=pending.request, chunk=answer.chunk, fault=answer.fault,
            error=f'policy server {server}: {answer.error}' if answer.fault else '',
            duration=round_trip, finished_at=self._clock()))

    def _watch(self) -> None:
        """Fail the request in flight at its deadline or when its server is lost; log lost servers."""
        tick = self._pool.timeout / 4
        while True:
            failed = None
            with self._condition:
                if self._stopping:
                    return
                now = time.monotonic()
                lost = self._pool.expire(now)
                self._counters['remote_server_losses'] += len(lost)
                pending = self._pending
                if pending is not None:
                    left = pending.sent + self._deadline - now
                    if self._unsent is not None:
                        error = self._unsent
                    elif pending.server in lost or (self._pool.instance(pending.server) is not None
                                                    and not self._pool.is_live(pending.server, now)):
                        error = (f'policy server {pending.server} lost: no heartbeat for '
                                 f'{self._pool.silence(pending.server, now):.2f} s (remote.server_timeout '
                                 f'{self._pool.timeout:g} s)')
                    elif left <= 0:
                        error = (f'no answer from the policy server {pending.server} within {self._deadline:.3f} s '
                                 '(the smaller of policy_deadline and max_observation_age)')
                    else:
                        error = None
                    if error is not None:
                        self._pending, self._unsent = None, None
                        self._counters['remote_timeouts'] += 1
                        failed = (pending, error)
                if failed is None:
                    wait = tick if pending is None else min(tick, max(left, 0.0))
                    self._condition.wait(wait)
            for server in lost:
                self._log(f'policy server {server} lost: no heartbeat for more than {self._pool.timeout:g} s')
            if failed is not None:
                pending, error = failed
                self._on_result(InferenceResult(
                    request=pending.request, chunk=None, fault=FAULT_LATE, error=error,
                    duration=time.monotonic() - pending.sent, finished_at=self._clock()))


def _percentiles(samples: list[float]) -> tuple[float, float]:
    if not samples:
        return float('nan'), float('nan')
    values = np.array(samples)
    return float(np.percentile(values, 50)), float(np.percentile(values, 95))
