# SPDX-License-Identifier: Apache-2.0
"""
The RunInstruction action of the policy node: ask for a task and learn how it ended.

Accepting a goal starts a fresh episode with its instruction, as the ``~/reset_episode``
service followed by the instruction topic does; the control tick then checks the goal
(:meth:`TaskAction.on_tick`): it publishes the feedback and ends the goal on the success
signal (``task_success_topic``), the time limit or a protective stop. A cancel holds the robot
at once and so do a time-out and a success: the loop ends the task (``ControlLoop.end_task``),
whose hold leaves through the loop's one exit like every command, and waits for the next. One
goal at a time: a new goal preempts the running one, which ends PREEMPTED without a hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
import math

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.node import Node
from rclpy.task import Future
from std_msgs.msg import Empty
from vla_policy_interfaces.action import RunInstruction

from vla_policy_node.control.loop import ControlLoop
from vla_policy_node.control.state import Mode
from vla_policy_node.ros.conversions import ConversionError, instruction_text
from vla_policy_node.ros.qos import COMMAND_QOS

Result = RunInstruction.Result


@dataclass
class _Goal:
    """The goal that runs, and the counters when it was accepted."""

    handle: ServerGoalHandle
    instruction: str
    time_limit: float
    started: float
    ticks: int
    chunks: int
    done: Future
    succeeded: bool = False


class TaskAction:
    """The ``~/run_instruction`` action server and the success subscription of one policy node."""

    def __init__(self, node: Node, success_topic: str, max_instruction_length: int,
                 loop: Callable[[], ControlLoop | None], refusal: Callable[[], str | None],
                 now: Callable[[], float]) -> None:
        """``loop``: the node's loop (None before one runs); ``refusal``: why no goal is taken now, or None."""
        self._node, self._loop, self._refusal, self._now = node, loop, refusal, now
        self._max_length = max_instruction_length
        self._goal: _Goal | None = None
        self._server = ActionServer(
            node, RunInstruction, '~/run_instruction', execute_callback=self._execute,
            goal_callback=self._on_goal, handle_accepted_callback=self._on_accepted,
            cancel_callback=self._on_cancel)
        node.create_subscription(Empty, success_topic, self._on_success, COMMAND_QOS)

    def _counts(self) -> tuple[int, int]:
        counters = self._loop().status(self._now(), 1.0).counters
        return counters['control_ticks'], counters['chunks_received']

    def _on_goal(self, request: RunInstruction.Goal) -> GoalResponse:
        refusal = self._refusal()
        try:
            instruction_text(request.instruction, self._max_length)
        except ConversionError as error:
            refusal = refusal or str(error)
        if not math.isfinite(request.time_limit) or request.time_limit < 0.0:
            refusal = refusal or f'time_limit {request.time_limit} must be 0 (none) or a positive number of seconds'
        if refusal is not None:
            self._node.get_logger().warning(f'run_instruction goal refused: {refusal}')
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _on_accepted(self, handle: ServerGoalHandle) -> None:
        """Preempt the running goal, then start the new one's episode."""
        request = handle.request
        if self._goal is not None:
            self._finish(Result.PREEMPTED, f'preempted by a new goal: {request.instruction[:80]!r}')
        loop = self._loop()
        text = instruction_text(request.instruction, self._max_length)
        if not loop.on_instruction(text):          # a new text has reset the episode already
            loop.reset_episode('run_instruction goal')
        ticks, chunks = self._counts()
        self._goal = _Goal(handle, text, request.time_limit, self._now(), ticks, chunks, Future())
        handle.execute()

    async def _execute(self, handle: ServerGoalHandle) -> RunInstruction.Result:
        goal = self._goal
        result = await goal.done
        {Result.SUCCEEDED: handle.succeed, Result.CANCELLED: handle.canceled}.get(result.outcome, handle.abort)()
        return result

    def _on_cancel(self, handle: ServerGoalHandle) -> CancelResponse:
        """Hold at once and end the goal CANCELLED."""
        if self._goal is None or self._goal.handle is not handle:
            return CancelResponse.REJECT
        self._loop().end_task(self._now(), 'run_instruction goal cancelled')
        self._finish(Result.CANCELLED, 'cancelled: holding')
        return CancelResponse.ACCEPT

    def _on_success(self, msg: Empty) -> None:
        if self._goal is not None:
            self._goal.succeeded = True

    def on_tick(self) -> None:
        """After a control tick: end the goal on success, time-out or a protective stop, else give feedback."""
        goal, loop = self._goal, self._loop()
        if goal is None or loop is None:
            return
        elapsed = self._now() - goal.started
        if goal.succeeded:
            loop.end_task(self._now(), 'run_instruction goal succeeded')
            self._finish(Result.SUCCEEDED, 'the task succeeded: holding')
        elif goal.time_limit > 0.0 and elapsed >= goal.time_limit:
            loop.end_task(self._now(), 'run_instruction goal timed out')
            self._finish(Result.TIMED_OUT, f'no success within {goal.time_limit:g} s: holding')
        elif loop.mode == Mode.LATCHED:
            self._finish(Result.FAULTED, f'protective stop: {loop.hold_reason}')
        else:
            ticks, chunks = self._counts()
            goal.handle.publish_feedback(RunInstruction.Feedback(
                elapsed=elapsed, control_steps=ticks - goal.ticks, chunks=chunks - goal.chunks,
                hold_reason=loop.hold_reason or ''))

    def abort(self, reason: str) -> None:
        """End the running goal FAULTED (the node stops or is deactivated: its hold is the node's)."""
        if self._goal is not None:
            self._finish(Result.FAULTED, reason)

    def _finish(self, outcome: int, reason: str) -> None:
        goal, self._goal = self._goal, None
        ticks, chunks = self._counts() if self._loop() is not None else (goal.ticks, goal.chunks)
        self._node.get_logger().info(f'run_instruction goal {goal.instruction[:80]!r} ended: {reason}')
        goal.done.set_result(Result(outcome=outcome, reason=reason, elapsed=self._now() - goal.started,
                                    control_steps=ticks - goal.ticks, chunks=chunks - goal.chunks))

    def destroy(self) -> None:
        """Destroy the action server."""
        self._server.destroy()
