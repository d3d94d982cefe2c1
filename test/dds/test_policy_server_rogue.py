# SPDX-License-Identifier: Apache-2.0
"""
The real vla_policy_server (a process, the tiny model) against a rogue participant on the robot's domain.

A robot (RemoteInference under the control loop, in this process) is served by the server
while the rogue, in a context of its own, re-publishes each of the robot's requests with
another state under the robot's exact key (a forged observation), and floods requests under the
robot's name from a session of its own. The server serves neither forgery for the robot: the
copies are dropped unanswered (``foreign_requests``), the flood never replaces the robot's own
request, and the robot keeps commanding its own policy's actions. Then 16 requests of 4096 x
4096 frames (16 publishers) reach the server at once, twice: its resident memory returns within
10% of its pre-burst value once they are answered (the server's Fast DDS readers free what they
took: ``release_reader_memory``). With a fleet key, the server answers nothing
unsigned.
"""

from __future__ import annotations

import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.serialization import deserialize_message, serialize_message
from ros_harness import DEFAULT_CONFIG, next_domain_id, NodeProcess, SERVER_COMMAND, wait_until
from test_remote_inference import JOINTS, Robot, wait_served

from vla_policy_node.ros.diagnostics import diagnostics_to_dict
from vla_policy_node.ros.qos import DIAGNOSTICS_QOS, REMOTE_FLEET_QOS, REMOTE_REQUEST_QOS
from vla_policy_node.ros.server.protocol import (ANSWER_TYPE, decode_chunk, encode_request, REQUEST_TYPE,
                                                 RequestKey)

pytestmark = pytest.mark.dds

SERVER_ARGS = ('-p', 'tiny_model.chunk_size:=16', '-p', 'tiny_model.num_steps:=2', '-p', 'num_threads:=1',
               '-p', 'joint_names:=[a,b,c]',
               '-p', 'camera_names:=[front]')
SERVER = '/vla_policy_server'
MIB = 1 << 20


