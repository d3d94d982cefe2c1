# SPDX-License-Identifier: Apache-2.0
"""
RemoteInference under the ROS-free control loop, against a scripted server over real DDS.

The robot's loop and a fake ``vla_policy_server`` (it records requests and answers when the
test says) share one process and one private domain: the wire format, the deadline, episode
and staleness rules are exercised without starting processes (the wire format's checks of
hostile messages: test/ros/test_server_protocol.py).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from ros_harness import next_domain_id
from diagnostic_msgs.msg import DiagnosticStatus

from vla_policy_node.control.chunking import SchedulerConfig
from vla_policy_node.control.loop import ControlLoop, LoopSettings
from vla_policy_node.control.safety import MotionLimits
from vla_policy_node.ros.qos import HEARTBEAT_QOS, REMOTE_FLEET_QOS
from vla_policy_node.ros.server.client import RemoteInference
from vla_policy_node.ros.server.protocol import (ANSWER_TYPE, decode_request, encode_chunk, encode_heartbeat,
                                                 REQUEST_TYPE, RequestKey, seal)
from vla_policy_node.server.fleet_key import request_digest
from vla_policy_node.server.pool import rendezvous

pytestmark = pytest.mark.dds

JOINTS = ('a', 'b', 'c')
RATE = 20.0
HORIZON = 8
TASK = 'stack the blocks'
RGB = np.arange(48 * 64 * 3, dtype=np.uint8).reshape(48, 64, 3)
STATE = np.array([0.1, -0.2, 0.3])


class FakeServer:
    """Records decoded requests (and their digests); answers only when told; beats every 0.1 s while ``beating``."""

    def __init__(self, context, namespace: str = '/', fleet_key: bytes | None = None) -> None:
        self.node = rclpy.create_node('vla_policy_server', namespace=namespace, context=context)
        self.name = self.node.get_fully_qualified_name()
        self.requests: list = []
        self.digests: list[bytes] = []
        self.raws: list[bytes] = []
        self.beating = True
        self.fleet_key = fleet_key
        self._beat = 0
        self._lock = threading.Lock()
        self.publisher = self.node.create_publisher(ANSWER_TYPE, '~/chunks', REMOTE_FLEET_QOS)
        self.node.create_subscription(REQUEST_TYPE, '~/requests', self._on_request, REMOTE_FLEET_QOS, raw=True)
        self.heartbeats = self.node.create_publisher(DiagnosticStatus, '~/heartbeat', HEARTBEAT_QOS)
        self.node.create_timer(0.1, self._heartbeat)

    def _heartbeat(self) -> None:
        if self.beating:
            self._beat += 1
            self.heartbeats.publish(encode_heartbeat(self.name, 'run1', 0.1, 0, self._beat, self.fleet_key))

    def _on_request(self, raw: bytes) -> None:
        with self._lock:
            self.requests.append(decode_request(raw))
            self.digests.append(request_digest(raw))
            self.raws.append(raw)

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def answer(self, index: int, chunk: np.ndarray | None = None, fault: str | None = None,
               key: RequestKey | None = None) -> None:
        self.publisher.publish(reply(self.requests[index], self.digests[index], chunk, fault, key, self.fleet_key))


def reply(request, digest: bytes, chunk: np.ndarray | None = None, fault: str | None = None,
          key: RequestKey | None = None, fleet_key: bytes | None = None) -> bytes:
    """Return the answer to a request (the policy's: the robot's state, HORIZON times) as it goes on the wire."""
    chunk = np.zeros((HORIZON, len(JOINTS))) + STATE if chunk is None and fault is None else chunk
    key = key or request.reply_to.key
    return seal(encode_chunk(key, digest, chunk, fault, 'scripted' if fault else '', 0.001, 0.01, 1),
                fleet_key)


class Robot:
    """The control loop with remote inference, fed fresh inputs and ticked by the test."""

    def __init__(self, context, deadline: float, max_observation_age: float = 0.5,
                 servers: tuple[str, ...] = ('/vla_policy_server',), fleet_key: bytes | None = None) -> None:
        self.node = rclpy.create_node('robot', namespace='/arm1', context=context)
        self.commands: list[tuple[np.ndarray, np.ndarray | None]] = []
        self.logged: list[str] = []
        self.remote = RemoteInference(self.node, servers, JOINTS, time.monotonic, deadline,
                                      self.logged.append, server_timeout=0.5, inform=self.logged.append,
                                      horizon=HORIZON, fleet_key=fleet_key)
        limits = MotionLimits(np.full(3, -3.0), np.full(3, 3.0), np.full(3, 2.0), 0.1)
        self.loop = ControlLoop(
            LoopSettings(JOINTS, ('front',), RATE, limits, max_observation_age=max_observation_age),
            SchedulerConfig(RATE, HORIZON), self.remote,
            lambda points, obs_times, joints: self.commands.append((points, obs_times)))
        self.loop.on_instruction(TASK)
        self.remote.start()

    def tick(self) -> None:
        now = time.monotonic()
        self.loop.on_joint_state(JOINTS, STATE, now, None)
        self.loop.on_image('front', RGB, now, None)
        self.loop.tick(now)

    def run_until(self, predicate, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.tick()
            if predicate():
                return True
            time.sleep(1.0 / RATE)
        return False

    def counters(self) -> dict[str, int]:
        return {**self.remote.stats['counters'], **self.loop.status(time.monotonic(), 1.0).counters}

    def executed(self) -> int:
        return sum(1 for _, obs_times in self.commands if obs_times is not None)


@pytest.fixture
def link(request):
    deadline, age = getattr(request, 'param', (2.0, 0.5))
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    server, robot = FakeServer(context), Robot(context, deadline, age)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(server.node)
    executor.add_node(robot.node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    assert wait_served(robot, 1)
    yield server, robot
    robot.remote.stop(1.0)
    executor.shutdown(timeout_sec=1.0)
    spinner.join(2.0)
    robot.node.destroy_node()
    server.node.destroy_node()
    rclpy.try_shutdown(context=context)


def wait_served(robot: Robot, servers: int, timeout: float = 10.0, live: int | None = None) -> bool:
    """Wait until ``servers`` servers take the robot's requests and ``live`` of them (default: all) beat."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        counters = robot.remote.stats['counters']
        want = (servers, servers if live is None else live)
        if (counters['remote_servers_matched'], counters['remote_servers_live']) == want:
            return True
        time.sleep(0.05)
    return False


