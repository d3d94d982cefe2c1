# SPDX-License-Identifier: Apache-2.0
"""
The installed node over DDS against what a hostile integrator did to it (issue 10).

One node process (default.yaml, tiny random model) and a probe robot per module; the tests
run in file order. Every command the probe records is also checked against the limits and the
step limit (``assert_safe``), across resets and faults.
"""

from __future__ import annotations

import threading
import time

from builtin_interfaces.msg import Time
import numpy as np
import pytest
from rcl_interfaces.srv import SetParameters
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from ros_harness import DEFAULT_CONFIG, next_domain_id, node_with_probe, NodeProcess
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger
from test_node_integration import CONFIG, JOINTS, RobotProbe, wait_until
from trajectory_msgs.msg import JointTrajectory
import yaml

from vla_policy_node.ros.qos import COMMAND_QOS

pytestmark = pytest.mark.dds

MAX_STEP = CONFIG['limits']['max_step']
LOWER, UPPER = np.array(CONFIG['limits']['lower']), np.array(CONFIG['limits']['upper'])


class SafetyProbe(RobotProbe):
    """The probe robot with joint-state faults: offsets, stamps, velocity-only messages."""

    offset = np.zeros(len(JOINTS))
    stamp = 'zero'          # zero | now | future | old | epoch
    velocity_only = False
    wheels = False          # another device's malformed message after each of ours

    def __init__(self, *args, **kwargs) -> None:
        self.measured_then: list[np.ndarray] = []      # the joint positions when each command arrived
        super().__init__(*args, **kwargs)

    def measured(self) -> np.ndarray:
        return np.array([0.1 * i for i in range(len(JOINTS))]) + self.offset

    def _on_command(self, msg) -> None:
        with self._lock:
            self.commands.append(msg)
            self.measured_then.append(self.measured())

    def _publish_joints(self) -> None:
        positions = self.measured()
        msg = JointState(name=JOINTS, position=positions.tolist())
        now = self.node.get_clock().now().nanoseconds * 1e-9
        seconds = {'zero': None, 'now': now, 'future': now + 10.0, 'old': now - 2.0,
                   'epoch': 1.0}[self.stamp]
        if seconds is not None:
            msg.header.stamp = Time(sec=int(seconds), nanosec=int(seconds % 1 * 1e9))
        self._joints.publish(msg)
        if self.velocity_only:
            self._joints.publish(JointState(name=JOINTS, velocity=[0.0] * len(JOINTS)))
        if self.wheels:
            self._joints.publish(JointState(name=['wheel_left', 'wheel_right'], position=[0.0]))

    def positions(self) -> np.ndarray:
        with self._lock:
            return np.array([list(c.points[0].positions) for c in self.commands])


def assert_safe(probe: SafetyProbe, start: int = 0) -> None:
    """
    Check every command from ``start`` on: inside the limits, and no jump.

    A message's first point is within max_step of the way the message before runs (the
    controllers interpolate through a message, so after a pause it steps from a later point), or,
    when it resumes after a hold from where the robot is (this probe's robot does not follow
    its commands), within max_step and a step of the measured state. Points of one message
    are within max_step of each other.
    """
    with probe._lock:
        messages = [np.array([list(point.positions) for point in c.points]) for c in probe.commands[start:]]
        measured = probe.measured_then[start:]
    for points in messages:
        assert np.all(points >= LOWER - 1e-9) and np.all(points <= UPPER + 1e-9)
        assert np.all(np.abs(np.diff(points, axis=0)) <= MAX_STEP + 1e-9)
    for before, points, robot in zip(messages, messages[1:], measured[1:]):
        way = np.vstack([before[:1], before])             # each segment of the way, a lone point too
        low, high = np.minimum(way[:-1], way[1:]), np.maximum(way[:-1], way[1:])
        from_before = np.maximum(np.maximum(low - points[0], points[0] - high), 0.0).max(axis=1).min()
        from_robot = np.abs(robot - points[0]).max()
        assert from_before <= MAX_STEP + 1e-9 or from_robot <= 2 * MAX_STEP + 1e-9, \
            f'a jump: {from_before:.3f} from the message before, {from_robot:.3f} from the robot'


@pytest.fixture(scope='module')
def system():
    with node_with_probe([DEFAULT_CONFIG], next_domain_id(), SafetyProbe) as pair:
        yield pair


def test_a_glitch_at_reset_never_becomes_a_jump(system):
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 30.0), node.output
    assert probe.reset_client.wait_for_service(timeout_sec=10.0)
    for _ in range(3):
        probe.offset = np.full(len(JOINTS), 1.5)         # the measured state glitches
        future = probe.reset_client.call_async(Trigger.Request())
        assert wait_until(future.done, 5.0)
        time.sleep(0.3)
        probe.offset = np.zeros(len(JOINTS))
        time.sleep(0.5)
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    assert_safe(probe)


