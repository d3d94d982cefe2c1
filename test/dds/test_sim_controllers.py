# SPDX-License-Identifier: Apache-2.0
"""
The simulated robot's controllers read their commands at each physics tick: in order, each from its arrival.

The planar arm runs in real time in this process (no episode: nothing but its controllers);
a commander in its own ``rclpy.Context`` publishes well-formed trajectories, a burst of them
between two ticks, bytes that are no trajectory, and joints the arm does not have.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from ros_harness import contexts_in_test_domain, DEFAULT_CONFIG, wait_until
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from vla_policy_node.ros.conversions import chunk_to_joint_trajectory
from vla_policy_node.ros.qos import COMMAND_QOS
from vla_policy_node.ros.sim.robot import SimRobot

pytestmark = pytest.mark.dds

PLANAR_CONFIG = DEFAULT_CONFIG.parent / 'planar.yaml'
TOPIC = '/joint_trajectory_controller/joint_trajectory'      # planar.yaml's
JOINTS = ('shoulder', 'elbow', 'wrist')


@pytest.fixture
def rig(monkeypatch):
    """Yield (the robot, the commander's publisher, spin(seconds, until)); the robot ticks in real time."""
    with contexts_in_test_domain(monkeypatch) as contexts:
        robot = SimRobot(context=contexts[0], cli_args=['--ros-args', '--params-file', str(PLANAR_CONFIG)],
                         parameter_overrides=[Parameter('episodes', value=0)])
        commander = rclpy.create_node('commander', context=contexts[1])
        publisher = commander.create_publisher(JointTrajectory, TOPIC, COMMAND_QOS)
        executor = SingleThreadedExecutor(context=contexts[0])
        executor.add_node(robot)

        def spin(seconds: float, until=lambda: False) -> bool:
            end = time.monotonic() + seconds
            while time.monotonic() < end and not until():
                executor.spin_once(timeout_sec=0.005)
            return until()

        assert wait_until(lambda: publisher.get_subscription_count() > 0, 10.0)
        yield robot, publisher, spin
        executor.shutdown(timeout_sec=1.0)
        robot.destroy_node()
        commander.destroy_node()


def trajectory(target: list[float], joints=JOINTS) -> JointTrajectory:
    return chunk_to_joint_trajectory(np.array([target]), list(joints), 0.2)


def test_a_trajectory_is_followed_from_its_arrival_and_the_last_of_a_burst_wins(rig):
    robot, publisher, spin = rig
    assert tuple(robot._env.joint_names) == JOINTS
    before = time.monotonic()
    publisher.publish(trajectory([0.3, 0.5, -0.3]))
    assert spin(5.0, lambda: robot._controllers.followers)
    follower = robot._controllers.followers[(0, 1, 2)]
    assert before <= follower._start <= time.monotonic()        # its arrival, not a later tick's time
    assert spin(3.0, lambda: np.allclose(robot._env.q, [0.3, 0.5, -0.3], atol=0.02)), robot._env.q
    # Three commands between two physics ticks: taken in the order sent, the last one stands.
    for target in ([0.1, 0.1, 0.1], [-0.5, 0.9, 0.4], [0.6, -0.2, 0.2]):
        publisher.publish(trajectory(target))
    assert spin(3.0, lambda: np.allclose(robot._env.q, [0.6, -0.2, 0.2], atol=0.02)), robot._env.q


def test_bytes_that_are_no_trajectory_and_unknown_joints_are_ignored_and_the_arm_keeps_its_command(rig):
    robot, publisher, spin = rig
    target = [0.4, -0.4, 0.3]
    publisher.publish(trajectory(target))
    assert spin(3.0, lambda: np.allclose(robot._env.q, target, atol=0.02)), robot._env.q
    publisher.publish(b'\x00\x01\x00\x00' + b'\xff' * 7)        # raw CDR: truncated, sizes past the end
    publisher.publish(trajectory([0.0, 0.0, 0.0, 0.0], ('shoulder', 'elbow', 'wrist', 'gripper')))
    short = JointTrajectory(joint_names=list(JOINTS), points=[JointTrajectoryPoint(positions=[0.0, 0.0])])
    short.points[0].time_from_start.nanosec = 200_000_000
    publisher.publish(short)                                    # three joints named, two positions
    spin(1.0)
    np.testing.assert_allclose(robot._env.q, target, atol=0.02)
    # And the next good one is followed: the controllers did not stop reading.
    publisher.publish(trajectory([0.0, 0.0, 0.0]))
    assert spin(3.0, lambda: np.allclose(robot._env.q, 0.0, atol=0.02)), robot._env.q
