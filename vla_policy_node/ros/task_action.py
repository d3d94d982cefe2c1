# SPDX-License-Identifier: Apache-2.0
"""
The RunInstruction action of the policy node: ask for a task and learn how it ended.

Accepting a goal starts a fresh episode with its instruction (``ros/episodes.py``), as the
``~/reset_episode`` service followed by the instruction topic does; the control tick then
checks the goal (:meth:`TaskAction.on_tick`): it publishes the feedback and ends the goal on
a success for its episode (``task_success_topic``), the time limit or a protective stop. A
cancel holds the robot at once and so do a time-out and a success: the loop ends the task
(``ControlLoop.end_task``), whose hold leaves through the loop's one exit like every command,
and waits for the next. One goal at a time: a new goal preempts the running one, which ends
PREEMPTED without a hold.

Every request is answered. The goal, cancel and result services keep every request
(``SERVICE_QOS``: rclpy's default keeps the last 10 and drops the rest unanswered), and at
most ``GOALS_AT_ONCE`` goals start within ``GOAL_WINDOW_S``: a goal past that bound is
accepted and ends at once REFUSED with the reason, while the running goal goes on (each start
resets the episode and the policy's cache: a flood of goals would only keep the robot
holding). The server keeps each result ``RESULT_KEPT_S`` for the client to fetch, and every
goal it keeps is in each status message it publishes: past ``MAX_GOALS_KEPT`` goals accepted
within that time a goal is rejected (said in the log), which bounds the work a flood adds to
the executor that also runs the control tick. Each goal's execute callback waits on its own
ending, so a cancel or a preemption racing with its start cannot leave it without an outcome;
the outcome is set on every path, and SUCCEEDED comes only from a ``TaskSuccess`` for the
goal's episode raised after it was accepted.

Statuses follow nav2 and BehaviorTree.CPP's ``RosActionNode``: SUCCEEDED means the task is
done, ABORTED and CANCELED mean it is not. The outcome says why.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
import math
import threading
import time

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.node import Node
from rclpy.task import Future
from vla_policy_interfaces.action import RunInstruction
from vla_policy_interfaces.msg import TaskSuccess

from vla_policy_node.control.loop import ControlLoop
from vla_policy_node.control.state import Mode
from vla_policy_node.ros.conversions import ConversionError, instruction_text
from vla_policy_node.ros.episodes import Episodes
from vla_policy_node.ros.qos import COMMAND_QOS, SERVICE_QOS

Goal = RunInstruction.Goal
Result = RunInstruction.Result
GOALS_AT_ONCE = 10          # goals that may start within GOAL_WINDOW_S; later ones end REFUSED
GOAL_WINDOW_S = 1.0
RESULT_KEPT_S = 10          # rclpy's default result_timeout, explicit: how long a result may be fetched
MAX_GOALS_KEPT = 1000       # goals accepted within RESULT_KEPT_S; more are rejected
SUCCESSES = (Result.SUCCEEDED, Result.COMPLETED)     # status SUCCEEDED; CANCELLED: CANCELED; the rest ABORTED


@dataclass
class _Goal:
    """The goal that runs, and the counters when it was accepted."""

    handle: ServerGoalHandle
    instruction: str
    time_limit: float
    mode: int
    started: float          # node clock at acceptance: a success stamped before it is stale
    ticks: int
    chunks: int
    done: Future
    succeeded: bool = False


class TaskAction:
    """The ``~/run_instruction`` action server and the success subscription of one policy node."""

    def __init__(self, node: Node, success_topic: str, max_instruction_length: int,
                 loop: Callable[[], ControlLoop | None], refusal: Callable[[], str | None],
                 now: Callable[[], float], episodes: Episodes) -> None:
        """``loop``: the node's loop (None before one runs); ``refusal``: why no goal is taken now, or None."""
        self._node, self._loop, self._refusal, self._now = node, loop, refusal, now
        self._episodes = episodes
        self._max_length = max_instruction_length
        self._lock = threading.Lock()          # the executor's thread, and stop() on the main thread
        self._goal: _Goal | None = None
        self._endings: dict[bytes, Future] = {}     # goal id -> its result, until its execute callback runs
        self._starts: deque[float] = deque()        # monotonic times of the last goal starts
        self._accepted: deque[float] = deque()      # monotonic times of the goals accepted
        self._server = ActionServer(
            node, RunInstruction, '~/run_instruction', execute_callback=self._execute,
            goal_callback=self._on_goal, handle_accepted_callback=self._on_accepted,
            cancel_callback=self._on_cancel, goal_service_qos_profile=SERVICE_QOS,
            result_service_qos_profile=SERVICE_QOS, cancel_service_qos_profile=SERVICE_QOS,
            result_timeout=RESULT_KEPT_S)
        node.create_subscription(TaskSuccess, success_topic, self._on_success, COMMAND_QOS)

    def _counts(self, loop: ControlLoop) -> tuple[int, int]:
        counters = loop.status(self._now(), 1.0).counters
        return counters['control_ticks'], counters['chunks_received']

    # ------------------------------------------------------------------ goals
    def _on_goal(self, request: Goal) -> GoalResponse:
        """Reject a goal the node cannot run (said in the log: a goal response carries no reason)."""
        refusal = self._refusal() or invalid(request, self._max_length) or self._flood()
        if refusal is not None:
            self._node.get_logger().warning(f'run_instruction goal rejected: {refusal}', throttle_duration_sec=1.0)
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _flood(self) -> str | None:
        """Count this goal's acceptance, or say why it is rejected."""
        if not within(self._accepted, RESULT_KEPT_S, MAX_GOALS_KEPT):
            return f'too many goals: {MAX_GOALS_KEPT} accepted within the last {RESULT_KEPT_S} s'
        return None

    def _on_accepted(self, handle: ServerGoalHandle) -> None:
        """Refuse the goal past the burst bound; else preempt the running goal and start its episode."""
        done = Future()
        self._endings[_key(handle)] = done
        with self._lock:
            refusal = self._refusal() or self._burst()
            if refusal is not None:
                self._node.get_logger().warning(f'run_instruction goal refused: {refusal}',
                                                throttle_duration_sec=1.0)
                done.set_result(Result(outcome=Result.REFUSED, reason=refusal))
            else:
                self._start(handle, done)
        handle.execute()

    def _burst(self) -> str | None:
        """Count this goal's start within the window, or say why it is refused."""
        if not within(self._starts, GOAL_WINDOW_S, GOALS_AT_ONCE):
            return (f'too many goals at once: {GOALS_AT_ONCE} started within the last {GOAL_WINDOW_S:g} s '
                    '(the running goal goes on)')
        return None

    def _start(self, handle: ServerGoalHandle, done: Future) -> None:
        request = handle.request
        loop = self._loop()
        text = instruction_text(request.instruction, self._max_length)
        if self._goal is not None:
            self._finish(Result.PREEMPTED, f'preempted by a new goal: {text[:80]!r}')
        if not loop.on_instruction(text):          # a new text has reset the episode already
            loop.reset_episode('run_instruction goal')
        self._episodes.start(text, 'run_instruction goal', handle.goal_id)
        ticks, chunks = self._counts(loop)
        self._goal = _Goal(handle, text, request.time_limit, request.time_limit_mode, self._now(), ticks, chunks,
                           done)

    async def _execute(self, handle: ServerGoalHandle) -> Result:
        """Wait for this goal's own ending; set the goal status that goes with its outcome."""
        result = await self._endings.pop(_key(handle))
        if result.outcome in SUCCESSES:
            handle.succeed()
        elif result.outcome == Result.CANCELLED and handle.is_cancel_requested:
            handle.canceled()
        else:
            handle.abort()
        return result

    def _on_cancel(self, handle: ServerGoalHandle) -> CancelResponse:
        """Hold at once and end the running goal CANCELLED; a goal already ending keeps its outcome."""
        with self._lock:
            goal = self._goal
            if goal is None or _key(goal.handle) != _key(handle):
                return CancelResponse.REJECT
            loop = self._loop()
            if loop is not None:
                loop.end_task(self._now(), 'run_instruction goal cancelled')
            self._finish(Result.CANCELLED, 'cancelled: holding')
            return CancelResponse.ACCEPT

    def _on_success(self, msg: TaskSuccess) -> None:
        """Take a success for the running goal's episode raised after its acceptance; ignore any other."""
        stamp = msg.stamp.sec + msg.stamp.nanosec * 1e-9
        with self._lock:
            goal = self._goal
            if goal is None:
                return
            episode = self._episodes.current
            if msg.episode == episode and stamp >= goal.started:
                goal.succeeded = True
                return
        why = (f'for episode {msg.episode}, the goal runs episode {episode}' if msg.episode != episode
               else 'stamped before the goal was accepted')
        self._node.get_logger().info(f'task success ignored: {why}', throttle_duration_sec=1.0)

    # ------------------------------------------------------------------ the control tick
    def on_tick(self) -> None:
        """After a control tick: end the goal on success, its time limit or a protective stop, else give feedback."""
        with self._lock:
            goal, loop = self._goal, self._loop()
            if goal is None or loop is None:
                return
            elapsed = self._now() - goal.started
            if goal.succeeded:
                loop.end_task(self._now(), 'run_instruction goal succeeded')
                self._finish(Result.SUCCEEDED, 'the task succeeded: holding')
            elif goal.time_limit > 0.0 and elapsed >= goal.time_limit:
                self._time_up(loop, goal)
            elif loop.mode == Mode.LATCHED:
                self._finish(Result.FAULTED, f'protective stop: {loop.hold_reason}')
            else:
                ticks, chunks = self._counts(loop)
                goal.handle.publish_feedback(RunInstruction.Feedback(
                    episode=self._episodes.current, elapsed=elapsed, control_steps=ticks - goal.ticks,
                    chunks=chunks - goal.chunks, hold_reason=loop.hold_reason or ''))

    def _time_up(self, loop: ControlLoop, goal: _Goal) -> None:
        if goal.mode == Goal.DURATION:
            loop.end_task(self._now(), 'run_instruction goal completed its time')
            self._finish(Result.COMPLETED, f'ran for its {goal.time_limit:g} s (time_limit_mode DURATION): holding')
        else:
            loop.end_task(self._now(), 'run_instruction goal timed out')
            self._finish(Result.TIMED_OUT, f'no success within {goal.time_limit:g} s: holding')

    def abort(self, reason: str) -> None:
        """End the running goal FAULTED (the node stops or is deactivated: its hold is the node's)."""
        with self._lock:
            if self._goal is not None:
                self._finish(Result.FAULTED, reason)
            else:
                self._episodes.end(0, reason)

    def _finish(self, outcome: int, reason: str) -> None:
        goal, self._goal = self._goal, None
        loop = self._loop()
        ticks, chunks = self._counts(loop) if loop is not None else (goal.ticks, goal.chunks)
        episode = self._episodes.current
        self._node.get_logger().info(f'run_instruction goal {goal.instruction[:80]!r} ended: {reason}')
        self._episodes.end(outcome, reason, goal.handle.goal_id)
        goal.done.set_result(Result(outcome=outcome, reason=reason, episode=episode,
                                    elapsed=self._now() - goal.started, control_steps=ticks - goal.ticks,
                                    chunks=chunks - goal.chunks))

    def destroy(self) -> None:
        """Destroy the action server."""
        self._server.destroy()


def within(times: deque[float], window: float, most: int) -> bool:
    """Count one more event in ``times`` (monotonic) if fewer than ``most`` happened within ``window`` s."""
    now = time.monotonic()
    while times and now - times[0] > window:
        times.popleft()
    if len(times) >= most:
        return False
    times.append(now)
    return True


def _key(handle: ServerGoalHandle) -> bytes:
    return bytes(handle.goal_id.uuid)


def invalid(request: Goal, max_length: int) -> str | None:
    """Say what makes a goal invalid, or None."""
    try:
        instruction_text(request.instruction, max_length)
    except ConversionError as error:
        return str(error)
    if not math.isfinite(request.time_limit) or request.time_limit < 0.0:
        return f'time_limit {request.time_limit} must be 0 (none) or a positive number of seconds'
    if request.time_limit_mode not in (Goal.CONFIRM, Goal.DURATION):
        return f'time_limit_mode {request.time_limit_mode} must be CONFIRM (0) or DURATION (1)'
    if request.time_limit_mode == Goal.DURATION and request.time_limit == 0.0:
        return 'time_limit_mode DURATION needs a time_limit: how long to run the task'
    return None