def test_a_burst_of_reset_calls_is_answered_call_for_call(system):
    node, probe = system
    qos = QoSProfile(history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE)
    client = probe.node.create_client(Trigger, '/vla_policy_node/reset_episode', qos_profile=qos)
    try:
        assert client.wait_for_service(timeout_sec=10.0)
        before = probe.counter('episode_resets')
        futures = [client.call_async(Trigger.Request()) for _ in range(100)]
        assert wait_until(lambda: all(f.done() for f in futures), 20.0), \
            f'{sum(f.done() for f in futures)} of 100 answered'
        assert all(f.result().success for f in futures)
        assert wait_until(lambda: probe.counter('episode_resets') == before + 100, 5.0)
    finally:
        probe.node.destroy_client(client)
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    assert_safe(probe)


@pytest.mark.parametrize('stamp, message', [
    ('future', 'ahead of the node clock'), ('old', 'old, more than max_observation_age'),
    ('epoch', 'old, more than max_observation_age')])
def test_joint_state_stamps_are_checked(system, stamp, message):
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    probe.stamp = stamp
    try:
        assert wait_until(lambda: probe.state().startswith('holding: joint_states'), 5.0), probe.state()
        assert message in probe.state()
        assert wait_until(lambda: probe.inputs_status.get(
            'vla_policy_node: input joint_states', {}).get('level') == '2', 3.0)
        count = probe.command_count()
        time.sleep(0.5)
        assert probe.command_count() == count
    finally:
        probe.stamp = 'now'
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    assert_safe(probe)


def test_velocity_only_joint_states_are_ignored_and_counted(system):
    node, probe = system
    probe.velocity_only = True
    try:
        assert wait_until(lambda: probe.counter('joint_states_without_positions') > 10, 5.0)
        count = probe.command_count()
        assert wait_until(lambda: probe.command_count() > count + 10, 5.0)
        assert probe.state() == 'commanding'
    finally:
        probe.velocity_only = False


def test_another_devices_malformed_joint_states_are_ignored(system):
    """Two names, one position, naming none of our joints: not a fault of our joint states."""
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    rejected = probe.counter('rejected_inputs')
    probe.wheels = True
    try:
        count = probe.command_count()
        assert wait_until(lambda: probe.command_count() > count + 40, 5.0), probe.state()
        assert probe.state() == 'commanding'
        assert probe.counter('rejected_inputs') == rejected
    finally:
        probe.wheels = False
    assert_safe(probe)


def test_another_publisher_on_the_command_topic_stops_commands(system):
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    intruder = probe.node.create_publisher(JointTrajectory, CONFIG['command_topic'], COMMAND_QOS)
    try:
        assert wait_until(lambda: 'other publisher' in probe.state(), 5.0), probe.state()
        count = probe.command_count()
        time.sleep(0.5)
        assert probe.command_count() == count, 'commanded while another node does'
        assert probe.policy_status.get('level') == '2'
    finally:
        probe.node.destroy_publisher(intruder)
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    assert_safe(probe)


def test_a_publisher_that_appears_for_60_ms_every_half_second_is_noticed(system):
    """Matched events catch an intruder the graph poll (every 0.1 s) may never see; it holds the node."""
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    stop = threading.Event()

    def intrude() -> None:
        while not stop.is_set():
            intruder = probe.node.create_publisher(JointTrajectory, CONFIG['command_topic'], COMMAND_QOS)
            time.sleep(0.06)
            probe.node.destroy_publisher(intruder)
            stop.wait(0.44)
    thread = threading.Thread(target=intrude, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: 'other publisher' in probe.state(), 6.0), probe.state()
        count = probe.command_count()
        time.sleep(1.5)
        assert probe.command_count() <= count + 1, 'commanded between the intruder\'s appearances'
    finally:
        stop.set()
        thread.join()
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    assert_safe(probe)


def test_when_the_controller_returns_the_node_re_enters_from_the_measured_state(system):
    node, probe = system
    assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
    probe.node.destroy_subscription(probe.command_subscription)
    assert wait_until(lambda: 'nobody subscribes' in probe.state(), 5.0), probe.state()
    probe.offset = np.full(len(JOINTS), 0.7)        # moved by hand meanwhile
    time.sleep(0.5)
    start = probe.command_count()
    probe.command_subscription = probe.node.create_subscription(
        JointTrajectory, CONFIG['command_topic'], probe._on_command, COMMAND_QOS)
    assert wait_until(lambda: probe.command_count() > start + 5, 10.0), node.output
    measured = np.array([0.1 * i for i in range(len(JOINTS))]) + 0.7
    first = probe.positions()[start]
    # Re-entry steps from the measured state (0.7 away from the last command); a command or
    # two may go out before the probe's reader has matched, hence the margin of one more step.
    assert np.all(np.abs(first - measured) <= 2 * MAX_STEP + 1e-9), (first, measured)
    assert_safe(probe, start)
    probe.offset = np.zeros(len(JOINTS))