def test_request_carries_the_observation_and_the_answer_is_executed(link):
    server, robot = link
    assert robot.run_until(lambda: server.count() == 1, 5.0)
    request = server.requests[0]
    key, observation, obs_time = request.reply_to.key, request.observation, request.reply_to.key.obs_time
    joints = request.reply_to.joints
    assert (key.robot, key.request_id, key.episode, request.rtc, joints) == ('/arm1/robot', 0, 0, None, JOINTS)
    assert request.reply_to.horizon == HORIZON, 'the robot asks for the steps it executes'
    assert request.deadline == 2.0, 'the deadline travels with the request'
    assert len(key.session) == 16
    np.testing.assert_array_equal(observation['images']['front'], RGB)
    np.testing.assert_allclose(observation['state'], STATE.astype(np.float32))
    assert observation['task'] == TASK and isinstance(obs_time, float)
    server.answer(0)
    assert robot.run_until(lambda: robot.executed() >= 3, 5.0)
    counters = robot.counters()
    assert counters['chunks_received'] == 1 and counters['remote_answers'] == 1
    assert all(np.all(obs_times == obs_time) for _, obs_times in robot.commands if obs_times is not None)
    assert robot.remote.stats['latencies']['total'][0] > 0


def test_an_answer_for_an_old_episode_is_never_executed(link):
    server, robot = link
    assert robot.run_until(lambda: server.count() == 1, 5.0)
    robot.loop.reset_episode('test')
    assert robot.run_until(lambda: server.count() == 2, 5.0), 'the new episode asks at once'
    assert server.requests[1].reply_to.key.episode == 1
    server.answer(0, chunk=np.full((HORIZON, 3), 2.5))      # the old episode's answer, late
    assert robot.run_until(lambda: robot.counters()['remote_late_answers'] == 1, 5.0)
    server.answer(1)
    assert robot.run_until(lambda: robot.executed() >= 3, 5.0)
    executed = np.concatenate([points for points, times in robot.commands if times is not None])
    assert np.all(executed < 2.0), 'an action of the old episode was executed'
    assert robot.counters()['chunks_received'] == 1


@pytest.mark.parametrize('link', [(2.0, 0.3)], indirect=True)
def test_an_answer_for_an_old_observation_is_never_executed(link):
    server, robot = link
    assert robot.run_until(lambda: server.count() == 1, 5.0)
    obs_time = server.requests[0].reply_to.key.obs_time
    robot.run_until(lambda: time.monotonic() - obs_time > 0.45, 2.0)
    server.answer(0, chunk=np.full((HORIZON, 3), 2.5))      # 0.45 s old: max_observation_age 0.3
    assert robot.run_until(lambda: robot.counters()['policy_stale'] == 1, 5.0)
    assert robot.executed() == 0 and robot.counters()['chunks_received'] == 0
    assert robot.run_until(lambda: server.count() == 2, 5.0), 'the robot asks again'
    server.answer(1)
    assert robot.run_until(lambda: robot.executed() >= 3, 5.0)


