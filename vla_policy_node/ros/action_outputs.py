# SPDX-License-Identifier: Apache-2.0
"""
A command group served by a ros2_control action: its client, and the controller's answers.

Each goal's answers (accepted or rejected, then succeeded, aborted or canceled) go to the
group's ``control.goal_answers.GoalAnswers``, which decides whether the group may be
commanded; this module only translates rclpy's futures. Every goal and answer is also
published on ``~/command_goals`` (``vla_policy_interfaces/CommandGoal``), so a recorder keeps
the commands that left as goals and what became of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from action_msgs.msg import GoalStatus
from builtin_interfaces.msg import Time
import numpy as np
from rclpy.action import ActionClient
from rclpy.node import Node
from trajectory_msgs.msg import JointTrajectory
from vla_policy_interfaces.msg import CommandGoal

from vla_policy_node.control.goal_answers import GoalAnswers, Outcome
from vla_policy_node.ros.conversions import chunk_to_joint_trajectory

OUTCOMES = {GoalStatus.STATUS_SUCCEEDED: (Outcome.SUCCEEDED, CommandGoal.SUCCEEDED),
            GoalStatus.STATUS_ABORTED: (Outcome.ABORTED, CommandGoal.ABORTED),
            GoalStatus.STATUS_CANCELED: (Outcome.CANCELED, CommandGoal.CANCELED)}


class ActionOutput:
    """One action group's client; its answers decide whether the group may be commanded (:meth:`refusal`)."""

    def __init__(self, node: Node, action: type, name: str, group: str, counters: dict[str, int],
                 record: Any, now: Callable[[], float], wall: Callable[[], float]) -> None:
        """``record``: the ``~/command_goals`` publisher (None: none); ``now``: the node clock; ``wall``: monotonic."""
        self._action, self._group = action, group
        self.client = ActionClient(node, action, name)
        self.action_name = node.resolve_topic_name(name)
        self._record, self._now, self._wall = record, now, wall
        # A gripper reaches a position already held at once: only a trajectory's timing says it was not run.
        self.answers = GoalAnswers(self.action_name, counters, node.get_logger().warning,
                                   checks_timing=hasattr(action.Result, 'error_code'), on_refused=self._cancel_running)
        self._next_id = 0
        self._running: dict[int, Any] = {}         # goal id -> handle of an accepted goal not ended

    @property
    def goal_type(self) -> type:
        """Return the action's goal message type."""
        return self._action.Goal

    def server_is_ready(self) -> bool:
        """Tell whether the controller's action server is there."""
        return self.client.server_is_ready()

    def refusal(self) -> str | None:
        """Say why the group may not be commanded now (a goal it did not run, lately), or None."""
        refusal = self.answers.refusal(self._wall())
        for goal in self.answers.unanswered:
            self._publish(CommandGoal.NO_RESPONSE, goal)
        self.answers.unanswered.clear()
        return refusal

    def send(self, goal: Any, trajectory: JointTrajectory) -> None:
        """Send a goal (``trajectory``: what it commands, for the record) and follow its answers; or hold it back."""
        if not self.answers.may_send():
            return
        self._next_id += 1
        goal_id = self._next_id
        first, last = (point.time_from_start for point in (trajectory.points[0], trajectory.points[-1]))
        self.answers.sent(goal_id, self._now(), self._wall(), first.sec + first.nanosec * 1e-9,
                          last.sec + last.nanosec * 1e-9)
        self._publish(CommandGoal.SENT, goal_id, trajectory)
        self.client.send_goal_async(goal).add_done_callback(lambda future: self._on_response(goal_id, future))

    def _on_response(self, goal_id: int, future: Any) -> None:
        handle = future.result()
        accepted = handle is not None and handle.accepted
        self._publish(CommandGoal.ACCEPTED if accepted else CommandGoal.REJECTED, goal_id)
        if self.answers.responded(goal_id, accepted, self._wall()):
            handle.cancel_goal_async()          # given up: a newer goal from the measured joints stands instead
        elif accepted:
            self._running[goal_id] = handle
            handle.get_result_async().add_done_callback(lambda result: self._on_result(goal_id, result))

    def _cancel_running(self) -> None:
        """Cancel every goal the controller still runs: the loop holds, and dropped their plan."""
        running, self._running = self._running, {}
        for handle in running.values():
            handle.cancel_goal_async()

    def _on_result(self, goal_id: int, future: Any) -> None:
        self._running.pop(goal_id, None)
        response = future.result()
        if response is None or response.status not in OUTCOMES:
            return
        outcome, event = OUTCOMES[response.status]
        result = response.result
        error = int(getattr(result, 'error_code', 0))
        text = str(getattr(result, 'error_string', ''))
        self._publish(event, goal_id, error_code=error, error_string=text)
        detail = (f': error_code {error} {text!r}' if hasattr(result, 'error_code')
                  else f': position {result.position:g}, reached_goal {result.reached_goal}')
        self.answers.finished(goal_id, outcome, self._now(), self._wall(), getattr(result, 'stalled', False),
                              detail)

    def _publish(self, event: int, goal_id: int, trajectory: JointTrajectory | None = None,
                 error_code: int = 0, error_string: str = '') -> None:
        if self._record is None:
            return
        nanoseconds = int(round(self._now() * 1e9))
        stamp = Time(sec=nanoseconds // 1_000_000_000, nanosec=nanoseconds % 1_000_000_000)
        self._record.publish(CommandGoal(
            event=event, stamp=stamp, group=self._group, action=self.action_name, goal=goal_id,
            trajectory=trajectory or JointTrajectory(), error_code=error_code, error_string=error_string))


def gripper_trajectory(joint: str, position: float, max_effort: float, dt: float) -> JointTrajectory:
    """Return the record of a GripperCommand goal: one point, its position and max effort, due one period on."""
    trajectory = chunk_to_joint_trajectory(np.array([[position]]), [joint], dt)
    trajectory.points[0].effort = [max_effort]
    return trajectory
