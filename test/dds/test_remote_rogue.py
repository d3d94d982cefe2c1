# SPDX-License-Identifier: Apache-2.0
"""
A rogue participant on the robot's domain, plain DDS, default parameters: the robot obeys only its own servers.

The robot (RemoteInference under the control loop) and scripted servers that answer every
request with the robot's own policy's chunk (the robot's state, far below 2 rad) share one
context; the rogue is a node in a context of its own on the same domain, as another process
would be. It answers first (the robot's exact key and digest: anyone can compute them), with
far-away actions, faults and a 170,000-step chunk; it beats for a killed server; it names its
node like the server. The robot must never execute a rogue's action and never hold while a
genuine server is live. The server's side (forged copies of a request, requests under a
robot's name, memory): test_policy_server_rogue.py.
"""

from __future__ import annotations

import threading
import time

from diagnostic_msgs.msg import DiagnosticStatus
import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from ros_harness import next_domain_id
from test_remote_inference import FakeServer, HORIZON, reply, Robot, wait_served

from vla_policy_node.ros.qos import HEARTBEAT_QOS, REMOTE_FLEET_QOS
from vla_policy_node.ros.server.protocol import ANSWER_TYPE, decode_request, encode_heartbeat, REQUEST_TYPE
from vla_policy_node.server.fleet_key import request_digest
from vla_policy_node.server.pool import rendezvous

pytestmark = pytest.mark.dds

FLEET_KEY = b'0123456789abcdef0123456789abcdef'
FAR = 2.5       # where the rogue sends the arm; the robot's own policy answers its state (< 0.4)


class AnsweringServer(FakeServer):
    """A scripted server that answers every request at once, ``delay`` seconds after it came."""

    def __init__(self, context, namespace: str = '/', delay: float = 0.02, fleet_key: bytes | None = None) -> None:
        super().__init__(context, namespace, fleet_key)
        self.answering = True
        self.delay = delay

    def _on_request(self, raw: bytes) -> None:
        super()._on_request(raw)
        if self.answering:
            index = self.count() - 1
            timer = None

            def later() -> None:
                timer.cancel()
                self.answer(index)
            timer = self.node.create_timer(self.delay, later)


