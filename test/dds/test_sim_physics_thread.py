# SPDX-License-Identifier: Apache-2.0
"""
The simulated robot in real time: its physics, joint states and camera run on a thread of its own.

The robot runs in this process; a peer in its own ``rclpy.Context`` listens to it and plays the
policy node's /diagnostics. The thread ticks without the executor, stops with the node, shares
the episode's state with the executor's callbacks under one lock, and a tick that raises is
logged and raised from the spin, as a failing timer callback's exception was.
"""

from __future__ import annotations

import sys
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from hypothesis import given, HealthCheck, settings, strategies as st
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from ros_harness import contexts_in_test_domain, DEFAULT_CONFIG, wait_until
from sensor_msgs.msg import Image, JointState
from vla_policy_interfaces.msg import Episode

from vla_policy_node.ros.qos import CAMERA_QOS, DIAGNOSTICS_QOS, JOINT_STATES_QOS
from vla_policy_node.ros.sim.robot import SimRobot

pytestmark = pytest.mark.dds

PLANAR_CONFIG = DEFAULT_CONFIG.parent / 'planar.yaml'
SHARED = ('_phase', '_policy', '_hold_seen', '_node_episode')     # what the tick and the callbacks both touch


@pytest.fixture
def rig(monkeypatch):
    """Yield make(robot class, params file, overrides) -> (robot, its executor, the peer node)."""
    with contexts_in_test_domain(monkeypatch) as contexts:
        peer = rclpy.create_node('peer', context=contexts[1])
        made = []

        def make(cls=SimRobot, params=PLANAR_CONFIG, **overrides):
            args = ['--ros-args', '--params-file', str(params)] if params else []
            robot = cls(context=contexts[0], cli_args=args, parameter_overrides=[
                Parameter(k, value=v) for k, v in {'episodes': 0, **overrides}.items()])
            executor = SingleThreadedExecutor(context=contexts[0])
            executor.add_node(robot)
            made.append((robot, executor))
            return robot, executor, peer

        yield make
        for robot, executor in made:
            executor.shutdown(timeout_sec=1.0)
            robot.destroy_node()
        peer.destroy_node()


def listen(peer, kind, topic: str, qos) -> list[float]:
    """Record the stamp of each message of ``topic`` (s)."""
    stamps: list[float] = []
    peer.create_subscription(kind, topic, lambda m: stamps.append(m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec),
                             qos)
    return stamps


def test_the_so101_publishes_joint_states_and_camera_from_its_thread_unspun_and_destroy_stops_it(rig):
    robot, _, peer = rig(params=None)                      # the SO-101 in MuJoCo: rendering on the thread
    joints = listen(peer, JointState, '/joint_states', JOINT_STATES_QOS)
    frames = listen(peer, Image, 'camera/front/image_raw', CAMERA_QOS)
    spinner = SingleThreadedExecutor(context=peer.context)
    spinner.add_node(peer)
    end = time.monotonic() + 20.0
    while time.monotonic() < end and not (frames and frames[-1] - frames[0] > 2.0):
        spinner.spin_once(timeout_sec=0.01)
    # Two seconds of it, the robot's executor never spun: physics at 100 Hz, the camera at 30 Hz.
    window = (frames[-1] - 1.5, frames[-1] - 0.5)
    per_second = [sum(window[0] <= t < window[1] for t in stamps) for stamps in (joints, frames)]
    assert 60 <= per_second[0] <= 102 and 15 <= per_second[1] <= 31, per_second
    robot.destroy_node()
    assert not robot._physics.alive
    stopped = robot._sim_time
    spinner.spin_once(timeout_sec=0.2)
    assert robot._sim_time == stopped                       # no tick after destroy
    spinner.shutdown(timeout_sec=1.0)


def test_a_failing_tick_is_logged_and_raised_from_the_spin_and_the_thread_ends(rig, capfd):
    robot, executor, _ = rig()

    def diverge(target, seconds):
        raise FloatingPointError('the physics diverged')

    robot._env.drive = diverge
    with pytest.raises(FloatingPointError, match='the physics diverged'):
        end = time.monotonic() + 10.0
        while time.monotonic() < end:
            executor.spin_once(timeout_sec=0.1)
    assert not robot._physics.alive and not robot.finished
    assert 'the physics thread failed, the simulation stops' in capfd.readouterr().err


def test_a_context_shut_down_under_the_thread_ends_it_quietly(rig, capfd):
    robot, _, _ = rig()
    assert wait_until(lambda: robot._sim_time > 1.05, 5.0)
    rclpy.try_shutdown(context=robot.context)               # Ctrl-C, SIGTERM: the process ends
    assert wait_until(lambda: not robot._physics.alive, 5.0)
    assert 'physics thread failed' not in capfd.readouterr().err