def test_limits_only_tighten_at_run_time(system):
    node, probe = system
    client = probe.node.create_client(SetParameters, '/vla_policy_node/set_parameters')
    try:
        assert client.wait_for_service(timeout_sec=10.0)

        def set_value(name, value) -> tuple[bool, str]:
            future = client.call_async(SetParameters.Request(
                parameters=[Parameter(name, value=value).to_parameter_msg()]))
            assert wait_until(future.done, 10.0)
            result = future.result().results[0]
            return result.successful, result.reason
        ok, reason = set_value('limits.upper', [1e6] * len(JOINTS))
        assert not ok and 'may only be tightened' in reason
        ok, reason = set_value('limits.max_step', 10.0)
        assert not ok and 'may only be tightened' in reason
        ok, reason = set_value('use_sim_time', True)
        assert not ok and 'use_sim_time is read-only' in reason
        assert set_value('limits.max_step', 0.05)[0]
    finally:
        probe.node.destroy_client(client)


def test_a_robot_that_does_not_follow_its_commands_holds_the_node(system):
    """This probe's robot never moves: with a tracking error checked, the node stops stepping away."""
    node, probe = system
    client = probe.node.create_client(SetParameters, '/vla_policy_node/set_parameters')
    try:
        assert client.wait_for_service(timeout_sec=10.0)

        def set_tracking(value: list[float]) -> None:
            future = client.call_async(SetParameters.Request(parameters=[
                Parameter('limits.max_tracking_error', value=value).to_parameter_msg()]))
            assert wait_until(future.done, 10.0) and future.result().results[0].successful
        assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
        start = probe.command_count()
        set_tracking([0.02])
        assert wait_until(lambda: 'do not follow the command' in probe.state(), 10.0), probe.state()
        assert probe.counter('tracking_error_holds') >= 1
        time.sleep(0.5)
        held = probe.command_count()
        time.sleep(0.5)
        assert probe.command_count() == held, 'nothing after the hold'
        assert_safe(probe, start)
        restart = probe.node.create_client(Trigger, '/vla_policy_node/restart_from_measured')
        assert restart.wait_for_service(timeout_sec=10.0)
        future = restart.call_async(Trigger.Request())      # the operator: start from where it is
        assert wait_until(future.done, 10.0) and future.result().success, future.result()
        assert wait_until(lambda: probe.command_count() > held, 10.0), node.output
        first = probe.positions()[held]
        assert np.all(np.abs(first - probe.measured()) <= MAX_STEP + 1e-9), (first, probe.measured())
        assert wait_until(lambda: probe.counter('tracking_error_holds') >= 2, 10.0), probe.state()
        set_tracking([5.0])          # within the envelope given at start (not checked)
        time.sleep(0.5)
        assert 'do not follow the command' in probe.state(), 'latched until the operator restarts'
        future = restart.call_async(Trigger.Request())
        assert wait_until(future.done, 10.0) and future.result().success, future.result()
        assert wait_until(lambda: probe.state() == 'commanding', 10.0), probe.state()
        probe.node.destroy_client(restart)
    finally:
        probe.node.destroy_client(client)


def test_random_weights_refuse_to_start_unless_allowed():
    process = NodeProcess([DEFAULT_CONFIG], next_domain_id(), random_weights=False)
    try:
        assert process.wait(timeout=60.0) == 1, process.output
    finally:
        process.kill()
    assert "cannot start: parameter 'checkpoint' is empty, which builds a model with RANDOM" in process.output


def test_a_stopped_sim_clock_makes_the_node_hold_and_keep_reporting(tmp_path):
    from rosgraph_msgs.msg import Clock

    class ClockedProbe(SafetyProbe):
        """Publishes /clock from the wall clock until told to stop it."""

        running = True

        def start_clock(self) -> None:
            self._clock = self.node.create_publisher(Clock, '/clock', 10)
            self.node.create_timer(0.01, self._tick_clock)

        def _tick_clock(self) -> None:
            if self.running:
                self._clock.publish(Clock(clock=self.node.get_clock().now().to_msg()))

    def make(domain_id: int) -> ClockedProbe:
        probe = ClockedProbe(domain_id)
        probe.start_clock()
        return probe
    override = tmp_path / 'sim.yaml'
    override.write_text(yaml.safe_dump({'/**': {'ros__parameters': {'use_sim_time': True}}}))
    with node_with_probe([DEFAULT_CONFIG, override], next_domain_id(), make) as (node, probe):
        assert wait_until(lambda: probe.state() == 'commanding', 30.0), node.output
        # A loaded machine can starve the probe's /clock before this point, and /diagnostics lags
        # the node: judge the stop by what the counters do while the clock stands, not by a sum.
        holds = probe.counter('watchdog_holds')
        probe.running = False
        assert wait_until(lambda: 'no control tick' in probe.state(), 5.0), probe.state()
        time.sleep(0.3)
        stopped_holds, ticks = probe.counters('watchdog_holds', 'control_ticks')
        count = probe.command_count()
        assert stopped_holds > holds, 'the stopped clock is counted as a watchdog hold'
        time.sleep(1.5)
        assert probe.counter('watchdog_holds') == stopped_holds, 'one hold per stop, not per check'
        assert probe.counter('control_ticks') == ticks, 'the control timer runs on /clock'
        assert probe.command_count() == count, 'nothing but the one hold while the clock stands'
        probe.running = True
        assert wait_until(lambda: probe.state() == 'commanding', 10.0), node.output
        assert_safe(probe)