class Rogue:
    """Another participant on the domain: answers the requests it reads first and beats for servers."""

    def __init__(self, domain: int, servers: list[str], name: str = 'rogue', namespace: str = '/') -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain)
        self.node = rclpy.create_node(name, namespace=namespace, context=self.context)
        self.answers = {s: self.node.create_publisher(ANSWER_TYPE, f'{s}/chunks', REMOTE_FLEET_QOS) for s in servers}
        self.beats = {s: self.node.create_publisher(DiagnosticStatus, f'{s}/heartbeat', HEARTBEAT_QOS)
                      for s in servers}
        self.sent = 0
        self.beating_for: str | None = None
        self._beat = 10_000
        for server in servers:
            self.node.create_subscription(REQUEST_TYPE, f'{server}/requests',
                                          lambda raw, s=server: self._answer_first(s, raw), REMOTE_FLEET_QOS, raw=True)
        self.node.create_timer(0.05, self._beat_for)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _answer_first(self, server: str, raw: bytes) -> None:
        """Answer at once with the exact key and digest: far actions, a fault, a 170,000-step chunk."""
        request, digest = decode_request(raw), request_digest(raw)
        for chunk, fault in ((np.full((HORIZON, 3), FAR), None), (None, 'raised'),
                             (np.full((170_000, 3), FAR), None)):
            self.answers[server].publish(reply(request, digest, chunk, fault))
            self.sent += 1

    def _beat_for(self) -> None:
        """Heartbeats for a server, a new run each time (as the red team's did), while told."""
        server = self.beating_for
        if server is not None:
            self._beat += 1
            self.beats[server].publish(encode_heartbeat(server, f'rogue{self._beat}', 0.1, 0, self._beat))

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.thread.join(2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


class Fleet:
    """Robot and scripted servers in one context, spun in one thread; the rogue apart."""

    def __init__(self, namespaces: tuple[str, ...], deadline: float = 0.5, fleet_key: bytes | None = None,
                 server_key: bytes | None = None) -> None:
        self.domain = next_domain_id()
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=self.domain)
        self.servers = [AnsweringServer(self.context, ns, fleet_key=server_key) for ns in namespaces]
        self.robot = Robot(self.context, deadline, max_observation_age=0.5,
                           servers=tuple(s.name for s in self.servers), fleet_key=fleet_key)
        self.executor = SingleThreadedExecutor(context=self.context)
        for node in [s.node for s in self.servers] + [self.robot.node]:
            self.executor.add_node(node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def chosen(self) -> tuple[AnsweringServer, ...]:
        """Return the servers, the robot's first choice first."""
        first = rendezvous('/arm1/robot', [s.name for s in self.servers])
        return tuple(sorted(self.servers, key=lambda s: s.name != first))

    def close(self) -> None:
        self.robot.remote.stop(1.0)
        self.executor.shutdown(timeout_sec=1.0)
        self.thread.join(2.0)
        for node in [s.node for s in self.servers] + [self.robot.node]:
            node.destroy_node()
        rclpy.try_shutdown(context=self.context)


@pytest.fixture
def fleet(request):
    created = []

    def make(*args, **kwargs) -> Fleet:
        created.append(Fleet(*args, **kwargs))
        return created[-1]
    yield make
    for item in created:
        item.close()


@pytest.fixture
def rogues():
    created = []

    def make(*args, **kwargs) -> Rogue:
        created.append(Rogue(*args, **kwargs))
        return created[-1]
    yield make
    for item in created:
        item.close()


def executed(robot: Robot) -> np.ndarray:
    points = [p for p, times in robot.commands if times is not None]
    return np.concatenate(points) if points else np.zeros((0, 3))


def commands_for(robot: Robot, seconds: float) -> int:
    """Run the robot for ``seconds``; return the actions executed meanwhile."""
    before = robot.executed()
    robot.run_until(lambda: False, seconds)
    return robot.executed() - before


def test_a_rogue_answering_first_with_far_actions_faults_and_a_huge_chunk_is_never_obeyed(fleet, rogues):
    own = fleet(('/',))
    rogue = rogues(own.domain, ['/vla_policy_server'])
    robot = own.robot
    assert wait_served(robot, 1)
    assert robot.run_until(lambda: robot.executed() >= 3 and rogue.sent >= 9, 10.0), robot.counters()
    moved = commands_for(robot, 2.0)
    assert moved >= 0.8 * 2.0 * 20, f'held while the genuine server was live: {moved} actions in 2 s'
    assert np.all(np.abs(executed(robot)) < 1.0), 'a rogue action was executed'
    counters = robot.counters()
    assert counters['remote_foreign_messages'] >= rogue.sent - 3, (counters, rogue.sent)
    assert counters['remote_faults'] == 0 and counters['remote_timeouts'] == 0, counters
    assert robot.remote.stats['counters']['remote_foreign_publishers'] >= 1
    warnings = [line for line in robot.logged if 'dropped a chunks message' in line]
    assert 1 <= len(warnings) <= 2, f'foreign answers are logged at most every 5 s: {warnings}'


def test_a_rogue_claiming_the_servers_name_contests_it_and_the_robot_asks_the_other(fleet, rogues):
    own = fleet(('/gpu0', '/gpu1'))
    mine, other = own.chosen()
    robot = own.robot
    assert wait_served(robot, 2)
    assert robot.run_until(lambda: robot.executed() >= 3, 10.0)
    namespace = mine.name.rsplit('/', 1)[0]
    rogue = rogues(own.domain, [mine.name], name='vla_policy_server', namespace=namespace)
    rogue.beating_for = mine.name
    assert robot.run_until(lambda: robot.remote.stats['server'] == other.name, 5.0), robot.logged
    moved = commands_for(robot, 2.0)
    assert moved >= 0.8 * 2.0 * 20, f'held while a genuine server was live: {moved} actions in 2 s'
    assert np.all(np.abs(executed(robot)) < 1.0), 'a rogue action was executed'
    assert robot.counters()['remote_contested'] == 1
    assert any('contested' in line for line in robot.logged), robot.logged
    rogue.close()                       # gone from the graph: the robot's own server is uncontested again
    assert robot.run_until(lambda: robot.remote.stats['server'] == mine.name, 10.0), robot.logged


def test_heartbeats_for_a_killed_server_do_not_keep_it_live(fleet, rogues):
    own = fleet(('/gpu0', '/gpu1'), deadline=2.0)
    mine, other = own.chosen()
    robot = own.robot
    assert wait_served(robot, 2)
    assert robot.run_until(lambda: robot.executed() >= 3, 10.0)
    rogue = rogues(own.domain, [mine.name])
    rogue.beating_for = mine.name
    mine.beating = mine.answering = False           # killed: silent from now on
    killed = time.monotonic()
    assert robot.run_until(lambda: other.count() >= 1, 3.0), robot.logged
    assert time.monotonic() - killed < 1.0, 'the move took longer than the heartbeat timeout and a request'
    moved = commands_for(robot, 2.0)
    assert moved >= 0.8 * 2.0 * 20, f'held while a genuine server was live: {moved} actions in 2 s'
    live = [line for line in robot.logged if 'is live' in line]
    assert len(live) <= 3, f'a new rogue run each beat must not be logged each time: {live}'
    assert robot.counters()['remote_foreign_messages'] > 10


def test_with_a_fleet_key_everything_unsigned_is_refused(fleet):
    own = fleet(('/',), fleet_key=FLEET_KEY)        # the server signs nothing (no key)
    server, robot = own.servers[0], own.robot
    assert robot.run_until(lambda: server.count() >= 2, 5.0), 'a server never heard from (unsigned beats) is asked'
    assert decode_request(server.raws[-1], FLEET_KEY).reply_to.key.robot == '/arm1/robot', 'requests are signed'
    assert robot.remote.stats['counters']['remote_servers_live'] == 0, 'an unsigned heartbeat made the server live'
    assert robot.run_until(lambda: 'no answer from the policy server' in (robot.loop.hold_reason or ''), 2.0)
    counters = robot.counters()
    assert robot.executed() == 0 and counters['remote_bad_answers'] >= 2 and counters['remote_answers'] == 0
    assert any('not signed with the fleet key' in line for line in robot.logged), robot.logged
    server.fleet_key = FLEET_KEY                    # now it signs its heartbeats and answers: obeyed
    assert wait_served(robot, 1)
    assert robot.run_until(lambda: robot.executed() >= 20, 10.0), robot.counters()
    assert np.all(np.abs(executed(robot)) < 1.0)