class Rogue:
    """Forges copies of the robot's requests, floods under its name, and sends huge requests; reads answers."""

    def __init__(self, domain: int) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain)
        self.node = rclpy.create_node('rogue', context=self.context)
        self.requests = self.node.create_publisher(REQUEST_TYPE, f'{SERVER}/requests', REMOTE_REQUEST_QOS)
        self.forging = self.flooding = False
        self.forged = self.flooded = 0
        self._copied: set = set()
        self.server: dict[str, str] = {}
        self.server_pid = 0
        self.max_queued_mib = 0.0
        self.answers: list = []
        self._lock = threading.Lock()
        self.node.create_subscription(REQUEST_TYPE, f'{SERVER}/requests', self._forge, REMOTE_FLEET_QOS, raw=True)
        self.node.create_subscription(ANSWER_TYPE, f'{SERVER}/chunks', self._on_answer, REMOTE_FLEET_QOS, raw=True)
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics, DIAGNOSTICS_QOS)
        self.node.create_timer(0.1, self._flood)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _forge(self, raw: bytes) -> None:
        """Re-publish the robot's request, same key, another state."""
        msg = deserialize_message(raw, REQUEST_TYPE)
        original = (msg.key.session, msg.key.request_id)
        if (self.forging and msg.key.robot == '/arm1/robot' and msg.key.session != 'rogue-session'
                and original not in self._copied):        # the rogue reads its own copies too
            self._copied.add(original)
            msg.state = [value + 1.5 for value in msg.state]
            self.requests.publish(serialize_message(msg))
            self.forged += 1

    def _flood(self) -> None:
        """Send a request under the robot's name from a session of the rogue's own."""
        if self.flooding:
            observation = {'images': {'front': np.zeros((48, 64, 3), np.uint8)}, 'state': np.zeros(3),
                           'task': 'wave'}
            key = RequestKey('/arm1/robot', 'rogue-session', self.flooded, 0, time.monotonic())
            self.requests.publish(encode_request(key, JOINTS, observation, None, 1.0, 8))
            self.flooded += 1

    def _on_answer(self, raw: bytes) -> None:
        answer = decode_chunk(raw)
        with self._lock:
            key = answer.request.reply_to.key
            self.answers.append((key.robot, key.session, answer.fault, answer.error))

    def _on_diagnostics(self, msg) -> None:
        for name, values in diagnostics_to_dict(msg).items():
            if name.endswith(': server'):
                with self._lock:
                    self.server = values
                    self.max_queued_mib = max(self.max_queued_mib, float(values.get('queued_mib', 0)))

    def counter(self, name: str) -> int:
        return int(self.value(name))

    def value(self, name: str) -> float:
        with self._lock:
            return float(self.server.get(name, 0))

    def answered(self, robot_prefix: str) -> list:
        with self._lock:
            return [a for a in self.answers if a[0].startswith(robot_prefix)]

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.thread.join(2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def resident_mib(pid: int) -> float:
    with open(f'/proc/{pid}/status') as status:
        line = next(line for line in status if line.startswith('VmRSS:'))
    return int(line.split()[1]) / 1024


def publishers(rogue: Rogue, count: int) -> list:
    """``count`` request publishers: one request waits per publisher, so a burst needs as many."""
    made = [rogue.node.create_publisher(REQUEST_TYPE, f'{SERVER}/requests', REMOTE_REQUEST_QOS) for _ in range(count)]
    assert wait_until(lambda: all(p.get_subscription_count() for p in made), 10.0)
    return made


def burst(rogue: Rogue, senders: list, side: int, run: int) -> tuple[float, list]:
    """Send one request of a side x side frame from each sender; return the server's peak RSS and the answers."""
    frame = np.full((side, side, 3), 7, np.uint8)
    for i, publisher in enumerate(senders):
        key = RequestKey(f'/big{run}-{i}', f'big{run}-{i}', 0, 0, 1.0)
        publisher.publish(encode_request(key, JOINTS, {'images': {'front': frame}, 'state': np.zeros(3),
                                                       'task': 'wave'}, None, 0.0, 8))
    del frame
    peak, end = 0.0, time.monotonic() + 120.0
    while len(rogue.answered(f'/big{run}-')) < len(senders) and time.monotonic() < end:
        peak = max(peak, resident_mib(rogue.server_pid))
        time.sleep(0.05)
    return peak, rogue.answered(f'/big{run}-')


@pytest.fixture
def served():
    domain = next_domain_id()
    server = NodeProcess([DEFAULT_CONFIG], domain, SERVER_ARGS, command=SERVER_COMMAND)
    context = rogue = robot = None
    try:
        assert server.wait_for_output('ready:', 90.0), server.output
        context = rclpy.Context()
        rclpy.init(context=context, domain_id=domain)
        robot = Robot(context, deadline=1.0, max_observation_age=1.0)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(robot.node)
        threading.Thread(target=executor.spin, daemon=True).start()
        rogue = Rogue(domain)
        assert wait_served(robot, 1, timeout=20.0), server.output
        yield server, robot, rogue
    finally:
        if robot is not None:
            robot.remote.stop(1.0)
            executor.shutdown(timeout_sec=1.0)
            robot.node.destroy_node()
            rclpy.try_shutdown(context=context)
        if rogue is not None:
            rogue.close()
        server.kill()


def test_forged_copies_and_requests_under_the_robots_name_never_serve_the_robot(served):
    server, robot, rogue = served
    assert robot.run_until(lambda: robot.executed() >= 10, 30.0), (robot.counters(), server.output)
    rogue.forging = rogue.flooding = True
    before = robot.executed()
    robot.run_until(lambda: False, 4.0)
    moved = robot.executed() - before
    rogue.forging = rogue.flooding = False
    assert moved >= 0.6 * 4.0 * 20, f'the robot was held: {moved} actions in 4 s ({robot.counters()})'
    assert rogue.forged >= 5 and rogue.flooded >= 20, (rogue.forged, rogue.flooded)
    assert wait_until(lambda: rogue.counter('foreign_requests') >= rogue.forged, 5.0), rogue.server
    robot_answers = [a for a in rogue.answered('/arm1/robot') if a[1] != 'rogue-session']
    counters = robot.counters()
    assert len(robot_answers) <= counters['remote_requests'], 'a forged copy was answered'
    assert counters['remote_faults'] == 0 and counters['remote_bad_answers'] == 0, counters
    assert 'from a publisher other than the one that session started with' in server.output


def test_a_burst_of_sixteen_4096_requests_is_served_within_the_budget_and_its_memory_returns(served):
    """16 requests of 4096 x 4096 frames at once, twice: all served, the queue within budget, RSS back within 10%."""
    server, robot, rogue = served
    rogue.server_pid = server.process.pid
    senders = publishers(rogue, 16)
    time.sleep(1.0)
    before = resident_mib(rogue.server_pid)
    results = []
    for run in range(2):
        peak, answers = burst(rogue, senders, 4096, run)
        assert len(answers) == 16 and all(a[2] is None for a in answers), (answers, server.output[-2000:])
        assert wait_until(lambda: rogue.value('queued_mib') == 0.0, 5.0), rogue.server
        time.sleep(1.0)
        results.append((peak, resident_mib(rogue.server_pid)))
    print(f'server RSS before {before:.0f} MiB; burst 1: peak {results[0][0]:.0f}, after {results[0][1]:.0f} MiB; '
          f'burst 2: peak {results[1][0]:.0f}, after {results[1][1]:.0f} MiB')
    assert max(peak for peak, _ in results) - before > 16 * 48 * 0.5, 'the burst never reached the server'
    assert all(after <= 1.1 * before for _, after in results), (before, results)
    assert 0 < rogue.max_queued_mib <= 1024, 'the queue passed its budget'


def test_with_a_fleet_key_the_server_answers_nothing_unsigned(tmp_path):
    key_file = tmp_path / 'fleet.key'
    key_file.write_text('k' * 64)
    key_file.chmod(0o600)
    domain = next_domain_id()
    server = NodeProcess([DEFAULT_CONFIG], domain, SERVER_ARGS + ('-p', f'fleet_key_file:={key_file}'),
                         command=SERVER_COMMAND)
    rogue = None
    try:
        assert server.wait_for_output('ready:', 90.0), server.output
        rogue = Rogue(domain)
        assert wait_until(lambda: rogue.requests.get_subscription_count() == 1, 10.0)
        rogue.flooding = True
        assert wait_until(lambda: rogue.counter('bad_requests') >= 10, 10.0), rogue.server
        rogue.flooding = False
        assert rogue.answered('/arm1') == [], 'an unsigned request was answered'
        assert 'request refused: not signed with the fleet key' in server.output
    finally:
        if rogue is not None:
            rogue.close()
        server.kill()
    key_file.chmod(0o644)
    refused = NodeProcess([DEFAULT_CONFIG], domain, SERVER_ARGS + ('-p', f'fleet_key_file:={key_file}'),
                          command=SERVER_COMMAND)
    assert refused.wait(60.0) == 1
    assert 'readable or writable by every user' in refused.output, refused.output
