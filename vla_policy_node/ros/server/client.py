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
  (its robot, session, request id, episode and observation time are compared, and the digest
  of the exact request bytes it carries), or from a server other than the one asked, is
  dropped here (counted as ``remote_late_answers``). The session is drawn when this client is
  made, so a late answer to a request of the robot's previous run never matches a new request;
* answers and heartbeats are taken only from the publisher of the server's own node
  (``senders.py``): another publisher's are dropped (``remote_foreign_messages``, a warning
  at most every few seconds); a server whose name more than one publisher claims is
  contested and not asked (its request in flight fails at once), so a rogue on the domain can
  neither answer for a server, fault its robots nor keep a dead server live. An answer must
  carry exactly the ``horizon`` steps asked for and one action per joint. With a fleet key,
  everything unsigned is refused too;
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
from vla_policy_node.control.inference import DeadlineWorker, FAULT_LATE, InferenceResult
from vla_policy_node.ros.qos import HEARTBEAT_QOS, REMOTE_FLEET_QOS, REMOTE_REQUEST_QOS
from vla_policy_node.ros.server.protocol import (ANSWER_TYPE, CHUNKS_TOPIC, decode_chunk,
                                                 decode_heartbeat, encode_request, HEARTBEAT_TOPIC, ProtocolError,
                                                 REQUEST_TYPE, RequestKey, REQUESTS_TOPIC, seal, topic)
from vla_policy_node.ros.server.senders import SENDER_KNOWN, ServerSenders, subscribe
from vla_policy_node.server.batching import ServedChunk
from vla_policy_node.server.fleet_key import request_digest
from vla_policy_node.server.pool import rendezvous, ServerPool

REMOTE_COUNTERS = ('control_steps', 'prefix_passes', 'cache_resets', 'remote_requests',
                   'remote_answers', 'remote_timeouts', 'remote_faults', 'remote_late_answers',
                   'remote_bad_answers', 'remote_server_losses', 'remote_server_switches',
                   'remote_foreign_messages', 'remote_contested')
WINDOW = 200        # round trips kept for the p50/p95
LOG_PERIOD = 5.0    # s between warnings of one kind (malformed or foreign messages, servers found or lost)


@dataclass(frozen=True)
class _Pending:
    request: ChunkRequest
    sent: float             # monotonic
    key: RequestKey
    server: str | None      # None: not sent, ``unsent`` says why
    digest: bytes = b''     # of the request's bytes on the wire