@pytest.mark.parametrize('link', [(0.3, 0.5)], indirect=True)
def test_a_silent_server_makes_the_robot_hold_within_the_deadline_and_it_resumes(link):
    server, robot = link
    assert robot.run_until(lambda: server.count() == 1, 5.0)
    server.answer(0)
    assert robot.run_until(lambda: robot.executed() >= 1, 5.0)
    # The server goes silent: the plan runs out, then one deadline later the loop holds.
    assert robot.run_until(lambda: robot.counters()['remote_timeouts'] >= 1, 3.0)
    sent = server.count()
    assert robot.run_until(lambda: 'no answer from the policy server' in (robot.loop.hold_reason or ''), 1.0)
    assert robot.run_until(lambda: server.count() > sent, 2.0), 'the robot keeps asking'
    executed = robot.executed()
    server.answer(server.count() - 1)
    assert robot.run_until(lambda: robot.executed() > executed, 3.0)
    assert robot.loop.hold_reason is None


def test_an_answer_to_an_earlier_run_of_the_robot_is_never_executed(link):
    """Ids restart at 0 with every run: only the session (and the observation time) tell runs apart."""
    server, robot = link
    assert robot.run_until(lambda: server.count() == 1, 5.0)
    key = server.requests[0].reply_to.key
    earlier_run = RequestKey(key.robot, 'f' * 16, key.request_id, key.episode, key.obs_time)
    server.answer(0, chunk=np.full((HORIZON, 3), 2.5), key=earlier_run)
    older_observation = RequestKey(key.robot, key.session, key.request_id, key.episode, key.obs_time - 1.0)
    server.answer(0, chunk=np.full((HORIZON, 3), 2.5), key=older_observation)
    assert robot.run_until(lambda: robot.counters()['remote_late_answers'] == 2, 5.0)
    server.answer(0)
    assert robot.run_until(lambda: robot.executed() >= 3, 5.0)
    executed = np.concatenate([points for points, times in robot.commands if times is not None])
    assert np.all(executed < 2.0), 'an answer of another run or observation was executed'


def test_a_whole_batch_of_answers_reaches_the_robot(link):
    """Every robot reads every answer of a batch: a large batch must not overwrite its own answer."""
    server, robot = link
    assert robot.run_until(lambda: server.count() == 1, 5.0)
    others = [RequestKey(f'/robot{i}', 'other', 0, 0, 1.0) for i in range(100)]

    def burst() -> None:            # in one executor callback: the robot takes nothing meanwhile
        timer.cancel()
        server.answer(0)
        for other in others:
            server.answer(0, key=other)
    timer = server.node.create_timer(0.01, burst)
    assert robot.run_until(lambda: robot.executed() >= 3, 5.0), robot.counters()
    assert robot.counters()['remote_answers'] == 1


def test_without_a_server_a_request_fails_at_once_with_the_reason():
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    try:
        robot = Robot(context, deadline=5.0)
        assert robot.run_until(lambda: robot.counters()['remote_timeouts'] >= 1, 1.0), \
            'the request waited for its deadline with nobody to answer it'
        assert robot.run_until(
            lambda: 'no live policy server (/vla_policy_server: no heartbeat yet)' in (robot.loop.hold_reason or ''),
            1.0), robot.loop.hold_reason
        assert robot.executed() == 0
        robot.remote.stop(1.0)
        robot.node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)


def test_a_malformed_answer_is_counted_and_never_executed(link):
    """A chunk with a NaN action, or bytes that are not an ActionChunk: refused by decode_chunk, never executed."""
    server, robot = link
    assert robot.run_until(lambda: server.count() == 1, 5.0)
    key = server.requests[0].reply_to.key
    poisoned = encode_chunk(key, server.digests[0], np.full((HORIZON, 3), 2.5), None, '', 0.001, 0.01, 1)
    poisoned.actions[5] = float('nan')
    server.publisher.publish(poisoned)
    server.publisher.publish(b'\x00\x01\x00\x00 not an ActionChunk')
    assert robot.run_until(lambda: robot.counters()['remote_bad_answers'] == 2, 5.0), robot.counters()
    assert robot.executed() == 0 and robot.counters()['remote_answers'] == 0
    server.answer(0)
    assert robot.run_until(lambda: robot.executed() >= 3, 5.0)
    executed = np.concatenate([points for points, times in robot.commands if times is not None])
    assert np.all(executed < 2.0), 'an action of the malformed answer was executed'


