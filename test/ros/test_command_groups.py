# SPDX-License-Identifier: Apache-2.0
"""
Command groups: parameters, the split of the safe command, and the messages ros2_controllers reads.

joint_trajectory_controller (validate_trajectory_msg): joint names all its own, strictly
increasing time_from_start, a zero header stamp meaning "now", and, with its default
allow_nonzero_velocity_at_trajectory_end false, a last point with zero velocity.
forward_command_controller: data of exactly its joint count, in its joint order.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory
from test_params import VALUES

from vla_policy_node.ros.command_groups import CommandOutputs, trajectory_velocities
from vla_policy_node.ros.params import ParameterError, settings_from_values

ARM = ['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll']
GROUPS = {
    'commands.groups': ['arm', 'gripper'],
    'commands.arm.joints': ARM, 'commands.arm.interface': 'joint_trajectory',
    'commands.arm.topic': 'arm_controller/joint_trajectory',
    # Listed in an order other than joint_names': the controller's, which the split follows.
    'commands.gripper.joints': ['gripper'], 'commands.gripper.interface': 'forward_command',
    'commands.gripper.topic': 'gripper_controller/commands',
}


def test_without_groups_the_single_default_group_takes_the_old_parameters():
    settings = settings_from_values(VALUES)
    (group,) = settings.command_groups
    assert group.joints == tuple(VALUES['joint_names'])
    assert (group.interface, group.topic) == (VALUES['command_interface'], VALUES['command_topic'])


def test_groups_map_their_joints_onto_the_policy_vector():
    arm, gripper = settings_from_values({**VALUES, **GROUPS}).command_groups
    assert arm.indices == (0, 1, 2, 3, 4) and gripper.indices == (5,)
    assert gripper.interface == 'forward_command'


def test_the_loop_knows_which_joints_get_only_the_first_point_of_a_trajectory():
    from vla_policy_node.ros.node import loop_settings
    loop = loop_settings(settings_from_values({**VALUES, **GROUPS}))
    assert loop.plan_points == 0 and loop.first_point_joints == (5,)
    single = loop_settings(settings_from_values({**VALUES, **GROUPS, 'trajectory_points': 1}))
    assert single.first_point_joints == (5,)        # its controller holds the first point of what it got


@pytest.mark.parametrize('change, message', [
    ({'commands.gripper.joints': ['gripper', 'wrist_roll']},
     "joint 'wrist_roll' is in command groups 'arm' and 'gripper'; a joint belongs to one controller"),
    ({'commands.gripper.joints': ['jaw']},
     "parameter 'commands.gripper.joints' names 'jaw', which is not in joint_names"),
    ({'commands.arm.joints': ARM[:4]},
     "joints ['wrist_roll'] are in no command group: every joint the policy drives must go to a "
     'controller'),
    ({'commands.gripper.topic': 'arm_controller/joint_trajectory'},
     "command groups share a topic: ['arm_controller/joint_trajectory', "
     "'arm_controller/joint_trajectory']"),
    ({'commands.gripper.interface': 'gripper_action'},
     "parameter 'commands.gripper.interface' = 'gripper_action' must be a string (one of "
     'joint_trajectory, forward_command, follow_joint_trajectory, gripper_command)'),
    ({'commands.gripper.interface': 'gripper_command', 'commands.gripper.joints': ['wrist_roll', 'gripper'],
      'commands.arm.joints': ['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex']},
     "command group 'gripper' uses gripper_command, which drives one joint; it lists 2"),
    ({'commands.groups': ['arm', 'arm']},
     "parameter 'commands.groups' has duplicated entries: ['arm', 'arm']"),
    ({'commands.groups': ['arm', 'the gripper']},
     "parameter 'commands.groups' has an invalid group name 'the gripper': use letters, digits "
     "and _ (starting with a letter), not 'groups'"),
    ({'commands.groups': ['arm', 'hand']},
     "parameter 'commands.hand.joints' is required: it must be a string array"),
])
def test_bad_groups_are_refused_with_a_reason(change, message):
    with pytest.raises(ParameterError) as error:
        settings_from_values({**VALUES, **GROUPS, **change})
    assert str(error.value) == message


class Recorder:
    """A publisher that keeps what it is given."""

    def __init__(self, topic: str) -> None:
        self.topic_name = topic
        self.messages = []
        self.subscribers = 1

    def publish(self, msg) -> None:
        self.messages.append(msg)

    def get_subscription_count(self) -> int:
        return self.subscribers


class FakeNode:
    """Just what CommandOutputs uses of a node."""

    def __init__(self) -> None:
        self.publishers: dict[str, tuple[type, Recorder]] = {}

    def create_publisher(self, kind, topic, qos):
        self.publishers[topic] = (kind, Recorder(topic))
        return self.publishers[topic][1]


@pytest.mark.parametrize('velocities', [False, True])
def test_the_safe_command_is_split_by_group_as_the_controllers_expect(velocities):
    settings = settings_from_values({**VALUES, **GROUPS})
    node = FakeNode()
    outputs = CommandOutputs(node, settings.command_groups, qos=None, velocities=velocities, watch=False)
    assert node.publishers['arm_controller/joint_trajectory'][0] is JointTrajectory
    assert node.publishers['gripper_controller/commands'][0] is Float64MultiArray
    dt = 0.05
    points = np.cumsum(np.full((4, 6), 0.02), axis=0) + np.arange(6) * 0.1    # (T, J)
    outputs.publish(points, dt)
    (trajectory,) = node.publishers['arm_controller/joint_trajectory'][1].messages
    (forward,) = node.publishers['gripper_controller/commands'][1].messages
    assert trajectory.joint_names == ARM
    assert (trajectory.header.stamp.sec, trajectory.header.stamp.nanosec) == (0, 0)
    np.testing.assert_array_equal([p.positions for p in trajectory.points], points[:, :5])
    times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in trajectory.points]
    np.testing.assert_allclose(times, dt * np.arange(1, 5))
    if velocities:
        speeds = np.array([p.velocities for p in trajectory.points])
        np.testing.assert_allclose(speeds[:-1], 0.02 / dt)
        assert np.all(speeds[-1] == 0.0)
    else:
        assert all(len(p.velocities) == 0 for p in trajectory.points)
    assert list(forward.data) == [points[0, 5]]


def test_a_hold_for_some_joints_goes_to_their_groups_only():
    """The loop's hold to the topics that listen: the gripper's topic (no subscriber) gets nothing."""
    settings = settings_from_values({**VALUES, **GROUPS})
    node = FakeNode()
    outputs = CommandOutputs(node, settings.command_groups, qos=None, watch=False)
    points = np.arange(6, dtype=float)[None, :] * 0.1                          # (1, J)
    outputs.publish(points, 0.05, np.array([True] * 5 + [False]))
    (trajectory,) = node.publishers['arm_controller/joint_trajectory'][1].messages
    assert node.publishers['gripper_controller/commands'][1].messages == []
    np.testing.assert_array_equal(trajectory.points[0].positions, points[0, :5])


def test_velocities_are_differences_of_the_safe_points_and_end_at_zero():
    rng = np.random.default_rng(0)
    dt, max_step = 0.05, 0.1
    points = np.cumsum(rng.uniform(-max_step, max_step, (8, 3)), axis=0)
    speeds = trajectory_velocities(points, dt)
    assert np.all(np.abs(speeds) <= max_step / dt + 1e-12)
    np.testing.assert_allclose(speeds[0], (points[1] - points[0]) / dt)
    np.testing.assert_allclose(speeds[3], (points[4] - points[2]) / (2 * dt))
    assert np.all(speeds[-1] == 0.0)
    assert np.all(trajectory_velocities(points[:1], dt) == 0.0)


def test_the_link_names_the_topic_the_loops_refusal_is_about():
    """Another publisher is refused before a missing subscriber: the reason names that topic."""
    settings = settings_from_values({**VALUES, **GROUPS})
    node = FakeNode()
    outputs = CommandOutputs(node, settings.command_groups, qos=None, watch=False)
    arm, gripper = (node.publishers[t][1] for t in ('arm_controller/joint_trajectory', 'gripper_controller/commands'))
    arm.subscribers, gripper.subscribers = 0, 1
    assert outputs.link((0, 1)) == (0, 1, 'gripper_controller/commands', (0, 1, 2, 3, 4), None)
    assert outputs.link((0, 0)) == (0, 0, 'arm_controller/joint_trajectory', (0, 1, 2, 3, 4), None)
    arm.subscribers = 1
    assert outputs.link((0, 0))[2:] == ('arm_controller/joint_trajectory', (), None)


def test_the_link_names_every_contested_topic_with_its_count():
    """The loop reports the sum of other publishers: with several topics, each says its share."""
    settings = settings_from_values({**VALUES, **GROUPS})
    node = FakeNode()
    outputs = CommandOutputs(node, settings.command_groups, qos=None, watch=False)
    assert outputs.link((1, 2))[1:3] == (
        3, 'arm_controller/joint_trajectory (1) and gripper_controller/commands (2)')
    assert outputs.link((0, 2))[1:3] == (2, 'gripper_controller/commands')
    for publisher in (node.publishers[t][1] for t in node.publishers):
        publisher.subscribers = 0
    assert outputs.link((0, 0))[2] == 'arm_controller/joint_trajectory and gripper_controller/commands'


class WatchedNode(FakeNode):
    """A FakeNode whose subscriptions keep their matched-event callback, for the test to fire."""

    def __init__(self) -> None:
        super().__init__()
        self.matched = {}

    def create_subscription(self, kind, topic, callback, qos, raw=False, event_callbacks=None):
        self.matched[topic] = event_callbacks.matched
        return object()


def test_a_publisher_that_appears_for_a_few_ms_keeps_its_topic_contested_for_a_while():
    """Matched events see a publisher however briefly it lives; the graph poll may never."""
    settings = settings_from_values({**VALUES, **GROUPS})
    node, clock = WatchedNode(), [10.0]
    outputs = CommandOutputs(node, settings.command_groups, qos=None, clock=lambda: clock[0])
    arm = 'arm_controller/joint_trajectory'
    for publisher in (node.publishers[t][1] for t in node.publishers):
        publisher.subscribers = 2                       # the controller and this node's own watcher
    node.matched[arm](SimpleNamespace(current_count=1))          # the watcher matched this node's publisher
    assert outputs.link((0, 0))[:2] == (1, 0), 'the watcher is no controller'
    node.matched[arm](SimpleNamespace(current_count=2))          # an intruder for 60 ms ...
    clock[0] += 0.06
    node.matched[arm](SimpleNamespace(current_count=1))          # ... gone again before any graph poll
    assert outputs.link((0, 0))[1:3] == (1, arm)
    clock[0] += 0.9
    assert outputs.link((0, 0))[1] == 1, 'back every 0.5 s: still contested in between'
    clock[0] += 0.2
    assert outputs.link((0, 0))[1] == 0
