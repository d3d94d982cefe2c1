# SPDX-License-Identifier: Apache-2.0
"""
Command groups: the safe command split over the controllers that own the joints.

Real setups split the arm (joint_trajectory_controller) from the gripper (a forward position
controller, or a second trajectory controller), and a controller refuses a message naming
joints it does not own (joint_trajectory_controller: "Incoming joint ... doesn't match the
controller's joints"; forward_command_controller silently ignores a ``data`` of the wrong
size). So the node publishes one message per group, each with exactly that group's joints.

The safety path is unchanged by the split: the control loop clamps the whole (T, J) vector
(limits, step, velocity) before its sink is called, and the sink only slices the safe command
by group. The command-link checks (a subscriber, no other publisher) hold for every group's
topic: the loop commands only while all of them are fine.

Messages, as ros2_controllers reads them:

* ``joint_trajectory`` (``/<controller>/joint_trajectory``): header stamp zero ("start now",
  no clock agreement needed), the group's joint names (any order; all the controller's joints
  unless it sets ``allow_partial_joints_goal``), point i at ``time_from_start = (i + 1) / rate``
  (strictly increasing). Optional velocities (``trajectory_velocities``): finite differences
  of the safe points (so within ``max_velocity``), the last one 0, because the controller's
  default ``allow_nonzero_velocity_at_trajectory_end: false`` rejects anything else; with
  velocities it interpolates with cubic splines instead of linearly.
* ``forward_command`` (``/<controller>/commands``): ``Float64MultiArray`` of this tick's
  point, in the group's joint order, which must be the controller's ``joints`` order.
* ``follow_joint_trajectory`` (the action ``/<controller>/follow_joint_trajectory``): each tick
  a goal with the trajectory the topic would carry; joint_trajectory_controller preempts the
  running goal with it (the preempted goal ends canceled: expected). Tolerances are left
  empty, so the controller's configured ones apply.
* ``gripper_command`` (the action ``/<controller>/gripper_cmd``, gripper_action_controller):
  one joint; each tick a goal with this tick's point as ``position`` and ``gripper_max_effort``
  as ``max_effort``, preempting the previous. A goal ending stalled is what grasping looks like.

A goal the controller did not run (rejected, aborted, unanswered, ended before it was due)
refuses its group: the loop holds, and the next goal steps from the measured joints
(``ros/action_outputs.py``). For the actions, the command-link check asks whether the action
server is there (a topic asks for a subscriber); another action client's goals cannot be seen
in the graph, so the check for other commanders covers the topics only. control_msgs is
imported only when a group uses an action (``make setup`` generates it where no ROS 2
distribution provides it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
import math
import re
import time
from typing import Any, NamedTuple

import numpy as np
from rclpy.duration import Duration
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory
from vla_policy_interfaces.msg import CommandGoal

from vla_policy_node.control.goal_answers import COUNTERS as ACTION_COUNTERS
from vla_policy_node.ros.action_outputs import ActionOutput, gripper_trajectory
from vla_policy_node.ros.conversions import action_to_float64_multiarray, chunk_to_joint_trajectory
from vla_policy_node.ros.qos import COMMAND_GOALS_QOS

COMMAND_INTERFACES = ('joint_trajectory', 'forward_command', 'follow_joint_trajectory', 'gripper_command')
TRAJECTORY_INTERFACES = ('joint_trajectory', 'follow_joint_trajectory')    # several points per message
ACTION_INTERFACES = ('follow_joint_trajectory', 'gripper_command')
DEFAULT_GROUP = 'default'
_GROUP_NAME = re.compile(r'[A-Za-z][A-Za-z0-9_]*')


@dataclass(frozen=True)
class CommandGroup:
    """One controller's share of the command: its joints, message interface and topic."""

    name: str
    joints: tuple[str, ...]
    interface: str
    topic: str
    indices: tuple[int, ...]        # the joints' positions in joint_names