def diagnostics(robot: SimRobot, state: str) -> DiagnosticArray:
    status = DiagnosticStatus(name=robot._policy_status, values=[KeyValue(key='state', value=state)])
    return DiagnosticArray(status=[status])


def test_a_diagnostics_callback_waits_for_the_physics_tick_under_way_then_takes_effect(rig):
    robot, executor, peer = rig()
    publisher = peer.create_publisher(DiagnosticArray, '/diagnostics', DIAGNOSTICS_QOS)
    assert wait_until(lambda: publisher.get_subscription_count() > 0, 10.0)
    inside, release, drive = threading.Event(), threading.Event(), robot._env.drive

    def held_tick(target, seconds):
        inside.set()
        release.wait(10.0)
        drive(target, seconds)

    robot._env.drive = held_tick
    assert inside.wait(5.0)
    publisher.publish(diagnostics(robot, 'holding: no camera image'))
    spinning = threading.Thread(target=executor.spin_once, kwargs={'timeout_sec': 10.0})
    spinning.start()

    def callback_waits() -> bool:
        frame = sys._current_frames().get(spinning.ident)
        while frame is not None and frame.f_code.co_name != '_on_diagnostics':
            frame = frame.f_back
        return frame is not None

    assert wait_until(callback_waits, 10.0)
    assert robot._policy == {}                              # the message is in, the tick holds the lock
    robot._env.drive = drive
    release.set()
    spinning.join(10.0)
    assert robot._policy['state'] == 'holding: no camera image'


class OwnedLock:
    """A lock that knows its holder."""

    def __init__(self) -> None:
        self._lock, self.owner = threading.Lock(), None

    def __enter__(self):
        self._lock.acquire()
        self.owner = threading.get_ident()

    def __exit__(self, *exc) -> None:
        self.owner = None
        self._lock.release()


class Guarded:
    """An attribute of the robot whose every use while its physics thread runs is checked to hold the lock."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, robot, kind=None):
        robot.check(self.name)
        return robot.__dict__['shared'][self.name]

    def __set__(self, robot, value) -> None:
        robot.check(self.name)
        robot.__dict__.setdefault('shared', {})[self.name] = value


class CheckedRobot(SimRobot):
    """The robot with its lock and shared state instrumented: who used what, holding the lock or not."""

    _phase, _policy, _hold_seen, _node_episode = Guarded(), Guarded(), Guarded(), Guarded()

    @property
    def _lock(self) -> OwnedLock:
        return self.__dict__['owned_lock']

    @_lock.setter
    def _lock(self, _) -> None:
        self.__dict__['owned_lock'] = OwnedLock()

    def check(self, name: str) -> None:
        physics = self.__dict__.get('_physics')
        if physics is None or not physics.alive:
            return                                          # construction and the end: one thread
        holder = self.__dict__['owned_lock'].owner
        self.__dict__.setdefault('uses', []).append((threading.get_ident(), name, holder == threading.get_ident()))


EVENTS = st.lists(st.one_of(
    st.tuples(st.just('diagnostics'), st.sampled_from(['running', 'holding: stale image', 'holding: no policy'])),
    st.tuples(st.just('episode'), st.sampled_from([Episode.STARTED, Episode.ENDED])),
    st.tuples(st.just('pause'), st.floats(0.0, 0.02))), min_size=1, max_size=30)


def test_the_tick_and_the_callbacks_use_the_episodes_state_only_under_the_lock(rig):
    """Episodes start and end on the thread (2 steps each) while the callbacks run in any order beside it."""
    robot, _, _ = rig(cls=CheckedRobot, max_steps=2)
    robot._reset.service_is_ready = lambda: True            # a node that is always ready; its reset never answers
    holds = {''}

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    @given(EVENTS)
    def interleave(events):
        for kind, value in events:      # the test thread plays the executor: it calls the callbacks
            if kind == 'diagnostics':
                robot._on_diagnostics(diagnostics(robot, value))
                holds.add(value.removeprefix('holding: ') if value.startswith('holding: ') else '')
            elif kind == 'episode':
                robot._on_node_episode(Episode(event=value, episode=7))
            else:
                time.sleep(value)

    interleave()
    assert wait_until(lambda: len(robot.reports) >= 3, 10.0)
    robot._physics.stop()
    uses = robot.__dict__['uses']
    assert {thread for thread, _, _ in uses} == {threading.get_ident(), robot._physics._thread.ident}
    assert {name for _, name, _ in uses} == set(SHARED)
    assert all(locked for _, _, locked in uses), [use for use in uses if not use[2]][:5]
    assert {report.hold for report in robot.reports} <= holds
