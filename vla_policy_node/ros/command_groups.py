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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
import math
import re
import time
from typing import Any

import numpy as np
from rclpy.duration import Duration
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from vla_policy_node.ros.conversions import action_to_float64_multiarray, chunk_to_joint_trajectory

COMMAND_INTERFACES = ('joint_trajectory', 'forward_command')
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
        groups.append(CommandGroup(name, joints, values[group_parameter(name, 'interface')], topic,
                                   tuple(index[joint] for joint in joints)))
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
    One publisher per group; the control loop's sink publishes through :meth:`publish`.

    Another publisher on a command topic is seen two ways: the graph, polled
    (:meth:`other_publishers`, every watchdog period), and a watcher subscription per topic
    whose matched events report each publisher as DDS matches it, however briefly it lives.
    """

    def __init__(self, node: Node, groups: Sequence[CommandGroup], qos: QoSProfile, velocities: bool = False,
                 clock: Callable[[], float] = time.monotonic, watch: bool = True) -> None:
        """``watch``: watch the topics for other publishers (False: the messages go to a bag, not DDS)."""
        self._node = node
        self._groups = tuple(groups)
        self._velocities = velocities
        self._clock = clock
        kinds = [JointTrajectory if group.interface == 'joint_trajectory' else Float64MultiArray
                 for group in self._groups]
        self._publishers = [node.create_publisher(kind, group.topic, qos) for kind, group in zip(kinds, self._groups)]
        self._matched = [0] * len(self._groups)         # publishers each watcher matches (this node's included)
        self._intruder_until = [-math.inf] * len(self._groups)
        self._watchers = [self._watch(i, kind, publisher.topic_name) if watch else None
                          for i, (kind, publisher) in enumerate(zip(kinds, self._publishers))]

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
        """Return the resolved topic of every group."""
        return tuple(publisher.topic_name for publisher in self._publishers)

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
            if group.interface == 'joint_trajectory':
                publisher.publish(chunk_to_joint_trajectory(
                    points[:, columns], group.joints, dt,
                    None if velocities is None else velocities[:, columns]))
            else:
                publisher.publish(action_to_float64_multiarray(points[0, columns]))

    def other_publishers(self) -> tuple[int, ...]:
        """Count the publishers on each group's topic besides this node (a graph query)."""
        return tuple(max(0, self._node.count_publishers(publisher.topic_name) - 1)
                     for publisher in self._publishers)

    def intruders(self, polled: Sequence[int]) -> tuple[int, ...]:
        """Return ``polled`` (:meth:`other_publishers`) raised to 1 on a topic whose watcher saw another lately."""
        now = self._clock()
        return tuple(max(count, 1 if now < until else 0) for count, until in zip(polled, self._intruder_until))

    def link(self, others: Sequence[int]) -> tuple[int, int, str, tuple[int, ...]]:
        """
        Return (fewest subscribers, other publishers on all, topics at fault, unheard joints).

        ``others`` comes from :meth:`other_publishers`. The topics named are those the loop's
        refusal is about: the ones with another publisher (that refusal comes first; with
        several, each with its count, as the loop reports the sum), else the ones without a
        subscriber, else the first topic. The unheard joints (indices) are those of the
        topics without a subscriber.
        """
        # The watchers subscribe too: a matched one is not a controller.
        subscribers = [max(0, publisher.get_subscription_count() - (watcher is not None and matched > 0))
                       for publisher, watcher, matched in zip(self._publishers, self._watchers, self._matched)]
        others = self.intruders(others)
        topics = self.topics
        contested = [(t, o) for t, o in zip(topics, others) if o > 0]
        if len(contested) > 1:
            fault = ' and '.join(f'{t} ({o})' for t, o in contested)
        else:
            silent = [t for t, s in zip(topics, subscribers) if s == 0]
            fault = contested[0][0] if contested else ' and '.join(silent) or topics[0]
        unheard = tuple(i for group, count in zip(self._groups, subscribers) if count == 0
                        for i in group.indices)
        return min(subscribers), sum(others), fault, unheard

    def wait_for_all_acked(self, seconds: float) -> None:
        """Wait (at most ``seconds`` each) until subscribers have every message sent."""
        for publisher in self._publishers:
            publisher.wait_for_all_acked(Duration(seconds=seconds))