def check_group_names(names: Sequence[str]) -> None:
    """Refuse group names that are not parameter-name tokens, or repeated (ValueError)."""
    for name in names:
        if not _GROUP_NAME.fullmatch(name) or name == 'groups':
            raise ValueError(
                f"parameter 'commands.groups' has an invalid group name {name!r}: use letters, "
                "digits and _ (starting with a letter), not 'groups'")
    if len(set(names)) != len(names):
        raise ValueError(f"parameter 'commands.groups' has duplicated entries: {list(names)}")


def group_parameter(group: str, field: str) -> str:
    """Return the parameter name of a group's field (``commands.<group>.<field>``)."""
    return f'commands.{group}.{field}'


def command_groups_from_values(values: Mapping[str, Any],
                               joint_names: Sequence[str]) -> tuple[CommandGroup, ...]:
    """
    Build the groups from parameter values; every joint must be in exactly one group.

    Without ``commands.groups`` the single group ``default`` holds every joint and takes
    ``command_interface`` / ``command_topic`` (the parameters before groups existed).
    """
    names = tuple(values.get('commands.groups') or ())
    if not names:
        return (CommandGroup(DEFAULT_GROUP, tuple(joint_names), values['command_interface'],
                             values['command_topic'], tuple(range(len(joint_names)))),)
    check_group_names(names)
    index = {joint: i for i, joint in enumerate(joint_names)}
    owner: dict[str, str] = {}
    groups = []
    for name in names:
        joints = tuple(values[group_parameter(name, 'joints')])
        topic = values[group_parameter(name, 'topic')]
        if not joints:
            raise ValueError(f"parameter '{group_parameter(name, 'joints')}' must not be empty")
        if not topic.strip():
            raise ValueError(f"parameter '{group_parameter(name, 'topic')}' must not be empty")
        for joint in joints:
            if joint not in index:
                raise ValueError(f"parameter '{group_parameter(name, 'joints')}' names '{joint}', "
                                 f'which is not in joint_names')
            if joint in owner:
                raise ValueError(f"joint '{joint}' is in command groups '{owner[joint]}' and "
                                 f"'{name}'; a joint belongs to one controller")
            owner[joint] = name
        interface = values[group_parameter(name, 'interface')]
        if interface == 'gripper_command' and len(joints) != 1:
            raise ValueError(f"command group '{name}' uses gripper_command, which drives one joint; "
                             f'it lists {len(joints)}')
        groups.append(CommandGroup(name, joints, interface, topic, tuple(index[joint] for joint in joints)))
    missing = [joint for joint in joint_names if joint not in owner]
    if missing:
        raise ValueError(f'joints {missing} are in no command group: every joint the policy '
                         'drives must go to a controller')
    topics = [group.topic for group in groups]
    if len(set(topics)) != len(topics):
        raise ValueError(f'command groups share a topic: {topics}')
    return tuple(groups)


def trajectory_velocities(points: np.ndarray, dt: float) -> np.ndarray:
    """
    Velocities (T, J) for trajectory points (T, J) ``dt`` apart; the last row is 0.

    Central differences inside, one-sided at the first point; each is a step of the safe
    (clamped) points over time, so it obeys the same velocity limit.
    """
    velocities = np.zeros_like(points, dtype=np.float64)
    if len(points) > 1:
        velocities[:-1] = np.gradient(points, dt, axis=0)[:-1]
    return velocities


# A publisher seen on a command topic keeps it contested this long after it left: one that
# comes back for a few ms every half second must not find the node commanding in between.
INTRUDER_LINGER_S = 1.0
# The watchers match every publisher (best effort, volatile: compatible with any) and read nothing.
WATCH_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.BEST_EFFORT,
                       durability=DurabilityPolicy.VOLATILE)