class RemoteInference(DeadlineWorker):
    """
    Sends chunk requests to the live server of a pool and turns answers (or their absence) into results.

    Long on purpose: the loop's ``Inference`` contract, the two callbacks (heartbeats, answers) and the
    deadline thread share one condition and one pending request; split, a reader could no longer follow
    a request from its sending to its answer, its timeout or its server's loss in one place.
    """

    def __init__(self, node: Node, servers: Sequence[str], joints: Sequence[str], clock: Callable[[], float],
                 deadline: float, log: Callable[[str], None], server_timeout: float = 0.5,
                 inform: Callable[[str], None] = lambda text: None, horizon: int = 1,
                 fleet_key: bytes | None = None) -> None:
        """
        ``log`` takes warnings (a lost server, a malformed answer), ``inform`` news (a server found, a move).

        ``horizon``: the steps each answer must carry; ``fleet_key``: sign requests, take only signed messages.
        """
        self._robot = node.get_fully_qualified_name()
        self._horizon = horizon
        self._fleet_key = fleet_key
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
        self._logged: dict[str, float] = {}     # what -> monotonic time of its last warning
        self._stopping = False
        self._counters = dict.fromkeys(REMOTE_COUNTERS, 0)
        self._round_trips: list[float] = []
        self._server_compute: list[float] = []
        self._requests: dict[str, Publisher] = {}
        self._beats: dict[str, tuple[str, int]] = {}    # server -> (run, beat) last taken
        self._contested: set[str] = set()
        self._senders = ServerSenders(node, {server: {'chunks': topic(server, CHUNKS_TOPIC),
                                                      'heartbeat': topic(server, HEARTBEAT_TOPIC)}
                                             for server in self._pool.servers})
        for server in self._pool.servers:
            self._requests[server] = node.create_publisher(
                REQUEST_TYPE, topic(server, REQUESTS_TOPIC), REMOTE_REQUEST_QOS)
            # Raw: the answer is deserialized by decode_chunk, so bytes that are not one are refused there.
            subscribe(node, ANSWER_TYPE, topic(server, CHUNKS_TOPIC), partial(self._on_answer, server),
                      REMOTE_FLEET_QOS, raw=True)
            subscribe(node, DiagnosticStatus, topic(server, HEARTBEAT_TOPIC), partial(self._on_heartbeat, server),
                      HEARTBEAT_QOS)
        if not SENDER_KNOWN:
            log('this rclpy gives no publisher of a message (MessageInfo.publisher_gid, Kilted and later): answers '
                'and heartbeats are not bound to their server\'s publisher, only to the request by its digest; '
                'set a fleet key (remote.fleet_key_file) where other participants share the domain')
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
        matched = self._matched()
        if self.busy:
            return False
        # Serialized (and signed) once: the digest is of the very bytes the server receives.
        wire = seal(encode_request(key, self._joints, observation, request.rtc, self.deadline, self._horizon),
                    self._fleet_key)
        digest = request_digest(wire)
        with self._condition:
            if self._pending is not None or self._stopping:
                return False
            now = time.monotonic()
            server = rendezvous(self._robot, self._usable(now, matched))
            moved = server is not None and self._server is not None and server != self._server
            self._pending = _Pending(request, now, key, server, digest)
            self._unsent = self._why_none_serves(now, matched) if server is None else None
            self._counters['remote_requests'] += 1
            self._counters['remote_server_switches'] += moved
            if server is not None:
                self._server = server
            self._condition.notify()
        if moved:
            self._inform(f'asking policy server {server} now')
        if server is not None:
            self._requests[server].publish(wire)
        return True

    def _matched(self) -> dict[str, bool]:
        """Tell per server whether it subscribes to its requests and no other node claims it."""
        return {server: publisher.get_subscription_count() > 0 and self._senders.contested(server) is None
                for server, publisher in self._requests.items()}

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
            elif self._senders.contested(server) is not None:
                reasons.append(self._senders.contested(server))
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

    def _on_stop(self) -> None:
        """Forget the request in flight: an answer arriving after the stop is dropped."""
        self._pending, self._unsent = None, None

    @property
    def stats(self) -> dict[str, Any]:
        """
        Return counters and latencies (p50, p95): ``total`` is the round trip, ``server`` its compute.

        ``remote_servers_matched`` is the number of servers that take requests now: 0
        while none runs, so a robot (or the simulated arm) can wait for one;
        ``remote_servers_live`` those whose heartbeats come; ``server`` is the
        server the last request went to (None before any).
        """
        matched = self._matched()
        with self._condition:
            now = time.monotonic()
            usable = self._usable(now, matched)
            heard = sum(self._pool.is_live(server, now) for server in self._pool.servers)
            return {'counters': {**self._counters, 'remote_servers_matched': len(usable),
                                 'remote_servers_live': heard,
                                 'remote_foreign_publishers': self._senders.foreign()},
                    'latencies': {'total': _percentiles(self._round_trips),
                                  'server': _percentiles(self._server_compute)},
                    'server': self._server}

    # ------------------------------------------------------------------ heartbeats, answers, deadlines
    def _warn(self, what: str, text: str, sink: Callable[[str], None] | None = None) -> None:
        """Log a warning (or news to ``sink``), at most one per ``LOG_PERIOD`` for each ``what``; all is counted."""
        now = time.monotonic()
        with self._condition:
            quiet = now - self._logged.get(what, -LOG_PERIOD) < LOG_PERIOD
            if not quiet:
                self._logged[what] = now
        if quiet:
            return
        # One call site per severity: rclpy refuses a call site whose severity changes.
        if sink is None:
            self._log(text)
        else:
            sink(text)

    def _foreign(self, server: str, what: str, sender: bytes | None) -> bool:
        """Tell whether a message on ``server``'s topic ``what`` is not its own (counted and logged)."""
        owner = self._senders.owner(server, what, sender)
        if not owner:
            return False
        with self._condition:
            self._counters['remote_foreign_messages'] += 1
        self._warn(f'foreign {server}', f'dropped a {what} message on {server}\'s topic from {owner}: only the '
                                        'server\'s own publisher is obeyed')
        return True

    def _on_heartbeat(self, server: str, msg: DiagnosticStatus, sender: bytes | None) -> None:
        if self._foreign(server, 'heartbeat', sender):
            return
        try:
            instance, beat = decode_heartbeat(msg, self._fleet_key)
        except ProtocolError as error:
            self._warn(f'heartbeat {server}', f'refused a heartbeat of {server}: {error}')
            return
        with self._condition:
            last = self._beats.get(server)
            if beat is not None and last is not None and last[0] == instance and beat <= last[1]:
                return          # a replayed or reordered beat of this run
            self._beats[server] = (instance, -1 if beat is None else beat)
            found = self._pool.heartbeat(server, instance, time.monotonic())
        if found:
            self._warn(f'live {server}', f'policy server {server} is live (run {instance})', self._inform)

    def _on_answer(self, server: str, msg: bytes, sender: bytes | None) -> None:
        if self._foreign(server, 'chunks', sender):
            return
        try:
            answer = decode_chunk(msg, self._fleet_key)
            reply = answer.request.reply_to
            if reply.key.robot == self._robot:
                self._check_shape(answer)
        except ProtocolError as error:
            with self._condition:
                self._counters['remote_bad_answers'] += 1
            self._warn('bad answer', f'malformed answer from the policy server {server}: {error}')
            return
        if reply.key.robot != self._robot:
            return
        with self._condition:
            pending = self._pending
            if (pending is None or pending.key != reply.key or pending.server != server
                    or pending.digest != reply.digest or self._unsent is not None):
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

    def _check_shape(self, answer: ServedChunk) -> None:
        """Refuse a chunk other than the ``horizon`` x joints asked for (a huge one is never taken)."""
        if answer.chunk is not None and answer.chunk.shape != (self._horizon, len(self._joints)):
            raise ProtocolError(f'the chunk must be {self._horizon} steps x {len(self._joints)} actions '
                                f'(the horizon asked for, one action per joint), got {answer.chunk.shape}')

    def _watch(self) -> None:
        """Fail the request in flight at its deadline or when its server is lost or contested; log lost servers."""
        tick = self._pool.timeout / 4
        refreshed = -tick
        while True:
            if time.monotonic() - refreshed >= tick:
                self._senders.refresh()         # outside the lock: a graph query
                refreshed = time.monotonic()
            contests = {server: self._senders.contested(server) for server in self._pool.servers}
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
                    error = self._failure(pending, lost, contests.get(pending.server), left, now)
                    if error is not None:
                        self._pending, self._unsent = None, None
                        self._counters['remote_timeouts'] += 1
                        failed = (pending, error)
                if failed is None:
                    wait = tick if pending is None else min(tick, max(left, 0.0))
                    self._condition.wait(wait)
            for server in lost:
                self._warn(f'lost {server}', f'policy server {server} lost: no heartbeat for more than '
                                             f'{self._pool.timeout:g} s')
            self._note_contests(contests)
            if failed is not None:
                pending, error = failed
                self._on_result(InferenceResult(
                    request=pending.request, chunk=None, fault=FAULT_LATE, error=error,
                    duration=time.monotonic() - pending.sent, finished_at=self._clock()))

    def _failure(self, pending: _Pending, lost: list[str], contest: str | None, left: float,
                 now: float) -> str | None:
        """Say why the request in flight fails now, or None (lock held)."""
        if self._unsent is not None:
            return self._unsent
        if contest is not None:
            return contest
        if pending.server in lost or (self._pool.instance(pending.server) is not None
                                      and not self._pool.is_live(pending.server, now)):
            return (f'policy server {pending.server} lost: no heartbeat for '
                    f'{self._pool.silence(pending.server, now):.2f} s (remote.server_timeout '
                    f'{self._pool.timeout:g} s)')
        if left <= 0:
            return (f'no answer from the policy server {pending.server} within {self._deadline:.3f} s '
                    '(the smaller of policy_deadline and max_observation_age)')
        return None

    def _note_contests(self, contests: dict[str, str | None]) -> None:
        """Count servers that became contested; warn (rate-limited) while one is."""
        for server, contest in contests.items():
            with self._condition:
                became = contest is not None and server not in self._contested
                self._counters['remote_contested'] += became
                if contest is None:
                    self._contested.discard(server)
                else:
                    self._contested.add(server)
            if contest is not None:
                self._warn(f'contested {server}', f'{contest}: not asked while it is')


def _percentiles(samples: list[float]) -> tuple[float, float]:
    if not samples:
        return float('nan'), float('nan')
    values = np.array(samples)
    return float(np.percentile(values, 50)), float(np.percentile(values, 95))