@pytest.fixture
def two_servers():
    """Give a robot a pool of two scripted servers; yield (the robot's server, the other, the robot)."""
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    servers = [FakeServer(context, '/gpu0'), FakeServer(context, '/gpu1')]
    robot = Robot(context, deadline=5.0, max_observation_age=10.0, servers=tuple(s.name for s in servers))
    executor = SingleThreadedExecutor(context=context)
    for node in [s.node for s in servers] + [robot.node]:
        executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    assert wait_served(robot, 2)
    chosen = rendezvous('/arm1/robot', [s.name for s in servers])
    mine, other = sorted(servers, key=lambda s: s.name != chosen)
    yield mine, other, robot
    robot.remote.stop(1.0)
    executor.shutdown(timeout_sec=1.0)
    spinner.join(2.0)
    for node in [s.node for s in servers] + [robot.node]:
        node.destroy_node()
    rclpy.try_shutdown(context=context)


def test_a_server_whose_heartbeats_stop_is_lost_at_once_not_after_the_deadline(two_servers):
    mine, other, robot = two_servers
    other.beating = False
    assert robot.run_until(lambda: mine.count() == 1, 5.0)
    mine.beating = False                                   # killed: no more heartbeats, no answer
    stopped = time.monotonic()
    assert robot.run_until(lambda: 'lost: no heartbeat' in (robot.loop.hold_reason or ''), 3.0), \
        robot.loop.hold_reason
    assert time.monotonic() - stopped < 2.0, 'the loss took the deadline (5 s), not the 0.5 s timeout'
    assert robot.counters()['remote_server_losses'] == 2, 'both servers went silent'
    assert robot.run_until(lambda: 'no live policy server' in (robot.loop.hold_reason or ''), 2.0), \
        'with no live server, requests fail at once'
    mine.beating = True                                    # back: picked up again
    assert robot.run_until(lambda: mine.count() >= 2, 5.0)
    mine.answer(mine.count() - 1)
    assert robot.run_until(lambda: robot.executed() >= 3, 5.0)
    assert robot.loop.hold_reason is None


def test_a_robot_moves_to_the_second_server_and_never_executes_the_first_ones_late_or_foreign_answers(two_servers):
    mine, other, robot = two_servers
    assert robot.run_until(lambda: mine.count() == 1, 5.0)
    assert other.count() == 0, 'one request, one server'
    mine.beating = False
    assert robot.run_until(lambda: other.count() == 1, 5.0), 'the robot asks the live server'
    assert robot.counters()['remote_server_switches'] == 1 and robot.remote.stats['server'] == other.name
    mine.answer(0, chunk=np.full((HORIZON, 3), 2.5))                           # late: its request failed
    mine.answer(0, chunk=np.full((HORIZON, 3), 2.5), key=other.requests[0].reply_to.key)  # foreign: sent to the other
    assert robot.run_until(lambda: robot.counters()['remote_late_answers'] == 2, 5.0)
    assert robot.executed() == 0
    other.answer(0)
    assert robot.run_until(lambda: robot.executed() >= 3, 5.0)
    executed = np.concatenate([points for points, times in robot.commands if times is not None])
    assert np.all(executed < 2.0), 'an answer of the lost server was executed'
    mine.beating = True                                    # back: the robot returns to its own server
    assert robot.run_until(lambda: mine.count() >= 2, 10.0)
    assert robot.remote.stats['server'] == mine.name


def test_a_server_that_never_sends_heartbeats_is_still_asked_while_it_subscribes():
    """A server of a version without heartbeats (a rolling upgrade): its loss is then seen at the deadline."""
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=next_domain_id())
    server = FakeServer(context)
    server.beating = False
    robot = Robot(context, deadline=0.5)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(server.node)
    executor.add_node(robot.node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        assert wait_served(robot, 1, live=0)
        assert robot.run_until(lambda: server.count() == 1, 5.0)
        server.answer(0)
        assert robot.run_until(lambda: robot.executed() >= 3, 5.0)
        assert robot.run_until(lambda: 'no answer from the policy server' in (robot.loop.hold_reason or ''), 5.0)
    finally:
        robot.remote.stop(1.0)
        executor.shutdown(timeout_sec=1.0)
        spinner.join(2.0)
        robot.node.destroy_node()
        server.node.destroy_node()
        rclpy.try_shutdown(context=context)