class CommandOutputs:
    """
    One publisher (or action client) per group; the control loop's sink publishes through :meth:`publish`.

    Another publisher on a command topic is seen two ways: the graph, polled
    (:meth:`other_publishers`, every watchdog period), and a watcher subscription per topic
    whose matched events report each publisher as DDS matches it, however briefly it lives.
    An action group's answers are its ``ActionOutput``'s.
    """

    def __init__(self, node: Node, groups: Sequence[CommandGroup], qos: QoSProfile, velocities: bool = False,
                 clock: Callable[[], float] = time.monotonic, watch: bool = True,
                 gripper_max_effort: float = 0.0, now: Callable[[], float] | None = None) -> None:
        """
        ``watch``: watch the topics for other publishers (False: the messages go to a bag, not DDS).

        ``clock``: a monotonic clock (how long a publisher stays an intruder, a goal unanswered);
        ``now``: the node's clock (when goals are due; default ``clock``).
        """
        self._node = node
        self._groups = tuple(groups)
        self._velocities = velocities
        self._clock = clock
        self._gripper_max_effort = gripper_max_effort
        self.counters = dict.fromkeys(ACTION_COUNTERS, 0)
        self._publishers: list[Any] = []
        self._watchers: list[Any] = []
        actions = [group for group in self._groups if group.interface in ACTION_INTERFACES]
        record = node.create_publisher(CommandGoal, '~/command_goals', COMMAND_GOALS_QOS) if actions else None
        for i, group in enumerate(self._groups):
            if group.interface in ACTION_INTERFACES:
                self._publishers.append(ActionOutput(node, _action_type(group.interface), group.topic, group.name,
                                                     self.counters, record, now or clock, clock))
                self._watchers.append(None)
                continue
            kind = JointTrajectory if group.interface == 'joint_trajectory' else Float64MultiArray
            publisher = node.create_publisher(kind, group.topic, qos)
            self._publishers.append(publisher)
            self._watchers.append(self._watch(i, kind, publisher.topic_name) if watch else None)
        self._matched = [0] * len(self._groups)         # publishers each watcher matches (this node's included)
        self._intruder_until = [-math.inf] * len(self._groups)

    def _watch(self, index: int, kind: type, topic: str) -> Any:
        """Subscribe to a command topic for its matched events only (None where rclpy has none: Humble)."""
        def matched(info: Any) -> None:
            self._matched[index] = info.current_count
            if info.current_count > 1:                  # besides this node's own publisher
                self._intruder_until[index] = self._clock() + INTRUDER_LINGER_S
        try:
            return self._node.create_subscription(
                kind, topic, lambda _: None, WATCH_QOS, raw=True,
                event_callbacks=SubscriptionEventCallbacks(matched=matched))
        except TypeError:
            return None

    @property
    def topics(self) -> tuple[str, ...]:
        """Return the resolved topic (or action name) of every group."""
        return tuple(publisher.action_name if group.interface in ACTION_INTERFACES else publisher.topic_name
                     for group, publisher in zip(self._groups, self._publishers))

    def publish(self, points: np.ndarray, dt: float, joints: np.ndarray | None = None) -> None:
        """
        Publish safe points (T, J): each group its joints' columns, row 0 at ``dt``.

        ``joints`` (J,): only the groups whose joints it marks (the loop's hold to the topics
        that listen); None: every group.
        """
        velocities = trajectory_velocities(points, dt) if self._velocities else None
        for group, publisher in zip(self._groups, self._publishers):
            columns = list(group.indices)
            if joints is not None and not joints[columns].all():
                continue
            if group.interface in TRAJECTORY_INTERFACES:
                trajectory = chunk_to_joint_trajectory(points[:, columns], group.joints, dt,
                                                       None if velocities is None else velocities[:, columns])
                if group.interface == 'joint_trajectory':
                    publisher.publish(trajectory)
                else:
                    publisher.send(publisher.goal_type(trajectory=trajectory), trajectory)
            elif group.interface == 'gripper_command':
                goal = publisher.goal_type()
                goal.command.position = float(points[0, columns[0]])
                goal.command.max_effort = float(self._gripper_max_effort)
                publisher.send(goal, gripper_trajectory(group.joints[0], goal.command.position,
                                                        goal.command.max_effort, dt))
            else:
                publisher.publish(action_to_float64_multiarray(points[0, columns]))

    def other_publishers(self) -> tuple[int, ...]:
        """Count the publishers on each group's topic besides this node (a graph query; 0 for actions)."""
        return tuple(0 if group.interface in ACTION_INTERFACES
                     else max(0, self._node.count_publishers(publisher.topic_name) - 1)
                     for group, publisher in zip(self._groups, self._publishers))

    def intruders(self, polled: Sequence[int]) -> tuple[int, ...]:
        """Return ``polled`` (:meth:`other_publishers`) raised to 1 on a topic whose watcher saw another lately."""
        now = self._clock()
        return tuple(max(count, 1 if now < until else 0) for count, until in zip(polled, self._intruder_until))

    def link(self, others: Sequence[int]) -> CommandLink:
        """
        Return the command link for the loop (``ControlLoop.set_command_link``).

        ``others`` comes from :meth:`other_publishers`. The topics named are those the loop's
        refusal is about: the ones with another publisher (that refusal comes first; with
        several, each with its count, as the loop reports the sum), else the ones without a
        subscriber, else the first topic. The unheard joints (indices) are those of the
        topics without a subscriber and of the action groups refused for a goal not run, or
        whose last goal is not answered yet.
        """
        refusals = [publisher.refusal() if group.interface in ACTION_INTERFACES else None
                    for group, publisher in zip(self._groups, self._publishers)]
        # The watchers subscribe too: a matched one is not a controller.
        subscribers = [int(publisher.server_is_ready()) if group.interface in ACTION_INTERFACES
                       else max(0, publisher.get_subscription_count() - (watcher is not None and matched > 0))
                       for group, publisher, watcher, matched
                       in zip(self._groups, self._publishers, self._watchers, self._matched)]
        others = self.intruders(others)
        topics = self.topics
        contested = [(t, o) for t, o in zip(topics, others) if o > 0]
        if len(contested) > 1:
            fault = ' and '.join(f'{t} ({o})' for t, o in contested)
        else:
            silent = [t for t, s in zip(topics, subscribers) if s == 0]
            fault = contested[0][0] if contested else ' and '.join(silent) or topics[0]
        awaiting = [group.interface in ACTION_INTERFACES and publisher.answers.awaiting
                    for group, publisher in zip(self._groups, self._publishers)]
        unheard = tuple(i for group, count, refusal, waiting in zip(self._groups, subscribers, refusals, awaiting)
                        if count == 0 or refusal is not None or waiting for i in group.indices)
        refused = '; '.join(refusal for refusal in refusals if refusal is not None) or None
        return CommandLink(min(subscribers), sum(others), fault, unheard, refused)

    def wait_for_all_acked(self, seconds: float) -> None:
        """Wait (at most ``seconds`` each) until subscribers have every message sent."""
        for group, publisher in zip(self._groups, self._publishers):
            if group.interface not in ACTION_INTERFACES:
                publisher.wait_for_all_acked(Duration(seconds=seconds))


class CommandLink(NamedTuple):
    """What the loop is told of its command topics (the arguments of ``ControlLoop.set_command_link``)."""

    subscribers: int                # the fewest subscribers of any group's topic (action: server there)
    other_publishers: int           # on all topics together
    topic: str                      # the topics the refusal is about
    unheard_joints: tuple[int, ...]     # joints whose next command steps from the measured state
    refused: str | None             # why an action group's controller did not run its goals, or None


def _action_type(interface: str) -> type:
    """Return the control_msgs action of an action interface (imported only here: make setup generates it)."""
    from control_msgs.action import FollowJointTrajectory, GripperCommand

    return FollowJointTrajectory if interface == 'follow_joint_trajectory' else GripperCommand
