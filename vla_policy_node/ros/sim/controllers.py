# SPDX-License-Identifier: Apache-2.0
"""
The simulated robot's controllers: their command topics and where they drive the joints.

Like ros2_control's, they read their commands at each update (the physics tick) rather than
at each message: each topic is a ``PolledSubscription``, so a command wakes no executor
(rclpy's costs ~0.5 ms of Python per wake, CPU the policy node beside the simulation needs).
Each command is still followed from its arrival, in the order the messages came. A
``JointTrajectory`` is followed in time as joint_trajectory_controller does (each for the
joints it names), a ``Float64MultiArray`` as forward_command_controller does for its joints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from rclpy.node import Node
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from vla_policy_node.ros.conversions import ConversionError, undecodable_is_an_error
from vla_policy_node.ros.polled_input import PolledSubscription
from vla_policy_node.ros.qos import COMMAND_QOS
from vla_policy_node.sim.trajectory import TrajectoryFollower


class SimControllers:
    """A joint_trajectory (or forward) controller on ``command_topic`` and a forward one on ``forward_topic``."""

    def __init__(self, node: Node, joints: Sequence[str], hold: np.ndarray, dt: float, interface: str,
                 command_topic: str, forward_topic: str, forward_joints: Sequence[str]) -> None:
        """``hold``: where the joints stay without a command; ``dt``: how long a forward command takes."""
        self._node, self._joints, self._dt = node, list(joints), dt
        # One follower per group of joints a controller drives, keyed by their indices.
        self.followers: dict[tuple[int, ...], TrajectoryFollower] = {}
        self._hold = np.array(hold, dtype=np.float64)
        self._forward = self._indices(list(forward_joints)) if forward_topic else None
        self._topics: list[tuple[PolledSubscription, Callable[[Any, float, np.ndarray], bool]]] = []
        if interface == 'joint_trajectory':
            self._topic(JointTrajectory, command_topic, self._on_trajectory)
        else:       # one forward controller for every joint
            self._forward = tuple(range(len(self._joints)))
            self._topic(Float64MultiArray, command_topic, self._on_forward)
        if forward_topic and interface == 'joint_trajectory':
            self._topic(Float64MultiArray, forward_topic, self._on_forward)

    def _topic(self, kind: type, topic: str, follow: Callable[[Any, float, np.ndarray], bool]) -> None:
        self._topics.append((PolledSubscription(self._node, kind, topic, COMMAND_QOS), follow))

    def take(self, now: float, current: np.ndarray, arrived_now: bool = False) -> float | None:
        """
        Follow the commands that arrived since the last call, in order, each from its arrival; return the last.

        ``current``: the joints now (where a new trajectory starts from); ``arrived_now``: take
        every command as arriving at ``now`` (lockstep: simulated time stands still between steps).
        Returns the arrival of the last command followed (None: none).
        """
        last = None
        for subscription, follow in self._topics:
            for raw, age in subscription.take_all():
                try:
                    msg = undecodable_is_an_error(subscription.decode, raw)
                except ConversionError as error:
                    self._node.get_logger().warning(f'ignoring a command: {error}', throttle_duration_sec=5.0)
                    continue
                arrival = now if arrived_now else now - age
                if follow(msg, arrival, current):
                    last = arrival if last is None else max(last, arrival)
        return last

    def target(self, now: float) -> np.ndarray:
        """Return where the controllers drive the joints at ``now`` (the simulator's time)."""
        target = self._hold.copy()
        for joints, follower in self.followers.items():
            desired = follower.desired(now)
            if desired is not None:
                target[list(joints)] = desired
        return target

    def hold(self, q: np.ndarray) -> None:
        """Forget every command: the joints stay at ``q``."""
        self.followers.clear()
        self._hold = np.array(q, dtype=np.float64)

    def destroy(self) -> None:
        """Destroy the subscriptions (before their node: they keep its handle in use)."""
        for subscription, _ in self._topics:
            subscription.destroy()

    def _on_trajectory(self, msg: JointTrajectory, arrival: float, current: np.ndarray) -> bool:
        if not msg.points:
            return False
        joints = self._indices(list(msg.joint_names))
        if joints is None:
            return False
        times = [p.time_from_start.sec + 1e-9 * p.time_from_start.nanosec for p in msg.points]
        try:
            points = np.asarray([p.positions for p in msg.points], dtype=np.float64)
        except ValueError:
            self._node.get_logger().warning('ignoring a trajectory whose points differ in length')
            return False
        return self._follow(joints, times, points, arrival, current)

    def _on_forward(self, msg: Float64MultiArray, arrival: float, current: np.ndarray) -> bool:
        if self._forward is None:
            return False
        return self._follow(self._forward, [self._dt], np.asarray(msg.data, dtype=np.float64)[None, :], arrival,
                            current)

    def _indices(self, names: list[str]) -> tuple[int, ...] | None:
        """Return the indices of the named joints, or None (said in the log) when one is not this robot's."""
        unknown = [n for n in names if n not in self._joints]
        if unknown or not names:
            self._node.get_logger().warning(f'joints {names} are not among {self._joints}: command ignored',
                                            throttle_duration_sec=5.0)
            return None
        return tuple(self._joints.index(n) for n in names)

    def _follow(self, joints: tuple[int, ...], times: list[float], points: np.ndarray, arrival: float,
                current: np.ndarray) -> bool:
        follower = TrajectoryFollower(len(joints))
        try:
            follower.set(arrival, current[list(joints)], np.asarray(times), points)
        except ValueError as error:
            self._node.get_logger().warning(f'ignoring command: {error}', throttle_duration_sec=5.0)
            return False
        # A new controller group takes its joints from any group that drove them before.
        for other in [g for g in self.followers if g != joints and set(g) & set(joints)]:
            del self.followers[other]
        self.followers[joints] = follower
        return True
